r"""Deciding on evidence (docs/method.md section 13): margin verdicts, power, effect sizes, noise.

Everything here works on **paired per-query differences** :math:`d_q = B_q - A_q` (the compared
version minus the baseline, each query's value its mean over repeats at one stage, only queries
valid and scored in both), as plain arrays, so that the gate, the comparison and the simulations
of ``tests/test_evidence.py`` run the same code.

**Verdicts** (:func:`margin_verdict`, :func:`evidence_bounds`). With the percentile paired-bootstrap
interval :math:`[lo, hi]` of :math:`\bar d` (:func:`~weknora_nb.analysis.stats.paired_bootstrap_ci`,
seeded) and a margin :math:`m > 0`:

- ``pass`` when :math:`lo > -m` (the data show that any loss is smaller than the margin);
- ``fail`` when :math:`hi < -m` (the data show a loss larger than the margin);
- ``inconclusive`` otherwise (the interval holds :math:`-m`).

A ``non-inferior`` bound passes only on ``pass`` (inconclusive fails it: the data must show the
change is safe); a ``not-worse`` bound fails only on ``fail`` (inconclusive passes it: the data
must show the change is harmful).

**Several bounds at once** (the rule the gate prints): the gate passes only when every bound
passes. With ``adjust="none"`` (the default) each interval is a 95 % interval of its own metric,
not adjusted for the number k of evidence bounds. For ``non-inferior`` bounds that is the
intersection-union test (Berger 1982): the chance of passing a change whose true loss on some
metric is at least its margin stays at most 2.5 % whatever k. For ``not-worse`` bounds each bound
can raise a false alarm with up to 2.5 % (at a true loss exactly at the margin), so k bounds raise
one with up to k x 2.5 %; ``adjust="bonferroni"`` widens every interval to level
:math:`1 - 0.05/k` and ``adjust="holm"`` decides from bootstrap p-values with Holm's step-down
(:math:`p_{pass} = \min(1, 2 (1 + \#\{\bar d^* \le -m\}) / (1 + R))`, :math:`p_{fail}` the same with
:math:`\ge`, each adjusted across the k bounds; pass when the adjusted :math:`p_{pass} < 0.05`,
fail when the adjusted :math:`p_{fail} < 0.05`), both bringing the false-alarm rate back to about
2.5 % at the cost of power (about: the percentile bootstrap's far tails run slightly light; four
bounds at n = 300 gave ~3 % in ``tests/test_evidence.py``). ``bonferroni`` and ``holm`` are both
conservative for ``non-inferior`` bounds.

**Predictions** (normal approximation, :mod:`weknora_nb.analysis.stats`): ``pass_if_equal``, the
chance a bound passes when the true change is 0 (``non-inferior``:
:math:`\Phi(m/se - z(1-\alpha/2))`; ``not-worse``: :math:`1 - \Phi(-m/se - z(1-\alpha/2))`), and
``loss_caught`` = m + MDE, the true loss that makes the interval lie entirely below :math:`-m`
(the bound fail) with 80 % power.

**Effect sizes and power** (:func:`effect_table`): per metric ``delta``, ``sd`` (ddof 1), ``d_z``
= delta / sd, ``share_improved`` (:math:`d_q` > ``improve_by``; 0: strictly better), ``mde`` at
80 % power and the interval's level, and ``n_needed`` for a named effect (``detect``).

**Noise split** (:func:`noise_split`): how much of a figure's variance comes from the sample of
queries and how much from the system's run-to-run variation (approximate nearest-neighbour
search, rerankers), from two bootstraps:

- over queries (each query's mean over its repeats resampled): :math:`V_{total}`, the variance of
  the figure, holding both sources (a query's mean carries its repeats' noise), and the figure's
  interval;
- over repeats (queries fixed; each query's repeats resampled with replacement among its own):
  :math:`V_{repeats}`, multiplied by
  :math:`c = \sum_q s_q^2 / n_q \big/ \sum_q s_q^2 (n_q - 1) / n_q^2` (the bootstrap of a mean of
  :math:`n_q` values shrinks its variance by :math:`(n_q - 1)/n_q`; :math:`c = R/(R-1)` with R
  repeats of every query);

then ``share_repeats`` = :math:`V_{repeats} / V_{total}` and ``share_queries`` = 1 - that
(:math:`V_{queries} = \max(V_{total} - V_{repeats}, 0)`). For a delta (``baseline`` given) the
two runs' repeats are resampled independently and their variances add. Queries with one repeat
add nothing to :math:`V_{repeats}`; without any query of two repeats it is NaN.

**Traffic weights** (:func:`weighted_figures`): a query's weight is its share of real traffic (a
``weight`` per test-set query); the weighted mean :math:`\sum w_q x_q / \sum w_q` and its bootstrap
interval resampling queries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from weknora_nb.analysis.stats import (
    DEFAULT_POWER,
    DEFAULT_RESAMPLES,
    TIE_TOLERANCE,
    bootstrap_distribution,
    degenerate,
    effect_size,
    holm,
    minimum_detectable_effect,
    one_sided_power,
    power_of,
    queries_needed,
    share_improved,
    weighted_bootstrap_ci,
    weighted_mean,
    z_quantile,
)
from weknora_nb.core.errors import UsageError

NON_INFERIOR, NOT_WORSE = "non-inferior", "not-worse"
KINDS = (NON_INFERIOR, NOT_WORSE)
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
ADJUSTMENTS = ("none", "bonferroni", "holm")
_BATCH_CELLS = 4_000_000


@dataclass(frozen=True)
class Bound:
    """One evidence bound: ``kind`` (``non-inferior`` or ``not-worse``), a metric, a margin > 0
    (in the metric's unit: ``ndcg@5`` 0.02 is two hundredths of NDCG)."""

    kind: str
    metric: str
    margin: float

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(argument="kind", allowed=list(KINDS), got=self.kind)
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise UsageError(f"the margin of a {self.kind} bound is a number >= 0, e.g. {self.metric}=0.02. "
                             f"Got {self.margin!r} instead.")


def margin_verdict(low: np.ndarray | float, high: np.ndarray | float, margin: float) -> np.ndarray:
    """``pass`` (low > -margin), ``fail`` (high < -margin) or ``inconclusive``, elementwise;
    an interval with a NaN end is inconclusive."""
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    return np.where(lo > -margin, PASS, np.where(hi < -margin, FAIL, INCONCLUSIVE))


def bound_passed(kind: str, verdict: np.ndarray | str) -> np.ndarray:
    """Whether a bound of ``kind`` passes on ``verdict``: non-inferior only on pass, not-worse unless fail."""
    v = np.asarray(verdict)
    return v == PASS if kind == NON_INFERIOR else v != FAIL


def _levels(bounds: Sequence[Bound], level: float, adjust: str) -> list[float]:
    if adjust not in ADJUSTMENTS:
        raise UsageError(argument="adjust", allowed=list(ADJUSTMENTS), got=adjust)
    if not 0 < level < 1:
        raise UsageError(argument="level", allowed="a probability strictly between 0 and 1, e.g. 0.95", got=level)
    k = max(len(bounds), 1)
    return [1 - (1 - level) / k if adjust == "bonferroni" else level for _ in bounds]


def _margin_pvalues(dist: np.ndarray, margin: float) -> tuple[float, float]:
    """Two-sided-scale bootstrap p-values against the boundary -margin: (against "loss >= margin",
    against "loss <= margin")."""
    r = len(dist)
    p_pass = min(1.0, 2 * (1 + int((dist <= -margin).sum())) / (1 + r))
    p_fail = min(1.0, 2 * (1 + int((dist >= -margin).sum())) / (1 + r))
    return p_pass, p_fail


def evidence_bounds(deltas: Mapping[str, np.ndarray], bounds: Sequence[Bound], *, level: float = 0.95,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0, adjust: str = "none") -> pd.DataFrame:
    """One row per bound: ``kind``, ``metric``, ``margin``, ``n``, ``delta``, ``ci_low``, ``ci_high``,
    ``level`` (of the interval shown), ``p_pass`` / ``p_fail`` (bootstrap p-values, Holm-adjusted
    with ``adjust="holm"``), ``verdict``, ``passed``, ``sd``, ``pass_if_equal``, ``loss_caught``
    (module docstring). ``deltas[metric]``: the paired differences of that metric (NaN dropped);
    every metric is resampled with the same seed, so one metric's interval does not depend on the
    others shown."""
    levels = _levels(bounds, level, adjust)
    rows, dists = [], {}
    for b, lev in zip(bounds, levels, strict=True):
        d = np.asarray(deltas[b.metric], dtype=np.float64)
        d = d[~np.isnan(d)]
        if b.metric not in dists:
            dists[b.metric] = bootstrap_distribution(d, resamples=resamples, seed=seed) if len(d) else None
        dist = dists[b.metric]
        tail = (1 - lev) / 2
        lo, hi = (np.quantile(dist, [tail, 1 - tail]) if dist is not None else (math.nan, math.nan))
        p_pass, p_fail = _margin_pvalues(dist, b.margin) if dist is not None else (math.nan, math.nan)
        sd = float(d.std(ddof=1)) if len(d) >= 2 else math.nan
        alpha = 1 - lev
        rows.append({"kind": b.kind, "metric": b.metric, "margin": b.margin, "n": len(d),
                     "delta": float(d.mean()) if len(d) else math.nan, "ci_low": float(lo), "ci_high": float(hi),
                     "level": lev, "p_pass": p_pass, "p_fail": p_fail, "sd": sd,
                     "pass_if_equal": _pass_if_equal(b, sd, len(d), alpha),
                     "loss_caught": b.margin + minimum_detectable_effect(sd, len(d), alpha=alpha)})
    table = pd.DataFrame(rows, columns=["kind", "metric", "margin", "n", "delta", "ci_low", "ci_high", "level",
                                        "p_pass", "p_fail", "sd", "pass_if_equal", "loss_caught"])
    if adjust == "holm" and len(table):
        table["p_pass"], table["p_fail"] = holm(table["p_pass"].to_numpy()), holm(table["p_fail"].to_numpy())
        alpha = 1 - level
        verdict = np.where(table["p_pass"] < alpha, PASS, np.where(table["p_fail"] < alpha, FAIL, INCONCLUSIVE))
    else:
        verdict = np.array([margin_verdict(r.ci_low, r.ci_high, r.margin)[()] for r in table.itertuples()],
                           dtype=object)
    table.insert(len(table.columns) - 3, "verdict", verdict)
    table.insert(len(table.columns) - 3, "passed",
                 [bool(bound_passed(k, v)) for k, v in zip(table["kind"], table["verdict"], strict=True)])
    return table


def _pass_if_equal(b: Bound, sd: float, n: int, alpha: float) -> float:
    """The predicted chance that ``b`` passes when the true change is 0 (module docstring)."""
    if b.kind == NON_INFERIOR:
        return one_sided_power(b.margin, sd, n, alpha=alpha)
    caught = one_sided_power(-b.margin, sd, n, alpha=alpha)  # the interval entirely below -m
    return 1 - caught if math.isfinite(caught) else math.nan


def rule_text(n_bounds: int, *, level: float = 0.95, adjust: str = "none") -> str:
    """The rule for several bounds at once, in words (printed under the gate's table)."""
    pct = f"{100 * level:g} %"
    if adjust == "bonferroni":
        each = (f"each interval at level {100 * (1 - (1 - level) / max(n_bounds, 1)):.4g} % "
                f"(Bonferroni over the {n_bounds} evidence bound(s))")
    elif adjust == "holm":
        each = (f"each verdict from bootstrap p-values Holm-adjusted over the {n_bounds} evidence bound(s) "
                f"(intervals shown at {pct})")
    else:
        each = f"each interval a {pct} paired-bootstrap interval of its own metric, not adjusted for the others"
    return (f"rule: the gate passes only when every bound passes; {each}. non-inferior passes only when the "
            "interval lies above -margin (inconclusive fails it); not-worse fails only when the interval lies "
            "entirely below -margin (inconclusive passes it).")


def effect_table(deltas: Mapping[str, np.ndarray], *, alpha: float = 0.05, power: float = DEFAULT_POWER,
                 detect: Mapping[str, float] | None = None, improve_by: float = 0.0) -> pd.DataFrame:
    """Per metric of ``deltas``: ``n``, ``delta``, ``sd``, ``d_z``, ``share_improved`` (d > ``improve_by``),
    ``mde`` (at ``power`` and two-sided ``alpha``), ``detect`` (the effect named for it, else NaN),
    ``n_needed`` (valid queries to detect it), ``power_now`` (the power the current n has for it) and
    ``degenerate`` (every query's difference the same, :func:`~weknora_nb.analysis.stats.degenerate`: then
    ``d_z``, ``mde``, ``n_needed`` and ``power_now`` are NaN, as nothing can be said of them)."""
    detect = dict(detect or {})
    unknown = sorted(set(detect) - set(deltas))
    if unknown:
        raise UsageError(argument="detect", allowed=f"metrics compared: {', '.join(deltas)}", got=unknown)
    rows = []
    for m, raw in deltas.items():
        d = np.asarray(raw, dtype=np.float64)
        d = d[~np.isnan(d)]
        n = len(d)
        sd = float(d.std(ddof=1)) if n >= 2 else math.nan
        effect = detect.get(m, math.nan)
        flat = degenerate(d)
        has = math.isfinite(effect) and not flat
        rows.append({"metric": m, "n": n, "delta": float(d.mean()) if n else math.nan, "sd": sd,
                     "d_z": effect_size(d), "share_improved": share_improved(d, improve_by),
                     "mde": math.nan if flat else minimum_detectable_effect(sd, n, alpha=alpha, power=power),
                     "detect": effect,
                     "n_needed": queries_needed(sd, effect, alpha=alpha, power=power) if has else math.nan,
                     "power_now": power_of(effect, sd, n, alpha=alpha) if has else math.nan, "degenerate": flat})
    return pd.DataFrame(rows, columns=["metric", "n", "delta", "sd", "d_z", "share_improved", "mde", "detect",
                                       "n_needed", "power_now", "degenerate"])


def effect_columns(metrics: pd.DataFrame, per_query: pd.DataFrame, *, alpha: float = 0.05,
                   power: float = DEFAULT_POWER, detect: Mapping[str, float] | None = None,
                   improve_by: float = 0.0) -> pd.DataFrame:
    """A comparison's metrics table (rows ``run``, ``metric``) with ``d_z``, ``share_improved``, ``mde`` and
    ``n_needed`` added, from its per-query table (``run``, ``<metric>_a``, ``<metric>_b``)."""
    out = metrics.copy()
    for col in ("d_z", "share_improved", "mde", "n_needed"):
        out[col] = np.nan
    out["degenerate"] = False
    for run, rows in out.groupby("run", sort=False):
        pq = per_query[per_query["run"] == run]
        mets = [m for m in rows["metric"] if f"{m}_a" in pq]
        wanted = {m: v for m, v in (detect or {}).items() if m in mets}
        eff = effect_table({m: (pq[f"{m}_b"] - pq[f"{m}_a"]).to_numpy() for m in mets}, alpha=alpha, power=power,
                           detect=wanted, improve_by=improve_by).set_index("metric")
        for i in rows.index:
            m = out.at[i, "metric"]
            if m in eff.index:
                for col in ("d_z", "share_improved", "mde", "n_needed", "degenerate"):
                    out.at[i, col] = eff.at[m, col]
    return out


# ---------------------------------------------------------------------------------------
# noise split: queries against repeats
# ---------------------------------------------------------------------------------------
def _repeat_matrix(frame: pd.DataFrame, metric: str, qids: pd.Index) -> tuple[np.ndarray, np.ndarray]:
    """(queries x most repeats) values packed left (the rest 0) and each query's number of repeats."""
    f = frame.dropna(subset=[metric])
    f = f[f["query_id"].isin(qids)]
    pos = f.groupby("query_id", observed=True, sort=False).cumcount().to_numpy()
    row = pd.Index(qids).get_indexer(f["query_id"])
    counts = np.bincount(row, minlength=len(qids))
    x = np.zeros((len(qids), max(int(counts.max()) if len(counts) else 1, 1)))
    x[row, pos] = f[metric].to_numpy(dtype=np.float64)
    return x, counts


def _repeat_replicates(x: np.ndarray, counts: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The figure (mean over queries of each query's mean over its resampled repeats) per replicate."""
    q, r = x.shape
    out = np.empty(resamples)
    batch = max(1, _BATCH_CELLS // max(q * r, 1))
    inside = np.arange(r)[None, None, :] < counts[None, :, None]
    for start in range(0, resamples, batch):
        b = min(batch, resamples - start)
        idx = np.minimum((rng.random((b, q, r)) * counts[None, :, None]).astype(np.int64), counts[None, :, None] - 1)
        vals = np.take_along_axis(np.broadcast_to(x, (b, q, r)), idx, axis=2)
        out[start:start + b] = ((vals * inside).sum(axis=2) / counts[None, :]).mean(axis=1)
    return out


def _repeat_variance(x: np.ndarray, counts: np.ndarray, resamples: int, rng: np.random.Generator) -> float:
    """The run-to-run variance of the figure: the bootstrap over repeats, bias-corrected (module docstring)."""
    inside = np.arange(x.shape[1])[None, :] < counts[:, None]
    mean = (x * inside).sum(axis=1) / counts
    s2 = np.where(counts >= 2, ((x - mean[:, None]) ** 2 * inside).sum(axis=1) / np.maximum(counts - 1, 1), 0.0)
    if not (counts >= 2).any():
        return math.nan
    s2 = np.where(s2 > TIE_TOLERANCE**2, s2, 0.0)  # repeats equal up to rounding vary not at all
    shrunk = float((s2 * (counts - 1) / counts**2).sum())
    if shrunk <= 0:
        return 0.0
    correction = float((s2 / counts).sum()) / shrunk
    return float(_repeat_replicates(x, counts, resamples, rng).var(ddof=1)) * correction


def noise_split(values: pd.DataFrame, metrics: Sequence[str], *, baseline: pd.DataFrame | None = None,
                level: float = 0.95, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per metric, how much of the figure's variance comes from the queries and how much from repeats.

    ``values`` (and ``baseline``): one row per scored request of one stage, ``query_id``, ``repeat`` and
    the metric columns (:attr:`Scores.per_query <weknora_nb.core.scoring.Scores>` of that stage). With
    ``baseline`` the figure is the paired delta (values minus baseline) over the queries both hold.
    Columns: ``metric``, ``figure``, ``n_queries``, ``repeats`` (mean per query), ``ci_low`` / ``ci_high``
    (over queries, ``level``), ``sd_total``, ``sd_queries``, ``sd_repeats`` (standard deviations of the
    figure), ``share_queries``, ``share_repeats`` (of its variance), ``repeat_low`` / ``repeat_high``
    (figure +- z sd_repeats: the interval run-to-run noise alone would give).
    """
    rng = np.random.default_rng(seed + 7)
    rows = []
    for m in metrics:
        qids = pd.Index(values.dropna(subset=[m])["query_id"].unique())
        if baseline is not None:
            qids = qids.intersection(pd.Index(baseline.dropna(subset=[m])["query_id"].unique()))
        x, counts = _repeat_matrix(values, m, qids)
        per_query = (x.sum(axis=1) / np.maximum(counts, 1))
        v_rep = _repeat_variance(x, counts, resamples, rng) if len(qids) else math.nan
        reps = [counts]
        if baseline is not None:
            xa, ca = _repeat_matrix(baseline, m, qids)
            per_query = per_query - xa.sum(axis=1) / np.maximum(ca, 1)
            v_rep = v_rep + _repeat_variance(xa, ca, resamples, rng) if len(qids) else math.nan
            reps.append(ca)
        rows.append(_split_row(m, per_query, np.concatenate(reps), v_rep, level, resamples, seed))
    return pd.DataFrame(rows)


def _split_row(metric: str, per_query: np.ndarray, counts: np.ndarray, v_rep: float, level: float,
               resamples: int, seed: int) -> dict[str, float | int | str]:
    """One metric's row of :func:`noise_split` from its per-query values and repeat variance."""
    n = len(per_query)
    if n == 0:
        return {"metric": metric, "figure": math.nan, "n_queries": 0, "repeats": math.nan}
    dist = bootstrap_distribution(per_query, resamples=resamples, seed=seed)
    tail = (1 - level) / 2
    lo, hi = np.quantile(dist, [tail, 1 - tail])
    v_total = float(dist.var(ddof=1))
    share = min(v_rep / v_total, 1.0) if v_total > 0 and math.isfinite(v_rep) else (0.0 if v_rep == 0 else math.nan)
    figure = float(per_query.mean())
    z = z_quantile(1 - tail)
    sd_rep = math.sqrt(v_rep) if math.isfinite(v_rep) else math.nan
    return {"metric": metric, "figure": figure, "n_queries": n, "repeats": float(counts.mean()),
            "ci_low": float(lo), "ci_high": float(hi), "sd_total": math.sqrt(v_total),
            "sd_queries": math.sqrt(max(v_total - v_rep, 0.0)) if math.isfinite(v_rep) else math.nan,
            "sd_repeats": sd_rep, "share_queries": 1 - share if math.isfinite(share) else math.nan,
            "share_repeats": share, "repeat_low": figure - z * sd_rep, "repeat_high": figure + z * sd_rep}


# ---------------------------------------------------------------------------------------
# traffic weights
# ---------------------------------------------------------------------------------------
def weighted_figures(per_query: pd.DataFrame, metrics: Sequence[str], weights: pd.Series, *, level: float = 0.95,
                     resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Each metric's plain and traffic-weighted mean over queries, with the weighted mean's interval.

    ``per_query``: one row per query (``query_id`` column or index) with the metric columns (each
    query's mean over repeats at one stage); ``weights``: a Series of weights >= 0 indexed by query id
    (the test set's per-query ``weight``: how often users ask it). Every query of ``per_query`` needs a
    weight (a :class:`UsageError` names the first missing ones); weights of other queries are ignored.
    Columns: ``metric``, ``n``, ``mean``, ``weighted_mean``, ``ci_low``, ``ci_high``, ``shift``
    (weighted minus plain).
    """
    frame = per_query.set_index("query_id") if "query_id" in per_query.columns else per_query
    missing = [q for q in frame.index if q not in weights.index or pd.isna(weights.get(q))]
    if missing:
        raise UsageError(f"{len(missing)} quer(ies) have no weight, e.g. {', '.join(map(str, missing[:5]))}: "
                         "give every scored query a weight >= 0", argument="weights",
                         allowed="a weight per query", got=missing[:5])
    w = weights.reindex(frame.index).to_numpy(dtype=np.float64)
    rows = []
    for m in metrics:
        v = frame[m].to_numpy(dtype=np.float64)
        keep = ~np.isnan(v)
        lo, hi = weighted_bootstrap_ci(v[keep], w[keep], level=level, resamples=resamples, seed=seed)
        plain = float(v[keep].mean()) if keep.any() else math.nan
        wm = weighted_mean(v[keep], w[keep])
        rows.append({"metric": m, "n": int(keep.sum()), "mean": plain, "weighted_mean": wm, "ci_low": lo,
                     "ci_high": hi, "shift": wm - plain})
    return pd.DataFrame(rows)

