"""Acceptance tiers (docs/method.md section 4).

A figure is ``excellent``, ``good``, ``pass`` or ``fail`` by the thresholds below. For a
specialised, deep-domain knowledge base every threshold may be lowered by a stated
fraction between 5 % and 10 % (``domain_adjustment=0.05`` .. ``0.10``): threshold x (1 - adjustment).
Metrics without thresholds have no tier (``None``).
"""

from __future__ import annotations

import math

from weknora_nb.core.errors import UsageError

#: tier names, best first
TIERS = ("excellent", "good", "pass", "fail")

#: metric -> (excellent, good, pass) lower bounds
THRESHOLDS: dict[str, tuple[float, float, float]] = {
    "recall@3": (0.70, 0.60, 0.50),
    "recall@5": (0.80, 0.70, 0.60),
    "recall@10": (0.90, 0.80, 0.70),
    "mrr@20": (0.80, 0.70, 0.60),
    "ndcg@5": (0.85, 0.75, 0.65),
    "ndcg@10": (0.80, 0.70, 0.60),
}

_EPS = 1e-12  # a figure equal to a bound reaches it despite float rounding


def check_domain_adjustment(domain_adjustment: float) -> None:
    """Raise UsageError unless ``domain_adjustment`` is 0 or in [0.05, 0.10] (within 1e-12)."""
    if not (domain_adjustment == 0 or 0.05 - _EPS <= domain_adjustment <= 0.10 + _EPS):
        raise UsageError(argument="domain_adjustment", allowed="0 or between 0.05 and 0.10",
                         got=domain_adjustment)


def thresholds(metric: str, domain_adjustment: float = 0.0) -> tuple[float, float, float] | None:
    """(excellent, good, pass) bounds of ``metric``, each x (1 - ``domain_adjustment``), or
    None for a metric without thresholds."""
    check_domain_adjustment(domain_adjustment)
    bounds = THRESHOLDS.get(metric)
    if bounds is None:
        return None
    excellent, good, pass_ = (b * (1.0 - domain_adjustment) for b in bounds)
    return excellent, good, pass_


def tier(metric: str, value: float | None, domain_adjustment: float = 0.0) -> str | None:
    """The tier of ``value`` for ``metric`` (canonical name such as ``"ndcg@5"``): the best
    tier whose bound ``value`` reaches (within 1e-12), ``"fail"`` below pass; None for a
    metric without thresholds or a missing value (None, NaN)."""
    bounds = thresholds(metric, domain_adjustment)
    if bounds is None or value is None or math.isnan(value):
        return None
    for name, bound in zip(TIERS, bounds, strict=False):  # TIERS has one more name: "fail"
        if value >= bound - _EPS:
            return name
    return "fail"
