"""Results rows as integer codes (:class:`ResultCodes`): what scoring reads, without pandas.

A Parquet results file whose columns have the results-table types is read straight into
codes (:func:`parquet_codes`), a record batch at a time, and its rows are checked as
:func:`weknora_nb.core.results.read_results` checks them. Nothing here needs pandas.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from weknora_nb.core.errors import Problem, ResultsError, reading

if TYPE_CHECKING:
    import os

    import pandas as pd


_STRINGS = ("query_id", "stage", "chunk_id", "knowledge_id", "status", "error", "sub_chunk_ids", "parent_chunk_id",
            "shown_chunk_ids", "flags")
#: the results columns that hold a JSON list of chunk ids (:mod:`weknora_nb.core.unfold`)
ID_LIST_COLUMNS = ("sub_chunk_ids", "shown_chunk_ids")
_INTS = ("repeat", "rank", "chunk_index", "match_type")
_FLOATS = ("score", "latency_ms", "base_score", "model_score")
#: categorical on read: few distinct values, many rows
_CATEGORIES = ("query_id", "stage", "chunk_id", "status", "knowledge_id")
MAX_PROBLEMS = 200
#: rows of a Parquet file read (and turned into codes) at a time for scoring
_BATCH_ROWS = 1 << 20


def _report(problems: list[Problem], path: str, rows, field: str, message: str, first_row: int,
            got: Callable[[int], str] | None = None) -> None:
    """One :class:`Problem` per 0-based row position (up to :data:`MAX_PROBLEMS` in all);
    ``got(r)`` shows the offending value."""
    positions = np.asarray(rows)
    for r in positions[: max(0, MAX_PROBLEMS - len(problems))]:
        shown = f", got {got(int(r))}" if got is not None else ""
        where = "line" if first_row > 1 else "row"
        problems.append(Problem(path, int(r) + first_row, field, message + shown, where))


def _value_at(column: pd.Series) -> Callable[[int], str]:
    """What a problem shows for row position ``r`` of ``column``: its value, repr'd as Python's
    (``1e+20``, ``[1, 2]``, not ``np.float64(1e+20)``, ``array([1, 2])``)."""
    def shown(r: int) -> str:
        v = column.iloc[r]
        v = v.tolist() if isinstance(v, np.ndarray) else v.item() if isinstance(v, np.generic) else v
        text = repr(v)
        return text if len(text) <= 80 else text[:77] + "..."
    return shown



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
                lat[at:at + k] = _numbers(batch.column("latency_ms").cast(pa.float64()), fill=np.nan)
            at += k

        def codes(name: str) -> tuple[np.ndarray, np.ndarray]:
            if name in const:
                return _blank_as_missing(np.broadcast_to(np.int8(0), (n,)), _strings([const[name]]))
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

        def low(a: np.ndarray, bound: int) -> bool:  # any value below bound? (one reduction, no mask)
            return bool(len(a)) and least(a) < bound

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


def least(a: np.ndarray) -> int:
    """The minimum of a non-empty integer array (one reduction); of a broadcast view (one value throughout)
    without a pass."""
    return int(a[0]) if a.ndim == 1 and a.strides[0] == 0 else int(a.min())


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
    length = pc.utf8_length(pc.utf8_trim_whitespace(arr))   # a null (no length) is blank too
    blank = _numbers(length) == 0 if not length.null_count else pc.fill_null(length, 0).to_numpy() == 0
    if blank.any():
        lut = np.append(np.where(blank, -1, np.arange(len(blank))), -1)  # the last slot serves code -1
        codes = lut[codes]
    if "pandas" in sys.modules:   # pyarrow's conversion (the faster one) imports pandas: only once it is there
        return codes, arr.to_numpy(zero_copy_only=False)
    text = np.empty(len(arr), dtype=object)
    text[:] = arr.to_pylist()   # see _numbers
    return codes, text


def _frame_codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd  # a table's codes: pandas is there already

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


def _numbers(arr: pa.Array, fill: float = 0) -> np.ndarray:
    """The values of an Arrow array of integers or floats as a numpy array (``fill`` where null): without a
    null, a view of its buffer (not to be written to). pyarrow's ``to_numpy`` (and ``fill_null``, ``pa.array``,
    ``pa.scalar``) import pandas first. Other types take
    pyarrow's conversion."""
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return arr.to_numpy(zero_copy_only=False)
    dtype = np.dtype(arr.type.to_pandas_dtype())
    values = np.frombuffer(arr.buffers()[1], dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    return np.where(_valid(arr), values, np.array(fill, dtype)) if arr.null_count else values


def _valid(arr: pa.Array) -> np.ndarray:
    """Which values of ``arr`` are not null (bool), read from its validity bitmap (see :func:`_numbers`)."""
    bitmap = arr.buffers()[0]
    if bitmap is None or not arr.null_count:
        return np.ones(len(arr), bool)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), count=arr.offset + len(arr), bitorder="little")
    return bits[arr.offset:].astype(bool)


def _strings(values: list[str]) -> pa.Array:
    """Python strings as an Arrow string array, built from its buffers: ``pa.array`` would import pandas
    first (see :func:`_numbers`)."""
    data = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(data) + 1, np.int32)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


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

    A Parquet file holds one dictionary per row group. The pieces of the first dictionary met are written
    into the codes as they arrive (its values come first in the merged dictionary, so their indices are
    their codes); the indices of a piece of any other dictionary are kept as they are (a view of the
    piece's buffer) until :meth:`finish` merges the dictionaries met (one hash pass over their values) and
    translates each such piece through a lookup table straight into the codes: one pass over each row. A
    column that comes in one piece (a file of one row group) has its indices for codes: a view of the
    reader's buffer, no copy.
    """

    def __init__(self, n: int):
        self.codes = np.empty(n, np.int32)
        self._dicts: list[pa.Array] = []                 # the distinct dictionaries met, in order
        self._ids: dict[tuple[int, int], int] = {}       # which dictionary -> its position in _dicts
        self._seen: list[pa.Array] = []                  # every dictionary met, kept alive: no later one
                                                         # takes its address (the key above)
        self._later: list[tuple[int, np.ndarray, int]] = []   # (first row, indices, dictionary) of pieces
                                                              # of a dictionary other than the first
        self._first: list[tuple[int, int]] = []          # (first row, end row) of the first dictionary's pieces
        self.nulls = False

    def add(self, arr: pa.Array, at: int) -> None:
        """The rows ``at`` .. ``at + len(arr)``."""
        if pa.types.is_null(arr.type):
            self.codes[at:at + len(arr)] = -1
            self.nulls = self.nulls or len(arr) > 0
            return
        if not pa.types.is_dictionary(arr.type):
            arr = pc.dictionary_encode(arr)
        indices = arr.indices
        self.nulls = self.nulls or indices.null_count > 0
        values = _numbers(indices, fill=-1)   # the last slot of every lookup table serves null
        k = self._dictionary(arr.dictionary)
        if k == 0:
            if at == 0 and len(arr) == len(self.codes) and values.dtype == self.codes.dtype:
                self.codes = values   # the whole column in one piece: its indices are the codes (no copy)
            else:
                self.codes[at:at + len(arr)] = values
            self._first.append((at, at + len(arr)))
        else:
            self._later.append((at, values, k))

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
            values, all_codes = merged.dictionary, _numbers(merged.indices).astype(np.int32)
            starts = np.cumsum([0] + [len(d) for d in self._dicts])
            luts = [np.append(all_codes[a:b], np.int32(-1)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
            if not np.array_equal(luts[0][:-1], np.arange(starts[1])):   # the first dictionary repeats a value
                for lo, hi in self._first:
                    piece = self.codes[lo:hi]
                    np.take(luts[0], piece, out=piece)   # mode "raise": buffered, so reading and writing one array
            for lo, indices, k in self._later:   # "wrap": unbuffered, and -1 (null) takes the last slot
                np.take(luts[k], indices, out=self.codes[lo:lo + len(indices)], mode="wrap")
            self._later = []
        if len(values) == 1 and not self.nulls:   # one value throughout (a stage, "ok"): no array needed
            return _blank_as_missing(np.broadcast_to(np.int8(0), (len(self.codes),)), values)
        return _blank_as_missing(self.codes, values)


class _IntValues:
    """An integer column fed a piece at a time: its values (0 where null; int32 when they fit, a read-only
    view when constant, or of the Arrow array's own values when the column came in one piece) and its null
    mask."""

    def __init__(self, n: int):
        self.values = np.empty(n, np.int32)
        self.na: np.ndarray | None = None
        self.lo: int | None = None
        self.hi: int | None = None

    def add(self, arr: pa.Array, at: int) -> None:
        if arr.null_count:
            if self.na is None:
                self.na = np.zeros(len(self.values), bool)
            self.na[at:at + len(arr)] = ~_valid(arr)
        lo_hi = pc.min_max(arr).as_py()   # of the values given: a null counts as 0 (below)
        lo, hi = (lo_hi["min"] or 0), (lo_hi["max"] or 0)
        if arr.null_count:
            lo, hi = min(lo, 0), max(hi, 0)
        self.lo = lo if self.lo is None else min(lo, self.lo)
        self.hi = hi if self.hi is None else max(hi, self.hi)
        if at == 0 and len(arr) == len(self.values) and pa.types.is_signed_integer(arr.type):
            # the whole column in one piece: its values, without a copy
            self.values = _numbers(arr)
            return
        if self.values.dtype == np.int32 and not (self.lo >= -(1 << 31) and self.hi < (1 << 31)):
            self.values = self.values.astype(np.int64)
        self.values[at:at + len(arr)] = _numbers(arr)

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


def _parquet_codes(p: Path) -> ResultCodes | None:
    """The fast path's read of a Parquet file: its scoring columns as codes, or None when the file
    needs :func:`read_results` (a column given twice or of another type, merged results to unfold)."""
    meta = pq.read_metadata(p)
    schema = meta.schema.to_arrow_schema()
    names = schema.names
    if len(set(names)) != len(names) or not _fast_types(schema):
        return None
    for name in ID_LIST_COLUMNS:   # a list to unfold (or to check): the table's way, read_results
        if name not in names:
            continue
        subs = pq.read_table(p, columns=[name]).column(name)
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
        if meta.num_row_groups == 1:
            # what write_results writes: read whole, a column per core; each column comes in one piece (one
            # dictionary per text column), and its indices or values are the codes, without a copy
            batches: Iterable[pa.RecordBatch] = pf.read(columns=wanted).to_batches()
        else:
            batches = pf.iter_batches(batch_size=_BATCH_ROWS, columns=wanted)
        return ResultCodes.from_batches(schema, batches, meta.num_rows, constant)


def parquet_codes(path: str | os.PathLike) -> ResultCodes | None:
    """The rows of a Parquet results file as checked codes, or None when the file needs
    :func:`weknora_nb.core.results.read_results` (not a ``.parquet``/``.pq`` file, not a file, a
    column given twice or of another type, merged results to unfold). A file that cannot be read
    is a :class:`ResultsError` naming it; bad rows, one naming their rows and fields."""
    p = Path(path)
    if p.suffix.lower() not in (".parquet", ".pq") or not p.is_file():
        return None
    with reading(p, ResultsError):
        codes = _parquet_codes(p)
    if codes is None:
        return None
    problems = codes.check(str(p))
    if problems:
        raise ResultsError(p, problems)
    return codes
