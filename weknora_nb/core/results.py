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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from weknora_nb.core.errors import Problem, ResultsError, UsageError, reading
from weknora_nb.core.files import atomic_path

__all__ = ["REQUIRED_COLUMNS", "OPTIONAL_COLUMNS", "read_results", "write_results",
           "read_trec_run", "write_trec_run", "validate_results", "expand_sub_chunks", "ResultCodes",
           "read_results_for_scoring"]

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
#: rows of a Parquet file read (and turned into codes) at a time for scoring
_BATCH_ROWS = 1 << 20


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
    _check_sub_chunk_ids(df, path, problems, first_row)
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


def _value_at(column: pd.Series) -> Callable[[int], str]:
    """What a problem shows for row position ``r`` of ``column``: its value, repr'd as Python's
    (``1e+20``, ``[1, 2]``, not ``np.float64(1e+20)``, ``array([1, 2])``)."""
    def shown(r: int) -> str:
        v = column.iloc[r]
        v = v.tolist() if isinstance(v, np.ndarray) else v.item() if isinstance(v, np.generic) else v
        text = repr(v)
        return text if len(text) <= 80 else text[:77] + "..."
    return shown


def _report(problems: list[Problem], path: str, rows, field: str, message: str, first_row: int,
            got: Callable[[int], str] | None = None) -> None:
    """One :class:`Problem` per 0-based row position (up to :data:`MAX_PROBLEMS` in all);
    ``got(r)`` shows the offending value."""
    positions = np.asarray(rows)
    for r in positions[: max(0, MAX_PROBLEMS - len(problems))]:
        shown = f", got {got(int(r))}" if got is not None else ""
        where = "line" if first_row > 1 else "row"
        problems.append(Problem(path, int(r) + first_row, field, message + shown, where))


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


@dataclass
class ResultCodes:
    """The columns scoring needs, one entry per results row, strings as integer codes.

    ``query``, ``stage``, ``chunk`` and ``status`` are codes into ``queries``,
    ``stages``, ``chunks`` and ``statuses`` (object arrays of str); -1 marks an empty
    value (missing, or only whitespace). ``rank`` and ``repeat`` are integers, 0 where the
    matching ``*_na`` mask (None when nothing is missing) is True. A column holding one
    value throughout may be a read-only broadcast view (no memory per row). ``unfolded``: the number of
    absorbed chunks placed after their results when the codes were made from a table with merged
    results unfolded (:func:`weknora_nb.core.scoring.result_codes`), else None.
    """

    query: np.ndarray
    queries: np.ndarray
    stage: np.ndarray
    stages: np.ndarray
    repeat: np.ndarray
    rank: np.ndarray
    chunk: np.ndarray
    chunks: np.ndarray
    status: np.ndarray
    statuses: np.ndarray
    repeat_na: np.ndarray | None = None
    rank_na: np.ndarray | None = None
    latency_ms: np.ndarray | None = None
    unfolded: int | None = None

    def __len__(self) -> int:
        return len(self.query)

    def take(self, idx: np.ndarray) -> ResultCodes:
        """The rows at positions ``idx``, in that order."""
        def t(a):
            return None if a is None else a[idx]
        return ResultCodes(self.query[idx], self.queries, self.stage[idx], self.stages, self.repeat[idx],
                           self.rank[idx], self.chunk[idx], self.chunks, self.status[idx], self.statuses,
                           t(self.repeat_na), t(self.rank_na), t(self.latency_ms), self.unfolded)

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> ResultCodes:
        """From a results table as :func:`read_results` returns it."""
        if "status" in df.columns:
            st, sts = _frame_codes(df["status"])
        else:
            st, sts = np.zeros(len(df), np.int8), np.array(["ok"], dtype=object)
        rep, rep_na = _frame_ints(df["repeat"])
        rank, rank_na = _frame_ints(df["rank"])
        lat = df["latency_ms"].to_numpy(dtype=np.float64, na_value=np.nan) if "latency_ms" in df.columns else None
        return cls(*_frame_codes(df["query_id"]), *_frame_codes(df["stage"]), rep, rank, *_frame_codes(df["chunk_id"]),
                   st, sts, rep_na, rank_na, lat)

    @classmethod
    def from_arrow(cls, table: pa.Table, constant: dict | None = None) -> ResultCodes | None:
        """From a pyarrow Table without going through pandas; None when a column's type
        needs the coercion (and its messages) of :func:`read_results`. ``constant`` gives
        columns left out of ``table`` that hold one value throughout."""
        return cls.from_batches(table.schema, table.to_batches(), table.num_rows, constant)

    @classmethod
    def from_batches(cls, schema: pa.Schema, batches: Iterable[pa.RecordBatch], n: int,
                     constant: dict | None = None) -> ResultCodes | None:
        """:meth:`from_arrow` of a table given as ``n`` rows of record batches (of ``schema``), each turned
        into codes as it arrives: no table of the whole file is held, and the memory one batch used is
        the next one's."""
        const = constant or {}
        names = set(schema.names) | set(const)
        if any(c not in names for c in ("query_id", "stage", "repeat", "rank", "chunk_id")):
            return None
        if len(set(schema.names)) != len(schema.names) or not _fast_types(schema):
            return None
        texts = {c: _TextCodes(n) for c in ("query_id", "stage", "chunk_id", "status")
                 if c in schema.names and c not in const}
        ints = {c: _IntValues(n) for c in ("repeat", "rank") if c not in const}
        lat = np.empty(n) if "latency_ms" in schema.names else None
        at = 0
        for batch in batches:
            k = batch.num_rows
            for name, text in texts.items():
                text.add(batch.column(name), at)
            for name, column in ints.items():
                column.add(batch.column(name), at)
            if lat is not None:
                lat[at:at + k] = batch.column("latency_ms").cast(pa.float64()).to_numpy(zero_copy_only=False)
            at += k

        def codes(name: str) -> tuple[np.ndarray, np.ndarray]:
            if name in const:
                return _blank_as_missing(np.broadcast_to(np.int8(0), (n,)), np.array([const[name]], dtype=object))
            if name not in texts:  # no status column: every request succeeded
                return np.broadcast_to(np.int8(0), (n,)), np.array(["ok"], dtype=object)
            return texts[name].finish()

        def values(name: str) -> tuple[np.ndarray, np.ndarray | None]:
            if name in const:
                return np.broadcast_to(np.int64(const[name]), (n,)), None
            return ints[name].finish()

        (rep, rep_na), (rank, rank_na) = values("repeat"), values("rank")
        return cls(*codes("query_id"), *codes("stage"), rep, rank, *codes("chunk_id"), *codes("status"),
                   rep_na, rank_na, lat)

    def check(self, path: str, *, first_row: int = 1, problems: list[Problem] | None = None) -> list[Problem]:
        """Append a :class:`Problem` per bad row (row or line, and field named) to ``problems``
        and return it. Whole-column reductions first: masks are built only for what is wrong."""
        problems = problems if problems is not None else []

        def report(mask: np.ndarray, field: str, message: str, values: np.ndarray | None = None,
                   na: np.ndarray | None = None) -> None:
            got = None if values is None else (
                lambda r: "<NA>" if na is not None and na[r] else repr(int(values[r])))
            _report(problems, path, np.flatnonzero(mask), field, message, first_row, got)

        def low(a: np.ndarray, bound: int) -> bool:  # any value below bound? (a reduction, no mask)
            return bool(len(a)) and extremes(a)[0] < bound

        if low(self.query, 0):
            report(self.query < 0, "query_id", "must not be empty")
        if low(self.stage, 0):
            report(self.stage < 0, "stage", "must not be empty")
        if low(self.status, 0):
            report(self.status < 0, "status", "must not be empty (use 'ok')")
        if self.repeat_na is not None or low(self.repeat, 1):
            bad_rep = self.repeat < 1
            report(bad_rep if self.repeat_na is None else bad_rep | self.repeat_na, "repeat",
                   "must be an integer >= 1", self.repeat, self.repeat_na)
        ok_code = np.flatnonzero(self.statuses == "ok")
        ok_c = int(ok_code[0]) if len(ok_code) else -2
        all_ok = not len(self) or extremes(self.status) == (ok_c, ok_c)
        all_chunks = not low(self.chunk, 0)
        if all_ok and all_chunks and self.rank_na is None:
            if low(self.rank, 1):
                report(self.rank < 1, "rank", "must be >= 1 (ranks are 1-based)", self.rank)
            return problems  # the usual case: nothing else can be wrong
        ok = self.status == ok_c
        has_chunk = self.chunk >= 0
        if self.rank_na is not None:
            report(has_chunk & self.rank_na, "rank", "is empty for a returned chunk")
            given = ~self.rank_na
            report(given & (self.rank < 1), "rank", "must be >= 1 (ranks are 1-based)", self.rank)
        else:
            given = None
            report(self.rank < 1, "rank", "must be >= 1 (ranks are 1-based)", self.rank)
        report(~ok & has_chunk, "chunk_id", "a failed request (status other than 'ok') must carry no chunk")
        empty = ok & ~has_chunk
        report(empty if given is None else empty & given, "chunk_id",
               "is empty but a rank is given (an empty result is one row with no rank and no chunk)")
        return problems


def extremes(a: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty integer array; of a broadcast view (one value throughout) without a pass."""
    if a.ndim == 1 and a.strides[0] == 0:
        return int(a[0]), int(a[0])
    return int(a.min()), int(a.max())


def _blank_as_missing(codes: np.ndarray, values: np.ndarray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Codes with -1 for values that are empty or only whitespace, and the values as an object array."""
    arr = values if isinstance(values, pa.Array) else pa.array(values, type=pa.string())
    if pa.types.is_dictionary(arr.type) or not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    blank = pc.equal(pc.utf8_trim_whitespace(arr), "").fill_null(True).to_numpy(zero_copy_only=False)
    if blank.any():
        lut = np.append(np.where(blank, -1, np.arange(len(blank))), -1)  # the last slot serves code -1
        codes = lut[codes]
    return codes, np.asarray(arr.to_numpy(zero_copy_only=False), dtype=object)


def _frame_codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(s.dtype, pd.CategoricalDtype):
        codes, uniques = s.cat.codes.to_numpy(), s.cat.categories
    else:
        codes, uniques = pd.factorize(s, use_na_sentinel=True)
    return _blank_as_missing(codes, np.asarray(pd.Index(uniques).astype(str), dtype=object))


def _frame_ints(s: pd.Series) -> tuple[np.ndarray, np.ndarray | None]:
    if s.dtype == np.int64:
        return s.to_numpy(), None
    na = s.isna().to_numpy(dtype=bool)
    values = s.to_numpy(dtype=np.float64, na_value=0).astype(np.int64)
    return values, (na if na.any() else None)


def _arrow_int64(t: pa.DataType) -> bool:
    """Whether every value of Arrow type ``t`` is an int64 (signed integers, unsigned up to 32 bits)."""
    return pa.types.is_signed_integer(t) or (pa.types.is_unsigned_integer(t) and t.bit_width <= 32)


def _fast_types(schema: pa.Schema) -> bool:
    """Whether every results column of ``schema`` has a type the fast path takes as it is (text as
    text, integers that fit int64, numbers as numbers); any other needs :func:`read_results`'s
    conversion and its messages."""
    for f in schema:
        if f.name in _STRINGS and not _arrow_is_text(f.type):
            return False
        if f.name in _INTS and not _arrow_int64(f.type):
            return False
        if f.name in _FLOATS and not (pa.types.is_floating(f.type) or _arrow_int64(f.type)):
            return False
    return True


def _arrow_is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)


class _TextCodes:
    """Codes (-1 for null or blank) and distinct values of a string or dictionary column, fed a piece at a
    time (:meth:`add`).

    A Parquet file holds one dictionary per row group: each piece's indices into its dictionary are kept
    as they are, and :meth:`finish` merges the dictionaries met (one hash pass over their values) and
    translates each piece's indices through a lookup table, in place.
    """

    def __init__(self, n: int):
        self.codes = np.empty(n, np.int32)
        self._dicts: list[pa.Array] = []                 # the distinct dictionaries met, in order
        self._ids: dict[tuple[int, int], int] = {}       # which dictionary -> its position in _dicts
        self._seen: list[pa.Array] = []                  # every dictionary met, kept alive: no later one
                                                         # takes its address (the key above)
        self._pieces: list[tuple[int, int, int]] = []    # (first row, end row, dictionary) of each piece
        self.nulls = False

    def add(self, arr: pa.Array, at: int) -> None:
        """The rows ``at`` .. ``at + len(arr)``."""
        out = self.codes[at:at + len(arr)]
        if pa.types.is_null(arr.type):
            out[:] = -1
            self.nulls = self.nulls or len(arr) > 0
            return
        if not pa.types.is_dictionary(arr.type):
            arr = pc.dictionary_encode(arr)
        indices = arr.indices
        if indices.null_count:
            self.nulls = True
            indices = pc.fill_null(indices, -1)   # the last slot of every lookup table serves null
        out[:] = indices.to_numpy()
        self._pieces.append((at, at + len(arr), self._dictionary(arr.dictionary)))

    def _dictionary(self, d: pa.Array) -> int:
        key = (d.buffers()[1].address, len(d))   # the pieces of one row group share their dictionary
        if key not in self._ids:
            self._seen.append(d)
            last = self._dicts[-1] if self._dicts else None
            if last is None or last.type != d.type or not last.equals(d):   # not the last one's values again
                self._dicts.append(d)
            self._ids[key] = len(self._dicts) - 1
        return self._ids[key]

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes, values as an object array of str); one value throughout: a read-only broadcast view."""
        if not self._dicts:   # no row, or nulls only
            return np.full(len(self.codes), -1, np.int32), np.zeros(0, dtype=object)
        if len(self._dicts) == 1:
            values = self._dicts[0].cast(pa.string())
        else:
            merged = pc.dictionary_encode(pa.concat_arrays([d.cast(pa.string()) for d in self._dicts]))
            values, all_codes = merged.dictionary, merged.indices.to_numpy().astype(np.int32)
            starts = np.cumsum([0] + [len(d) for d in self._dicts])
            luts = [np.append(all_codes[a:b], np.int32(-1)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
            for lo, hi, k in self._pieces:
                piece = self.codes[lo:hi]
                np.take(luts[k], piece, out=piece)   # mode "raise": buffered, so reading and writing one array
        if len(values) == 1 and not self.nulls:   # one value throughout (a stage, "ok"): no array needed
            return _blank_as_missing(np.broadcast_to(np.int8(0), (len(self.codes),)), values)
        return _blank_as_missing(self.codes, values)


class _IntValues:
    """An integer column fed a piece at a time: its values (0 where null; int32 when they fit, a read-only
    view when constant) and its null mask."""

    def __init__(self, n: int):
        self.values = np.empty(n, np.int32)
        self.na: np.ndarray | None = None
        self.lo: int | None = None
        self.hi: int | None = None

    def add(self, arr: pa.Array, at: int) -> None:
        if arr.null_count:
            if self.na is None:
                self.na = np.zeros(len(self.values), bool)
            self.na[at:at + len(arr)] = arr.is_null().to_numpy(zero_copy_only=False)
            arr = pc.fill_null(arr, 0)
        lo_hi = pc.min_max(arr).as_py()
        lo, hi = (lo_hi["min"] or 0), (lo_hi["max"] or 0)
        self.lo = lo if self.lo is None else min(lo, self.lo)
        self.hi = hi if self.hi is None else max(hi, self.hi)
        if self.values.dtype == np.int32 and not (self.lo >= -(1 << 31) and self.hi < (1 << 31)):
            self.values = self.values.astype(np.int64)
        self.values[at:at + len(arr)] = arr.to_numpy(zero_copy_only=False)

    def finish(self) -> tuple[np.ndarray, np.ndarray | None]:
        if len(self.values) and self.lo == self.hi:
            return np.broadcast_to(np.int64(self.lo or 0), (len(self.values),)), self.na
        return self.values, self.na


def _constant_column(meta: pq.FileMetaData, name: str) -> str | int | None:
    """The single value of column ``name`` when the file's statistics show it holds one value
    and no null in every row group (string values under 64 bytes, never truncated), else None."""
    leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if leaves.count(name) != 1:
        return None
    index = leaves.index(name)
    value = None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(index).statistics
        if st is None or not st.has_min_max or not st.has_null_count or st.null_count or st.min != st.max:
            return None
        if value is not None and st.min != value:
            return None
        value = st.min
    if isinstance(value, bytes) or (isinstance(value, str) and len(value.encode()) >= 64):
        return None
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def read_results_for_scoring(path: str | Path) -> pd.DataFrame | ResultCodes:
    """What :func:`weknora_nb.score` reads when given a path.

    A Parquet file whose columns have the results-table types is read straight into
    :class:`ResultCodes` (only the columns scoring needs, no pandas conversion) and its
    rows are checked as :func:`read_results` would; any other file, one with a column of
    another type, or one with merged results to unfold (``sub_chunk_ids``), goes through
    :func:`read_results`. A file that cannot be read is a :class:`ResultsError` naming it.
    """
    p = Path(path)
    if p.suffix.lower() not in (".parquet", ".pq") or not p.is_file():
        return read_results(p)
    with reading(p, ResultsError):
        codes = _parquet_codes(p)
    if codes is None:
        return read_results(p)
    problems = codes.check(str(p))
    if problems:
        raise ResultsError(p, problems)
    return codes


def _parquet_codes(p: Path) -> ResultCodes | None:
    """The fast path's read of a Parquet file: its scoring columns as codes, or None when the file
    needs :func:`read_results` (a column given twice or of another type, merged results to unfold)."""
    meta = pq.read_metadata(p)
    schema = meta.schema.to_arrow_schema()
    names = schema.names
    if len(set(names)) != len(names) or not _fast_types(schema):
        return None
    if "sub_chunk_ids" in names:
        subs = pq.read_table(p, columns=["sub_chunk_ids"]).column("sub_chunk_ids")
        if pa.types.is_string(subs.type) or pa.types.is_large_string(subs.type):
            given = pc.utf8_trim_whitespace(pc.fill_null(subs, ""))
            if pc.any(pc.invert(pc.is_in(given, pa.array(["", "[]"])))).as_py():
                return None
    constant = {c: v for c, kind in (("stage", str), ("repeat", int), ("status", str)) if c in names
                for v in [_constant_column(meta, c)] if isinstance(v, kind)}
    wanted = [c for c in ("query_id", "stage", "repeat", "rank", "chunk_id", "status", "latency_ms")
              if c in names and c not in constant]
    with pq.ParquetFile(p, read_dictionary=[c for c in _CATEGORIES if c in wanted]) as pf:
        schema = pa.schema([pf.schema_arrow.field(c) for c in wanted])
        batches = pf.iter_batches(batch_size=_BATCH_ROWS, columns=wanted)
        return ResultCodes.from_batches(schema, batches, meta.num_rows, constant)


def write_results(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a results table atomically (temp file + rename) as Parquet, CSV or JSONL."""
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


def expand_sub_chunks(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Unfold merged results: each absorbed chunk id (``sub_chunk_ids``, a JSON list) is placed
    right after its result, and ranks are renumbered 1..n within each request.

    WeKnora's merge step folds neighbouring chunks into one result whose content the user
    (and the LLM) sees; unfolding credits those chunks at the positions they occupy.
    Returns the new table and the number of chunks unfolded.

    An absorbed chunk's row is its result's row with its own ``chunk_id`` and no ``chunk_index``,
    ``knowledge_id``, ``score``, ``base_score``, ``model_score`` or ``match_type``. Rows come out sorted by
    (query_id, stage, repeat, rank, position after the result), missing values last, ties in their first
    order; categorical columns come out as strings; ``rank`` counts, per (query_id, stage, repeat), the rows
    with a chunk (rows without one, or with a key missing, get none).
    """
    if "sub_chunk_ids" not in df.columns or not df["sub_chunk_ids"].notna().any():
        return df, 0
    subs = df["sub_chunk_ids"].astype("string")
    blank = subs.str.strip()
    has = (subs.notna() & (blank != "") & (blank != "[]")).to_numpy(dtype=bool)
    if not has.any():
        return df, 0
    lists, bad = _sub_chunk_lists(subs[has])
    if len(bad):
        problems: list[Problem] = []
        _report(problems, "<results>", np.flatnonzero(has)[bad], "sub_chunk_ids", _SUB_CHUNKS_FORMAT, 1,
                _value_at(subs))
        raise ResultsError("<results>", problems)
    absorbed = [[str(x) for x in ids if x is not None] for ids in lists]
    counts = np.zeros(len(df), np.int64)
    counts[has] = [len(ids) for ids in absorbed]
    parent = np.repeat(np.arange(len(df)), 1 + counts)       # each row, then a row per absorbed chunk
    first = np.repeat(np.cumsum(1 + counts) - 1 - counts, 1 + counts)
    sub = np.arange(len(parent)) - first                       # 0: the result itself
    base = df.reset_index(drop=True)
    keys = [_sort_codes(base[c]) for c in ("query_id", "stage", "repeat", "rank")]
    ids = np.empty(len(parent), dtype=object)
    ids[sub > 0] = [c for chunk_ids in absorbed for c in chunk_ids]  # laid out as the rows are, before sorting
    order = np.lexsort((np.arange(len(parent)), sub, *(k[parent] for k in reversed(keys))))
    rows, extra, ids = parent[order], sub[order] > 0, ids[order]
    out = pd.DataFrame({c: _unfolded(base[c], rows, extra, c, ids) for c in base.columns})
    out["rank"] = _renumbered(out, keys, rows)
    return out, int(counts.sum())


#: the columns an absorbed chunk's row leaves empty (its result's own facts)
_RESULT_ONLY = ("chunk_index", "knowledge_id", "score", "base_score", "model_score", "match_type")


def _sort_codes(col: pd.Series) -> np.ndarray:
    """Integer sort keys of ``col`` in the order pandas sorts it (strings by value, also when categorical;
    missing values last)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        col = col.astype("string")
    codes, _ = pd.factorize(col, sort=True)
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes < 0, codes.max(initial=-1) + 1, codes)


def _unfolded(col: pd.Series, rows: np.ndarray, extra: np.ndarray, name: str, ids: np.ndarray) -> Any:
    """Column ``name`` of the unfolded table: ``col`` at ``rows``; on the absorbed chunks' rows (``extra``) the
    chunk id ``ids`` for ``chunk_id``, nothing for :data:`_RESULT_ONLY`. Categorical columns become strings."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        taken = _category_strings(col, rows)
    else:
        taken = col.take(rows).reset_index(drop=True)
    if name == "chunk_id":
        values = taken.to_numpy(dtype=object, copy=True)
        values[extra] = ids[extra]
        return pd.Series(values, dtype=taken.dtype)
    if name in _RESULT_ONLY and extra.any():
        return taken.where(~extra, None) if taken.dtype == object else taken.mask(extra)
    return taken


def _category_strings(col: pd.Series, rows: np.ndarray) -> pd.Series:
    """``col.astype("string")`` at ``rows`` for a categorical ``col``, each category converted once (Arrow)."""
    codes = col.cat.codes.to_numpy()[rows]
    categories = pa.array([str(c) for c in col.cat.categories], type=pa.large_string())
    decoded = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), categories).dictionary_decode()
    return pd.Series(pd.array(decoded, dtype=pd.StringDtype()))


def _renumbered(out: pd.DataFrame, keys: list[np.ndarray], rows: np.ndarray) -> Any:
    """Ranks 1..n over the rows with a chunk within each (query_id, stage, repeat) of the sorted table; <NA>
    for rows without a chunk or with one of the three missing."""
    counted = out["chunk_id"].notna().to_numpy(dtype=bool, copy=True)
    for c in ("query_id", "stage", "repeat"):
        counted &= out[c].notna().to_numpy(dtype=bool)
    at = np.flatnonzero(counted)
    q, s, r = (k[rows[at]] for k in keys[:3])
    new_group = np.ones(len(at), dtype=bool)
    new_group[1:] = (q[1:] != q[:-1]) | (s[1:] != s[:-1]) | (r[1:] != r[:-1])
    starts = np.flatnonzero(new_group)
    rank = np.arange(len(at)) - np.repeat(starts, np.diff(np.append(starts, len(at)))) + 1
    values = np.zeros(len(out), dtype=np.int64)
    values[at] = rank
    return pd.arrays.IntegerArray(values, ~counted)


_SUB_CHUNKS_FORMAT = 'must be a JSON list of chunk ids such as ["c1", "c2"]'


def _sub_chunk_lists(subs: pd.Series) -> tuple[list[list], np.ndarray]:
    """Each value of ``subs`` (text) parsed as a JSON list of chunk ids (strings or integers; nulls
    are skipped later), and the positions of the values that are not such a list. Each distinct text is
    parsed once (a request's repeats and stages carry the same lists)."""
    codes, texts = pd.factorize(subs)
    parsed = [_chunk_id_list(t) for t in texts]
    lists = [parsed[c] if parsed[c] is not None else [] for c in codes]
    bad = [i for i, c in enumerate(codes) if parsed[c] is None]
    return lists, np.asarray(bad, dtype=np.int64)


def _chunk_id_list(text: str) -> list | None:
    """``text`` as a JSON list of chunk ids (strings, integers, nulls), or None when it is not one."""
    try:
        ids = json.loads(text)
    except (ValueError, RecursionError):
        return None
    ok = isinstance(ids, list) and all(
        x is None or isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)) for x in ids)
    return ids if ok else None


def _check_sub_chunk_ids(df: pd.DataFrame, path: str, problems: list[Problem], first_row: int) -> None:
    """A problem per row whose ``sub_chunk_ids`` is given but not a JSON list of chunk ids; those become missing."""
    if "sub_chunk_ids" not in df.columns:
        return
    subs = df["sub_chunk_ids"]
    blank = subs.str.strip()
    has = (subs.notna() & (blank != "") & (blank != "[]")).to_numpy(dtype=bool)
    if not has.any():
        return
    _, bad = _sub_chunk_lists(subs[has])
    if len(bad):
        rows = np.flatnonzero(has)[bad]
        _report(problems, path, rows, "sub_chunk_ids", _SUB_CHUNKS_FORMAT, first_row, _value_at(subs))
        df["sub_chunk_ids"] = subs.mask(np.isin(np.arange(len(subs)), rows))
