"""Which query types gain: a comparison's delta per query type and per tag, and where the change pays.

The second source measures in order to apply reranking selectively: a reranker that lifts
procedural questions may do nothing for factual ones and still cost every query its latency.
:func:`group_gains` splits one compared run's paired per-query differences (a
:class:`~weknora_nb.analysis.compare.Comparison`, compared run minus baseline, means over repeats)
by group:

- groups: each labelled ``query_type`` and each tag (a query with several tags is in several
  groups), or any of :data:`weknora_nb.analysis.stratify.DIMENSIONS`' ``rule_type``;
- per group and metric: ``n``, both means, ``delta`` with its 95 % paired-bootstrap interval,
  the randomization-test p-value and ``p_holm``, Holm's adjustment across every group and
  dimension shown (one family: a group is a hypothesis);
- the latency each group costs: p50 / p95 of the successful requests of the group's queries at
  the stage, per run, and their deltas (ms);
- ``verdict`` for the headline metric: ``pays`` (p_holm < alpha, interval above 0, delta >=
  ``min_gain``, 0.02 by default: the source's "a gain below 0.02 rarely pays"), ``small gain``
  (significant but below ``min_gain``), ``loses`` (p_holm < alpha, interval below 0), ``no clear
  difference`` otherwise; groups under :data:`~weknora_nb.analysis.stats.MIN_GROUP_SIZE` queries
  carry a warning.

:attr:`GroupGains.recommendation` names, in words, the query types and tags where the change pays
(with their delta and latency cost) and those where it does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from weknora_nb.analysis.compare import Comparison
from weknora_nb.analysis.stats import (
    MIN_GROUP_SIZE,
    holm,
    paired_bootstrap_ci,
    randomization_test,
    small_group_warning,
)
from weknora_nb.analysis.stratify import classify
from weknora_nb.core.errors import UsageError
from weknora_nb.core.pipeline import HEADLINE_METRIC
from weknora_nb.core.run import Run
from weknora_nb.core.testset import TestSet

GROUP_DIMENSIONS = ("query_type", "tag", "rule_type")
PAYS, SMALL_GAIN, LOSES, NO_CLEAR = "pays", "small gain", "loses", "no clear difference"


@dataclass
class GroupGains:
    """What :func:`group_gains` found: ``table`` (one row per dimension, group and metric) and the
    ``recommendation`` in words."""

    table: pd.DataFrame
    run: str
    baseline: str
    stage: str
    metric: str
    recommendation: str


def _memberships(testset: TestSet, dimensions: Iterable[str]) -> pd.DataFrame:
    """(query_id, dimension, group) rows: a query's type, each of its tags, its rule-based type."""
    dims = list(dimensions)
    bad = [d for d in dims if d not in GROUP_DIMENSIONS]
    if bad:
        raise UsageError(argument="dimensions", allowed=list(GROUP_DIMENSIONS), got=bad)
    q = testset.queries
    rows = []
    rule_types = classify(q["query"].tolist()) if "rule_type" in dims else [None] * len(q)
    for (qid, qtype, tags), rule in zip(q[["query_id", "query_type", "tags"]].itertuples(index=False),
                                        rule_types, strict=True):
        if "query_type" in dims:
            rows.append((qid, "query_type", qtype if isinstance(qtype, str) else "(none)"))
        if "tag" in dims:
            rows += [(qid, "tag", str(t)) for t in (tags if tags is not None else [])]
        if "rule_type" in dims:
            rows.append((qid, "rule_type", str(rule)))
    return pd.DataFrame(rows, columns=["query_id", "dimension", "group"])


def _latency(run: Run, stage: str, qids: pd.Index) -> tuple[float, float]:
    """p50 and p95 (ms) of the successful requests of ``qids`` at ``stage``, all repeats."""
    req = run.scores.requests
    sel = (req["stage"] == stage) & (req["status"] == "ok") & req["query_id"].isin(qids)
    lat = req.loc[sel, "latency_ms"].dropna().to_numpy(dtype=np.float64) if "latency_ms" in req else np.array([])
    if not len(lat):
        return np.nan, np.nan
    p50, p95 = np.percentile(lat, [50, 95])
    return float(p50), float(p95)


def _verdict(row: pd.Series, alpha: float, min_gain: float) -> str:
    if not row["p_holm"] < alpha:
        return NO_CLEAR
    if row["ci_low"] > 0:
        return PAYS if row["delta"] >= min_gain else SMALL_GAIN
    if row["ci_high"] < 0:
        return LOSES
    return NO_CLEAR


def group_gains(cmp: Comparison, *, run: str | None = None, metrics: Iterable[str] | None = None,
                metric: str = HEADLINE_METRIC, dimensions: Iterable[str] = ("query_type", "tag"),
                min_gain: float = 0.02, alpha: float = 0.05, resamples: int = 2000, seed: int = 0,
                min_group: int = MIN_GROUP_SIZE) -> GroupGains:
    """Per group of queries, one compared run's delta against the baseline (module docstring).

    ``run``: the compared run (default: the first after the baseline); ``metrics``: the metrics of the
    table (default: ``metric`` alone); ``metric``: the one the verdicts and the recommendation use.
    Columns: ``dimension``, ``group``, ``metric``, ``n``, ``mean_a``, ``mean_b``, ``delta``, ``ci_low``,
    ``ci_high``, ``p_value``, ``p_holm``, ``verdict`` (``metric``'s rows only), ``p50_a_ms``,
    ``p50_b_ms``, ``delta_p50_ms``, ``p95_a_ms``, ``p95_b_ms``, ``delta_p95_ms``, ``warning``.
    """
    names = [r.name for r in cmp.runs]
    run = run or names[1]
    if run not in names[1:]:
        raise UsageError(argument="run", allowed=names[1:], got=run)
    mets = list(dict.fromkeys([metric, *(metrics or [])]))
    pq = cmp.per_query[cmp.per_query["run"] == run].set_index("query_id")
    lacking = [m for m in mets if f"{m}_a" not in pq.columns]
    if lacking:
        raise UsageError(argument="metric", allowed=[c[:-2] for c in pq.columns if c.endswith("_a")], got=lacking[0])
    base, other = cmp.runs[0], cmp.runs[names.index(run)]
    mem = _memberships(base.testset, dimensions)
    mem = mem[mem["query_id"].isin(pq.index)]
    rows = []
    for (dim, group), g in mem.groupby(["dimension", "group"], sort=True):
        qids = pd.Index(g["query_id"].unique())
        a = pq.loc[qids, [f"{m}_a" for m in mets]].to_numpy()
        b = pq.loc[qids, [f"{m}_b" for m in mets]].to_numpy()
        lo, hi = (np.asarray(x) for x in paired_bootstrap_ci(a, b, resamples=resamples, seed=seed))
        p = np.asarray(randomization_test(a, b, resamples=resamples, seed=seed + 1))
        (p50a, p95a), (p50b, p95b) = _latency(base, cmp.stage, qids), _latency(other, cmp.stage, qids)
        for j, m in enumerate(mets):
            rows.append({"dimension": dim, "group": group, "metric": m, "n": len(qids),
                         "mean_a": float(a[:, j].mean()), "mean_b": float(b[:, j].mean()),
                         "delta": float((b[:, j] - a[:, j]).mean()), "ci_low": float(lo[j]), "ci_high": float(hi[j]),
                         "p_value": float(p[j]), "p50_a_ms": p50a, "p50_b_ms": p50b, "delta_p50_ms": p50b - p50a,
                         "p95_a_ms": p95a, "p95_b_ms": p95b, "delta_p95_ms": p95b - p95a,
                         "warning": small_group_warning(len(qids), min_group)})
    table = _finish(pd.DataFrame(rows), metric, alpha, min_gain)
    return GroupGains(table, run, base.name, cmp.stage, metric,
                      _recommend(table, run, base.name, metric, min_gain))


_COLUMNS = ["dimension", "group", "metric", "n", "mean_a", "mean_b", "delta", "ci_low", "ci_high", "p_value",
            "p_holm", "verdict", "p50_a_ms", "p50_b_ms", "delta_p50_ms", "p95_a_ms", "p95_b_ms", "delta_p95_ms",
            "warning"]


def _finish(table: pd.DataFrame, metric: str, alpha: float, min_gain: float) -> pd.DataFrame:
    """Holm across every group of each metric, and the verdicts of ``metric``'s rows."""
    if table.empty:
        return pd.DataFrame(columns=_COLUMNS)
    table["p_holm"] = np.nan
    for _, idx in table.groupby("metric", sort=False).groups.items():
        table.loc[idx, "p_holm"] = holm(table.loc[idx, "p_value"].to_numpy())
    table["verdict"] = [(_verdict(r, alpha, min_gain) if r["metric"] == metric else None)
                        for _, r in table.iterrows()]
    return table[_COLUMNS]


def _describe(r: pd.Series) -> str:
    cost = "" if pd.isna(r["delta_p95_ms"]) else f", p95 latency {r['delta_p95_ms']:+.0f} ms"
    small = " (few queries)" if isinstance(r["warning"], str) else ""
    return (f"{r['group']} ({r['delta']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}], n {int(r['n'])}"
            f"{cost}){small}")


def _recommend(table: pd.DataFrame, run: str, baseline: str, metric: str, min_gain: float) -> str:
    """The recommendation: per dimension, the groups where the change pays, where it gains too little,
    where it loses, and where the data show no difference."""
    t = table[table["metric"] == metric]
    if t.empty:
        return f"{run} vs {baseline}: no group of queries to compare."
    lines = [f"{run} vs {baseline}, {metric} by group (Holm across {len(t)} groups; pays: a significant gain of "
             f"at least {min_gain:g}):"]
    for dim, g in t.groupby("dimension", sort=False):
        what = {"query_type": "query types", "tag": "tags", "rule_type": "rule-based types"}.get(str(dim), str(dim))
        parts = {v: [_describe(r) for _, r in g[g["verdict"] == v].sort_values("delta", ascending=False).iterrows()]
                 for v in (PAYS, SMALL_GAIN, LOSES, NO_CLEAR)}
        if parts[PAYS]:
            lines.append(f"- Apply {run} to the {what} {'; '.join(parts[PAYS])}.")
        if parts[SMALL_GAIN]:
            lines.append(f"- Gains too small to pay for its cost on {'; '.join(parts[SMALL_GAIN])}.")
        if parts[LOSES]:
            lines.append(f"- Keep {baseline} for {'; '.join(parts[LOSES])}: {run} is worse there.")
        if parts[NO_CLEAR]:
            lines.append(f"- No clear difference on {'; '.join(parts[NO_CLEAR])}: the change does not pay there "
                         "on this test set.")
    return "\n".join(lines)
