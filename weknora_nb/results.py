"""The results table: the format every collector writes and every scorer reads.

One row per returned chunk::

    query_id  stage  repeat  rank  chunk_id  score   [knowledge_id chunk_index match_type
                                                      latency_ms status error]

- ``rank`` is 1-based and is the order the system returned the chunks in (never a
  re-sort by score, never WeKnora's ``seq``).
- ``repeat`` is 1-based (1..N repeats of the same request).
- ``status`` is ``"ok"`` (the default when the column is absent) or an error kind
  (``"timeout"``, ``"server"``, ...). A failed request is **one** row with that status,
  no chunk (``chunk_id`` and ``rank`` empty) and optionally an ``error`` message.
- A successful request that returned nothing is one row with status ``"ok"`` and no
  chunk: it scores 0, whereas a failed request is excluded and counted.

Files: Parquet, CSV and JSONL (:func:`read_results`, :func:`write_results`); TREC run
files (:func:`read_trec_run`, :func:`write_trec_run`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import Problem, ResultsError
from .files import atomic_path

__all__ = ["REQUIRED_COLUMNS", "OPTIONAL_COLUMNS", "read_results", "write_results",
           "read_trec_run", "write_trec_run", "validate_results", "expand_sub_chunks"]

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("query_id", "stage", "repeat", "rank", "chunk_id", "score")
OPTIONAL_COLUMNS = ("knowledge_id", "chunk_index", "match_type", "latency_ms", "status", "error",
                    "sub_chunk_ids", "base_score", "model_score")
_STRINGS = ("query_id", "stage", "chunk_id", "knowledge_id", "status", "error", "sub_chunk_ids")
_INTS = ("repeat", "rank", "chunk_index", "match_type")
_FLOATS = ("score", "latency_ms", "base_score", "model_score")
#: categorical on read: few distinct values, many rows
_CATEGORIES = ("query_id", "stage", "chunk_id", "status", "knowledge_id")
MAX_PROBLEMS = 200


def read_results(path: str | Path, *, validate: bool = True) -> pd.DataFrame:
    """Read a results table from ``.parquet``, ``.csv`` or ``.jsonl``.

    String columns with few distinct values come back as ``category``. ``status`` is
    filled with ``"ok"`` when absent. Raises :class:`ResultsError` naming the row and
    field of every problem (up to 200).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"results file not found: {p}")
    suffix = p.suffix.lower()
    if suffix in (".parquet", ".pq"):
        names = pq.read_schema(p).names
        table = pq.read_table(p, read_dictionary=[c for c in _CATEGORIES if c in names])
        df = table.to_pandas()
        first_row = 1
    elif suffix == ".csv":
        df = pd.read_csv(p, dtype={c: "string" for c in _STRINGS}, keep_default_na=False,
                         na_values={c: [""] for c in _INTS + _FLOATS + _STRINGS}, encoding="utf-8-sig")
        first_row = 2  # header on line 1: row r is on line r + 1
    elif suffix in (".jsonl", ".ndjson", ".json"):
        try:
            df = pd.read_json(p, lines=True, dtype={c: "string" for c in _STRINGS}, encoding="utf-8")
        except ValueError as exc:
            raise ResultsError(p, [Problem(str(p), None, None, f"not valid JSON lines: {exc}")]) from exc
        first_row = 1
    else:
        raise ResultsError(p, [Problem(str(p), None, None,
                                       f"unsupported results format {suffix!r}; expected .parquet, .csv or .jsonl "
                                       "(TREC run files: read_trec_run)")])
    problems: list[Problem] = []
    df = _coerce(df, str(p), problems, first_row=first_row)
    if validate:
        validate_results(df, str(p), first_row=first_row, problems=problems)
    elif problems:
        raise ResultsError(p, problems)
    return df


def _coerce(df: pd.DataFrame, path: str, problems: list[Problem], first_row: int = 1) -> pd.DataFrame:
    """Check required columns and bring every known column to its dtype."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        problems.append(Problem(path, None, None, f"missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}"))
        raise ResultsError(path, problems)
    df = df.copy(deep=False)
    if "status" not in df.columns:
        df["status"] = "ok"
    for c in _INTS:
        if c in df.columns and not pd.api.types.is_integer_dtype(df[c]):
            num = pd.to_numeric(df[c], errors="coerce")
            bad = (num.isna() & df[c].notna()) | (num.notna() & (num != np.floor(num.fillna(0))))
            _report(problems, path, df.index[bad.to_numpy()], c, "must be an integer", first_row, df[c])
            df[c] = num.where(~bad).astype("Int64")
    for c in _FLOATS:
        if c in df.columns and not pd.api.types.is_float_dtype(df[c]):
            num = pd.to_numeric(df[c], errors="coerce")
            bad = num.isna() & df[c].notna()
            _report(problems, path, df.index[bad.to_numpy()], c, "must be a number", first_row, df[c])
            df[c] = num.astype("float64")
    for c in _STRINGS:
        if c in df.columns and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("string")
    return df


def _report(problems: list[Problem], path: str, rows, field: str, message: str, first_row: int,
            values: pd.Series | None = None) -> None:
    positions = np.asarray(rows)
    for r in positions[: max(0, MAX_PROBLEMS - len(problems))]:
        shown = ""
        if values is not None:
            shown = f", got {values.iloc[int(r)]!r}"
        where = "line" if first_row > 1 else "row"
        problems.append(Problem(path, int(r) + first_row, field, message + shown, where))


def validate_results(df: pd.DataFrame, path: str = "<memory>", *, first_row: int = 1,
                     problems: list[Problem] | None = None) -> None:
    """Row-level checks (vectorised); raise :class:`ResultsError` listing every problem.

    Structural checks that need the rows grouped by request (a rank given twice, a
    request both failed and with chunks) run when scoring (see ``scoring.prepare``).
    """
    problems = problems if problems is not None else []
    df = df.reset_index(drop=True)

    def blank(c: str) -> np.ndarray:
        s = df[c]
        if isinstance(s.dtype, pd.CategoricalDtype):
            cats = s.cat.categories
            cats_blank = np.append((cats.astype("string").str.strip() == "").to_numpy(dtype=bool, na_value=True),
                                   True)
            codes = s.cat.codes.to_numpy()
            return cats_blank[np.where(codes < 0, len(cats_blank) - 1, codes)]
        return (s.isna() | (s.astype("string").str.strip() == "")).to_numpy(dtype=bool)

    for c in ("query_id", "stage"):
        _report(problems, path, np.flatnonzero(blank(c)), c, "must not be empty", first_row)
    _report(problems, path, np.flatnonzero(blank("status")), "status", "must not be empty (use 'ok')", first_row)
    rep = df["repeat"]
    _report(problems, path, np.flatnonzero((rep.isna() | (rep < 1)).to_numpy(dtype=bool, na_value=True)),
            "repeat", "must be an integer >= 1", first_row, rep)
    ok = (df["status"] == "ok").to_numpy(dtype=bool, na_value=False)
    has_chunk = ~blank("chunk_id")
    rank = df["rank"]
    rank_na = rank.isna().to_numpy(dtype=bool)
    _report(problems, path, np.flatnonzero(has_chunk & rank_na), "rank", "is empty for a returned chunk", first_row)
    low = (~rank_na) & (rank.fillna(1).to_numpy(dtype=np.int64) < 1)
    _report(problems, path, np.flatnonzero(low), "rank", "must be >= 1 (ranks are 1-based)", first_row, rank)
    _report(problems, path, np.flatnonzero(~ok & has_chunk), "chunk_id",
            "a failed request (status other than 'ok') must carry no chunk", first_row)
    _report(problems, path, np.flatnonzero(ok & ~has_chunk & ~rank_na), "chunk_id",
            "is empty but a rank is given (an empty result is one row with no rank and no chunk)", first_row)
    if problems:
        raise ResultsError(path, problems)


def write_results(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a results table atomically (temp file + rename) as Parquet, CSV or JSONL."""
    p = Path(path)
    suffix = p.suffix.lower()
    out = df.copy(deep=False)
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype("string")
    if suffix not in (".parquet", ".pq", ".csv", ".jsonl", ".ndjson", ".json"):
        raise ValueError(f"unsupported results format {suffix!r}; expected .parquet, .csv or .jsonl")
    with atomic_path(p) as tmp:
        if suffix in (".parquet", ".pq"):
            table = pa.Table.from_pandas(out, preserve_index=False)
            pq.write_table(table, tmp)
        elif suffix == ".csv":
            out.to_csv(tmp, index=False, encoding="utf-8")
        else:
            out.to_json(tmp, orient="records", lines=True, force_ascii=False)
    return p


def read_trec_run(path: str | Path, *, stage: str | None = None, repeat: int = 1) -> pd.DataFrame:
    """Read a TREC run file (``qid Q0 chunk_id rank score tag``).

    The file's rank column is taken as the returned order. ``stage`` defaults to the
    run tag. Every malformed line is reported with its number.
    """
    p = Path(path)
    problems: list[Problem] = []
    rows = []
    text = p.read_bytes().decode("utf-8-sig", errors="strict")
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
        raise ValueError(f"score_mode must be 'order' or 'original'. Got {score_mode!r} instead.")
    stages = df["stage"].astype("string").unique().tolist()
    stage = stage or (stages[0] if len(stages) == 1 else None)
    if stage is None:
        raise ValueError(f"the results hold several stages {stages}; pass stage=")
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


def expand_sub_chunks(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Unfold merged results: each absorbed chunk id (``sub_chunk_ids``, a JSON list) is placed
    right after its result, and ranks are renumbered 1..n within each request.

    WeKnora's merge step folds neighbouring chunks into one result whose content the user
    (and the LLM) sees; unfolding credits those chunks at the positions they occupy.
    Returns the new table and the number of chunks unfolded.
    """
    if "sub_chunk_ids" not in df.columns or not df["sub_chunk_ids"].notna().any():
        return df, 0
    import json

    subs = df["sub_chunk_ids"].astype("string")
    has = subs.notna() & (subs != "") & (subs != "[]")
    if not has.any():
        return df, 0
    base = df.copy()
    for c in base.columns:
        if isinstance(base[c].dtype, pd.CategoricalDtype):
            base[c] = base[c].astype("string")
    base["_sub"] = 0
    extra = base[has.to_numpy()].copy()
    extra["_ids"] = [json.loads(x) for x in subs[has]]
    extra = extra.explode("_ids")
    extra = extra[extra["_ids"].notna()]
    n = len(extra)
    extra["chunk_id"] = extra["_ids"].astype("string")
    extra["_sub"] = extra.groupby(level=0).cumcount() + 1
    for c in ("chunk_index", "knowledge_id", "score", "base_score", "model_score", "match_type"):
        if c in extra.columns:
            extra[c] = None
    extra = extra.drop(columns="_ids")
    out = pd.concat([base, extra.astype(base.dtypes.to_dict())], ignore_index=True)
    out = out.sort_values(["query_id", "stage", "repeat", "rank", "_sub"], kind="stable", na_position="last")
    has_chunk = out["chunk_id"].notna()
    keys = [out["query_id"], out["stage"], out["repeat"]]
    new_rank = out[has_chunk].groupby(keys, sort=False, observed=True).cumcount() + 1
    out["rank"] = pd.array(pd.Series(pd.NA, index=out.index, dtype="Int64").mask(has_chunk, new_rank), dtype="Int64")
    return out.drop(columns="_sub").reset_index(drop=True), n
