"""Step 6 of scoring: the tables built from the scored requests (requests, per_query, excluded, by_repeat,
summary), the :class:`~weknora_nb.core.scoring.scores.Counts` and the warnings every report shows.

A stage's figure (docs/method.md section 2) is the mean over its queries of each query's mean over its scored
repeats: the basis every interval, test and delta of the stage is computed on (a query whose request failed in
one repeat counts once, with the repeats it has). The spread between repeats (std, min, max of the per-repeat
means) is reported beside it.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa

from weknora_nb.core.pipeline import significance_warning
from weknora_nb.core.requests import Lists, Requests
from weknora_nb.core.results import NOT_FAILED, SKIPPED
from weknora_nb.core.scoring.scores import Counts
from weknora_nb.core.scoring.selection import INVALID, Selection
from weknora_nb.core.tiers import tier

log = logging.getLogger(__name__)


def requests_table(req: Requests, sel: Selection, lists: Lists, ts_q: pd.DataFrame, query_text: pa.Array
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
    strings, without a Python string per value."""
    text = pa.array(values, pa.large_string())
    return (text if at is None else text.take(at)).to_pandas().array


def _missing_requests(req: Requests, sel: Selection, ts_q: pd.DataFrame) -> pd.DataFrame | None:
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


def scored_rows(requests: pd.DataFrame, *, has_latency: bool) -> pd.DataFrame:
    """The requests table's scored rows, with what :func:`per_query_table` shows of them besides the metrics:
    ids, list counts, latency (when the results carry it)."""
    counts = ["n_returned", "n_duplicates", *(["latency_ms"] if has_latency else [])]
    return requests.loc[requests["scored"], ["query_id", "stage", "repeat", *counts]].reset_index(drop=True)


def per_query_table(scored: pd.DataFrame, values: dict[str, np.ndarray], names: list[str]) -> pd.DataFrame:
    """One row per scored request (:func:`scored_rows`): ids, one column per metric, list counts, latency."""
    metrics = pd.DataFrame({name: values[name] for name in names}, index=scored.index)
    # joined once (a column inserted per metric copies the table's index and blocks each time)
    return pd.concat([scored[["query_id", "stage", "repeat"]], metrics, scored.iloc[:, 3:]], axis=1)


def excluded_table(ts_q: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """What no mean includes: the invalid queries (stage and repeat empty), then every
    request not scored for another reason (failed, missing, unknown query)."""
    inv = ts_q.loc[~ts_q["valid"], ["query_id"]].assign(stage=None, repeat=pd.NA, reason=INVALID)
    not_scored = requests.loc[~requests["scored"] & requests["reason"].notna()
                              & ~requests["reason"].astype(str).str.startswith("invalid"),
                              ["query_id", "stage", "repeat", "reason"]]
    excluded = pd.concat([inv, not_scored], ignore_index=True) if len(not_scored) else inv.reset_index(drop=True)
    excluded["repeat"] = excluded["repeat"].astype("Int64")
    return excluded


def by_repeat_table(per_query: pd.DataFrame, names: list[str], stage_order: list[str]) -> pd.DataFrame:
    """Mean of each metric per (stage, repeat) and the requests scored, stages in
    ``stage_order`` then repeats ascending."""
    g = per_query.groupby(["stage", "repeat"], sort=False)
    by_repeat = g[names].mean().join(g.size().rename("n_scored")).reset_index()
    by_repeat = by_repeat[["stage", "repeat", "n_scored", *names]]
    by_repeat["_o"] = by_repeat["stage"].map({s: i for i, s in enumerate(stage_order)})
    return by_repeat.sort_values(["_o", "repeat"]).drop(columns="_o").reset_index(drop=True)


def queries_per_stage(req: Requests, scored: np.ndarray) -> dict[str, int]:
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


def summary_table(per_query: pd.DataFrame, by_repeat: pd.DataFrame, n_queries: dict[str, int], names: list[str],
                  stage_order: list[str], domain_adjustment: float) -> pd.DataFrame:
    """One row per (stage, metric) of a stage with a scored request: the mean over queries of each query's mean
    over its scored repeats, the std (ddof 1; 0 for one repeat), min and max of the per-repeat means, the
    repeats, the queries scored and the tier of the mean."""
    query_means = per_query.groupby(["stage", "query_id"], sort=False, observed=True)[names].mean()
    stage_means = query_means.groupby(level="stage", sort=False, observed=True).mean()
    rows = []
    for stage in stage_order:  # stages x metrics: a few dozen rows at most
        br = by_repeat[by_repeat["stage"] == stage]
        if br.empty:
            continue
        for m in names:
            v = br[m].to_numpy()
            mean = float(stage_means.at[stage, m])
            rows.append({
                "stage": stage, "metric": m, "mean": mean,
                "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                "min": float(v.min()), "max": float(v.max()),
                "n_repeats": len(v), "n_queries": int(n_queries.get(stage, 0)),
                "tier": tier(m, mean, domain_adjustment),
            })
    return pd.DataFrame(rows, columns=["stage", "metric", "mean", "std", "min", "max", "n_repeats", "n_queries",
                                       "tier"])


def make_counts(ts_q: pd.DataFrame, requests: pd.DataFrame, sel: Selection, lists: Lists, n_expanded: int,
                stage_order: list[str], repeats: np.ndarray) -> Counts:
    """The :class:`Counts` of the test set and of the requests table."""
    status_counts = requests["status"].value_counts()
    failed_kinds = {k: int(v) for k, v in status_counts.items() if k not in (*NOT_FAILED, "missing")}
    skipped = requests["status"] == SKIPPED
    return Counts(
        n_queries=int(len(ts_q)),
        n_valid=int(ts_q["valid"].sum()),
        n_invalid=int((~ts_q["valid"]).sum()),
        invalid_ids=ts_q.loc[~ts_q["valid"], "query_id"].tolist(),
        n_requests=int(len(requests)),
        n_scored=int(requests["scored"].sum()),
        n_failed=int(sum(failed_kinds.values())),
        failed_by_kind=failed_kinds,
        n_skipped=int(skipped.sum()),
        skipped_ids=list(dict.fromkeys(requests.loc[skipped, "query_id"].astype(str))),
        n_missing=int((requests["status"] == "missing").sum()),
        n_unknown_query=int((~sel.known).sum()),
        n_duplicates_removed=int(lists.n_duplicates.sum()),
        n_sub_chunks_expanded=int(n_expanded),
        stages=list(stage_order),
        repeats=[int(x) for x in repeats],
    )


def make_warnings(counts: Counts, domain_adjustment: float) -> list[str]:
    """The plain-words warnings every report shows (each also logged at INFO): too few valid
    queries, invalid queries, an incomplete run (or one where nothing was scored), skipped requests,
    duplicates removed, lowered thresholds."""
    warnings = []
    significance = significance_warning(counts.n_valid)
    if significance:
        warnings.append(significance)
    if counts.n_invalid:
        warnings.append(f"{counts.n_invalid} invalid queries (no chunk of grade >= 1) are excluded from every mean.")
    if counts.nothing_scored is not None:
        warnings.append(f"Nothing was scored: {counts.nothing_scored}.")
    elif not counts.complete:
        warnings.append(f"The run is incomplete: {counts.n_failed} failed, {counts.n_missing} missing and "
                        f"{counts.n_unknown_query} unknown-query requests are excluded from the means.")
    if counts.n_skipped:
        warnings.append(f"{counts.n_skipped} chat request(s) of {len(counts.skipped_ids)} quer(ies) skipped retrieval "
                        "on the server (an intent such as a greeting or chit-chat): excluded from the means, not "
                        "failures.")
    if counts.n_duplicates_removed:
        warnings.append(f"{counts.n_duplicates_removed} duplicate chunk ids were removed (first position kept).")
    if domain_adjustment:
        warnings.append(f"Acceptance thresholds lowered by {domain_adjustment:.0%} for a specialised domain.")
    for w in warnings:
        log.info(w)
    return warnings
