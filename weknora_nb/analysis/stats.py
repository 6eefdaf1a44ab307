r"""Statistics over queries: bootstrap intervals, paired tests, multiple-comparison correction.

All resampling is vectorised (a replicate is a row of counts or signs; the statistic is a
matrix product), batched to bound memory, and seedable.

- :func:`bootstrap_ci`: percentile 95 % interval of a mean, resampling queries with
  replacement.
- :func:`paired_bootstrap_ci`: the same for the mean of paired differences
  :math:`d_q = b_q - a_q` (version B minus version A on the same query).
- :func:`randomization_test`: paired sign-flip test, two-sided,
  :math:`p = (1 + \#\{|\bar d^{*}| \ge |\bar d|\}) / (1 + R)`.
- :func:`holm`: Holm's step-down adjustment of p-values across the metrics shown;
  :func:`bonferroni` the single-step one.
- :func:`bootstrap_distribution`: the resampled means themselves (the intervals above are
  their quantiles; the same seed gives the same replicates).

Power and effect sizes of paired differences (docs/method.md section 13), with
:math:`z(p)` the standard normal quantile, level :math:`\alpha` (two-sided) and power
:math:`1 - \beta`:

- :func:`minimum_detectable_effect`:
  :math:`MDE = (z(1 - \alpha/2) + z(1 - \beta)) \, sd(d) / \sqrt{n}`;
- :func:`queries_needed`: :math:`n = ((z(1 - \alpha/2) + z(1 - \beta)) \, sd(d) / D)^2`,
  rounded up (at least 2: a standard deviation needs two queries);
- :func:`power_of`: the power of the two-sided test for a true mean difference :math:`D`,
  :math:`\Phi(|D|\sqrt{n}/sd - z(1-\alpha/2)) + \Phi(-|D|\sqrt{n}/sd - z(1-\alpha/2))`;
  :func:`one_sided_power` the first term alone (the chance that a two-sided interval lies
  entirely on one side of a boundary :math:`D` away from the true mean);
- :func:`effect_size`: :math:`d_z = \overline{d} / sd(d)` (sample SD, ddof 1);
- :func:`share_improved`: the share of queries with :math:`d_q > \text{by}` (``by = 0``:
  strictly better, :math:`d_q > 10^{-12}`, the comparison's wins).

Traffic weights: :func:`weighted_mean` and :func:`weighted_bootstrap_ci`, a query's weight
being how often users ask it (each resample's figure is :math:`\sum c_q w_q x_q / \sum c_q w_q`
with :math:`c_q` the query's count in the resample).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from statistics import NormalDist

import numpy as np

from weknora_nb.core.errors import UsageError
from weknora_nb.core.pipeline import significance_warning as significance_warning  # also ``weknora_nb.stats``'s

DEFAULT_RESAMPLES = 10_000
#: groups smaller than this get a warning in stratified tables
MIN_GROUP_SIZE = 30
#: the power the minimum detectable effect and the queries needed are stated at
DEFAULT_POWER = 0.8
#: a paired difference at most this far from 0 is a tie (the comparison's wins / ties / losses)
TIE_TOLERANCE = 1e-12
_BATCH_CELLS = 4_000_000  # replicate x query cells per batch (bounds memory)


def _as_matrix(values: np.ndarray) -> tuple[np.ndarray, bool]:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        return v[:, None], True
    if v.ndim != 2:
        raise UsageError(f"values must be 1-D (queries) or 2-D (queries x metrics). Got shape {v.shape} instead.",
                         argument="values", allowed="1-D or 2-D", got=v.shape)
    return v, False


def _count_batches(n: int, resamples: int, rng: np.random.Generator) -> Iterator[tuple[int, np.ndarray]]:
    """(first replicate, counts) batches: counts[i, q] is how often row q is drawn in replicate i."""
    batch = max(1, _BATCH_CELLS // max(n, 1))
    for start in range(0, resamples, batch):
        b = min(batch, resamples - start)
        idx = rng.integers(0, n, size=(b, n), dtype=np.int64)
        idx += (np.arange(b, dtype=np.int64) * n)[:, None]
        yield start, np.bincount(idx.ravel(), minlength=b * n).reshape(b, n)


def _bootstrap_means(v: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples x metrics) means of bootstrap resamples of the rows of ``v``."""
    n, m = v.shape
    out = np.empty((resamples, m))
    vf = v.astype(np.float64)
    for start, counts in _count_batches(n, resamples, rng):
        out[start:start + len(counts)] = counts @ vf / n
    return out


def bootstrap_distribution(values: np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                           seed: int | None = 0) -> np.ndarray:
    """The means of ``resamples`` bootstrap resamples of the queries: shape (resamples,) for 1-D
    ``values``, (resamples, metrics) for 2-D. :func:`bootstrap_ci` is their quantiles (same seed,
    same replicates)."""
    v, flat = _as_matrix(values)
    if len(v) == 0:
        raise UsageError("a bootstrap needs at least one query", argument="values", allowed="at least one row",
                         got=0)
    means = _bootstrap_means(v, resamples, np.random.default_rng(seed))
    return means[:, 0] if flat else means


def bootstrap_ci(values: np.ndarray, *, level: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                 seed: int | None = 0) -> tuple[np.ndarray, np.ndarray] | tuple[float, float]:
    """Percentile bootstrap interval of the mean over queries.

    ``values``: one value per query (1-D) or queries x metrics (2-D, one shared resampling).
    Returns ``(low, high)``: floats for 1-D input, arrays per metric for 2-D. NaN for no query.
    """
    v, flat = _as_matrix(values)
    if len(v) == 0:
        nan = np.full(v.shape[1], np.nan)
        return (float("nan"), float("nan")) if flat else (nan, nan.copy())
    means = _bootstrap_means(v, resamples, np.random.default_rng(seed))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha], axis=0)
    return (float(lo[0]), float(hi[0])) if flat else (lo, hi)


def paired_bootstrap_ci(a: np.ndarray, b: np.ndarray, *, level: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                        seed: int | None = 0):
    """Bootstrap interval of mean(b - a) over queries (paired: same queries, same order)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise UsageError(f"paired values need the same shape. Got {a.shape} and {b.shape} instead.",
                         argument="b", allowed=f"shape {a.shape}", got=b.shape)
    return bootstrap_ci(b - a, level=level, resamples=resamples, seed=seed)


def randomization_test(a: np.ndarray, b: np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                       seed: int | None = 0) -> np.ndarray | float:
    """Two-sided paired randomization (sign-flip) test of mean(b - a) = 0.

    Returns the p-value (float for 1-D input, an array per metric for 2-D).
    """
    d, flat = _as_matrix(np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64))
    n, m = d.shape
    if n == 0:
        return float("nan") if flat else np.full(m, np.nan)
    observed = np.abs(d.mean(axis=0))
    rng = np.random.default_rng(seed)
    exceed = np.zeros(m)
    batch = max(1, _BATCH_CELLS // max(n, 1))
    tol = 1e-12 * np.maximum(1.0, observed)
    for start in range(0, resamples, batch):
        r = min(batch, resamples - start)
        signs = rng.integers(0, 2, size=(r, n), dtype=np.int8).astype(np.float64) * 2.0 - 1.0
        stats = np.abs(signs @ d / n)
        exceed += (stats >= observed - tol).sum(axis=0)
    p = (1.0 + exceed) / (1.0 + resamples)
    return float(p[0]) if flat else p


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (same order as given; NaN stays NaN)."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    q = p[ok]
    m = len(q)
    if m == 0:
        return out
    order = np.argsort(q)
    adj = np.maximum.accumulate((m - np.arange(m)) * q[order])
    res = np.empty(m)
    res[order] = np.minimum(adj, 1.0)
    out[ok] = res
    return out


def bonferroni(pvalues: np.ndarray) -> np.ndarray:
    """Bonferroni-adjusted p-values: each times the number of (non-NaN) p-values, at most 1."""
    p = np.asarray(pvalues, dtype=np.float64)
    return np.minimum(p * int((~np.isnan(p)).sum()), 1.0)


# ---------------------------------------------------------------------------------------
# power, minimum detectable effect, effect sizes (module docstring)
# ---------------------------------------------------------------------------------------
def z_quantile(p: float) -> float:
    """The standard normal quantile: ``z_quantile(0.975)`` is 1.95996..."""
    if not 0 < p < 1:
        raise UsageError(argument="p", allowed="a probability strictly between 0 and 1", got=p)
    return NormalDist().inv_cdf(p)


def _check_levels(alpha: float, power: float) -> float:
    """z(1 - alpha/2) + z(power), checking both."""
    if not 0 < alpha < 1:
        raise UsageError(argument="alpha", allowed="a level strictly between 0 and 1, e.g. 0.05", got=alpha)
    if not 0 < power < 1:
        raise UsageError(argument="power", allowed="a probability strictly between 0 and 1, e.g. 0.8", got=power)
    return z_quantile(1 - alpha / 2) + z_quantile(power)


def minimum_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, power: float = DEFAULT_POWER) -> float:
    """The smallest true mean difference a paired test over ``n`` queries detects with probability
    ``power`` at two-sided level ``alpha``, for per-query differences of standard deviation ``sd``
    (same unit as the metric). NaN when ``n`` < 2 or ``sd`` is NaN."""
    z = _check_levels(alpha, power)
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return z * sd / math.sqrt(n)


def queries_needed(sd: float, delta: float, *, alpha: float = 0.05, power: float = DEFAULT_POWER) -> float:
    """The number of valid queries needed to detect a true mean difference ``delta`` with probability
    ``power`` (two-sided level ``alpha``), for per-query differences of standard deviation ``sd``:
    a whole number (at least 2), NaN when ``sd`` is NaN."""
    z = _check_levels(alpha, power)
    if not (math.isfinite(delta) and delta != 0):
        raise UsageError(argument="delta", allowed="a finite non-zero difference, e.g. 0.02", got=delta)
    if not math.isfinite(sd):
        return math.nan
    return float(max(2, math.ceil((z * sd / abs(delta)) ** 2 - 1e-9)))


def _standard_error(sd: float, n: int) -> float:
    return sd / math.sqrt(n) if n >= 1 and math.isfinite(sd) else math.nan


def one_sided_power(shift: float, sd: float, n: int, *, alpha: float = 0.05) -> float:
    """The chance that the two-sided ``1 - alpha`` interval of a mean of ``n`` paired differences lies
    entirely beyond a boundary ``shift`` away from the true mean (``shift`` > 0: the true mean is past
    the boundary), normal approximation: :math:`\\Phi(shift/se - z(1-\\alpha/2))`."""
    se = _standard_error(sd, n)
    if not math.isfinite(se):
        return math.nan
    z = z_quantile(1 - alpha / 2)
    if se == 0:
        return 1.0 if shift > 0 else 0.0
    return NormalDist().cdf(shift / se - z)


def power_of(delta: float, sd: float, n: int, *, alpha: float = 0.05) -> float:
    """The power of the two-sided paired test at level ``alpha`` for a true mean difference ``delta``."""
    return one_sided_power(abs(delta), sd, n, alpha=alpha) + one_sided_power(-abs(delta), sd, n, alpha=alpha)


def effect_size(d: np.ndarray) -> float:
    """Standardised paired difference :math:`d_z = mean(d) / sd(d)` (ddof 1). NaN for fewer than 2
    differences or when every difference is the same (:func:`degenerate`: no spread to measure it against)."""
    d = np.asarray(d, dtype=np.float64)
    if len(d) < 2 or degenerate(d):
        return math.nan
    return float(d.mean()) / float(d.std(ddof=1))


def degenerate(d: np.ndarray) -> bool:
    """Whether paired differences ``d`` (two or more) are all the same, within :data:`TIE_TOLERANCE`: a run
    compared with itself, or two versions that differ by a constant. Such a comparison has no spread, so its
    effect size, minimum detectable effect and queries needed mean nothing."""
    d = np.asarray(d, dtype=np.float64)
    d = d[~np.isnan(d)]
    return len(d) >= 2 and float(d.max() - d.min()) <= TIE_TOLERANCE


def share_improved(d: np.ndarray, by: float = 0.0) -> float:
    """The share of queries whose paired difference exceeds ``by`` (``by = 0``: strictly better,
    :math:`d_q > 10^{-12}`). NaN without queries."""
    d = np.asarray(d, dtype=np.float64)
    if not len(d):
        return math.nan
    return float((d > by + TIE_TOLERANCE).mean())


# ---------------------------------------------------------------------------------------
# traffic weights
# ---------------------------------------------------------------------------------------
def _check_weights(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v, w = np.asarray(values, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    if v.shape[:1] != w.shape or w.ndim != 1:
        raise UsageError(f"weights need one value per query ({v.shape[0]}). Got shape {w.shape} instead.",
                         argument="weights", allowed=f"shape ({v.shape[0]},)", got=w.shape)
    if len(w) and (not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0):
        raise UsageError("weights must be finite, >= 0 and not all 0 (a query's share of the traffic)",
                         argument="weights", allowed="finite numbers >= 0, not all 0", got="other values")
    return v, w


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray | float:
    """:math:`\\sum w_q x_q / \\sum w_q` per metric (float for 1-D ``values``); NaN without queries."""
    v, w = _check_weights(values, weights)
    if not len(v):
        return math.nan if v.ndim == 1 else np.full(v.shape[1], np.nan)
    out = w @ v / w.sum()
    return float(out) if v.ndim == 1 else out


def weighted_bootstrap_ci(values: np.ndarray, weights: np.ndarray, *, level: float = 0.95,
                          resamples: int = DEFAULT_RESAMPLES,
                          seed: int | None = 0) -> tuple[np.ndarray, np.ndarray] | tuple[float, float]:
    """Percentile interval of the weighted mean, resampling queries (each keeps its weight)."""
    v, w = _check_weights(values, weights)
    m, flat = _as_matrix(v)
    if not len(m):
        nan = np.full(m.shape[1], np.nan)
        return (math.nan, math.nan) if flat else (nan, nan.copy())
    out = np.empty((resamples, m.shape[1]))
    for start, counts in _count_batches(len(m), resamples, np.random.default_rng(seed)):
        cw = counts * w
        total = cw.sum(axis=1, keepdims=True)
        out[start:start + len(counts)] = np.divide(cw @ m, total, out=np.full((len(counts), m.shape[1]), np.nan),
                                                   where=total > 0)
    alpha = (1 - level) / 2
    lo, hi = np.nanquantile(out, [alpha, 1 - alpha], axis=0)
    return (float(lo[0]), float(hi[0])) if flat else (lo, hi)


def small_group_warning(size: int, minimum: int = MIN_GROUP_SIZE) -> str | None:
    if size < minimum:
        return f"only {size} queries: too few to trust this group's figure"
    return None
