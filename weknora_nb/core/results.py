"""The results table: the format every collector writes and every scorer reads.

One row per returned chunk::

    query_id  stage  repeat  rank  chunk_id  score   [knowledge_id chunk_index match_type
                                                      latency_ms status error sub_chunk_ids
                                                      base_score model_score parent_chunk_id
                                                      shown_chunk_ids flags]

- ``rank`` is 1-based and is the order the system returned the chunks in (never a
  re-sort by score, never WeKnora's ``seq``).
- ``repeat`` is 1-based (1..N repeats of the same request).
- ``status`` is ``"ok"`` (the default when the column is absent) or an error kind
  (``"timeout"``, ``"server"``, ...). A failed request is **one** row with that status,
  no chunk (``chunk_id`` and ``rank`` empty) and optionally an ``error`` message.
- A successful request that returned nothing is one row with status ``"ok"`` and no
  chunk: it scores 0, whereas a failed request is excluded and counted.
- ``"skipped"`` (:data:`SKIPPED`) is a chat whose server decided not to retrieve (a greeting, chit-chat):
  one row, no chunk; neither a failure nor an empty list, it is excluded from the means and counted.
- ``sub_chunk_ids`` (WeKnora's ``sub_chunk_id``) and ``shown_chunk_ids`` (the chunks whose content the result
  shows besides itself) are JSON lists of chunk ids, unfolded by :func:`weknora_nb.core.unfold.expand_sub_chunks`;
  ``parent_chunk_id`` is the result's parent chunk (parent-child knowledge bases); ``flags`` names what the
  collector noticed about the request, comma-separated and repeated on its rows (:data:`FLAGS`).

Files: Parquet, CSV and JSONL (:func:`read_results`, :func:`write_results`); TREC run
files (:func:`read_trec_run`, :func:`write_trec_run`).

A results file is untrusted input: a file that cannot be read (a folder, no permission,
empty, truncated, not UTF-8, a column given twice) is a :class:`ResultsError` naming it,
and a value of the wrong type is a problem naming its row (or line) and field: an integer
column holds integers of the int64 range (not ``1e20``, ``inf``, ``1.5``, a list or a
boolean; NaN is an empty value), a number column numbers, an id column text (integers are
read as their decimal text; bytes, lists, mappings, fractions are refused).
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from weknora_nb.core.codes import (
    _CATEGORIES,
    _FLOATS,
    _INTS,
    _STRINGS,
    MAX_PROBLEMS,
    ResultCodes,
    _arrow_is_text,
    _report,
    _value_at,
    parquet_codes,
)
from weknora_nb.core.errors import Problem, ResultsError, UsageError, reading
from weknora_nb.core.files import atomic_path
from weknora_nb.core.unfold import check_id_lists

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("query_id", "stage", "repeat", "rank", "chunk_id", "score")
#: the status of a chat whose server skipped retrieval: not a failure, not scored (docs/method.md section 2)
SKIPPED = "skipped"
#: the statuses that are no failure of the request
NOT_FAILED = ("ok", SKIPPED)
#: what ``flags`` may name, and what each means (docs/user-guide.md; both are heuristics)
FLAGS = {
    "vector_path_missing": "every primary hit of a knowledge-search answer is a keyword match although a knowledge "
                           "base has vector retrieval: "
                           "the query's embedding probably failed and WeKnora answered from the keyword path alone "
                           "(a heuristic)",
    "references_rebuilt": "the chat's references lost match_type, sub_chunk_id and metadata: the server's Redis stream "
                          "manager rebuilt them (a heuristic); match types were not filtered",
}
OPTIONAL_COLUMNS = ("knowledge_id", "chunk_index", "match_type", "latency_ms", "status", "error",
                    "sub_chunk_ids", "base_score", "model_score", "parent_chunk_id", "shown_chunk_ids", "flags")


def read_results(path: str | Path, *, validate: bool = True) -> pd.DataFrame:
    """Read a results table from ``.parquet``, ``.csv`` or ``.jsonl``.

    String columns with few distinct values come back as ``category``. ``status`` is
    filled with ``"ok"`` when absent. Raises :class:`ResultsError` naming the row and
    field of every problem (up to 200), and naming the file when it cannot be read at all
    (a folder, no permission, empty, truncated, not UTF-8, a column given twice);
    :class:`FileNotFoundError` when there is no such file.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"results file not found: {p}")
    suffix = p.suffix.lower()
    reader = _READERS.get(suffix)
    if reader is None:
        raise ResultsError(p, [Problem(str(p), None, None,
                                       f"unsupported results format {suffix!r}; expected .parquet, .csv or .jsonl "
                                       "(TREC run files: read_trec_run)")])
    if not p.is_file():
        raise ResultsError(p, "is not a file (a folder?)")
    with reading(p, ResultsError):
        df, first_row = reader(p)
    problems: list[Problem] = []
    df = _coerce(df, str(p), problems, first_row=first_row)
    if validate:
        validate_results(df, str(p), first_row=first_row, problems=problems)
    elif problems:
        raise ResultsError(p, problems)
    return df


def _read_parquet(p: Path) -> tuple[pd.DataFrame, int]:
    """A Parquet results file as a frame (text columns with few values as categories); rows are numbered from 1."""
    schema = pq.read_schema(p)
    _refuse_repeated_columns(schema.names, p)
    text = [c for c in _CATEGORIES if c in schema.names and _arrow_is_text(schema.field(c).type)
            and not pa.types.is_null(schema.field(c).type)]
    return pq.read_table(p, read_dictionary=text).to_pandas(), 1


def _read_csv(p: Path) -> tuple[pd.DataFrame, int]:
    """A CSV results file as a frame (every column as text first); its header is line 1, row r is line r + 1."""
    with open(p, encoding="utf-8-sig", newline="") as fh:
        header = next(csv.reader(fh), [])
    _refuse_repeated_columns(header, p)
    df = pd.read_csv(p, dtype={c: "string" for c in _STRINGS}, keep_default_na=False,
                     na_values={c: [""] for c in _INTS + _FLOATS + _STRINGS}, encoding="utf-8-sig")
    return df, 2


def _read_jsonl(p: Path) -> tuple[pd.DataFrame, int]:
    """A JSON-lines results file as a frame (one object per non-blank line; values as JSON gave them,
    converted by :func:`_coerce`); rows are numbered from 1. A line that is not a JSON object is a
    problem naming its line."""
    rows: list[dict] = []
    problems: list[Problem] = []
    with open(p, encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:  # bad JSON, an integer of > 4300 digits, deep nesting
                problems.append(Problem(str(p), lineno, None, f"not valid JSON: {_one_line(exc)}"))
            else:
                if isinstance(row, dict):
                    rows.append(row)
                else:
                    problems.append(Problem(str(p), lineno, None,
                                            f"must be a JSON object (one row), got {type(row).__name__}"))
            if len(problems) >= MAX_PROBLEMS:
                break
    if problems:
        raise ResultsError(p, problems)
    return pd.DataFrame.from_records(rows) if rows else pd.DataFrame(), 1


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line, at most 200 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


_READERS: dict[str, Callable[[Path], tuple[pd.DataFrame, int]]] = {
    ".parquet": _read_parquet, ".pq": _read_parquet, ".csv": _read_csv,
    ".jsonl": _read_jsonl, ".ndjson": _read_jsonl, ".json": _read_jsonl}


def _refuse_repeated_columns(names: list[str], path: str | Path) -> None:
    """ResultsError naming the results columns that a file gives more than once (which one would count?)."""
    known = set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS)
    twice = sorted({n for n in names if n in known and names.count(n) > 1})
    if twice:
        raise ResultsError(path, f"column(s) {twice} appear more than once; keep one of each")


def _coerce(df: pd.DataFrame, path: str, problems: list[Problem], first_row: int = 1) -> pd.DataFrame:
    """Check required columns and bring every known column to its dtype; a value that cannot be
    converted is a problem (row and field named) and becomes missing."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        problems.append(Problem(path, None, None, f"missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}"))
        raise ResultsError(path, problems)
    _refuse_repeated_columns([str(c) for c in df.columns], path)
    df = df.copy(deep=False)
    if "status" not in df.columns:
        df["status"] = "ok"
    conversions = ((_INTS, _to_int64, "must be an integer"), (_FLOATS, _to_float64, "must be a number"),
                   (_STRINGS, _to_text, "must be text"))
    for columns, convert, message in conversions:
        for c in columns:
            if c not in df.columns:
                continue
            converted, bad = convert(df[c])
            if bad is not None and bad.any():
                _report(problems, path, np.flatnonzero(bad), c, message, first_row, _value_at(df[c]))
            df[c] = converted
    check_id_lists(df, path, problems, first_row)
    return df


#: the int64 range, as floats: values at or beyond these bounds do not fit
_INT64_LOW, _INT64_HIGH = -float(2**63), float(2**63)


def _to_int64(s: pd.Series) -> tuple[pd.Series, np.ndarray | None]:
    """``s`` as integers (unchanged when already signed integers, else ``Int64``) and the mask of
    values given but not an integer of the int64 range (text, a fraction, NaN text, inf, 1e20,
    a list, a boolean, a date); None when nothing can be wrong."""
    if pd.api.types.is_signed_integer_dtype(s.dtype):
        return s, None
    given = s.notna().to_numpy(dtype=bool)
    values = s.astype(object) if isinstance(s.dtype, pd.CategoricalDtype) else s
    kind = getattr(values.dtype, "kind", "O")
    if pd.api.types.is_bool_dtype(values.dtype) or kind not in "iufO":  # booleans, dates, durations, complex
        return pd.Series(pd.array([pd.NA] * len(s), dtype="Int64"), index=s.index), given
    num = values if kind in "uf" else pd.to_numeric(values, errors="coerce")
    if pd.api.types.is_bool_dtype(num.dtype):
        return pd.Series(pd.array([pd.NA] * len(s), dtype="Int64"), index=s.index), given
    if num.dtype.kind == "u":
        raw = num.to_numpy(dtype=np.uint64, na_value=0)
        ok = num.notna().to_numpy(dtype=bool) & (raw <= np.uint64(2**63 - 1))
        ints = np.where(ok, raw, 0).astype(np.int64)
    elif num.dtype.kind == "i":
        ok = num.notna().to_numpy(dtype=bool)
        ints = num.to_numpy(dtype=np.int64, na_value=0)
    else:
        f = num.to_numpy(dtype=np.float64, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(f) & (f == np.floor(f)) & (f >= _INT64_LOW) & (f < _INT64_HIGH)
        ints = np.where(ok, f, 0).astype(np.int64)
    out = pd.Series(pd.arrays.IntegerArray(ints, ~ok), index=s.index)
    return out, given & ~ok


def _to_float64(s: pd.Series) -> tuple[pd.Series, np.ndarray | None]:
    """``s`` as float64 and the mask of values given but not a number (NaN and inf are numbers)."""
    if pd.api.types.is_float_dtype(s.dtype):
        return s, None
    given = s.notna().to_numpy(dtype=bool)
    values = s.astype(object) if isinstance(s.dtype, pd.CategoricalDtype) else s
    kind = getattr(values.dtype, "kind", "O")
    if pd.api.types.is_bool_dtype(values.dtype) or kind not in "iufO":
        return pd.Series(np.full(len(s), np.nan), index=s.index), given
    num = pd.to_numeric(values, errors="coerce")
    if pd.api.types.is_bool_dtype(num.dtype):
        return pd.Series(np.full(len(s), np.nan), index=s.index), given
    f = pd.Series(num.to_numpy(dtype=np.float64, na_value=np.nan), index=s.index)
    return f, given & f.isna().to_numpy(dtype=bool)


def _is_text_value(v: object) -> bool:
    """Whether one value of an object column can be an id: a string, an integer (its decimal text) or missing."""
    if isinstance(v, str) or v is None or v is pd.NA or v is pd.NaT:
        return True
    if isinstance(v, (int, np.integer)):
        return not isinstance(v, (bool, np.bool_))
    return isinstance(v, (float, np.floating)) and bool(np.isnan(v))


def _to_text(s: pd.Series) -> tuple[pd.Series, np.ndarray | None]:
    """``s`` as strings (categories kept) and the mask of values given that are not text: a number
    with a fraction, a boolean, bytes, a list, a mapping, a date. Integers read as their decimal text."""
    if isinstance(s.dtype, pd.StringDtype):
        return s, None
    if isinstance(s.dtype, pd.CategoricalDtype):
        inferred = pd.api.types.infer_dtype(s.cat.categories, skipna=True)
        if inferred in ("string", "empty", "integer"):
            return s, None
        s = s.astype(object)
    kind = getattr(s.dtype, "kind", "O")
    if kind in "iu" and not pd.api.types.is_bool_dtype(s.dtype):
        return s.astype("string"), None
    given = s.notna().to_numpy(dtype=bool)
    if kind != "O":  # floats, booleans, dates: an id is never one of these
        return pd.Series(pd.array([pd.NA] * len(s), dtype="string"), index=s.index), given
    if pd.api.types.infer_dtype(s, skipna=True) in ("string", "empty"):
        return s.astype("string"), None
    bad = ~np.fromiter((_is_text_value(v) for v in s.to_numpy()), dtype=bool, count=len(s))
    return s.where(~bad, None).astype("string"), bad


def validate_results(df: pd.DataFrame, path: str = "<memory>", *, first_row: int = 1,
                     problems: list[Problem] | None = None) -> None:
    """Row-level checks (vectorised); raise :class:`ResultsError` listing every problem.

    Structural checks that need the rows grouped by request (a rank given twice, a
    request both failed and with chunks) run when scoring. A row and field already in
    ``problems`` (a value that could not be converted) is not reported a second time.
    """
    problems = problems if problems is not None else []
    seen = {(p.line, p.field) for p in problems}
    found = ResultCodes.from_frame(df).check(path, first_row=first_row)
    problems += [p for p in found if (p.line, p.field) not in seen][: max(0, MAX_PROBLEMS - len(problems))]
    if problems:
        raise ResultsError(path, problems)


def read_results_for_scoring(path: str | Path) -> pd.DataFrame | ResultCodes:
    """What :func:`weknora_nb.score` reads when given a path.

    A Parquet file whose columns have the results-table types is read straight into
    :class:`ResultCodes` (:func:`weknora_nb.core.codes.parquet_codes`: only the columns
    scoring needs, no pandas conversion) and its rows are checked as :func:`read_results`
    would; any other file, one with a column of another type, or one with merged results to
    unfold (``sub_chunk_ids``), goes through :func:`read_results`. A file that cannot be read
    is a :class:`ResultsError` naming it.
    """
    codes = parquet_codes(path)
    return codes if codes is not None else read_results(Path(path))


#: the largest dictionary page of a column written to Parquet (Arrow's default is 1 MiB): beyond it the
#: writer stores the rest of the column as plain text, which a reader must hash again
_DICTIONARY_PAGE_BYTES = 64 << 20


def write_results(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a results table atomically (temp file + rename) as Parquet, CSV or JSONL.

    Parquet is written as one row group with one dictionary per text column (up to 64 MiB of distinct
    text): a reader then takes each column in one piece, its dictionary indices as they are
    (:func:`weknora_nb.core.codes.parquet_codes`), instead of merging a dictionary per million rows.
    A column without a null is written as ``required`` (:func:`_required_where_full`).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    out = df.copy(deep=False)
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype("string")
    allowed = (".parquet", ".pq", ".csv", ".jsonl", ".ndjson", ".json")
    if suffix not in allowed:
        raise UsageError(f"unsupported results format {suffix!r} for {p}: the suffix must be .parquet, .csv or "
                         ".jsonl (or .pq, .ndjson, .json)", argument="path", allowed=allowed, got=str(p))
    with atomic_path(p) as tmp:
        if suffix in (".parquet", ".pq"):
            table = _required_where_full(pa.Table.from_pandas(out, preserve_index=False))
            pq.write_table(table, tmp, row_group_size=max(table.num_rows, 1),
                           dictionary_pagesize_limit=_DICTIONARY_PAGE_BYTES)
        elif suffix == ".csv":
            out.to_csv(tmp, index=False, encoding="utf-8")
        else:
            out.to_json(tmp, orient="records", lines=True, force_ascii=False)
    return p


def _required_where_full(table: pa.Table) -> pa.Table:
    """``table`` with each column that holds no null marked not nullable, so Parquet stores it as
    ``required``: no definition level per value, which a reader would otherwise decode and turn into a
    validity bitmap (scoring reads three such columns of every row). Columns with a null stay
    ``optional``; the values and the pandas metadata are unchanged."""
    fields = [f.with_nullable(col.null_count > 0 or pa.types.is_null(f.type))   # a column of no type: nullable
              for f, col in zip(table.schema, table.columns, strict=True)]
    return pa.Table.from_arrays(table.columns, schema=pa.schema(fields, metadata=table.schema.metadata))


def read_trec_run(path: str | Path, *, stage: str | None = None, repeat: int = 1) -> pd.DataFrame:
    """Read a TREC run file (``qid Q0 chunk_id rank score tag``).

    The file's rank column is taken as the returned order. ``stage`` defaults to the
    run tag. Every malformed line is reported with its number (a rank must be an integer
    from 1 to 2^63 - 1); a file that cannot be read (a folder, not UTF-8) is a
    :class:`ResultsError` naming it.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"results file not found: {p}")
    if not p.is_file():
        raise ResultsError(p, "is not a file (a folder?)")
    with reading(p, ResultsError):
        text = p.read_bytes().decode("utf-8-sig", errors="strict")
    problems: list[Problem] = []
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            problems.append(Problem(str(p), lineno, None,
                                    f"expected 6 fields 'qid Q0 chunk_id rank score tag', got {len(parts)}"))
            continue
        qid, _, cid, rank, score, tag = parts
        try:
            r = int(rank)
        except ValueError:
            problems.append(Problem(str(p), lineno, "rank", f"must be an integer, got {rank!r}"))
            continue
        if not 1 <= r < 2**63:
            problems.append(Problem(str(p), lineno, "rank",
                                    ("must be >= 1 (ranks are 1-based)" if r < 1 else "must be an integer below 2^63")
                                    + f", got {rank!r}"))
            continue
        try:
            s = float(score)
        except ValueError:
            problems.append(Problem(str(p), lineno, "score", f"must be a number, got {score!r}"))
            continue
        rows.append((qid, stage or tag, repeat, r, cid, s))
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise ResultsError(p, problems)
    df = pd.DataFrame(rows, columns=list(REQUIRED_COLUMNS))
    df["status"] = "ok"
    df = _coerce(df, str(p), problems)
    validate_results(df, str(p), problems=problems)
    return df


def write_trec_run(df: pd.DataFrame, path: str | Path, *, stage: str | None = None, repeat: int | None = None,
                   tag: str | None = None, score_mode: str = "order") -> int:
    """Write one stage and repeat as a TREC run; returns the number of lines written.

    ``score_mode="order"`` (default) writes ``score = n - rank + 1`` so that tools that
    re-sort by score (trec_eval) keep the returned order; ``"original"`` writes the
    system's scores. Failed requests cannot be expressed in TREC format and are
    skipped with a warning; deduplicate first if the tool needs unique ids.
    """
    if score_mode not in ("order", "original"):
        raise UsageError(argument="score_mode", allowed=["'order'", "'original'"], got=score_mode)
    stages = df["stage"].astype("string").unique().tolist()
    stage = stage or (stages[0] if len(stages) == 1 else None)
    if stage is None:
        raise UsageError(f"the results hold several stages ({', '.join(map(str, stages))}); pass stage= one of them",
                         argument="stage", allowed=stages, got=None)
    sub = df[df["stage"].astype("string") == stage]
    repeats = sorted(sub["repeat"].dropna().unique().tolist())
    repeat = repeat if repeat is not None else (repeats[0] if repeats else 1)
    sub = sub[sub["repeat"] == repeat]
    status = sub["status"].astype("string").fillna("ok")
    failed = sub.loc[status != "ok", "query_id"].astype("string").unique()
    if len(failed):
        log.warning("write_trec_run: %d failed request(s) skipped (not expressible in TREC format)", len(failed))
    sub = sub[(status == "ok") & sub["chunk_id"].notna()].sort_values(["query_id", "rank"], kind="stable")
    n = len(sub)
    qid = sub["query_id"].astype("string").to_numpy()
    cid = sub["chunk_id"].astype("string").to_numpy()
    rank = sub["rank"].to_numpy(dtype=np.int64)
    if score_mode == "order":
        score = (rank.max() + 1 - rank).astype(np.float64) if n else rank.astype(np.float64)
    else:
        score = sub["score"].to_numpy(dtype=np.float64)
    name = tag or stage
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(f"{qid[i]} Q0 {cid[i]} {rank[i]} {score[i]:.6f} {name}\n")
    return n
