r"""Prediction-powered inference of a mean (docs/method.md section 16; Angelopoulos et al., Science 2023).

Many items carry a prediction :math:`f` (a figure computed from LLM grades, a judge's score); a random sample
of them also carries the truth :math:`y` (the figure from people's labels or ratings). The prediction-powered
estimate of the mean of :math:`y` (the method of record's :math:`\theta_{PP} = \overline{f}_{all} +
\overline{(y - f)}_{human}`) and its interval at level :math:`1 - \alpha`:

.. math::

    \hat\theta_{PP} = \frac{1}{N}\sum_{i=1}^{N} f_i + \frac{1}{n}\sum_{j \in L} (y_j - f_j), \qquad
    \hat\theta_{PP} \pm z_{1-\alpha/2}\sqrt{\frac{\hat\sigma^2_{f}}{N} + \frac{\hat\sigma^2_{y-f,L}}{n}}

where

- the first mean runs over all :math:`N` items (the :math:`n` labelled ones included), the second over the
  labelled sample :math:`L`;
- :math:`\hat\sigma^2` are variances with divisor :math:`N` (:math:`n`): the interval is ppi-python's
  ``ppi_mean_ci(Y=y_L, Yhat=f_L, Yhat_unlabeled=f_all, lam=1)``, and :func:`ppi_mean` agrees with it to 1e-9
  (``tests/test_ppi.py``). The interval leaves out the covariance of the two means (they share the labelled items),
  of order :math:`1/N`; the simulation of ``benchmarks/ppi_coverage.py`` measures the coverage this gives;
- the rectifier :math:`\frac1n\sum (y - f)` removes the prediction's bias whatever it is: the estimate is unbiased
  and the interval valid as long as :math:`L` is a random sample of the items (never chosen by looking at
  :math:`y - f`) and :math:`f` is the same function of an item whether it is labelled or not. A good :math:`f`
  (small :math:`\sigma_{y-f}`) makes the interval narrower than the classical one from :math:`L` alone, and each
  further labelled item narrows it.

A version delta is the same estimator on the paired per-query differences (:math:`f_B - f_A`, :math:`y_B - y_A`).

**Strata** (:func:`stratified`): items whose truth is known without a sample (:math:`f = y` by construction:
queries whose pooled chunks all had labels before any grading) form a stratum of their own, averaged
classically; the estimate is the mix of the strata weighted by their share of the items,

.. math::

    \hat\theta = \sum_h \frac{N_h}{N_{all}} \hat\theta_h, \qquad
    se = \sqrt{\sum_h \left(\frac{N_h}{N_{all}}\right)^2 se_h^2},

so that a sample drawn at random among the graded queries is not mixed with queries that were complete from the
start (mixing them would bias the rectifier towards 0). With one stratum this is :func:`ppi_mean` itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from weknora_nb.analysis.stats import z_quantile
from weknora_nb.core.errors import UsageError


@dataclass(frozen=True)
class Estimate:
    """A mean with its normal interval: ``estimate`` [``low``, ``high``], its standard error ``se``; ``n_labelled``
    and ``n_unlabelled`` items; ``reason`` says why it is NaN (too few labelled items), else None."""

    estimate: float
    low: float
    high: float
    se: float
    n_labelled: int
    n_unlabelled: int
    reason: str | None = None

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def _nan(n: int, m: int, reason: str) -> Estimate:
    return Estimate(math.nan, math.nan, math.nan, math.nan, n, m, reason)


def _interval(estimate: float, se: float, n: int, m: int, alpha: float) -> Estimate:
    z = z_quantile(1 - alpha / 2)
    return Estimate(float(estimate), float(estimate - z * se), float(estimate + z * se), float(se), n, m)


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise UsageError(argument="alpha", allowed="a number strictly between 0 and 1", got=alpha)
    return float(alpha)


def ppi_mean(y: np.ndarray, f_labelled: np.ndarray, f_all: np.ndarray, *, alpha: float = 0.05) -> Estimate:
    """The prediction-powered mean and its interval (module docstring; ppi-python's ``ppi_mean_ci(y, f_labelled,
    f_all, alpha=alpha, lam=1)``): ``f_all`` the predictions of every item, the labelled ones included. With no
    prediction it is the classical mean of ``y`` (the variance of ``y`` with divisor n); with fewer than 2 labelled
    items it is NaN with the reason. ``n_unlabelled`` of the result: the items without a label, N - n."""
    alpha = _check_alpha(alpha)
    y, fl, fu = (np.asarray(a, dtype=np.float64).ravel() for a in (y, f_labelled, f_all))
    if y.shape != fl.shape:
        raise UsageError(argument="f_labelled", allowed=f"one prediction per labelled item ({len(y)})", got=len(fl))
    n, m = len(y), len(fu)
    if n < 2:
        return _nan(n, m, f"{n} labelled item{'s' if n != 1 else ''}: the rectifier's spread needs at least 2")
    if m == 0:
        return classical_mean(y, alpha=alpha)
    r = y - fl
    return _interval(fu.mean() + r.mean(), math.sqrt(fu.var() / m + r.var() / n), n, max(0, m - n), alpha)


def classical_mean(y: np.ndarray, *, alpha: float = 0.05) -> Estimate:
    """The mean of ``y`` with the normal interval from its variance with divisor n (ppi-python's ``lam=0``)."""
    alpha = _check_alpha(alpha)
    y = np.asarray(y, dtype=np.float64).ravel()
    if len(y) < 2:
        return _nan(len(y), 0, f"{len(y)} item{'s' if len(y) != 1 else ''}: a spread needs at least 2")
    return _interval(y.mean(), math.sqrt(y.var() / len(y)), len(y), 0, alpha)


@dataclass(frozen=True)
class Stratum:
    """One stratum of :func:`stratified`: the labelled items' truth and prediction (``y``, ``f_labelled``) and the
    predictions of all its items, the labelled ones included (``f_all``); ``exact``: every item's truth is known and
    equals its prediction (only ``y`` is read, averaged classically)."""

    y: np.ndarray
    f_labelled: np.ndarray
    f_all: np.ndarray
    exact: bool = False

    @property
    def size(self) -> int:
        return len(self.y) if self.exact else len(self.f_all)


def stratified(strata: list[Stratum], *, alpha: float = 0.05) -> Estimate:
    """The strata's estimates mixed by their share of the items (module docstring); empty strata left out.
    ``n_labelled`` counts the labelled items of the sampled strata, ``n_unlabelled`` their other items."""
    alpha = _check_alpha(alpha)
    parts = [s for s in strata if s.size > 0]
    total = sum(s.size for s in parts)
    if total == 0:
        return _nan(0, 0, "no item")
    estimate = variance = 0.0
    n_lab = n_unl = 0
    for s in parts:
        w = s.size / total
        if s.exact:
            y = np.asarray(s.y, dtype=np.float64)
            est = float(y.mean())
            se = math.sqrt(y.var() / len(y))
        else:
            part = ppi_mean(s.y, s.f_labelled, s.f_all, alpha=alpha)
            if part.reason:
                return _nan(len(s.y), len(s.f_all) - len(s.y), part.reason)
            est, se = part.estimate, part.se
            n_lab, n_unl = n_lab + part.n_labelled, n_unl + part.n_unlabelled
        estimate += w * est
        variance += (w * se) ** 2
    return _interval(estimate, math.sqrt(variance), n_lab, n_unl, alpha)


def projected_half_width(y: np.ndarray, f_labelled: np.ndarray, f_all: np.ndarray, more: int, *,
                         alpha: float = 0.05, share: float = 1.0) -> float:
    """The half-width the interval of :func:`ppi_mean` is expected to have once ``more`` further items drawn at
    random are labelled, the spreads staying as estimated now:
    :math:`z \\, w \\sqrt{\\hat\\sigma^2_f / N + \\hat\\sigma^2_{y-f} / (n + k)}` (``share`` w: the sampled
    stratum's share of all items; k at most the items still unlabelled). NaN with fewer than 2 labelled items."""
    y, fl, fa = (np.asarray(a, dtype=np.float64).ravel() for a in (y, f_labelled, f_all))
    n, m = len(y), len(fa)
    if n < 2:
        return math.nan
    k = min(more, max(0, m - n))
    var = (fa.var() / m if m else 0.0) + (y - fl).var() / (n + k)
    return z_quantile(1 - _check_alpha(alpha) / 2) * share * math.sqrt(var)
