"""Acceptance tiers (METHOD.md section 4).

A figure is ``excellent``, ``good``, ``pass`` or ``fail`` by the thresholds below. For a
specialised, deep-domain knowledge base every threshold may be lowered by a stated
fraction between 5 % and 10 % (``domain_adjustment=0.05`` .. ``0.10``): threshold x (1 - adjustment).
Metrics without thresholds have no tier (``None``).
"""

from __future__ import annotations

__all__ = ["THRESHOLDS", "TIERS", "tier", "thresholds"]

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


def _check_adjustment(domain_adjustment: float) -> None:
    if not (domain_adjustment == 0 or 0.05 - _EPS <= domain_adjustment <= 0.10 + _EPS):
        raise ValueError("domain_adjustment must be 0 or between 0.05 and 0.10 (5-10 %). "
                         f"Got {domain_adjustment!r} instead.")


def thresholds(metric: str, domain_adjustment: float = 0.0) -> tuple[float, float, float] | None:
    """(excellent, good, pass) bounds of ``metric`` after the domain adjustment, or None."""
    _check_adjustment(domain_adjustment)
    bounds = THRESHOLDS.get(metric)
    if bounds is None:
        return None
    return tuple(b * (1.0 - domain_adjustment) for b in bounds)  # type: ignore[return-value]


def tier(metric: str, value: float, domain_adjustment: float = 0.0) -> str | None:
    """The tier of ``value`` for ``metric`` (canonical name such as ``"ndcg@5"``), or None."""
    bounds = thresholds(metric, domain_adjustment)
    if bounds is None or value is None or value != value:  # NaN has no tier
        return None
    for name, bound in zip(TIERS, bounds):
        if value >= bound - _EPS:
            return name
    return "fail"
