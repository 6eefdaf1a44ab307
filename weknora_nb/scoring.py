"""Score a results table against a test set (METHOD.md sections 2-3).

The pipeline, all vectorised (no Python loop over queries):

1. group rows into requests (query, stage, repeat), sorted by rank;
2. check structure: one status per request, no rank given twice;
3. set aside what is not scored, with the reason: invalid queries (no grade >= 1),
   failed requests (status other than ``ok``), requests of unknown query ids, and
   valid queries missing from a stage/repeat that other queries have;
4. remove duplicate chunk ids (first position kept, ranks closed up, count reported);
5. look up grades and compute every metric per request.

System figure = mean over scored requests of a (stage, repeat); the stage figure is
the mean of its repeat figures, with their spread (std, min, max).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd

from .errors import Problem, ResultsError
from .metrics import Metric, RankedLists, compute, parse_metrics
from .results import expand_sub_chunks
from .testset import MIN_VALID_QUERIES, TestSet
from .tiers import tier

__all__ = ["Scores", "score", "PIPELINE"]

#: stages in pipeline order (METHOD.md section 5); other stages follow in the order first seen
PIPELINE = ("vector", "keyword", "hybrid", "final", "citations")

log = logging.getLogger(__name__)


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


def _codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes (-1 for missing) and the distinct values (object array of str) of a column."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        return s.cat.codes.to_numpy(dtype=np.int64), np.asarray(s.cat.categories.astype(str), dtype=object)
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    return codes.astype(np.int64), np.asarray(pd.Index(uniques).astype(str), dtype=object)


def _small_ints(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, codes) of an array of small non-negative integers, in O(n)."""
    if not len(a):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo = int(a.min())
    d = a - lo
    present = np.bincount(d) > 0
    if present.all():  # the usual case: repeats 1..N all present
        return np.arange(lo, lo + len(present)), d
    lookup = np.cumsum(present) - 1
    return np.flatnonzero(present) + lo, lookup[d]


def _lookup(keys: np.ndarray, table_keys: np.ndarray, table_values: np.ndarray, default: int = 0) -> np.ndarray:
    """``table_values`` at the position of each of ``keys`` in ``table_keys`` (unique), else ``default``.

    Most keys are usually absent, so a hashed byte filter (one multiply and one gather
    per key) sets them aside before the exact binary search runs on the few candidates.
    """
    out = np.full(len(keys), default, dtype=table_values.dtype)
    if not len(table_keys) or not len(keys):
        return out
    order = np.argsort(table_keys)
    tk, tv = table_keys[order], table_values[order]
    bits = int(min(26, max(16, np.ceil(np.log2(len(tk) * 16)))))
    shift = np.uint64(64 - bits)
    mult = np.uint64(0x9E3779B97F4A7C15)
    bloom = np.zeros(1 << bits, dtype=np.bool_)
    bloom[(tk.astype(np.uint64) * mult) >> shift] = True
    cand = np.flatnonzero(bloom[(keys.astype(np.uint64) * mult) >> shift])
    at = np.searchsorted(tk, keys[cand])
    at_c = np.minimum(at, len(tk) - 1)
    found = tk[at_c] == keys[cand]
    out[cand[found]] = tv[at_c[found]]
    return out


def _repeats_within(group: np.ndarray, value: np.ndarray, n_values: int) -> np.ndarray:
    """True for each row whose value already appeared earlier in the same group.

    ``group`` is sorted (rows of a group are contiguous and in order). Lists are short,
    so each group is laid out as a row of a padded matrix and sorted row-wise to find
    the few groups holding a repeat; only their rows go through the exact hash check.
    """
    n = len(group)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    starts = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1]
    lengths = np.diff(np.r_[starts, n])
    width = int(lengths.max())
    suspect_rows = np.ones(n, dtype=bool)
    if len(starts) * width <= 4 * n + 1_000_000:
        col = np.arange(n) - np.repeat(starts, lengths)
        grid = np.broadcast_to(-1 - np.arange(width, dtype=np.int64), (len(starts), width)).copy()
        grid[np.repeat(np.arange(len(starts)), lengths), col] = value
        grid.sort(axis=1)
        suspect = (grid[:, 1:] == grid[:, :-1]).any(axis=1)
        suspect_rows = np.repeat(suspect, lengths)
    idx = np.flatnonzero(suspect_rows)
    if len(idx):
        key = group[idx].astype(np.int64) * np.int64(n_values) + value[idx]
        out[idx] = pd.Series(key).duplicated(keep="first").to_numpy()
    return out


def score(testset: TestSet, results: pd.DataFrame, metrics: Iterable[str | Metric] | str | None = None, *,
          stages: Iterable[str] | None = None, domain_adjustment: float = 0.0, sub_chunks: str = "expand",
          source: str = "<results>") -> Scores:
    """Score ``results`` (the results-table format) against ``testset``.

    Parameters
    ----------
    testset : TestSet
    results : DataFrame
        As read by :func:`weknora_nb.read_results`.
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
    source : str
        Name used in error messages.

    Returns
    -------
    Scores

    Raises
    ------
    ResultsError
        A request with two statuses, or a rank given twice within a request.
    MetricError
        An unknown metric name.
    """
    mets = parse_metrics(metrics)
    tier(mets[0].name, 0.0, domain_adjustment)  # validates the adjustment early
    if sub_chunks not in ("expand", "ignore"):
        raise ValueError(f"sub_chunks must be 'expand' or 'ignore'. Got {sub_chunks!r} instead.")
    df = results
    n_expanded = 0
    if sub_chunks == "expand":
        df, n_expanded = expand_sub_chunks(df)
    if stages is not None:
        stages = list(stages)
        df = df[df["stage"].astype("string").isin(stages)]
    n_rows = len(df)

    # -- 1. requests ------------------------------------------------------------------
    q_code, q_uni = _codes(df["query_id"])
    s_code, s_uni = _codes(df["stage"])
    rep_uni, rep_code = _small_ints(df["repeat"].to_numpy(dtype=np.int64))
    rank_col = df["rank"]
    rank = (rank_col.to_numpy(dtype=np.int64) if rank_col.dtype == np.int64  # no missing rank: no conversion
            else rank_col.to_numpy(dtype=np.float64, na_value=0).astype(np.int64))
    c_code, c_uni = _codes(df["chunk_id"])
    st_code, st_uni = _codes(df["status"])
    if (st_code < 0).any():  # an empty status means ok
        st_uni = np.append(st_uni, "ok") if "ok" not in st_uni else st_uni
        st_code = np.where(st_code < 0, int(np.flatnonzero(st_uni == "ok")[0]), st_code)

    n_s, n_rep = max(len(s_uni), 1), max(len(rep_uni), 1)
    req_key = (q_code * n_s + s_code) * n_rep + rep_code
    key = req_key * (int(rank.max(initial=0)) + 1) + rank
    step = np.diff(key)
    if n_rows and np.any(step < 0):
        order = np.argsort(key, kind="stable")
        req_key, key, rank = req_key[order], key[order], rank[order]
        q_code, c_code, st_code = q_code[order], c_code[order], st_code[order]
        step = np.diff(key)
    else:
        order = None

    def row_of(j: int) -> int:
        """1-based row number in the caller's table of sorted row j."""
        return (int(order[j]) if order is not None else int(j)) + 1

    new_req = np.r_[True, req_key[1:] != req_key[:-1]] if n_rows else np.zeros(0, bool)
    starts = np.flatnonzero(new_req)
    req_of_row = np.cumsum(new_req) - 1
    n_req = len(starts)
    r_key = req_key[starts]
    r_q = r_key // (n_s * n_rep)
    r_s = (r_key // n_rep) % n_s
    r_rep = r_key % n_rep

    # -- 2. structure -------------------------------------------------------------------
    problems: list[Problem] = []
    ok_label = np.flatnonzero(st_uni == "ok")
    is_ok = st_code == ok_label[0] if len(ok_label) else np.zeros(n_rows, bool)
    if n_req:
        lo = np.minimum.reduceat(st_code, starts)
        hi = np.maximum.reduceat(st_code, starts)
        for r in np.flatnonzero(lo != hi)[:20]:
            problems.append(Problem(source, row_of(starts[r]), "status",
                                    f"request ({q_uni[r_q[r]]!r}, {s_uni[r_s[r]]!r}, repeat {rep_uni[r_rep[r]]}) "
                                    "has rows with different statuses", "row"))
    has_chunk = c_code >= 0
    dup_rank = np.flatnonzero((step == 0) & has_chunk[1:] & has_chunk[:-1]) + 1 if n_rows else []
    for j in dup_rank[:20]:
        problems.append(Problem(source, row_of(j), "rank",
                                f"rank {rank[j]} appears twice in request ({q_uni[q_code[j]]!r}, "
                                f"{s_uni[s_code[j] if order is None else s_code[order[j]]]!r})", "row"))
    if problems:
        raise ResultsError(source, problems)

    # -- 3. what is scored ---------------------------------------------------------------
    ts_q = testset.queries
    ts_index = pd.Index(ts_q["query_id"])
    q_in_ts = ts_index.get_indexer(pd.Index(q_uni)) if len(q_uni) else np.zeros(0, np.int64)
    ts_valid = ts_q["valid"].to_numpy(dtype=bool)
    r_ts = q_in_ts[r_q] if n_req else np.zeros(0, np.int64)
    r_status = st_uni[st_code[starts]] if n_req else np.zeros(0, object)
    r_ok = is_ok[starts] if n_req else np.zeros(0, bool)
    r_known = r_ts >= 0
    r_valid = np.zeros(n_req, bool)
    r_valid[r_known] = ts_valid[r_ts[r_known]]
    r_scored = r_ok & r_known & r_valid

    reason = np.full(n_req, None, dtype=object)
    reason[~r_known] = "unknown query id (not in the test set)"
    reason[r_known & ~r_valid] = "invalid query (no chunk of grade >= 1)"
    failed = r_known & r_valid & ~r_ok
    reason[failed] = np.char.add("failed: ", r_status[failed].astype(str)) if failed.any() else reason[failed]

    # -- 4. dedupe and positions ----------------------------------------------------------
    keep_row = np.repeat(r_scored, np.diff(np.r_[starts, n_rows])) & has_chunk
    rows = np.flatnonzero(keep_row)
    rq = req_of_row[rows]
    rc = c_code[rows]
    dup = _repeats_within(rq, rc, max(len(c_uni), 1))
    n_dups_req = np.bincount(rq[dup], minlength=n_req)
    rows, rq, rc = rows[~dup], rq[~dup], rc[~dup]
    n_ret_req = np.bincount(rq, minlength=n_req)
    first_of_req = np.cumsum(n_ret_req) - n_ret_req  # where each request starts among the kept rows

    # -- 5. grades and metrics ------------------------------------------------------------
    qrels = testset.qrels
    qr_q = pd.Index(q_uni).get_indexer(qrels["query_id"]) if len(qrels) else np.zeros(0, np.int64)
    qr_c = pd.Index(c_uni).get_indexer(qrels["chunk_id"]) if len(qrels) else np.zeros(0, np.int64)
    found = (qr_q >= 0) & (qr_c >= 0)
    n_c = np.int64(max(len(c_uni), 1))
    lab_key = qr_q[found].astype(np.int64) * n_c + qr_c[found]
    grade = _lookup(q_code[rows] * n_c + rc, lab_key, qrels["grade"].to_numpy()[found].astype(np.int8))
    # every metric sums over relevant rows only (a grade-0 row adds nothing), so only they go on,
    # each with its 1-based position among its request's kept rows
    rel = np.flatnonzero(grade >= 1)
    rq_rel = rq[rel]
    pos = rel - first_of_req[rq_rel] + 1

    # scored requests, renumbered 0..n_sc-1
    sc = np.flatnonzero(r_scored)
    new_id = np.full(n_req, -1)
    new_id[sc] = np.arange(len(sc))
    ts_qid = qrels["query_id"].to_numpy()
    pos_rel = qrels["grade"].to_numpy() >= 1
    ideal = pd.DataFrame({"q": ts_index.get_indexer(ts_qid[pos_rel]), "g": qrels["grade"].to_numpy()[pos_rel]})
    ideal = ideal.sort_values(["q", "g"], ascending=[True, False], kind="stable")
    ideal_q = ideal["q"].to_numpy()
    ideal_pos = ideal.groupby("q", sort=False).cumcount().to_numpy() + 1
    n_rel = np.bincount(ideal_q, minlength=len(ts_q))
    rl = RankedLists(req=new_id[rq_rel], pos=pos, grade=grade[rel], n_req=len(sc), req_query=r_ts[sc], n_q=len(ts_q),
                     n_rel=n_rel, ideal_q=ideal_q, ideal_pos=ideal_pos, ideal_grade=ideal["g"].to_numpy())
    values = {m.name: compute(rl, m) for m in mets}

    # -- tables -------------------------------------------------------------------------
    lat = None
    if "latency_ms" in df.columns:
        lat_all = df["latency_ms"].to_numpy(dtype=np.float64, na_value=np.nan)
        lat = (lat_all[order] if order is not None else lat_all)[starts] if n_req else np.zeros(0)
    requests = pd.DataFrame({
        "query_id": q_uni[r_q] if n_req else np.zeros(0, object),
        "stage": s_uni[r_s] if n_req else np.zeros(0, object),
        "repeat": rep_uni[r_rep] if n_req else np.zeros(0, np.int64),
        "status": r_status,
        "scored": r_scored,
        "reason": reason,
        "n_returned": n_ret_req,
        "n_duplicates": n_dups_req,
        "latency_ms": lat if lat is not None else np.full(n_req, np.nan),
    })
    # valid queries missing from a (stage, repeat) that the run has
    valid_ids = ts_q.loc[ts_q["valid"], "query_id"]
    combos = requests[["stage", "repeat"]].drop_duplicates()
    if len(combos) and len(valid_ids):
        expected = combos.merge(pd.DataFrame({"query_id": valid_ids}), how="cross")
        seen = requests[["query_id", "stage", "repeat"]]
        missing = expected.merge(seen, how="left", indicator=True)
        missing = missing.loc[missing["_merge"] == "left_only", ["query_id", "stage", "repeat"]]
        if len(missing):
            missing = missing.assign(status="missing", scored=False, reason="missing: not collected",
                                     n_returned=0, n_duplicates=0, latency_ms=np.nan)
            requests = pd.concat([requests, missing], ignore_index=True)
    requests["repeat"] = requests["repeat"].astype(np.int64)

    per_query = requests.loc[requests["scored"], ["query_id", "stage", "repeat", "n_returned", "n_duplicates",
                                                  "latency_ms"]].reset_index(drop=True)
    for name, v in values.items():
        per_query[name] = v
    if lat is None:
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

    seen_stages = list(dict.fromkeys(s_uni[r_s])) if n_req else []
    stage_order = stages if stages is not None else sorted(
        seen_stages, key=lambda s: (PIPELINE.index(s) if s in PIPELINE else len(PIPELINE), seen_stages.index(s)))
    by_repeat = (per_query.groupby(["stage", "repeat"], sort=False)[metric_cols].mean()
                 .join(per_query.groupby(["stage", "repeat"], sort=False).size().rename("n_scored"))
                 .reset_index())
    by_repeat = by_repeat[["stage", "repeat", "n_scored", *metric_cols]]
    by_repeat["_o"] = by_repeat["stage"].map({s: i for i, s in enumerate(stage_order)})
    by_repeat = by_repeat.sort_values(["_o", "repeat"]).drop(columns="_o").reset_index(drop=True)

    summary_rows = []
    for stage in stage_order:
        br = by_repeat[by_repeat["stage"] == stage]
        if br.empty:
            continue
        nq = per_query.loc[per_query["stage"] == stage, "query_id"].nunique()
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
    if counts["n_valid"] < MIN_VALID_QUERIES:
        warnings.append(f"Only {counts['n_valid']} valid queries (fewer than {MIN_VALID_QUERIES}): these figures "
                        "are not statistically significant.")
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
