"""Figures of the evidence a decision rests on (docs/method.md section 13), in the package's style.

- :func:`versions_chart`: every version side by side, one panel per metric (NDCG, MRR, hit rate,
  each mean with its 95 % bootstrap interval over the queries all versions share) and one of latency
  (p50 and p95 of the compared stage): the second source's comparison figure.
- :func:`group_gain_chart`: a forest plot of one compared run's delta per query type and tag
  (:func:`weknora_nb.analysis.groups.group_gains`), coloured by verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from weknora_nb.analysis.compare import Comparison
from weknora_nb.analysis.groups import LOSES, PAYS, SMALL_GAIN, GroupGains
from weknora_nb.analysis.stats import bootstrap_ci
from weknora_nb.reports.figures import figure_style

#: the families the side-by-side chart shows, and the metric it prefers for each
VERSION_METRICS = (("ndcg", "ndcg@5"), ("mrr", "mrr@20"), ("hit", "hit@5"))
_VERDICT_COLOURS = {PAYS: "#1a9850", SMALL_GAIN: "#91cf60", LOSES: "#d73027"}


def _chosen_metrics(cmp: Comparison, metrics: Sequence[str] | None) -> list[str]:
    """``metrics``, else for each family of :data:`VERSION_METRICS` its preferred metric, or the first of
    that family the comparison holds."""
    have = list(dict.fromkeys(cmp.metrics["metric"])) if len(cmp.metrics) else []
    if metrics is not None:
        return [m for m in metrics if m in have]
    out = []
    for family, preferred in VERSION_METRICS:
        pick = preferred if preferred in have else next((m for m in have if m.startswith(f"{family}@")), None)
        if pick:
            out.append(pick)
    return out


def _version_frame(cmp: Comparison, metric: str, resamples: int) -> pd.DataFrame:
    """Per version: mean of ``metric`` over the shared queries and its 95 % bootstrap interval."""
    pq = cmp.per_query
    wide = pq.pivot_table(index="query_id", columns="run", values=f"{metric}_b", aggfunc="first", observed=True)
    base = pq.groupby("query_id", sort=False)[f"{metric}_a"].first().rename(cmp.runs[0].name)
    values = pd.concat([base, wide], axis=1)[[r.name for r in cmp.runs]].dropna()
    lo, hi = bootstrap_ci(values.to_numpy(), resamples=resamples, seed=0)
    return pd.DataFrame({"run": values.columns, "mean": values.mean().to_numpy(), "ci_low": lo, "ci_high": hi})


def versions_chart(cmp: Comparison, *, metrics: Sequence[str] | None = None, resamples: int = 2000):
    """Every version of ``cmp`` side by side: one panel per metric (mean, 95 % interval) and latency."""
    figure_style()
    mets = _chosen_metrics(cmp, metrics)
    names = [r.name for r in cmp.runs]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(mets) + 1, figsize=(3.2 * (len(mets) + 1), 3.6), layout="constrained",
                             squeeze=False)
    x = np.arange(len(names))
    for ax, m in zip(axes[0], mets, strict=False):
        t = _version_frame(cmp, m, resamples).set_index("run").reindex(names)
        err = np.vstack([t["mean"] - t["ci_low"], t["ci_high"] - t["mean"]])
        ax.bar(x, t["mean"], yerr=err, capsize=3, color=[colours[i % len(colours)] for i in range(len(names))])
        for i, v in enumerate(t["mean"]):
            ax.text(i, v / 2, f"{v:.3f}", ha="center", va="center", fontsize=8, color="white")
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylim(0, 1.05)
        ax.set_title(m)
    lat = cmp.latency.set_index("run").reindex(names)
    ax = axes[0][-1]
    w = 0.38
    ax.bar(x - w / 2, lat["p50_ms"], w, label="p50", color="#4575b4")
    ax.bar(x + w / 2, lat["p95_ms"], w, label="p95", color="#d73027")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("ms")
    ax.set_title(f"latency ({cmp.stage})")
    ax.legend(fontsize=8)
    fig.suptitle(f"Versions side by side, stage {cmp.stage} (95 % intervals over shared queries)")
    plt.close(fig)
    return fig


def group_gain_chart(gains: GroupGains):
    """Delta of ``gains.metric`` per group with its 95 % interval; filled by verdict (pays, small gain,
    loses), hollow where the data show no clear difference."""
    figure_style()
    t = gains.table[gains.table["metric"] == gains.metric].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(t) + 1.4), layout="constrained")
    y = np.arange(len(t))[::-1]
    ax.errorbar(t["delta"], y, xerr=np.vstack([t["delta"] - t["ci_low"], t["ci_high"] - t["delta"]]), fmt="none",
                ecolor="grey", capsize=3)
    for verdict, g in t.groupby("verdict", sort=False):
        colour = _VERDICT_COLOURS.get(str(verdict))
        style: dict[str, Any] = {"color": colour} if colour else {"facecolors": "none", "edgecolors": "#555555"}
        ax.scatter(g["delta"], y[g.index], zorder=3, label=str(verdict), **style)
    ax.set_yticks(y, [f"{d}: {g} (n {n})" for d, g, n in zip(t["dimension"], t["group"], t["n"], strict=True)])
    ax.axvline(0, color="black", lw=0.8)
    # the intervals are each group's own; a verdict also needs the group's p after Holm across the groups, so an
    # interval clear of 0 can stand beside a hollow mark: said under the axis, where the reader looks for the scale
    ax.set_xlabel(f"{gains.metric}: {gains.run} minus {gains.baseline} (95 % CI)\n"
                  "filled: significant after Holm across the groups; hollow: not")
    ax.legend(fontsize=8)
    ax.set_title(f"Which query types gain ({gains.stage})")
    plt.close(fig)
    return fig
