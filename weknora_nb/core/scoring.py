"""Score a results table against a test set (docs/method.md sections 2-3).

:func:`score` runs these steps, all vectorised (no Python loop over queries), on integer
codes (:class:`~weknora_nb.core.codes.ResultCodes`; a Parquet path is read straight into
them):

1. group rows into requests (:func:`~weknora_nb.core.requests.prepare`): runs of equal (query, stage,
   repeat); rows are sorted only when a request's rows lie apart or out of rank order;
2. check structure (there too): one status per request, no rank given twice;
3. set aside what is not scored, with the reason (:func:`_select`): invalid queries (no
   grade >= 1), failed requests (status other than ``ok``), requests of unknown query ids;
   valid queries missing from a stage/repeat that other queries have are added as
   ``missing`` requests in step 6;
4. lay the requests out as rows of a grid (:mod:`weknora_nb.core.requests`); rows holding a
   repeated chunk id are found by sorting each row, and every row keeps its first K_max
   distinct chunk ids (first position kept, ranks closed up, duplicates counted over the
   whole list);
5. look up the grades (>= 1 only: grade 0 adds nothing; :func:`_grades`) and compute every metric
   (:func:`_ranked_lists`, then :func:`~weknora_nb.core.metrics.compute`);
6. the tables: requests (missing requests included), per_query, excluded, by_repeat,
   summary; then the counts and the warnings.

System figure = mean over scored requests of a (stage, repeat); the stage figure is
the mean of its repeat figures, with their spread (std, min, max).

Steps 1, 2 and 4 need no test set (:mod:`weknora_nb.core.requests`: the results' side, every request's list
laid out as if it were scored; step 3 then empties those not scored). Two cores: the test set's labels
(:class:`_Relevance`) are prepared in a second thread while the results are read and grouped
(Arrow and numpy work without the interpreter lock). :func:`score_files` does the whole results'
side in a thread while the test set loads, and hashes the test set while scoring.
:meth:`Scores.to_json_bytes` writes ``--json`` with orjson, the per-query rows as Arrow
strings; :meth:`Scores.write_per_query` writes them to a file instead (``--per-query-out``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from weknora_nb.core.codes import ResultCodes, in_background
from weknora_nb.core.errors import ResultsError, UsageError, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.metrics import NEEDS_ALL_LABELS, Metric, RankedLists, compute, parse_metrics
from weknora_nb.core.pipeline import significance_warning
from weknora_nb.core.pipeline import stage_order as _stage_order
from weknora_nb.core.requests import Lists, Prepared, Requests, prepare
from weknora_nb.core.results import expand_sub_chunks, read_results_for_scoring
from weknora_nb.core.testset import TestSet, _json_inner, _string_bytes, load_testset
from weknora_nb.core.tiers import check_domain_adjustment, tier

__all__ = ["Counts", "Scores", "score", "score_files", "result_codes"]


log = logging.getLogger(__name__)

#: the values ``score(..., sub_chunks=...)`` accepts
SUB_CHUNKS = ("expand", "ignore")

_INVALID = "invalid query (no chunk of grade >= 1)"


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
        return b"".join(self.json_pieces(per_query=per_query, indent=indent))

    def json_pieces(self, *, per_query: bool = True, indent: bool = True) -> list[bytes | memoryview]:
        """:meth:`to_json_bytes` in pieces, to be written one after another (``writelines``): the per-query
        rows are not copied once more into one text."""
        import orjson

        head = orjson.dumps(self.to_json_dict(per_query=False), option=orjson.OPT_INDENT_2 if indent else 0)
        if not per_query:
            return [head]
        rows = _per_query_json(self.per_query_mean(), self.metric_names, indent=indent)
        if indent:   # the head ends with "\n}"
            return [memoryview(head)[:-2], b',\n  "per_query": ', *rows, b"\n}"]
        return [memoryview(head)[:-1], b',"per_query":', *rows, b"}"]

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


#: rows of ``--json``'s per-query array from which its text is built in two halves at once (:func:`_per_query_json`)
JSON_HALVES_FROM = 20_000


def _per_query_json(table: pd.DataFrame, names: list[str], *, indent: bool,
                    lines: bool = False) -> list[bytes | memoryview]:
    """The rows of :meth:`Scores.per_query_mean` as the JSON array of ``--json`` (``indent``: laid out as
    ``json.dumps(indent=2)`` lays out a list in the top object; ``lines``: one compact object a line
    instead), built column by column with Arrow: numbers in their shortest round-trip form, a missing
    value as null. The text comes in pieces, to be joined or written. From :data:`JSON_HALVES_FROM` rows the
    second half's text is built in a thread beside the first's (Arrow joins the pieces without the interpreter
    lock): 100,000 rows of 9 metrics, 0.053 -> 0.036 s."""
    if not len(table):
        return [] if lines else [b"[]"]
    if indent:
        opener, sep, closer, between = "\n    {\n      ", ",\n      ", "\n    }", ","
    else:
        opener, sep, closer, between = "{", ",", "}", "\n" if lines else ","
    keys = ["query_id", "stage", "n_repeats", *names]
    # ids without their quotes (the quotes go with the text around them), numbers as they are
    ids, stages = _text(table["query_id"]), _text(table["stage"])
    numbers = [table["n_repeats"].to_numpy(np.int64), *[table[m].to_numpy(np.float64) for m in names]]
    texts: list[str] = []
    for i, key in enumerate(keys):
        before = opener if i == 0 else '"' + sep if i in (1, 2) else sep   # the ids' closing quotes, after them
        texts.append(before + _json_key(key) + (": " if indent else ":") + ('"' if i < 2 else ""))

    def rows(lo: int, hi: int) -> bytes | memoryview:
        """The text of rows ``lo`` .. ``hi``, each followed by ``between``."""
        values = [_json_inner(ids.slice(lo, hi - lo)), _json_inner(stages.slice(lo, hi - lo)),
                  *[_json_numbers(v[lo:hi]) for v in numbers]]
        parts = [x for text, value in zip(texts, values, strict=True) for x in (text, value)] + [closer + between]
        return _string_bytes(pc.binary_join_element_wise(
            *[pa.scalar(x, pa.large_string()) if isinstance(x, str) else x for x in parts],
            pa.scalar("", pa.large_string())))

    n = len(table)
    if n < max(JSON_HALVES_FROM, 2):
        bodies = [rows(0, n)]
    else:
        second = in_background(lambda: rows(n // 2, n), "weknora-nb-json")
        bodies = [rows(0, n // 2), second.result()]
    bodies[-1] = memoryview(bodies[-1])[:-len(between)]
    return [*bodies, b"\n"] if lines else [b"[", *bodies, b"\n  ]" if indent else b"]"]


def _json_key(key: str) -> str:
    """A key as JSON text, quoted."""
    import orjson

    return orjson.dumps(key).decode()


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
    data = raw[raw != 44]
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


class _KeyTable:
    """Integer keys (sorted, unique) and their values, to look many keys up at once (:meth:`get`).

    Most keys looked up are usually absent, so a hashed byte filter (one multiply and one gather per key),
    built once with the table, sets them aside before the exact binary search runs on the few candidates.
    """

    _MULT = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, keys: np.ndarray, values: np.ndarray):
        self.keys, self.values = keys, values
        bits = int(min(26, max(16, np.ceil(np.log2(max(len(keys), 1) * 16)))))
        self.shift = np.uint64(64 - bits)
        self.filter = np.zeros(1 << bits, dtype=np.bool_)
        self.filter[self._slots(keys)] = True

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Each key's slot in the filter: its 64 bits times an odd constant, the top bits kept (one temporary)."""
        h = (keys.view(np.uint64) if keys.dtype == np.int64 else keys.astype(np.uint64)) * self._MULT
        h >>= self.shift
        return h

    def get(self, keys: np.ndarray, default: int = 0) -> np.ndarray:
        """The value of each of ``keys`` in the table, else ``default``."""
        out = np.full(len(keys), default, dtype=self.values.dtype)
        if not len(self.keys) or not len(keys):
            return out
        cand = np.flatnonzero(self.filter[self._slots(keys)])
        wanted = keys[cand]
        at = np.minimum(np.searchsorted(self.keys, wanted), len(self.keys) - 1)
        found = self.keys[at] == wanted
        out[cand[found]] = self.values[at[found]]
        return out


def _lookup(keys: np.ndarray, table_keys: np.ndarray, table_values: np.ndarray, default: int = 0) -> np.ndarray:
    """``table_values`` at the position of each of ``keys`` in ``table_keys`` (sorted, unique), else ``default``
    (:class:`_KeyTable`)."""
    return _KeyTable(table_keys, table_values).get(keys, default)


@dataclass
class _Relevance:
    """The labels scoring needs, as integer keys: grade >= 1 only (grade 0 adds nothing anywhere)."""

    chunks: np.ndarray      # distinct chunk ids with a grade >= 1 somewhere
    grades: _KeyTable       # query_index * len(chunks) + chunk_index -> grade (int8)
    n_rel: np.ndarray       # per test-set query: chunks of grade >= 1
    ideal_q: np.ndarray     # the ideal rankings (grades descending), flattened
    ideal_pos: np.ndarray
    ideal_grade: np.ndarray

    @classmethod
    def of(cls, testset: TestSet) -> _Relevance:
        qrels = testset.qrels
        g = qrels["grade"].to_numpy()
        rel = g >= 1
        q = testset.label_rows[rel]
        g = g[rel].astype(np.int8)
        enc = pc.dictionary_encode(_text(qrels["chunk_id"]).filter(pa.array(rel)))
        c_code, chunks = enc.indices.to_numpy().astype(np.int64), enc.dictionary.to_numpy(zero_copy_only=False)
        keys = q * max(len(chunks), 1) + c_code
        order = np.argsort(keys, kind="stable")
        ideal = np.argsort(q * 4 + (3 - g), kind="stable")
        ideal_q = q[ideal]
        n_rel = np.bincount(q, minlength=len(testset.queries))
        first = np.cumsum(n_rel) - n_rel
        return cls(chunks, _KeyTable(keys[order], g[order]), n_rel, ideal_q,
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


# -- what passes between the steps --------------------------------------------------------


@dataclass
class _Selection:
    """Which requests are scored (step 3), and why the others are not."""

    ts_query: np.ndarray  # each request's query as a row of the test set, -1 when unknown
    status: np.ndarray    # each request's status name
    known: np.ndarray     # the test set holds the query
    scored: np.ndarray    # ok, of a known and valid query
    reason: np.ndarray    # why a request is not scored (None when scored)


def _prepare(results: pd.DataFrame | ResultCodes | str | os.PathLike, sub_chunks: str, source: str | None,
             stages: Iterable[str] | None, k_max: int) -> Prepared:
    """Read ``results`` (:func:`_read`), then the results' side of scoring (:func:`~weknora_nb.core.requests.prepare`:
    stages kept, requests grouped and checked, each request's first ``k_max`` distinct chunks laid out)."""
    rc, n_expanded, source = _read(results, sub_chunks, source)
    return prepare(rc, source, stages, k_max, n_expanded)


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
    with ThreadPoolExecutor(1, thread_name_prefix="weknora-nb-scoring") as pool:
        labels = pool.submit(_Relevance.of, testset)   # the test set's side, beside the results' (Arrow, numpy)
        rc, n_expanded, source = _read(results, sub_chunks, source)
        positions = pool.submit(lambda: _Positions.find(rc.queries, rc.chunks, testset, labels, None))
        prepared = prepare(rc, source, stages, _k_max(mets), n_expanded, pool)   # beside the positions
        return _score_prepared(testset, prepared, mets, labels, domain_adjustment, pool, positions)


def _score_prepared(testset: TestSet, prepared: Prepared, mets: list[Metric], labels: Future[_Relevance],
                    domain_adjustment: float, pool: Executor, positions: Future[_Positions] | None = None) -> Scores:
    """Steps 3, 5 and 6 of :func:`score`: what needs the test set, given the results' side (:func:`_prepare`) and
    the labels being prepared by ``pool`` (step 3 runs beside them). Two threads share step 5 with step 6: the
    grades of the first half of the requests are looked up in ``pool`` while this thread builds the requests
    table (pandas) and then looks up the second half's; the metrics are computed in ``pool`` while this thread
    builds the tables and counts that need no metric. ``pool`` runs its tasks in turn, the labels' first.
    ``positions``: :class:`_Positions` of the results' queries and chunks, begun earlier (beside
    :func:`~weknora_nb.core.requests.prepare`), else found here."""
    req, stages = prepared.requests, prepared.stages
    pos = positions.result() if positions is not None else None
    if pos is None or not pos.serves(req):
        pos = _Positions.find(req.queries, req.chunks, testset, labels, pool)
    sel = _select(req, testset, pos.in_testset)
    lists = prepared.lists.only(sel.scored)
    top, half = lists.top, len(lists.top) // 2
    first = pool.submit(lambda: _grades(top[:half], sel.ts_query[:half], pos.in_labels.result(), labels.result()))
    requests, at_scored = _requests_table(req, sel, lists, testset.queries, pos.query_text)
    second = _grades(top[half:], sel.ts_query[half:], pos.in_labels.result(), labels.result())
    grade = np.concatenate([first.result(), second])
    ranked = pool.submit(lambda: _ranked_lists(req, sel, top, grade, testset, mets, labels.result()))
    computed = pool.submit(lambda: {m.name: compute(ranked.result(), m) for m in mets[::2]})
    excluded = _excluded_table(testset.queries, requests)
    stage_order = stages if stages is not None else _stage_order(_stages_seen(req.stages, req.r_stage))
    counts = _counts(testset.queries, requests, sel, lists, prepared.n_expanded, stage_order, req.repeats)
    warnings = _warnings(counts, domain_adjustment)
    scored = _scored_rows(requests, has_latency=req.latency is not None)
    values = {m.name: compute(ranked.result(), m) for m in mets[1::2]} | computed.result()
    values = values if at_scored is None else {k: v[at_scored] for k, v in values.items()}
    names = [m.name for m in mets]
    per_query = _per_query_table(scored, values, names)
    by_repeat = _by_repeat_table(per_query, names, stage_order)
    summary = _summary_table(by_repeat, _queries_per_stage(req, sel.scored), names, stage_order,
                             domain_adjustment)
    return Scores(metrics=mets, per_query=per_query, requests=requests, excluded=excluded, by_repeat=by_repeat,
                  summary=summary, counts=counts, testset=testset, warnings=warnings,
                  domain_adjustment=domain_adjustment)


def _stages_seen(stages: np.ndarray, codes: np.ndarray) -> list[str]:
    """The names of the stages ``codes`` refers to, in the order they first appear: a pass per distinct stage,
    not a Python loop over the requests."""
    present = np.flatnonzero(np.bincount(codes, minlength=len(stages))) if len(codes) else np.zeros(0, np.intp)
    first = [int(np.argmax(codes == c)) for c in present]
    return [str(stages[c]) for _, c in sorted(zip(first, present, strict=True))]


def _k_max(mets: list[Metric]) -> int:
    """The longest prefix of a list any of ``mets`` reads."""
    return max(m.k for m in mets)


def score_files(testset: str | os.PathLike, results: str | os.PathLike,
                metrics: Iterable[str | Metric] | str | None = None, *, stages: Iterable[str] | None = None,
                domain_adjustment: float = 0.0, sub_chunks: str = "expand") -> Scores:
    """:func:`score` of a results file against a test-set file (:func:`~weknora_nb.load_testset`), with the
    same checks and errors in the same order, using a second core: the results file is read, grouped into
    requests and checked, and each request's distinct list laid out, in a second thread while the test set
    loads (none of it needs the test set, and it is Arrow and numpy work, which leaves the first thread free);
    the test set's hash (:attr:`Scores.testset_hash`) is computed beside the scoring."""
    mets = _check_options(metrics, domain_adjustment, sub_chunks)
    stages = None if stages is None else list(stages)
    path = Path(results)
    with ThreadPoolExecutor(2, thread_name_prefix="weknora-nb-files") as pool:
        prepared = in_background(lambda: _prepare(path, sub_chunks, str(path), stages, _k_max(mets)),
                                 "weknora-nb-results")   # while the test set loads
        ts = load_testset(Path(testset))
        digest = pool.submit(lambda: ts.hash)
        labels = pool.submit(_Relevance.of, ts)
        sc = _score_prepared(ts, prepared.result(), mets, labels, domain_adjustment, pool)
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


#: the columns of a results table its codes are made of (:meth:`ResultCodes.from_frame`), and the one unfolding reads
_CODE_COLUMNS = frozenset({"query_id", "stage", "repeat", "rank", "chunk_id", "status", "latency_ms", "sub_chunk_ids"})


def result_codes(results: pd.DataFrame, *, source: str = "<results>") -> ResultCodes:
    """A results table as the codes :func:`score` scores: merged results unfolded (:func:`expand_sub_chunks`,
    their number in :attr:`ResultCodes.unfolded`), rows checked (a :class:`ResultsError` naming ``source``).
    Scoring the codes again and again skips both steps: what a :class:`~weknora_nb.core.run.Run` keeps. Only the
    columns the codes are made of are unfolded (the other columns' rows are not made)."""
    expanded, n_expanded = expand_sub_chunks(results[[c for c in results.columns if c in _CODE_COLUMNS]])
    rc = _checked_codes(expanded, source)
    rc.unfolded = n_expanded
    return rc


def _checked_codes(results: pd.DataFrame, source: str) -> ResultCodes:
    rc = ResultCodes.from_frame(results)
    bad = rc.check(source)  # a table built by hand gets read_results's row checks too (reductions: cheap)
    if bad:
        raise ResultsError(source, bad)
    return rc


# -- 3. what is scored ---------------------------------------------------------------------


def _select(req: Requests, testset: TestSet, q_in_ts: np.ndarray) -> _Selection:
    """Step 3: a request is scored when its status is ``ok`` and its query is a valid query
    of the test set; the reason of every other request (unknown query id, invalid query,
    ``failed: <kind>``). ``q_in_ts``: :attr:`_Positions.in_testset`."""
    ts_q = testset.queries
    ts_valid = ts_q["valid"].to_numpy(dtype=bool)
    r_ts = q_in_ts[req.r_query]
    r_st = req.status
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


# -- 5. grades and metrics -----------------------------------------------------------------


@dataclass
class _Positions:
    """Where the results' distinct queries and chunks stand on the test set's side, each array with a last slot
    -1 that code -1 (none) reads: ``in_testset``, each query's row in the test set (-1: unknown);
    ``in_labels``, each chunk's position among the labels' chunks (:attr:`_Relevance.chunks`; -1: no label of
    grade >= 1). ``queries`` and ``chunks``: the arrays they were found for; ``query_text``: ``queries`` as
    Arrow text (what the requests table is built from)."""

    queries: np.ndarray
    chunks: np.ndarray
    in_testset: np.ndarray
    in_labels: Future[np.ndarray]
    query_text: pa.Array

    @classmethod
    def find(cls, queries: np.ndarray, chunks: np.ndarray, testset: TestSet, labels: Future[_Relevance],
             pool: Executor | None) -> _Positions:
        """The queries' positions found in this thread; the chunks' (which wait for the labels) in ``pool``, or
        here when None."""
        text = _text(queries)
        in_testset = np.append(_index_in(text, testset.queries["query_id"]), -1)

        def in_labels() -> np.ndarray:
            return np.append(_index_in(chunks, labels.result().chunks), -1)

        found: Future[np.ndarray] = pool.submit(in_labels) if pool is not None else Future()
        if pool is None:
            found.set_result(in_labels())
        return cls(queries, chunks, in_testset, found, text)

    def serves(self, req: Requests) -> bool:
        """Whether these are the positions of ``req``'s queries and chunks (the same arrays)."""
        return self.queries is req.queries and self.chunks is req.chunks


def _grades(top: np.ndarray, ts_query: np.ndarray, labelled: np.ndarray, lab: _Relevance) -> np.ndarray:
    """The grade (>= 1, else 0) of every cell of ``top`` (rows of chunk codes, -1 past a list's end), each row a
    request of test-set query ``ts_query`` (-1: not in the test set); ``labelled``: what
    :attr:`_Positions.in_labels` gives."""
    top_lab = labelled[top]
    key = ts_query[:, None].astype(np.int64) * max(len(lab.chunks), 1) + top_lab
    key[top_lab < 0] = -1  # never a label key
    return lab.grades.get(key.ravel()).reshape(top.shape)


def _ranked_lists(req: Requests, sel: _Selection, top: np.ndarray, grade: np.ndarray, testset: TestSet,
                  mets: list[Metric], lab: _Relevance) -> RankedLists:
    """Step 5: what the metric kernels (:func:`~weknora_nb.core.metrics.compute`) read of every scored request
    (in request order), given the grade of every cell of ``top`` (:func:`_grades`) and the test set's
    :class:`_Relevance`; with the labelled cells when one of ``mets`` needs them.

    Every metric sums over relevant cells only (a grade-0 cell adds nothing), so only they
    go on to the kernels, each with its 1-based position among its request's distinct chunks.
    """
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
    return rl


def _labelled_cells(req: Requests, sel: _Selection, top: np.ndarray, testset: TestSet
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The cells of ``top`` whose chunk carries a label for its query, grade 0 included, as
    (request, 1-based position), row-major: what label coverage (``judged@K``) counts."""
    qrels = testset.qrels
    q = testset.label_rows
    enc = pc.dictionary_encode(_text(qrels["chunk_id"]))
    chunks = enc.dictionary.to_numpy(zero_copy_only=False)
    width = max(len(chunks), 1)
    labelled = np.unique(q * width + enc.indices.to_numpy().astype(np.int64))
    top_lab = np.append(_index_in(req.chunks, chunks), -1)[top]
    key = sel.ts_query[:, None].astype(np.int64) * width + top_lab
    key[top_lab < 0] = -1  # never a label key
    found = _lookup(key.ravel(), labelled, np.ones(len(labelled), np.int8)).reshape(top.shape)
    cell_req, cell_col = np.nonzero(found)
    return cell_req, cell_col + 1


# -- 6. tables, counts, warnings ------------------------------------------------------------


def _requests_table(req: Requests, sel: _Selection, lists: Lists, ts_q: pd.DataFrame, query_text: pa.Array
                    ) -> tuple[pd.DataFrame, np.ndarray | None]:
    """The requests table: every request in (query, stage, repeat) code order whatever the
    order of the file, then the missing ones; and the order that puts the scored requests' values
    (in request order) in the table's order (None: they are in it already). ``query_text``: ``req.queries``
    as Arrow text."""
    at_sc = None
    if req.n > 1 and np.any(req.key[1:] < req.key[:-1]):
        by_key: np.ndarray | slice = np.argsort(req.key, kind="stable")
        at_sc = np.argsort(req.key[sel.scored], kind="stable")
    else:
        by_key = slice(None)
    requests = pd.DataFrame({
        "query_id": query_text.take(req.r_query).to_pandas().array,
        "stage": _str_array(req.stages, req.r_stage),
        "repeat": req.repeats[req.r_repeat],
        "status": _str_array(req.statuses, req.status),
        "scored": sel.scored,
        "reason": _str_array(sel.reason),
        "n_returned": lists.n_returned,
        "n_duplicates": lists.n_duplicates,
        "latency_ms": req.latency if req.latency is not None else np.full(req.n, np.nan),
    }).iloc[by_key].reset_index(drop=True)
    missing = _missing_requests(req, sel, ts_q)
    if missing is not None:
        requests = pd.concat([requests, missing], ignore_index=True)
    requests["repeat"] = requests["repeat"].astype(np.int64)
    return requests, at_sc


def _str_array(values: np.ndarray, at: np.ndarray | None = None) -> pd.api.extensions.ExtensionArray:
    """Text (an object array of str, None where missing) as pandas' string array, ``values[at]`` when ``at`` is
    given: built through Arrow, the same dtype and values as pandas' own conversion of a column of Python
    strings, which takes 5-8x longer."""
    text = pa.array(values, pa.large_string())
    return (text if at is None else text.take(at)).to_pandas().array


def _missing_requests(req: Requests, sel: _Selection, ts_q: pd.DataFrame) -> pd.DataFrame | None:
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
        "query_id": ts_q["query_id"].to_numpy()[m_q], "stage": req.stages[combos[m_combo] // req.n_rep],
        "repeat": req.repeats[combos[m_combo] % req.n_rep], "status": "missing", "scored": False,
        "reason": "missing: not collected", "n_returned": 0, "n_duplicates": 0, "latency_ms": np.nan})


def _scored_rows(requests: pd.DataFrame, *, has_latency: bool) -> pd.DataFrame:
    """The requests table's scored rows, with what :func:`_per_query_table` shows of them besides the metrics:
    ids, list counts, latency (when the results carry it)."""
    counts = ["n_returned", "n_duplicates", *(["latency_ms"] if has_latency else [])]
    return requests.loc[requests["scored"], ["query_id", "stage", "repeat", *counts]].reset_index(drop=True)


def _per_query_table(scored: pd.DataFrame, values: dict[str, np.ndarray], names: list[str]) -> pd.DataFrame:
    """One row per scored request (:func:`_scored_rows`): ids, one column per metric, list counts, latency."""
    metrics = pd.DataFrame({name: values[name] for name in names}, index=scored.index)
    # joined once (a column inserted per metric copies the table's index and blocks each time)
    return pd.concat([scored[["query_id", "stage", "repeat"]], metrics, scored.iloc[:, 3:]], axis=1)


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


def _queries_per_stage(req: Requests, scored: np.ndarray) -> dict[str, int]:
    """Distinct queries with a scored request, per stage name."""
    sc = np.flatnonzero(scored)
    n_q = max(len(req.queries), 1)
    key = req.r_stage[sc].astype(np.int64) * n_q + req.r_query[sc]
    if len(req.stages) * n_q <= 1 << 26:   # a mark per (stage, query): no sort
        seen = np.zeros(max(len(req.stages), 1) * n_q, bool)
        seen[key] = True
        n = seen.reshape(-1, n_q).sum(axis=1)
        stage = np.flatnonzero(n)
        n = n[stage]
    else:
        stage, n = np.unique(np.unique(key) // n_q, return_counts=True)
    return {req.stages[k]: int(v) for k, v in zip(stage, n, strict=True)}


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


def _counts(ts_q: pd.DataFrame, requests: pd.DataFrame, sel: _Selection, lists: Lists, n_expanded: int,
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
