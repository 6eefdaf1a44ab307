"""Score a results table against a test set (docs/method.md sections 2-3).

:func:`score` runs these steps, all vectorised (no Python loop over queries), on integer
codes (:class:`~weknora_nb.core.codes.ResultCodes`; a Parquet path is read straight into
them):

1. group rows into requests (:func:`_group_requests`): runs of equal (query, stage,
   repeat); rows are sorted only when a request's rows lie apart or out of rank order;
2. check structure (:func:`_check_structure`): one status per request, no rank given
   twice;
3. set aside what is not scored, with the reason (:func:`_select`): invalid queries (no
   grade >= 1), failed requests (status other than ``ok``), requests of unknown query ids;
   valid queries missing from a stage/repeat that other queries have are added as
   ``missing`` requests in step 6;
4. lay the requests out as rows of a grid (:func:`_distinct_lists`); rows holding a
   repeated chunk id are found by sorting each row, and every row keeps its first K_max
   distinct chunk ids (first position kept, ranks closed up, duplicates counted over the
   whole list);
5. look up the grades (>= 1 only: grade 0 adds nothing) and compute every metric
   (:func:`_metric_values`);
6. the tables: requests (missing requests included), per_query, excluded, by_repeat,
   summary; then the counts and the warnings.

System figure = mean over scored requests of a (stage, repeat); the stage figure is
the mean of its repeat figures, with their spread (std, min, max).

Steps 1, 2 and 4 need no test set (:func:`_prepare`: the results' side, every request's list laid out as if
it were scored; step 3 then empties those not scored). Two cores: the test set's labels
(:class:`_Relevance`) are prepared in a second thread while the results are read and grouped
(Arrow and numpy work without the interpreter lock). :func:`score_files` does the whole results'
side while the test set loads (the file read by a :class:`~weknora_nb.core.codes.ReadAhead`, which
the command line starts before it imports pandas), and hashes the test set while scoring.
:meth:`Scores.to_json_bytes` writes ``--json`` with orjson, the per-query rows as Arrow
strings; :meth:`Scores.write_per_query` writes them to a file instead (``--per-query-out``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from weknora_nb.core.codes import ReadAhead, ResultCodes, extremes, in_background, short_switches
from weknora_nb.core.errors import Problem, ResultsError, UsageError, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.metrics import NEEDS_ALL_LABELS, Metric, RankedLists, compute, parse_metrics
from weknora_nb.core.pipeline import significance_warning
from weknora_nb.core.pipeline import stage_order as _stage_order
from weknora_nb.core.results import expand_sub_chunks, read_results, read_results_for_scoring
from weknora_nb.core.testset import TestSet, _json_inner, _string_bytes, load_testset
from weknora_nb.core.tiers import check_domain_adjustment, tier

__all__ = ["Counts", "Scores", "score", "score_files", "result_codes"]


log = logging.getLogger(__name__)

#: padding cells a grid of requests x longest list may hold beyond 4 per row before the
#: long lists are cut to their first K_max distinct chunks by hashing instead
GRID_SLACK = 1_000_000

#: the values ``score(..., sub_chunks=...)`` accepts
SUB_CHUNKS = ("expand", "ignore")

_INVALID = "invalid query (no chunk of grade >= 1)"


def _sorts_16bit_in_simd() -> bool:
    """Whether numpy sorts 16-bit integers with SIMD on this CPU (x86-simd-sort's 16-bit kernels need AVX-512
    ICL or SPR). Without them a 16-bit sort is the scalar one, 5-9x slower than the AVX2 sort of the same
    values as int32 (AMD EPYC, numpy 2.4: 0.58-0.93 s against 0.11 s for 100,000 rows of 100)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:   # another numpy layout: keep 32 bits, fast wherever numpy has a SIMD sort
        return False
    return bool(features.get("AVX512_ICL") or features.get("AVX512_SPR"))


#: rows of chunk codes are sorted as 16-bit values (half the bytes) only where numpy has a SIMD sort for them
SORT_16BIT = _sorts_16bit_in_simd()

#: :attr:`Counts.incomplete_reason` when there is nothing to score
NO_ROWS = "the results file has no rows"
NO_TESTSET_ROW = "no row belongs to a query of the test set"


@dataclass(frozen=True)
class Counts:
    """Test-set and run counts of one :func:`score` call, never hidden.

    Attributes
    ----------
    n_queries, n_valid, n_invalid : int
        Queries in the test set; those with a chunk of grade >= 1 (scored); the others.
    invalid_ids : list of str
        Ids of the invalid queries, in test-set order.
    n_requests : int
        Rows of :attr:`Scores.requests`: every request seen, plus the missing ones.
    n_scored : int
        Requests scored (ok, of a valid query of the test set).
    n_failed : int
        Requests whose status is an error kind; ``failed_by_kind`` maps kind -> count.
    n_missing : int
        (valid query, stage, repeat) combinations the run lacks while other queries have them.
    n_unknown_query : int
        Requests naming a query id that the test set does not hold.
    n_duplicates_removed : int
        Repeated chunk ids removed from scored lists (first position kept).
    n_sub_chunks_expanded : int
        Absorbed neighbour chunks placed after their merged result (``sub_chunks="expand"``).
    stages : list of str
        Stages scored, in report order; ``repeats``: the distinct repeat numbers, ascending.
    complete : bool
        Something was scored and nothing is left out: the results have rows, one of them
        at least belongs to a query of the test set, and no request failed, is missing or
        names an unknown query (derived, not passed; :attr:`incomplete_reason` says why not).
    """

    n_queries: int
    n_valid: int
    n_invalid: int
    invalid_ids: list[str]
    n_requests: int
    n_scored: int
    n_failed: int
    failed_by_kind: dict[str, int]
    n_missing: int
    n_unknown_query: int
    n_duplicates_removed: int
    n_sub_chunks_expanded: int
    stages: list[str]
    repeats: list[int]
    complete: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "complete", self.incomplete_reason is None)

    @property
    def incomplete_reason(self) -> str | None:
        """Why the run is not complete, in plain words (derived from the counts; None when it is):
        ``"the results file has no rows"``, ``"no row belongs to a query of the test set"``, or
        ``"F failed, M missing and U unknown-query requests"``."""
        if self.n_requests == 0:  # every row belongs to a request: no request, no row
            return NO_ROWS
        if self.n_requests - self.n_missing - self.n_unknown_query <= 0:
            return NO_TESTSET_ROW
        if self.n_failed or self.n_missing or self.n_unknown_query:
            return (f"{self.n_failed} failed, {self.n_missing} missing and {self.n_unknown_query} "
                    "unknown-query requests")
        return None

    def to_dict(self) -> dict:
        """Every field by name, in the order above (a deep copy: plain lists and dicts)."""
        return {f.name: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                for f in fields(self) for v in [getattr(self, f.name)]}   # the values hold no deeper container


@dataclass
class Scores:
    """Everything :func:`score` computed.

    Attributes
    ----------
    metrics : list of Metric
    per_query : DataFrame
        One row per scored request: ``query_id``, ``stage``, ``repeat``, one column per
        metric (values in [0, 1]), ``n_returned`` (after duplicate removal),
        ``n_duplicates``, and ``latency_ms`` when the results carry it.
    requests : DataFrame
        Every request seen or expected: ``query_id``, ``stage``, ``repeat``, ``status``
        (``ok``, an error kind, or ``missing``), ``scored`` (bool), ``reason`` when not
        scored, ``n_returned``, ``n_duplicates``, ``latency_ms``.
    excluded : DataFrame
        ``query_id``, ``stage``, ``repeat``, ``reason``: invalid queries (stage and
        repeat empty), failed, missing and unknown-query requests.
    by_repeat : DataFrame
        Means per (stage, repeat): ``stage``, ``repeat``, ``n_scored``, one column per metric.
    summary : DataFrame
        Long format, one row per (stage, metric): ``mean`` (mean of repeat means),
        ``std`` / ``min`` / ``max`` across repeats, ``n_repeats``, ``n_queries``, ``tier``.
    counts : Counts
        Test-set and run counts, never hidden.
    warnings : list of str
        Plain-words warnings every report must show.
    """

    metrics: list[Metric]
    per_query: pd.DataFrame
    requests: pd.DataFrame
    excluded: pd.DataFrame
    by_repeat: pd.DataFrame
    summary: pd.DataFrame
    counts: Counts
    testset: TestSet = field(repr=False)
    warnings: list[str] = field(default_factory=list)
    domain_adjustment: float = 0.0

    @property
    def testset_hash(self) -> str:
        """Content hash of the test set scored against (computed when first asked for)."""
        return self.testset.hash

    @property
    def metric_names(self) -> list[str]:
        """Canonical names of the metrics, in the order asked."""
        return [m.name for m in self.metrics]

    @property
    def stages(self) -> list[str]:
        """Stages of the summary, in report order."""
        return list(dict.fromkeys(self.summary["stage"]))

    @property
    def complete(self) -> bool:
        """False when nothing was scored (no row, no row of a test-set query) or any request failed,
        is missing, or names an unknown query (:attr:`Counts.incomplete_reason` says which)."""
        return self.counts.complete

    def summary_wide(self, value: str = "mean") -> pd.DataFrame:
        """Stages as rows, metrics as columns (in the order asked)."""
        wide = self.summary.pivot(index="stage", columns="metric", values=value)
        return wide.reindex(index=self.stages, columns=self.metric_names)

    def per_query_mean(self) -> pd.DataFrame:
        """Per (query, stage): each metric averaged over the query's scored repeats (``n_repeats``), in the
        order the pairs first appear."""
        cols = self.metric_names
        if self.per_query["repeat"].nunique() <= 1:   # one repeat: one row per (query, stage), its own mean
            out = self.per_query[["query_id", "stage", *cols]].reset_index(drop=True)
            out["n_repeats"] = np.ones(len(out), np.int64)
            return out
        g = self.per_query.groupby(["query_id", "stage"], sort=False, observed=True)
        out = g[cols].mean()
        out["n_repeats"] = g.size()
        return out.reset_index()

    def to_json_bytes(self, *, per_query: bool = True, indent: bool = True) -> bytes:
        """:meth:`to_json_dict` as UTF-8 JSON text (orjson; ``indent``: two spaces, as ``json.dumps(indent=2)``).
        The per-query rows, most of the text, are written as Arrow strings, never as Python dicts."""
        import orjson

        head = orjson.dumps(self.to_json_dict(per_query=False), option=orjson.OPT_INDENT_2 if indent else 0)
        if not per_query:
            return head
        rows = _per_query_json(self.per_query_mean(), self.metric_names, indent=indent)
        if indent:   # the head ends with "\n}"
            return b"".join([memoryview(head)[:-2], b',\n  "per_query": ', *rows, b"\n}"])
        return b"".join([memoryview(head)[:-1], b',"per_query":', *rows, b"}"])

    def write_per_query(self, path: str | os.PathLike) -> Path:
        """Write :meth:`per_query_mean` to ``path`` (atomically), the format following the suffix
        (:data:`PER_QUERY_FORMATS`): Parquet, CSV, or JSONL (the ``--json`` rows, one a line)."""
        fmt = per_query_format(path)
        table = self.per_query_mean()
        p = Path(path)
        with writing(p), atomic_path(p) as tmp:
            if fmt == "parquet":
                pq.write_table(pa.Table.from_pandas(table, preserve_index=False), tmp)
            elif fmt == "csv":
                table.to_csv(tmp, index=False, encoding="utf-8")
            else:
                with open(tmp, "wb") as fh:
                    fh.writelines(_per_query_json(table, self.metric_names, indent=False, lines=True))
        return p

    def to_json_dict(self, *, per_query: bool = True) -> dict:
        """The ``weknora-nb score --json`` object.

        ``summary`` and ``tiers`` are always keyed by stage, then metric
        (``{"final": {"ndcg@5": 0.71}}``), whatever the number of stages; ``spread`` is
        keyed ``"stage/metric"``.
        """
        cells = {(r.stage, r.metric): r for r in self.summary.itertuples()}   # stages x metrics: a few dozen
        stages, names = self.stages, self.metric_names
        out = {
            "summary": {s: {m: _num(cells[s, m].mean) if (s, m) in cells else None for m in names} for s in stages},
            "tiers": {s: {m: _str(cells[s, m].tier) if (s, m) in cells else None for m in names} for s in stages},
            "spread": {f"{r.stage}/{r.metric}": {"std": _num(r.std), "min": _num(r.min), "max": _num(r.max)}
                       for r in self.summary.itertuples()},
            "counts": self.counts.to_dict(),
            "complete": self.complete,
            "incomplete_reason": self.counts.incomplete_reason,
            "warnings": self.warnings,
            "testset_hash": self.testset_hash,
            "domain_adjustment": self.domain_adjustment,
            "excluded": _json_records(self.excluded, ints=("repeat",)),
        }
        if per_query:
            out["per_query"] = _json_records(self.per_query_mean()[["query_id", "stage", "n_repeats", *names]],
                                             ints=("n_repeats",))
        return out


#: suffix -> format of :meth:`Scores.write_per_query`
PER_QUERY_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def per_query_format(path: str | os.PathLike) -> str:
    """The format :meth:`Scores.write_per_query` writes ``path`` in; UsageError for another suffix."""
    fmt = PER_QUERY_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise UsageError(argument="--per-query-out", allowed="a path ending in " + ", ".join(PER_QUERY_FORMATS),
                         got=str(path))
    return fmt


def _per_query_json(table: pd.DataFrame, names: list[str], *, indent: bool,
                    lines: bool = False) -> list[bytes | memoryview]:
    """The rows of :meth:`Scores.per_query_mean` as the JSON array of ``--json`` (``indent``: laid out as
    ``json.dumps(indent=2)`` lays out a list in the top object; ``lines``: one compact object a line
    instead), built column by column with Arrow: numbers in their shortest round-trip form, a missing
    value as null. The text comes in pieces, to be joined or written."""
    import orjson

    if not len(table):
        return [] if lines else [b"[]"]
    keys = ["query_id", "stage", "n_repeats", *names]
    if indent:
        opener, sep, closer, between = "\n    {\n      ", ",\n      ", "\n    }", ","
    else:
        opener, sep, closer, between = "{", ",", "}", "\n" if lines else ","
    # ids without their quotes (the quotes go with the text around them), numbers as they are
    values = [_json_inner(_text(table["query_id"])), _json_inner(_text(table["stage"])),
              _json_numbers(table["n_repeats"].to_numpy(np.int64)),
              *[_json_numbers(table[m].to_numpy(np.float64)) for m in names]]
    parts: list[pa.Array | str] = []
    for i, (key, value) in enumerate(zip(keys, values, strict=True)):
        before = opener if i == 0 else '"' + sep if i in (1, 2) else sep   # the ids' closing quotes, after them
        parts += [before + orjson.dumps(key).decode() + (": " if indent else ":") + ('"' if i < 2 else ""), value]
    parts.append(closer + between)
    rows = pc.binary_join_element_wise(*[pa.scalar(x, pa.large_string()) if isinstance(x, str) else x
                                         for x in parts], pa.scalar("", pa.large_string()))
    body = _string_bytes(rows)[:-len(between)]
    return [body, b"\n"] if lines else [b"[", body, b"\n  ]" if indent else b"]"]


def _json_numbers(v: np.ndarray) -> pa.Array:
    """Numbers as JSON text, as orjson writes them (a float in the shortest form that reads back the same
    double, an integral one as ``1.0``; a NaN as null, as :func:`_num` gives, and an infinity too, which
    JSON cannot write): one orjson call for the column, its text cut at the commas into an Arrow array."""
    import orjson

    raw = np.frombuffer(orjson.dumps(np.ascontiguousarray(v), option=orjson.OPT_SERIALIZE_NUMPY), np.uint8)[1:-1]
    commas = np.flatnonzero(raw == 44)   # numbers hold no comma
    offsets = np.empty(len(v) + 1, np.int64)
    offsets[0], offsets[-1] = 0, len(raw) - len(commas)
    offsets[1:-1] = commas - np.arange(len(commas))
    data = np.delete(raw, commas)
    return pa.LargeStringArray.from_buffers(len(v), pa.py_buffer(offsets), pa.py_buffer(data))


def _json_records(table: pd.DataFrame, ints: tuple[str, ...] = ()) -> list[dict]:
    """The rows of ``table`` as dicts of plain values: a missing value None, the ``ints`` columns as int."""
    names, columns = list(table.columns), []
    for name in names:
        col = table[name]
        na = col.isna().to_numpy(dtype=bool)
        values = col.to_numpy(dtype=object).tolist()
        if name in ints or na.any():
            values = [None if n else (int(v) if name in ints else v) for v, n in zip(values, na, strict=True)]
        columns.append(values)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def _num(x) -> float | None:
    """``x`` as a float, None for a missing value (JSON null)."""
    return None if x is None or pd.isna(x) else float(x)


def _str(x) -> str | None:
    """``x`` when it is a string (a tier), else None."""
    return x if isinstance(x, str) else None


def _lookup(keys: np.ndarray, table_keys: np.ndarray, table_values: np.ndarray, default: int = 0) -> np.ndarray:
    """``table_values`` at the position of each of ``keys`` in ``table_keys`` (sorted, unique), else ``default``.

    Most keys are usually absent, so a hashed byte filter (one multiply and one gather
    per key) sets them aside before the exact binary search runs on the few candidates.
    """
    out = np.full(len(keys), default, dtype=table_values.dtype)
    if not len(table_keys) or not len(keys):
        return out
    bits = int(min(26, max(16, np.ceil(np.log2(len(table_keys) * 16)))))
    shift = np.uint64(64 - bits)
    mult = np.uint64(0x9E3779B97F4A7C15)
    bloom = np.zeros(1 << bits, dtype=np.bool_)
    bloom[(table_keys.astype(np.uint64) * mult) >> shift] = True
    cand = np.flatnonzero(bloom[(keys.astype(np.uint64) * mult) >> shift])
    at = np.minimum(np.searchsorted(table_keys, keys[cand]), len(table_keys) - 1)
    found = table_keys[at] == keys[cand]
    out[cand[found]] = table_values[at[found]]
    return out


@dataclass
class _Relevance:
    """The labels scoring needs, as integer keys: grade >= 1 only (grade 0 adds nothing anywhere)."""

    chunks: np.ndarray      # distinct chunk ids with a grade >= 1 somewhere
    keys: np.ndarray        # sorted query_index * len(chunks) + chunk_index
    grades: np.ndarray      # int8, aligned with keys
    n_rel: np.ndarray       # per test-set query: chunks of grade >= 1
    ideal_q: np.ndarray     # the ideal rankings (grades descending), flattened
    ideal_pos: np.ndarray
    ideal_grade: np.ndarray

    @classmethod
    def of(cls, testset: TestSet) -> _Relevance:
        qrels = testset.qrels
        g = qrels["grade"].to_numpy()
        rel = pa.array(g >= 1)
        q = _index_in(_text(qrels["query_id"]).filter(rel), testset.queries["query_id"])
        g = g[g >= 1].astype(np.int8)
        enc = pc.dictionary_encode(_text(qrels["chunk_id"]).filter(rel))
        c_code, chunks = enc.indices.to_numpy().astype(np.int64), enc.dictionary.to_numpy(zero_copy_only=False)
        keys = q * max(len(chunks), 1) + c_code
        order = np.argsort(keys, kind="stable")
        ideal = np.argsort(q * 4 + (3 - g), kind="stable")
        ideal_q = q[ideal]
        n_rel = np.bincount(q, minlength=len(testset.queries))
        first = np.cumsum(n_rel) - n_rel
        return cls(chunks, keys[order], g[order], n_rel, ideal_q,
                   np.arange(len(ideal_q)) - first[ideal_q] + 1, g[ideal])


def _text(x) -> pa.Array:
    """A column of strings (Series, array, or Arrow) as an Arrow large_string array."""
    a = x if isinstance(x, pa.Array) else pa.array(x.array if isinstance(x, pd.Series) else x)
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if pa.types.is_dictionary(a.type):
        a = a.dictionary_decode()
    return a.cast(pa.large_string())


def _index_in(values, value_set) -> np.ndarray:
    """Position (int64) of each of ``values`` in ``value_set`` (distinct strings), -1 where absent."""
    if not len(values):
        return np.zeros(0, np.int64)
    if not len(value_set):
        return np.full(len(values), -1, np.int64)
    found = pc.index_in(_text(values), value_set=_text(value_set))
    return found.fill_null(-1).to_numpy().astype(np.int64)


def _first_k_distinct(grid: np.ndarray, k: int, below: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``grid`` (values >= 0, padding < 0): the first ``k`` distinct values
    in row order (padded with -1) and the number of repeated values in the row.

    A sorted copy of each row finds the rows holding a repeat (as 16-bit values when ``below``
    says every value is in 0 .. 65,535 and numpy sorts them in SIMD, :data:`SORT_16BIT`: half the
    bytes to sort); only those rows are argsorted
    to tell first occurrences from repeats, and compacted (lists are short, repeats rare).
    """
    n_rows, width = grid.shape
    top = np.maximum(grid[:, :k], -1)
    n_dup = np.zeros(n_rows, np.int64)
    if width < 2 or not n_rows:
        return top, n_dup
    # in blocks of rows: small temporaries are recycled instead of freshly mapped each time
    small = np.uint16 if SORT_16BIT and below is not None and below <= (1 << 16) else None
    block = max(1, (1 << 21) // width)
    suspect = np.concatenate([
        np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1)) + i
        for i in range(0, n_rows, block)
        for srt in [np.sort(grid[i:i + block] if small is None else grid[i:i + block].astype(small), axis=1)]])
    if not len(suspect):
        return top, n_dup
    # within a suspect row, sorting value * width + position puts equal values together, earliest first
    sub = grid[suspect]
    srt = np.sort(sub.astype(np.int64) * width + np.arange(width), axis=1)
    value, at = srt // width, srt % width
    repeat = np.zeros(sub.shape, bool)
    repeat[:, 1:] = (value[:, 1:] == value[:, :-1]) & (value[:, 1:] >= 0)
    dup = np.zeros(sub.shape, bool)
    np.put_along_axis(dup, at, repeat, axis=1)
    n_dup[suspect] = dup.sum(axis=1)
    keep = (sub >= 0) & ~dup
    at = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # kept cells first, in row order
    vals = np.take_along_axis(sub, at, axis=1)
    vals[~np.take_along_axis(keep, at, axis=1)] = -1
    top[suspect] = vals
    return top, n_dup



# -- what passes between the steps --------------------------------------------------------


@dataclass
class _Requests:
    """The rows grouped into requests (step 1), as the later steps read them.

    Row arrays (``query`` .. ``has_chunk``, one entry per row) are in an order where each
    request's rows lie together, in rank order; request arrays (``starts`` .. ``key``) have
    one entry per request, in the order the requests' rows come.
    """

    codes: ResultCodes            # the rows scored (after the stage filter): their dictionaries, latency
    query: np.ndarray             # query code of each row
    stage: np.ndarray             # stage code of each row
    rank: np.ndarray
    chunk: np.ndarray             # chunk code, -1 where none (a failed request's row)
    status: np.ndarray            # status code; an empty status reads as ``ok``
    has_chunk: np.ndarray         # chunk >= 0
    brk: np.ndarray               # brk[j]: row j + 1 starts a request
    ordered: bool                 # ranks strictly increase within every request
    statuses: np.ndarray          # status names (``ok`` added when an empty status needed it)
    order: np.ndarray | None      # row j here is row order[j] of ``codes`` (None: same order)
    row_number: np.ndarray | None  # row i of ``codes`` is 0-based row row_number[i] of the caller's table
    starts: np.ndarray            # first row of each request
    lengths: np.ndarray           # rows of each request
    r_query: np.ndarray           # query code of each request
    r_stage: np.ndarray           # stage code of each request
    repeats: np.ndarray           # distinct repeat numbers, ascending
    r_repeat: np.ndarray          # each request's repeat, as a position in ``repeats``
    key: np.ndarray               # (query * n_stages + stage) * n_repeats + repeat position, int64

    @property
    def n(self) -> int:
        """Number of requests."""
        return len(self.starts)

    @property
    def n_rep(self) -> int:
        """Number of distinct repeats (at least 1: the base of ``key``)."""
        return max(len(self.repeats), 1)

    def row_of(self, j: int) -> int:
        """1-based row number in the caller's table of row ``j`` (in the order here)."""
        j = int(self.order[j]) if self.order is not None else int(j)
        return (int(self.row_number[j]) if self.row_number is not None else j) + 1

    def latency(self) -> np.ndarray:
        """Latency (ms) of each request, NaN when the results carry none."""
        lat = self.codes.latency_ms
        if lat is None:
            return np.full(self.n, np.nan)
        return lat[self.order[self.starts]] if self.order is not None else lat[self.starts]


@dataclass
class _Selection:
    """Which requests are scored (step 3), and why the others are not."""

    ts_query: np.ndarray  # each request's query as a row of the test set, -1 when unknown
    status: np.ndarray    # each request's status name
    known: np.ndarray     # the test set holds the query
    scored: np.ndarray    # ok, of a known and valid query
    reason: np.ndarray    # why a request is not scored (None when scored)


@dataclass
class _Lists:
    """The requests' ranked lists after duplicate removal (step 4)."""

    top: np.ndarray           # requests x K_max: first K_max distinct chunk codes, -1 padding
    n_returned: np.ndarray    # distinct chunks returned per request (0 when not scored)
    n_duplicates: np.ndarray  # repeated chunk ids removed per request (0 when not scored)

    def only(self, scored: np.ndarray) -> _Lists:
        """These lists with the requests not ``scored`` emptied: no chunk, counts 0 (in place)."""
        self.top[~scored] = -1
        self.n_returned[~scored] = 0
        self.n_duplicates[~scored] = 0
        return self


@dataclass
class _Prepared:
    """The results' side of :func:`score`, which needs no test set (:func:`_prepare`): the rows read and kept
    (``req.codes``), grouped into requests and checked (steps 1 and 2), and every request's list laid out
    (step 4) as if it were scored."""

    req: _Requests
    lists: _Lists
    stages: list[str] | None   # the stages kept (None: all)
    n_expanded: int            # absorbed chunks unfolded


def _prepare(results: pd.DataFrame | ResultCodes | str | os.PathLike, sub_chunks: str, source: str | None,
             stages: Iterable[str] | None, k_max: int) -> _Prepared:
    """Read ``results`` (:func:`_read`), keep ``stages``, group the rows into requests, check their structure,
    and lay out each request's first ``k_max`` distinct chunks."""
    rc, n_expanded, source = _read(results, sub_chunks, source)
    rc, row_number, kept = _keep_stages(rc, stages)
    req = _group_requests(rc, row_number)
    _check_structure(req, source)
    return _Prepared(req, _distinct_lists(req, np.ones(req.n, bool), k_max), kept, n_expanded)


# -- the entry point ------------------------------------------------------------------------


def score(testset: TestSet, results: pd.DataFrame | ResultCodes | str | os.PathLike,
          metrics: Iterable[str | Metric] | str | None = None, *,
          stages: Iterable[str] | None = None, domain_adjustment: float = 0.0, sub_chunks: str = "expand",
          source: str | None = None) -> Scores:
    """Score ``results`` (the results-table format) against ``testset``.

    Parameters
    ----------
    testset : TestSet
    results : DataFrame, or path
        A results table as read by :func:`weknora_nb.read_results`, or the path of a
        results file (a Parquet file is then read straight into integer codes, without
        a pandas table: the fast path for large runs). Rows are checked either way.
    metrics : list of str, optional
        Metric names (default :data:`weknora_nb.core.metrics.DEFAULT_METRICS`).
    stages : list of str, optional
        Keep only these stages (in this order); each must be in the results.
    domain_adjustment : float, default 0
        Lower every acceptance threshold by this fraction (0, or 0.05-0.10).
    sub_chunks : {"expand", "ignore"}, default "expand"
        Merged results that absorbed neighbouring chunks (``sub_chunk_ids``): ``expand``
        places each absorbed chunk right after its result (what the user sees);
        ``ignore`` scores only the result's own chunk id.
    source : str, optional
        Name used in error messages (default: the path, or ``<results>``).

    Returns
    -------
    Scores

    Raises
    ------
    ResultsError
        A bad row (named by row and field), a request with two statuses, or a rank
        given twice within a request.
    MetricError
        An unknown metric name.
    UsageError
        A stage asked for that the results do not hold, a bad ``sub_chunks`` or
        ``domain_adjustment``.
    """
    mets = _check_options(metrics, domain_adjustment, sub_chunks)
    with ThreadPoolExecutor(1, thread_name_prefix="weknora-nb-labels") as pool:
        labels = pool.submit(_Relevance.of, testset)   # the test set's side, beside the results' (Arrow, numpy)
        prepared = _prepare(results, sub_chunks, source, stages, _k_max(mets))
        return _score_prepared(testset, prepared, mets, labels.result(), domain_adjustment)


def _score_prepared(testset: TestSet, prepared: _Prepared, mets: list[Metric], labels: _Relevance,
                    domain_adjustment: float) -> Scores:
    """Steps 3, 5 and 6 of :func:`score`: what needs the test set, given the results' side (:func:`_prepare`)."""
    req, stages, rc = prepared.req, prepared.stages, prepared.req.codes
    sel = _select(req, testset)
    lists = prepared.lists.only(sel.scored)
    values = _metric_values(req, sel, lists.top, testset, mets, labels)
    requests, values = _requests_table(req, sel, lists, values, testset.queries)
    names = [m.name for m in mets]
    per_query = _per_query_table(requests, values, names, has_latency=rc.latency_ms is not None)
    excluded = _excluded_table(testset.queries, requests)
    stage_order = stages if stages is not None else _stage_order(rc.stages[req.r_stage])
    by_repeat = _by_repeat_table(per_query, names, stage_order)
    summary = _summary_table(by_repeat, _queries_per_stage(req, sel.scored), names, stage_order,
                             domain_adjustment)
    counts = _counts(testset.queries, requests, sel, lists, prepared.n_expanded, stage_order, req.repeats)
    warnings = _warnings(counts, domain_adjustment)
    return Scores(metrics=mets, per_query=per_query, requests=requests, excluded=excluded, by_repeat=by_repeat,
                  summary=summary, counts=counts, testset=testset, warnings=warnings,
                  domain_adjustment=domain_adjustment)


def _k_max(mets: list[Metric]) -> int:
    """The longest prefix of a list any of ``mets`` reads."""
    return max(m.k for m in mets)


def score_files(testset: str | os.PathLike, results: str | os.PathLike | ReadAhead,
                metrics: Iterable[str | Metric] | str | None = None, *, stages: Iterable[str] | None = None,
                domain_adjustment: float = 0.0, sub_chunks: str = "expand") -> Scores:
    """:func:`score` of a results file against a test-set file (:func:`~weknora_nb.load_testset`), with the
    same checks and errors in the same order, using a second core: the results file is read, grouped into
    requests and checked, and each request's distinct list laid out, in a second thread while the test set
    loads (none of it needs the test set, and it is Arrow and numpy work, which leaves the first thread free);
    the test set's hash (:attr:`Scores.testset_hash`) is computed beside the scoring. ``results`` may be a
    :class:`~weknora_nb.core.codes.ReadAhead` of the results file, started earlier (the command line starts
    one before it imports pandas)."""
    mets = _check_options(metrics, domain_adjustment, sub_chunks)
    ahead = results if isinstance(results, ReadAhead) else ReadAhead(results, read_results)

    def results_side() -> _Prepared:
        rows = ahead.result()
        return _prepare(rows if rows is not None else read_results(ahead.path), sub_chunks, str(ahead.path), stages,
                        _k_max(mets))

    with short_switches(), ThreadPoolExecutor(2, thread_name_prefix="weknora-nb-files") as pool:
        prepared = in_background(results_side, "weknora-nb-results")   # while the test set loads
        ts = load_testset(Path(testset))
        digest = pool.submit(lambda: ts.hash)
        labels = pool.submit(_Relevance.of, ts)
        sc = _score_prepared(ts, prepared.result(), mets, labels.result(), domain_adjustment)
        digest.result()
    return sc


def _check_options(metrics: Iterable[str | Metric] | str | None, domain_adjustment: float,
                   sub_chunks: str) -> list[Metric]:
    """The metrics parsed, after the options are checked (MetricError, UsageError)."""
    mets = parse_metrics(metrics)
    check_domain_adjustment(domain_adjustment)
    if sub_chunks not in SUB_CHUNKS:
        raise UsageError(argument="sub_chunks", allowed=list(SUB_CHUNKS), got=sub_chunks)
    return mets


# -- reading -------------------------------------------------------------------------------


def _read(results: pd.DataFrame | ResultCodes | str | os.PathLike, sub_chunks: str,
          source: str | None) -> tuple[ResultCodes, int, str]:
    """The results as integer codes, the number of absorbed chunks unfolded, and the name for
    error messages. A path is read (straight into codes when it can be); a table has its
    merged results unfolded (``sub_chunks="expand"``) and its rows checked."""
    if isinstance(results, (str, os.PathLike)):
        source = source or str(results)
        results = read_results_for_scoring(Path(results))
    source = source or "<results>"
    if not isinstance(results, pd.DataFrame):
        if results.unfolded is not None and sub_chunks != "expand":
            raise UsageError(argument="sub_chunks", allowed='"expand" for codes whose merged results are unfolded '
                             "(score the results table to ignore them)", got=sub_chunks)
        return results, results.unfolded or 0, source
    if sub_chunks == "expand":
        rc = result_codes(results, source=source)
        return rc, rc.unfolded or 0, source
    return _checked_codes(results, source), 0, source


def result_codes(results: pd.DataFrame, *, source: str = "<results>") -> ResultCodes:
    """A results table as the codes :func:`score` scores: merged results unfolded (:func:`expand_sub_chunks`,
    their number in :attr:`ResultCodes.unfolded`), rows checked (a :class:`ResultsError` naming ``source``).
    Scoring the codes again and again skips both steps: what a :class:`~weknora_nb.core.run.Run` keeps."""
    expanded, n_expanded = expand_sub_chunks(results)
    rc = _checked_codes(expanded, source)
    rc.unfolded = n_expanded
    return rc


def _checked_codes(results: pd.DataFrame, source: str) -> ResultCodes:
    rc = ResultCodes.from_frame(results)
    bad = rc.check(source)  # a table built by hand gets read_results's row checks too (reductions: cheap)
    if bad:
        raise ResultsError(source, bad)
    return rc


def _keep_stages(rc: ResultCodes, stages: Iterable[str] | None
                 ) -> tuple[ResultCodes, np.ndarray | None, list[str] | None]:
    """Only the rows of ``stages`` (every row when None), the position in ``rc`` of each row
    kept (None when all are kept), and ``stages`` as a list.

    Raises UsageError naming the stages the results hold (in pipeline order) when one of
    ``stages`` has no row.
    """
    if stages is None:
        return rc, None, None
    stages = list(stages)
    present = np.zeros(len(rc.stages) + 1, bool)  # the last slot serves code -1
    present[rc.stage] = True
    held = _stage_order(rc.stages[present[:-1]])
    absent = [s for s in stages if s not in held]
    if absent:
        raise UsageError(argument="stage", allowed=held or "a stage of the results (they hold none)",
                         got=absent[0])
    wanted = np.append(np.isin(rc.stages, stages), False)
    keep = wanted[rc.stage]
    if keep.all():
        return rc, None, stages
    row_number = np.flatnonzero(keep)
    return rc.take(row_number), row_number, stages


# -- 1. requests: runs of rows with the same (query, stage, repeat) --------------------------


def _group_requests(rc: ResultCodes, row_number: np.ndarray | None) -> _Requests:
    """Step 1: the rows as requests, runs of equal (query, stage, repeat).

    The rows keep their order when every request's rows lie together in rank order (the
    collector's files); otherwise they are sorted by request key, then rank (stable, so
    errors still name the first offending row).
    """
    q, s, rep, rank, c = rc.query, rc.stage, rc.repeat, rc.rank, rc.chunk
    st, statuses = _empty_status_is_ok(rc.status, rc.statuses)
    starts, brk, ordered = _runs(q, s, rep, rank)
    repeats, r_repeat = np.unique(rep[starts], return_inverse=True)
    n_s, n_rep = max(len(rc.stages), 1), max(len(repeats), 1)
    key = (q[starts].astype(np.int64) * n_s + s[starts]) * n_rep + r_repeat
    order = None
    if not ordered or (np.any(key[1:] <= key[:-1]) and len(np.unique(key)) != len(key)):
        # rows of a request are not together, or not in rank order: sort (row order kept for errors)
        order = _request_order(key, np.diff(np.r_[starts, len(rc)]), rank)
        q, s, rep, rank, c, st = q[order], s[order], rep[order], rank[order], c[order], st[order]
        starts, brk, ordered = _runs(q, s, rep, rank)
        r_repeat = np.searchsorted(repeats, rep[starts])
        key = (q[starts].astype(np.int64) * n_s + s[starts]) * n_rep + r_repeat
    return _Requests(codes=rc, query=q, stage=s, rank=rank, chunk=c, status=st, has_chunk=c >= 0, brk=brk,
                     ordered=ordered, statuses=statuses, order=order, row_number=row_number, starts=starts,
                     lengths=np.diff(np.r_[starts, len(rc)]), r_query=q[starts], r_stage=s[starts],
                     repeats=repeats, r_repeat=r_repeat, key=key)


def _empty_status_is_ok(status: np.ndarray, statuses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Status codes and names where an empty status (code -1) reads as ``ok``."""
    if not len(status) or extremes(status)[0] >= 0:
        return status, statuses
    if "ok" not in statuses:
        statuses = np.append(statuses, "ok")
    return np.where(status < 0, int(np.flatnonzero(statuses == "ok")[0]), status), statuses


def _runs(q: np.ndarray, s: np.ndarray, rep: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Where each run of equal (query, stage, repeat) starts, the break mask (``brk[j]``: row
    j + 1 starts a run), and whether ranks strictly increase within every run."""
    if not len(q):
        return np.zeros(0, np.int64), np.zeros(0, bool), True
    brk = q[1:] != q[:-1]
    for a in (s, rep):  # a constant column cannot break a run
        if extremes(a)[0] != extremes(a)[1]:
            brk |= a[1:] != a[:-1]
    starts = np.r_[0, np.flatnonzero(brk) + 1]
    ordered = not np.any((rank[1:] <= rank[:-1]) > brk)
    return starts, brk, ordered


def _request_order(key: np.ndarray, lengths: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The stable permutation sorting rows by (request key, rank), given the key and length
    of each run of rows: one int64 argsort when key x (max rank + 1) fits, else a lexsort."""
    row_key = np.repeat(key, lengths)
    top_rank = int(rank.max(initial=0)) + 1
    if int(key.max(initial=0)) < (1 << 62) // top_rank:
        return np.argsort(row_key * top_rank + rank, kind="stable")
    return np.lexsort((rank, row_key))


# -- 2. structure --------------------------------------------------------------------------


def _check_structure(req: _Requests, source: str) -> None:
    """Step 2: ResultsError (up to 20 of each, by row) for a request whose rows carry
    different statuses, or a rank given twice for returned chunks of one request."""
    problems: list[Problem] = []
    st, brk, n_rows = req.status, req.brk, len(req.query)
    queries, stages = req.codes.queries, req.codes.stages
    if n_rows > 1 and extremes(st)[0] != extremes(st)[1]:
        mixed = np.flatnonzero((st[1:] != st[:-1]) > brk) + 1
        for r in np.unique(np.searchsorted(req.starts, mixed, side="right") - 1)[:20]:
            problems.append(Problem(source, req.row_of(req.starts[r]), "status",
                                    f"request ({queries[req.r_query[r]]!r}, {stages[req.r_stage[r]]!r}, "
                                    f"repeat {req.repeats[req.r_repeat[r]]}) has rows with different statuses",
                                    "row"))
    if n_rows > 1 and not req.ordered:  # ranks within a request are not all increasing: a rank given twice?
        rank, has = req.rank, req.has_chunk
        for j in (np.flatnonzero((rank[1:] == rank[:-1]) & ~brk & has[1:] & has[:-1]) + 1)[:20]:
            problems.append(Problem(source, req.row_of(j), "rank",
                                    f"rank {rank[j]} appears twice in request ({queries[req.query[j]]!r}, "
                                    f"{stages[req.stage[j]]!r})", "row"))
    if problems:
        raise ResultsError(source, problems)


# -- 3. what is scored ---------------------------------------------------------------------


def _select(req: _Requests, testset: TestSet) -> _Selection:
    """Step 3: a request is scored when its status is ``ok`` and its query is a valid query
    of the test set; the reason of every other request (unknown query id, invalid query,
    ``failed: <kind>``)."""
    ts_q = testset.queries
    q_in_ts = np.append(_index_in(req.codes.queries, ts_q["query_id"]), -1)  # the last slot serves code -1
    ts_valid = ts_q["valid"].to_numpy(dtype=bool)
    r_ts = q_in_ts[req.r_query]
    r_st = req.status[req.starts]
    status = req.statuses[r_st] if req.n else np.zeros(0, object)
    ok_label = np.flatnonzero(req.statuses == "ok")
    ok = r_st == ok_label[0] if len(ok_label) else np.zeros(req.n, bool)
    known = r_ts >= 0
    valid = np.zeros(req.n, bool)
    valid[known] = ts_valid[r_ts[known]]
    reason = np.full(req.n, None, dtype=object)
    reason[~known] = "unknown query id (not in the test set)"
    reason[known & ~valid] = _INVALID
    failed = known & valid & ~ok
    if failed.any():
        reason[failed] = np.char.add("failed: ", status[failed].astype(str))
    return _Selection(ts_query=r_ts, status=status, known=known, scored=ok & known & valid, reason=reason)


# -- 4. each scored request as a row of a grid; duplicates out; the first K_max kept ----------


def _distinct_lists(req: _Requests, scored: np.ndarray, k_max: int) -> _Lists:
    """Step 4: each scored request's first ``k_max`` distinct chunk codes (first position
    kept, ranks closed up) and its counts of distinct and repeated chunk ids (over the
    whole list). Requests not scored get an empty row and zero counts."""
    lengths = req.lengths
    if req.n and lengths.min() == lengths.max() and req.has_chunk.all():
        # the usual case: every request returned the same number of chunks, so the rows are the grid;
        # requests not scored are blanked out below
        kept_len = np.where(scored, lengths, 0)
        grid = req.chunk.reshape(req.n, int(lengths[0]))
        n_dups = np.zeros(req.n, np.int64)
        below: int | None = len(req.codes.chunks)   # every cell a chunk code: 0 .. len(chunks) - 1
    else:
        grid, kept_len, n_dups = _ragged_grid(req, scored, k_max)
        below = None
    top, n_dup = _first_k_distinct(grid, k_max, below)
    n_dups += n_dup
    top[~scored] = -1
    n_dups[~scored] = 0
    return _Lists(top=top, n_returned=kept_len - n_dups, n_duplicates=n_dups)


def _ragged_grid(req: _Requests, scored: np.ndarray, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The returned chunks of the scored requests as rows of a grid, when lists differ in
    length: (grid, chunks returned per request, repeats already removed per request).

    Cells past a list's end hold distinct negative values (never taken for a repeat). When
    requests x longest list exceeds 4 cells per returned chunk + GRID_SLACK (a few very long
    lists among short ones), repeats are removed by hashing first and the grid is only
    ``k_max`` wide.
    """
    n_req = req.n
    rows = np.flatnonzero(np.repeat(scored, req.lengths) & req.has_chunk)
    rq = np.repeat(np.arange(n_req), req.lengths)[rows]
    chunk = req.chunk[rows]
    kept_len = np.bincount(rq, minlength=n_req)
    width = int(kept_len.max(initial=0))
    n_dups = np.zeros(n_req, np.int64)
    if n_req * width > 4 * len(rows) + GRID_SLACK:
        # a few very long lists among short ones: remove repeats by hashing, keep each request's first K_max
        cell = rq.astype(np.int64) * max(len(req.codes.chunks), 1) + chunk
        dup = pd.Series(cell).duplicated(keep="first").to_numpy()
        n_dups = np.bincount(rq[dup], minlength=n_req)
        rq, chunk = rq[~dup], chunk[~dup]
        width = k_max
    n_k = np.bincount(rq, minlength=n_req)
    col = np.arange(len(rq)) - np.repeat(np.cumsum(n_k) - n_k, n_k)
    near = col < width
    pad = -1 - np.arange(width, dtype=np.int64)  # distinct padding: never taken for a repeat
    grid = np.broadcast_to(pad, (n_req, width)).astype(np.promote_types(req.chunk.dtype, np.int32))
    grid[rq[near], col[near]] = chunk[near]
    return grid, kept_len, n_dups


# -- 5. grades and metrics -----------------------------------------------------------------


def _metric_values(req: _Requests, sel: _Selection, top: np.ndarray, testset: TestSet,
                   mets: list[Metric], lab: _Relevance | None = None) -> dict[str, np.ndarray]:
    """Step 5: each metric's value for every scored request (in request order); ``lab``: the test
    set's :class:`_Relevance` (computed here when not given).

    Every metric sums over relevant cells only (a grade-0 cell adds nothing), so only they
    go on to the kernels, each with its 1-based position among its request's distinct chunks.
    """
    lab = lab if lab is not None else _Relevance.of(testset)
    c_in_lab = np.append(_index_in(req.codes.chunks, lab.chunks), -1)  # the last slot serves -1
    top_lab = c_in_lab[top]
    key = sel.ts_query[:, None].astype(np.int64) * max(len(lab.chunks), 1) + top_lab
    key[top_lab < 0] = -1  # never a label key
    grade = _lookup(key.ravel(), lab.keys, lab.grades).reshape(top.shape)
    cell_req, cell_col = np.nonzero(grade >= 1)  # row-major: by request, then position
    sc = np.flatnonzero(sel.scored)  # scored requests, renumbered 0..n_sc-1
    new_id = np.full(req.n, -1)
    new_id[sc] = np.arange(len(sc))
    rl = RankedLists(req=new_id[cell_req], pos=cell_col + 1, grade=grade[cell_req, cell_col], n_req=len(sc),
                     req_query=sel.ts_query[sc], n_q=len(testset.queries), n_rel=lab.n_rel, ideal_q=lab.ideal_q,
                     ideal_pos=lab.ideal_pos, ideal_grade=lab.ideal_grade)
    if any(m.family in NEEDS_ALL_LABELS for m in mets):
        judged_req, judged_pos = _labelled_cells(req, sel, top, testset)
        rl = replace(rl, judged_req=new_id[judged_req], judged_pos=judged_pos,
                     n_distinct=(top[sc] >= 0).sum(axis=1))
    return {m.name: compute(rl, m) for m in mets}


def _labelled_cells(req: _Requests, sel: _Selection, top: np.ndarray, testset: TestSet
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The cells of ``top`` whose chunk carries a label for its query, grade 0 included, as
    (request, 1-based position), row-major: what label coverage (``judged@K``) counts."""
    qrels = testset.qrels
    q = _index_in(_text(qrels["query_id"]), testset.queries["query_id"])
    enc = pc.dictionary_encode(_text(qrels["chunk_id"]))
    chunks = enc.dictionary.to_numpy(zero_copy_only=False)
    width = max(len(chunks), 1)
    labelled = np.unique(q * width + enc.indices.to_numpy().astype(np.int64))
    top_lab = np.append(_index_in(req.codes.chunks, chunks), -1)[top]
    key = sel.ts_query[:, None].astype(np.int64) * width + top_lab
    key[top_lab < 0] = -1  # never a label key
    found = _lookup(key.ravel(), labelled, np.ones(len(labelled), np.int8)).reshape(top.shape)
    cell_req, cell_col = np.nonzero(found)
    return cell_req, cell_col + 1


# -- 6. tables, counts, warnings ------------------------------------------------------------


def _requests_table(req: _Requests, sel: _Selection, lists: _Lists, values: dict[str, np.ndarray],
                    ts_q: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The requests table: every request in (query, stage, repeat) code order whatever the
    order of the file, then the missing ones; and ``values`` put in the same order."""
    if req.n > 1 and np.any(req.key[1:] < req.key[:-1]):
        by_key: np.ndarray | slice = np.argsort(req.key, kind="stable")
        at_sc = np.argsort(req.key[sel.scored], kind="stable")
        values = {k: v[at_sc] for k, v in values.items()}
    else:
        by_key = slice(None)
    requests = pd.DataFrame({
        "query_id": req.codes.queries[req.r_query],
        "stage": req.codes.stages[req.r_stage],
        "repeat": req.repeats[req.r_repeat],
        "status": sel.status,
        "scored": sel.scored,
        "reason": sel.reason,
        "n_returned": lists.n_returned,
        "n_duplicates": lists.n_duplicates,
        "latency_ms": req.latency(),
    }).iloc[by_key].reset_index(drop=True)
    missing = _missing_requests(req, sel, ts_q)
    if missing is not None:
        requests = pd.concat([requests, missing], ignore_index=True)
    requests["repeat"] = requests["repeat"].astype(np.int64)
    return requests, values


def _missing_requests(req: _Requests, sel: _Selection, ts_q: pd.DataFrame) -> pd.DataFrame | None:
    """Requests rows (status ``missing``) for the valid queries absent from a (stage, repeat)
    that the run has, in the order the combinations first appear; None when there are none."""
    ts_valid = ts_q["valid"].to_numpy(dtype=bool)
    combo = req.r_stage.astype(np.int64) * req.n_rep + req.r_repeat
    combos, first, combo_of_req = np.unique(combo, return_index=True, return_inverse=True)
    if not len(combos) or not ts_valid.any():
        return None
    seen = np.zeros((len(combos), len(ts_q)), bool)
    seen[combo_of_req[sel.known], sel.ts_query[sel.known]] = True
    at = np.argsort(first, kind="stable")
    m_combo, m_q = np.nonzero(~seen[at] & ts_valid)
    if not len(m_combo):
        return None
    m_combo = at[m_combo]
    return pd.DataFrame({
        "query_id": ts_q["query_id"].to_numpy()[m_q], "stage": req.codes.stages[combos[m_combo] // req.n_rep],
        "repeat": req.repeats[combos[m_combo] % req.n_rep], "status": "missing", "scored": False,
        "reason": "missing: not collected", "n_returned": 0, "n_duplicates": 0, "latency_ms": np.nan})


def _per_query_table(requests: pd.DataFrame, values: dict[str, np.ndarray], names: list[str], *,
                     has_latency: bool) -> pd.DataFrame:
    """One row per scored request: ids, one column per metric, list counts, latency (when
    the results carry it)."""
    per_query = requests.loc[requests["scored"], ["query_id", "stage", "repeat", "n_returned", "n_duplicates",
                                                  "latency_ms"]].reset_index(drop=True)
    for name, v in values.items():
        per_query[name] = v
    if not has_latency:
        per_query = per_query.drop(columns="latency_ms")
    return per_query[["query_id", "stage", "repeat", *names,
                      *[c for c in ("n_returned", "n_duplicates", "latency_ms") if c in per_query]]]


def _excluded_table(ts_q: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """What no mean includes: the invalid queries (stage and repeat empty), then every
    request not scored for another reason (failed, missing, unknown query)."""
    inv = ts_q.loc[~ts_q["valid"], ["query_id"]].assign(stage=None, repeat=pd.NA, reason=_INVALID)
    not_scored = requests.loc[~requests["scored"] & requests["reason"].notna()
                              & ~requests["reason"].astype(str).str.startswith("invalid"),
                              ["query_id", "stage", "repeat", "reason"]]
    excluded = pd.concat([inv, not_scored], ignore_index=True) if len(not_scored) else inv.reset_index(drop=True)
    excluded["repeat"] = excluded["repeat"].astype("Int64")
    return excluded


def _by_repeat_table(per_query: pd.DataFrame, names: list[str], stage_order: list[str]) -> pd.DataFrame:
    """Mean of each metric per (stage, repeat) and the requests scored, stages in
    ``stage_order`` then repeats ascending."""
    g = per_query.groupby(["stage", "repeat"], sort=False)
    by_repeat = g[names].mean().join(g.size().rename("n_scored")).reset_index()
    by_repeat = by_repeat[["stage", "repeat", "n_scored", *names]]
    by_repeat["_o"] = by_repeat["stage"].map({s: i for i, s in enumerate(stage_order)})
    return by_repeat.sort_values(["_o", "repeat"]).drop(columns="_o").reset_index(drop=True)


def _queries_per_stage(req: _Requests, scored: np.ndarray) -> dict[str, int]:
    """Distinct queries with a scored request, per stage name."""
    sc = np.flatnonzero(scored)
    n_q = max(len(req.codes.queries), 1)
    key = req.r_stage[sc].astype(np.int64) * n_q + req.r_query[sc]
    if len(req.codes.stages) * n_q <= 1 << 26:   # a mark per (stage, query): no sort
        seen = np.zeros(max(len(req.codes.stages), 1) * n_q, bool)
        seen[key] = True
        n = seen.reshape(-1, n_q).sum(axis=1)
        stage = np.flatnonzero(n)
        n = n[stage]
    else:
        stage, n = np.unique(np.unique(key) // n_q, return_counts=True)
    return {req.codes.stages[k]: int(v) for k, v in zip(stage, n, strict=True)}


def _summary_table(by_repeat: pd.DataFrame, n_queries: dict[str, int], names: list[str], stage_order: list[str],
                   domain_adjustment: float) -> pd.DataFrame:
    """One row per (stage, metric) of a stage with a scored request: mean of the repeat
    means, their std (ddof 1; 0 for one repeat), min and max, the repeats, the queries
    scored and the tier of the mean."""
    rows = []
    for stage in stage_order:  # stages x metrics: a few dozen rows at most
        br = by_repeat[by_repeat["stage"] == stage]
        if br.empty:
            continue
        for m in names:
            v = br[m].to_numpy()
            mean = float(v.mean())
            rows.append({
                "stage": stage, "metric": m, "mean": mean,
                "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                "min": float(v.min()), "max": float(v.max()),
                "n_repeats": len(v), "n_queries": int(n_queries.get(stage, 0)),
                "tier": tier(m, mean, domain_adjustment),
            })
    return pd.DataFrame(rows, columns=["stage", "metric", "mean", "std", "min", "max", "n_repeats", "n_queries",
                                       "tier"])


def _counts(ts_q: pd.DataFrame, requests: pd.DataFrame, sel: _Selection, lists: _Lists, n_expanded: int,
            stage_order: list[str], repeats: np.ndarray) -> Counts:
    """The :class:`Counts` of the test set and of the requests table."""
    status_counts = requests["status"].value_counts()
    failed_kinds = {k: int(v) for k, v in status_counts.items() if k not in ("ok", "missing")}
    return Counts(
        n_queries=int(len(ts_q)),
        n_valid=int(ts_q["valid"].sum()),
        n_invalid=int((~ts_q["valid"]).sum()),
        invalid_ids=ts_q.loc[~ts_q["valid"], "query_id"].tolist(),
        n_requests=int(len(requests)),
        n_scored=int(requests["scored"].sum()),
        n_failed=int(sum(failed_kinds.values())),
        failed_by_kind=failed_kinds,
        n_missing=int((requests["status"] == "missing").sum()),
        n_unknown_query=int((~sel.known).sum()),
        n_duplicates_removed=int(lists.n_duplicates.sum()),
        n_sub_chunks_expanded=int(n_expanded),
        stages=list(stage_order),
        repeats=[int(x) for x in repeats],
    )


def _warnings(counts: Counts, domain_adjustment: float) -> list[str]:
    """The plain-words warnings every report shows (each also logged at INFO): too few valid
    queries, invalid queries, an incomplete run (or one where nothing was scored), duplicates
    removed, lowered thresholds."""
    warnings = []
    significance = significance_warning(counts.n_valid)
    if significance:
        warnings.append(significance)
    if counts.n_invalid:
        warnings.append(f"{counts.n_invalid} invalid queries (no chunk of grade >= 1) are excluded from every mean.")
    if counts.incomplete_reason in (NO_ROWS, NO_TESTSET_ROW):
        warnings.append(f"The run is incomplete: {counts.incomplete_reason}, so nothing was scored.")
    elif not counts.complete:
        warnings.append(f"The run is incomplete: {counts.n_failed} failed, {counts.n_missing} missing and "
                        f"{counts.n_unknown_query} unknown-query requests are excluded from the means.")
    if counts.n_duplicates_removed:
        warnings.append(f"{counts.n_duplicates_removed} duplicate chunk ids were removed (first position kept).")
    if domain_adjustment:
        warnings.append(f"Acceptance thresholds lowered by {domain_adjustment:.0%} for a specialised domain.")
    for w in warnings:
        log.info(w)
    return warnings
