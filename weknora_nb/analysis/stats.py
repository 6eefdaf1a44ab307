r"""Statistics over queries: bootstrap intervals, paired tests, multiple-comparison correction.

All resampling is vectorised (a replicate is a row of counts or signs; the statistic is a
matrix product), batched to bound memory, and seedable.

- :func:`bootstrap_ci`: percentile 95 % interval of a mean, resampling queries with
  replacement.
- :func:`paired_bootstrap_ci`: the same for the mean of paired differences
  :math:`d_q = b_q - a_q` (version B minus version A on the same query).
- :func:`randomization_test`: paired sign-flip test, two-sided,
  :math:`p = (1 + \#\{|\bar d^{*}| \ge |\bar d|\}) / (1 + R)`.
- :func:`holm`: Holm's step-down adjustment of p-values across the metrics shown.
"""

from __future__ import annotations

import numpy as np

from weknora_nb.core.errors import UsageError
from weknora_nb.core.pipeline import significance_warning

__all__ = ["bootstrap_ci", "paired_bootstrap_ci", "randomization_test", "holm", "significance_warning",
           "small_group_warning", "DEFAULT_RESAMPLES", "MIN_GROUP_SIZE"]

DEFAULT_RESAMPLES = 10_000
#: groups smaller than this get a warning in stratified tables
MIN_GROUP_SIZE = 30
_BATCH_CELLS = 4_000_000  # replicate x query cells per batch (bounds memory)


def _as_matrix(values: np.ndarray) -> tuple[np.ndarray, bool]:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        return v[:, None], True
    if v.ndim != 2:
        raise UsageError(f"values must be 1-D (queries) or 2-D (queries x metrics). Got shape {v.shape} instead.",
                         argument="values", allowed="1-D or 2-D", got=v.shape)
    return v, False


def _bootstrap_means(v: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples x metrics) means of bootstrap resamples of the rows of ``v``."""
    n, m = v.shape
    out = np.empty((resamples, m))
    batch = max(1, _BATCH_CELLS // max(n, 1))
    vf = v.astype(np.float64)
    for start in range(0, resamples, batch):
        b = min(batch, resamples - start)
        idx = rng.integers(0, n, size=(b, n), dtype=np.int64)
        idx += (np.arange(b, dtype=np.int64) * n)[:, None]
        counts = np.bincount(idx.ravel(), minlength=b * n).reshape(b, n)
        out[start:start + b] = counts @ vf / n
    return out


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




def small_group_warning(size: int, minimum: int = MIN_GROUP_SIZE) -> str | None:
    if size < minimum:
        return f"only {size} queries: too few to trust this group's figure"
    return None
