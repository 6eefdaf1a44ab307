"""Score a results table against a test set (METHOD.md sections 2-3).

The pipeline, all vectorised (no Python loop over queries), on integer codes
(:class:`~weknora_nb.results.ResultCodes`; a Parquet path is read straight into them):

1. group rows into requests: runs of equal (query, stage, repeat); rows are sorted
   only when a request's rows lie apart or out of rank order;
2. check structure: one status per request, no rank given twice;
3. set aside what is not scored, with the reason: invalid queries (no grade >= 1),
   failed requests (status other than ``ok``), requests of unknown query ids, and
   valid queries missing from a stage/repeat that other queries have;
4. lay the scored requests out as rows of a grid; rows holding a repeated chunk id are
   found by sorting each row, and every row keeps its first K_max distinct chunk ids
   (first position kept, ranks closed up, duplicates counted over the whole list);
5. look up the grades (>= 1 only: grade 0 adds nothing) and compute every metric.

System figure = mean over scored requests of a (stage, repeat); the stage figure is
the mean of its repeat figures, with their spread (std, min, max).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from weknora_nb.core.errors import Problem, ResultsError
from weknora_nb.core.metrics import Metric, RankedLists, compute, parse_metrics
from weknora_nb.core.pipeline import significance_warning
from weknora_nb.core.pipeline import stage_order as _stage_order
from weknora_nb.core.results import ResultCodes, expand_sub_chunks, read_results_for_scoring
from weknora_nb.core.testset import TestSet
from weknora_nb.core.tiers import tier

__all__ = ["Scores", "score"]


log = logging.getLogger(__name__)

#: padding cells a grid of requests x longest list may hold beyond 4 per row before the
#: long lists are cut to their first K_max distinct chunks by hashing instead
GRID_SLACK = 1_000_000


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
    counts : dict
        Test-set and run counts (see :meth:`counts`), never hidden.
    warnings : list of str
        Plain-words warnings every report must show.
    """

    metrics: list[Metric]
    per_query: pd.DataFrame
    requests: pd.DataFrame
    excluded: pd.DataFrame
    by_repeat: pd.DataFrame
    summary: pd.DataFrame
    counts: dict
    testset: TestSet = field(repr=False)
    warnings: list[str] = field(default_factory=list)
    domain_adjustment: float = 0.0

    @property
    def testset_hash(self) -> str:
        """Content hash of the test set scored against (computed when first asked for)."""
        return self.testset.hash

    @property
    def metric_names(self) -> list[str]:
        return [m.name for m in self.metrics]

    @property
    def stages(self) -> list[str]:
        return list(dict.fromkeys(self.summary["stage"]))

    @property
    def complete(self) -> bool:
        """False when any request failed, is missing, or names an unknown query."""
        return bool(self.counts["complete"])

    def summary_wide(self, value: str = "mean") -> pd.DataFrame:
        """Stages as rows, metrics as columns (in the order asked)."""
        wide = self.summary.pivot(index="stage", columns="metric", values=value)
        return wide.reindex(index=self.stages, columns=self.metric_names)

    def per_query_mean(self) -> pd.DataFrame:
        """Per (query, stage): each metric averaged over the query's scored repeats."""
        cols = self.metric_names
        g = self.per_query.groupby(["query_id", "stage"], sort=False, observed=True)
        out = g[cols].mean()
        out["n_repeats"] = g.size()
        return out.reset_index()

    def to_json_dict(self, *, per_query: bool = True) -> dict:
        """The ``weknora-nb score --json`` object."""
        wide = self.summary_wide()
        tiers = self.summary_wide("tier")
        if len(wide) == 1:
            summary = {m: _num(wide.iloc[0][m]) for m in wide.columns}
            tier_map = {m: _str(tiers.iloc[0][m]) for m in tiers.columns}
        else:
            summary = {s: {m: _num(wide.loc[s, m]) for m in wide.columns} for s in wide.index}
            tier_map = {s: {m: _str(tiers.loc[s, m]) for m in tiers.columns} for s in tiers.index}
        out = {
            "summary": summary,
            "tiers": tier_map,
            "spread": {f"{r.stage}/{r.metric}": {"std": _num(r.std), "min": _num(r.min), "max": _num(r.max)}
                       for r in self.summary.itertuples()},
            "counts": self.counts,
            "complete": self.complete,
            "warnings": self.warnings,
            "testset_hash": self.testset_hash,
            "domain_adjustment": self.domain_adjustment,
            "excluded": [
                {k: (None if pd.isna(v) else (int(v) if k == "repeat" else v)) for k, v in rec.items()}
                for rec in self.excluded.to_dict("records")
            ],
        }
        if per_query:
            pq = self.per_query_mean()
            out["per_query"] = [
                {"query_id": r["query_id"], "stage": r["stage"], "n_repeats": int(r["n_repeats"]),
                 **{m: _num(r[m]) for m in self.metric_names}}
                for r in pq.to_dict("records")
            ]
        return out


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def _str(x) -> str | None:
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


def _first_k_distinct(grid: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``grid`` (values >= 0, padding < 0): the first ``k`` distinct values
    in row order (padded with -1) and the number of repeated values in the row.

    A sorted copy of each row finds the rows holding a repeat; only those are argsorted
    to tell first occurrences from repeats, and compacted (lists are short, repeats rare).
    """
    n_rows, width = grid.shape
    top = np.maximum(grid[:, :k], -1)
    n_dup = np.zeros(n_rows, np.int64)
    if width < 2 or not n_rows:
        return top, n_dup
    # in blocks of rows: small temporaries are recycled instead of freshly mapped each time
    block = max(1, (1 << 21) // width)
    suspect = np.concatenate([
        np.unique(np.flatnonzero(np.diff(np.sort(grid[i:i + block], axis=1), axis=1) == 0) // (width - 1)) + i
        for i in range(0, n_rows, block)])
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
        Metric names (default :data:`weknora_nb.metrics.DEFAULT_METRICS`).
    stages : list of str, optional
        Keep only these stages (in this order).
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
    """
    mets = parse_metrics(metrics)
    tier(mets[0].name, 0.0, domain_adjustment)  # validates the adjustment early
    if sub_chunks not in ("expand", "ignore"):
        raise ValueError(f"sub_chunks must be 'expand' or 'ignore'. Got {sub_chunks!r} instead.")
    if isinstance(results, (str, os.PathLike)):
        source = source or str(results)
        results = read_results_for_scoring(results)
    source = source or "<results>"
    n_expanded = 0
    if isinstance(results, pd.DataFrame):
        if sub_chunks == "expand":
            results, n_expanded = expand_sub_chunks(results)
        rc = ResultCodes.from_frame(results)
        bad = rc.check(source)  # a table built by hand gets read_results's row checks too (reductions: cheap)
        if bad:
            raise ResultsError(source, bad)
    else:
        rc = results
    row_number = None  # position in rc -> 0-based row of the caller's table, when they differ
    if stages is not None:
        stages = list(stages)
        wanted = np.append(np.isin(rc.stages, stages), False)  # the last slot serves code -1
        keep = wanted[rc.stage]
        if not keep.all():
            row_number = np.flatnonzero(keep)
            rc = rc.take(row_number)
    n_rows = len(rc)

    # -- 1. requests: runs of rows with the same (query, stage, repeat) -----------------
    q, s, rep, rank, c = rc.query, rc.stage, rc.repeat, rc.rank, rc.chunk
    st, st_uni = rc.status, rc.statuses
    if n_rows and st.min() < 0:  # an empty status means ok
        if "ok" not in st_uni:
            st_uni = np.append(st_uni, "ok")
        st = np.where(st < 0, int(np.flatnonzero(st_uni == "ok")[0]), st)
    q_uni, s_uni = rc.queries, rc.stages
    order = None

    def runs(q, s, rep, rank):
        """Where each run of equal (query, stage, repeat) starts, the break mask, and whether
        ranks strictly increase within every run."""
        if not len(q):
            return np.zeros(0, np.int64), np.zeros(0, bool), True
        brk = q[1:] != q[:-1]
        for a in (s, rep):  # a constant column cannot break a run
            if a.min() != a.max():
                brk |= a[1:] != a[:-1]
        starts = np.r_[0, np.flatnonzero(brk) + 1]
        ordered = not np.any((rank[1:] <= rank[:-1]) > brk)
        return starts, brk, ordered

    starts, brk, ordered = runs(q, s, rep, rank)
    rep_uni, r_repc = np.unique(rep[starts], return_inverse=True)
    n_s, n_rep = max(len(s_uni), 1), max(len(rep_uni), 1)

    def request_keys(starts, r_repc):
        return (q[starts].astype(np.int64) * n_s + s[starts]) * n_rep + r_repc

    r_key = request_keys(starts, r_repc)
    if not ordered or (np.any(r_key[1:] <= r_key[:-1]) and len(np.unique(r_key)) != len(r_key)):
        # rows of a request are not together, or not in rank order: sort (row order kept for errors)
        row_req = np.repeat(r_key, np.diff(np.r_[starts, n_rows]))
        top_rank = int(rank.max(initial=0)) + 1
        if int(r_key.max(initial=0)) < (1 << 62) // top_rank:
            order = np.argsort(row_req * top_rank + rank, kind="stable")
        else:
            order = np.lexsort((rank, row_req))
        q, s, rep, rank, c, st = q[order], s[order], rep[order], rank[order], c[order], st[order]
        starts, brk, ordered = runs(q, s, rep, rank)
        r_repc = np.searchsorted(rep_uni, rep[starts])
        r_key = request_keys(starts, r_repc)

    def row_of(j: int) -> int:
        """1-based row number in the caller's table of sorted row j."""
        j = int(order[j]) if order is not None else int(j)
        return (int(row_number[j]) if row_number is not None else j) + 1

    n_req = len(starts)
    lengths = np.diff(np.r_[starts, n_rows])
    r_q, r_s = q[starts], s[starts]

    # -- 2. structure -------------------------------------------------------------------
    problems: list[Problem] = []
    if n_rows > 1 and st.min() != st.max():
        mixed = np.flatnonzero((st[1:] != st[:-1]) > brk) + 1
        for r in np.unique(np.searchsorted(starts, mixed, side="right") - 1)[:20]:
            problems.append(Problem(source, row_of(starts[r]), "status",
                                    f"request ({q_uni[r_q[r]]!r}, {s_uni[r_s[r]]!r}, repeat {rep_uni[r_repc[r]]}) "
                                    "has rows with different statuses", "row"))
    has_chunk = c >= 0
    if n_rows > 1 and not ordered:  # ranks within a request are not all increasing: a rank given twice?
        for j in (np.flatnonzero((rank[1:] == rank[:-1]) & ~brk & has_chunk[1:] & has_chunk[:-1]) + 1)[:20]:
            problems.append(Problem(source, row_of(j), "rank",
                                    f"rank {rank[j]} appears twice in request ({q_uni[q[j]]!r}, {s_uni[s[j]]!r})",
                                    "row"))
    if problems:
        raise ResultsError(source, problems)

    # -- 3. what is scored ---------------------------------------------------------------
    ts_q = testset.queries
    q_in_ts = np.append(_index_in(q_uni, ts_q["query_id"]), -1)  # the last slot serves code -1
    ts_valid = ts_q["valid"].to_numpy(dtype=bool)
    r_ts = q_in_ts[r_q]
    r_status = st_uni[st[starts]] if n_req else np.zeros(0, object)
    ok_label = np.flatnonzero(st_uni == "ok")
    r_ok = st[starts] == ok_label[0] if len(ok_label) else np.zeros(n_req, bool)
    r_known = r_ts >= 0
    r_valid = np.zeros(n_req, bool)
    r_valid[r_known] = ts_valid[r_ts[r_known]]
    r_scored = r_ok & r_known & r_valid

    reason = np.full(n_req, None, dtype=object)
    reason[~r_known] = "unknown query id (not in the test set)"
    reason[r_known & ~r_valid] = "invalid query (no chunk of grade >= 1)"
    failed = r_known & r_valid & ~r_ok
    reason[failed] = np.char.add("failed: ", r_status[failed].astype(str)) if failed.any() else reason[failed]

    # -- 4. each scored request as a row of a grid; duplicates out; the first K_max kept ------
    k_max = max(m.k for m in mets)
    n_dups_req = np.zeros(n_req, np.int64)
    if n_req and lengths.min() == lengths.max() and has_chunk.all():
        # the usual case: every request returned the same number of chunks, so the rows are the grid;
        # requests not scored are blanked out below
        kept_len = np.where(r_scored, lengths, 0)
        grid = c.reshape(n_req, int(lengths[0]))
    else:
        keep_row = np.repeat(r_scored, lengths) & has_chunk
        rows = np.flatnonzero(keep_row)
        rq = np.repeat(np.arange(n_req), lengths)[rows]
        rc_ = c[rows]
        kept_len = np.bincount(rq, minlength=n_req)
        width = int(kept_len.max(initial=0))
        if n_req * width > 4 * len(rows) + GRID_SLACK:
            # a few very long lists among short ones: remove repeats by hashing, keep each request's first K_max
            dup = pd.Series(rq.astype(np.int64) * max(len(rc.chunks), 1) + rc_).duplicated(keep="first").to_numpy()
            n_dups_req = np.bincount(rq[dup], minlength=n_req)
            rq, rc_ = rq[~dup], rc_[~dup]
            width = k_max
        n_k = np.bincount(rq, minlength=n_req)
        col = np.arange(len(rq)) - np.repeat(np.cumsum(n_k) - n_k, n_k)
        near = col < width
        pad = -1 - np.arange(width, dtype=np.int64)  # distinct padding: never taken for a repeat
        grid = np.broadcast_to(pad, (n_req, width)).astype(np.promote_types(c.dtype, np.int32))
        grid[rq[near], col[near]] = rc_[near]
    top, n_dup = _first_k_distinct(grid, k_max)
    n_dups_req += n_dup
    top[~r_scored] = -1
    n_dups_req[~r_scored] = 0
    n_ret_req = kept_len - n_dups_req
    del grid

    # -- 5. grades and metrics ------------------------------------------------------------
    # every metric sums over relevant rows only (a grade-0 row adds nothing), so only they go on,
    # each with its 1-based position among its request's distinct chunks
    lab = _Relevance.of(testset)
    c_in_lab = np.append(_index_in(rc.chunks, lab.chunks), -1)  # the last slot serves -1
    top_lab = c_in_lab[top]
    key = r_ts[:, None].astype(np.int64) * max(len(lab.chunks), 1) + top_lab
    key[top_lab < 0] = -1  # never a label key
    grade = _lookup(key.ravel(), lab.keys, lab.grades).reshape(top.shape)
    cell_req, cell_col = np.nonzero(grade >= 1)  # row-major: by request, then position
    sc = np.flatnonzero(r_scored)  # scored requests, renumbered 0..n_sc-1
    new_id = np.full(n_req, -1)
    new_id[sc] = np.arange(len(sc))
    rl = RankedLists(req=new_id[cell_req], pos=cell_col + 1, grade=grade[cell_req, cell_col], n_req=len(sc),
                     req_query=r_ts[sc], n_q=len(ts_q), n_rel=lab.n_rel, ideal_q=lab.ideal_q,
                     ideal_pos=lab.ideal_pos, ideal_grade=lab.ideal_grade)
    values = {m.name: compute(rl, m) for m in mets}

    # requests in (query, stage, repeat) code order, whatever the order of the file
    if n_req > 1 and np.any(r_key[1:] < r_key[:-1]):
        by_key = np.argsort(r_key, kind="stable")
        at_sc = np.argsort(r_key[sc], kind="stable")
        values = {k: v[at_sc] for k, v in values.items()}
    else:
        by_key = slice(None)
    lat = rc.latency_ms
    lat = (lat[order] if order is not None else lat)[starts] if lat is not None else np.full(n_req, np.nan)

    # -- tables -------------------------------------------------------------------------
    requests = pd.DataFrame({
        "query_id": q_uni[r_q],
        "stage": s_uni[r_s],
        "repeat": rep_uni[r_repc],
        "status": r_status,
        "scored": r_scored,
        "reason": reason,
        "n_returned": n_ret_req,
        "n_duplicates": n_dups_req,
        "latency_ms": lat,
    }).iloc[by_key].reset_index(drop=True)
    # valid queries missing from a (stage, repeat) that the run has, in the order the combinations first appear
    combo = r_s.astype(np.int64) * n_rep + r_repc
    combos, first, combo_of_req = np.unique(combo, return_index=True, return_inverse=True)
    if len(combos) and ts_valid.any():
        seen = np.zeros((len(combos), len(ts_q)), bool)
        seen[combo_of_req[r_known], r_ts[r_known]] = True
        at = np.argsort(first, kind="stable")
        m_combo, m_q = np.nonzero(~seen[at] & ts_valid)
        if len(m_combo):
            m_combo = at[m_combo]
            missing = pd.DataFrame({
                "query_id": ts_q["query_id"].to_numpy()[m_q], "stage": s_uni[combos[m_combo] // n_rep],
                "repeat": rep_uni[combos[m_combo] % n_rep], "status": "missing", "scored": False,
                "reason": "missing: not collected", "n_returned": 0, "n_duplicates": 0, "latency_ms": np.nan})
            requests = pd.concat([requests, missing], ignore_index=True)
    requests["repeat"] = requests["repeat"].astype(np.int64)

    per_query = requests.loc[requests["scored"], ["query_id", "stage", "repeat", "n_returned", "n_duplicates",
                                                  "latency_ms"]].reset_index(drop=True)
    for name, v in values.items():
        per_query[name] = v
    if rc.latency_ms is None:
        per_query = per_query.drop(columns="latency_ms")
    metric_cols = [m.name for m in mets]
    per_query = per_query[["query_id", "stage", "repeat", *metric_cols,
                           *[c for c in ("n_returned", "n_duplicates", "latency_ms") if c in per_query]]]

    inv = ts_q.loc[~ts_q["valid"], ["query_id"]].assign(stage=None, repeat=pd.NA,
                                                          reason="invalid query (no chunk of grade >= 1)")
    not_scored = requests.loc[~requests["scored"] & requests["reason"].notna()
                              & ~requests["reason"].astype(str).str.startswith("invalid"),
                              ["query_id", "stage", "repeat", "reason"]]
    excluded = pd.concat([inv, not_scored], ignore_index=True) if len(not_scored) else inv.reset_index(drop=True)
    excluded["repeat"] = excluded["repeat"].astype("Int64")

    seen_stages = list(dict.fromkeys(s_uni[r_s]))
    stage_order = stages if stages is not None else _stage_order(seen_stages)
    by_repeat = (per_query.groupby(["stage", "repeat"], sort=False)[metric_cols].mean()
                 .join(per_query.groupby(["stage", "repeat"], sort=False).size().rename("n_scored"))
                 .reset_index())
    by_repeat = by_repeat[["stage", "repeat", "n_scored", *metric_cols]]
    by_repeat["_o"] = by_repeat["stage"].map({s: i for i, s in enumerate(stage_order)})
    by_repeat = by_repeat.sort_values(["_o", "repeat"]).drop(columns="_o").reset_index(drop=True)

    sc_stage_q = np.unique(r_s[sc].astype(np.int64) * max(len(q_uni), 1) + r_q[sc])
    n_queries_of_stage = {s_uni[k]: int(v) for k, v in zip(*np.unique(sc_stage_q // max(len(q_uni), 1),
                                                                       return_counts=True))}
    summary_rows = []
    for stage in stage_order:
        br = by_repeat[by_repeat["stage"] == stage]
        if br.empty:
            continue
        nq = n_queries_of_stage.get(stage, 0)
        for m in metric_cols:
            v = br[m].to_numpy()
            mean = float(v.mean())
            summary_rows.append({
                "stage": stage, "metric": m, "mean": mean,
                "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                "min": float(v.min()), "max": float(v.max()),
                "n_repeats": len(v), "n_queries": int(nq),
                "tier": tier(m, mean, domain_adjustment),
            })
    summary = pd.DataFrame(summary_rows, columns=["stage", "metric", "mean", "std", "min", "max", "n_repeats",
                                                  "n_queries", "tier"])

    status_counts = requests["status"].value_counts()
    failed_kinds = {k: int(v) for k, v in status_counts.items() if k not in ("ok", "missing")}
    counts = {
        "n_queries": int(len(ts_q)),
        "n_valid": int(ts_q["valid"].sum()),
        "n_invalid": int((~ts_q["valid"]).sum()),
        "invalid_ids": ts_q.loc[~ts_q["valid"], "query_id"].tolist(),
        "n_requests": int(len(requests)),
        "n_scored": int(requests["scored"].sum()),
        "n_failed": int(sum(failed_kinds.values())),
        "failed_by_kind": failed_kinds,
        "n_missing": int((requests["status"] == "missing").sum()),
        "n_unknown_query": int((~r_known).sum()),
        "n_duplicates_removed": int(n_dups_req.sum()),
        "n_sub_chunks_expanded": int(n_expanded),
        "stages": list(stage_order),
        "repeats": [int(x) for x in rep_uni],
    }
    counts["complete"] = counts["n_failed"] == 0 and counts["n_missing"] == 0 and counts["n_unknown_query"] == 0

    warnings = []
    significance = significance_warning(counts["n_valid"])
    if significance:
        warnings.append(significance)
    if counts["n_invalid"]:
        warnings.append(f"{counts['n_invalid']} invalid queries (no chunk of grade >= 1) are excluded from every "
                        "mean.")
    if not counts["complete"]:
        warnings.append(f"The run is incomplete: {counts['n_failed']} failed, {counts['n_missing']} missing and "
                        f"{counts['n_unknown_query']} unknown-query requests are excluded from the means.")
    if counts["n_duplicates_removed"]:
        warnings.append(f"{counts['n_duplicates_removed']} duplicate chunk ids were removed (first position kept).")
    if domain_adjustment:
        warnings.append(f"Acceptance thresholds lowered by {domain_adjustment:.0%} for a specialised domain.")
    for w in warnings:
        log.info(w)
    return Scores(metrics=mets, per_query=per_query, requests=requests, excluded=excluded, by_repeat=by_repeat,
                  summary=summary, counts=counts, testset=testset, warnings=warnings,
                  domain_adjustment=domain_adjustment)
