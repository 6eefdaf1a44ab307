"""Acceptance tiers (docs/method.md section 4): every bound, the domain adjustment, refusals."""

from __future__ import annotations

import math

import pytest

from weknora_nb import UsageError, score
from weknora_nb.core.testset import TestSet
from weknora_nb.core.tiers import THRESHOLDS, TIERS, check_domain_adjustment, thresholds, tier

from .conftest import ranked, results_frame

#: (metric, tier, bound) for every bound of every metric with thresholds
BOUNDS = [(m, name, b) for m, bounds in THRESHOLDS.items() for name, b in zip(TIERS, bounds, strict=False)]


def next_tier(name: str) -> str:
    return TIERS[TIERS.index(name) + 1]


def test_every_metric_has_three_falling_bounds():
    assert TIERS == ("excellent", "good", "pass", "fail")
    assert set(THRESHOLDS) == {"recall@3", "recall@5", "recall@10", "mrr@20", "ndcg@5", "ndcg@10"}
    for bounds in THRESHOLDS.values():
        assert len(bounds) == 3 and bounds[0] > bounds[1] > bounds[2] > 0


@pytest.mark.parametrize("metric, name, bound", BOUNDS)
def test_a_value_at_a_bound_reaches_it_and_just_below_falls_to_the_next(metric, name, bound):
    assert tier(metric, bound) == name
    assert tier(metric, bound - 1e-13) == name  # float rounding at the bound is forgiven
    assert tier(metric, bound - 1e-9) == next_tier(name)
    assert tier(metric, math.nextafter(bound, 2.0)) == name


@pytest.mark.parametrize("metric", sorted(THRESHOLDS))
def test_below_pass_is_fail_and_a_perfect_figure_is_excellent(metric):
    assert tier(metric, 0.0) == "fail"
    assert tier(metric, THRESHOLDS[metric][2] / 2) == "fail"
    assert tier(metric, 1.0) == "excellent"


@pytest.mark.parametrize("metric", ["hit@5", "precision@5", "map@10", "ndcg@5:linear", "ndcg@5:binary",
                                    "recall@20", "mrr@10", "ndcg@3"])
def test_metrics_without_thresholds_have_no_tier(metric):
    assert thresholds(metric) is None and thresholds(metric, 0.05) is None
    assert tier(metric, 0.99) is None and tier(metric, 0.0) is None


@pytest.mark.parametrize("value", [None, float("nan")])
def test_a_missing_value_has_no_tier(value):
    assert tier("ndcg@5", value) is None and tier("ndcg@5", value, 0.10) is None


@pytest.mark.parametrize("adjustment", [0.05, 0.10])
def test_the_domain_adjustment_lowers_every_bound_by_its_fraction(adjustment):
    for metric, bounds in THRESHOLDS.items():
        lowered = thresholds(metric, adjustment)
        assert lowered is not None
        assert lowered == pytest.approx(tuple(b * (1 - adjustment) for b in bounds), abs=1e-15)
        assert all(low < b for low, b in zip(lowered, bounds, strict=True))
        for name, low in zip(TIERS, lowered, strict=False):
            assert tier(metric, low, adjustment) == name
            assert tier(metric, low - 1e-9, adjustment) == next_tier(name)


def test_the_worked_adjustment_of_ndcg_at_5():
    assert thresholds("ndcg@5") == (0.85, 0.75, 0.65)
    assert thresholds("ndcg@5", 0.05) == pytest.approx((0.8075, 0.7125, 0.6175))
    assert thresholds("ndcg@5", 0.10) == pytest.approx((0.765, 0.675, 0.585))
    assert tier("ndcg@5", 0.62) == "fail"
    assert tier("ndcg@5", 0.62, 0.05) == "pass"  # 0.65 x 0.95 = 0.6175
    assert tier("ndcg@5", 0.70, 0.10) == "good"  # 0.75 x 0.90 = 0.675


@pytest.mark.parametrize("adjustment", [0, 0.0, 0.05, 0.07, 0.10, 0.05 - 1e-13, 0.10 + 1e-13])
def test_allowed_adjustments(adjustment):
    check_domain_adjustment(adjustment)
    assert tier("ndcg@5", 0.9, adjustment) == "excellent"


@pytest.mark.parametrize("adjustment", [0.02, 0.2, -0.05, 0.04999, 0.10001, 1.0, float("nan")])
def test_other_adjustments_are_refused(adjustment):
    for call in (lambda: check_domain_adjustment(adjustment), lambda: thresholds("ndcg@5", adjustment),
                 lambda: tier("ndcg@5", 0.7, adjustment), lambda: tier("hit@5", 0.7, adjustment)):
        with pytest.raises(UsageError) as err:
            call()
        assert err.value.argument == "domain_adjustment" and err.value.allowed == "0 or between 0.05 and 0.10"
        assert err.value.got is adjustment
        assert str(err.value) == f"domain_adjustment must be 0 or between 0.05 and 0.10. Got {adjustment!r} instead."


WORKED = TestSet.from_records([{"query_id": "q1", "query": "worked example", "relevant": {"A": 3, "B": 2, "C": 1}}])
RUN = results_frame(ranked("q1", ["X", "B", "A", "Y", "C"]))  # recall@3 = 2/3, ndcg@5 = 0.615328, mrr@20 = 0.5


def summary_tiers(adjustment: float) -> dict[str, str | None]:
    sc = score(WORKED, RUN, ["recall@3", "ndcg@5", "mrr@20", "hit@5"], domain_adjustment=adjustment)
    tiers = {r.metric: r.tier if isinstance(r.tier, str) else None for r in sc.summary.itertuples()}  # NaN: none
    assert tiers == {r.metric: tier(r.metric, r.mean, adjustment) for r in sc.summary.itertuples()}
    return tiers


def test_score_applies_the_adjustment_to_its_summary_and_says_so():
    assert summary_tiers(0) == {"recall@3": "good", "ndcg@5": "fail", "mrr@20": "fail", "hit@5": None}
    # recall@3 2/3 >= 0.70 x 0.95 = 0.665; ndcg@5 0.6153 < 0.6175
    assert summary_tiers(0.05) == {"recall@3": "excellent", "ndcg@5": "fail", "mrr@20": "fail", "hit@5": None}
    # ndcg@5 0.6153 >= 0.65 x 0.90 = 0.585; mrr@20 0.5 < 0.60 x 0.90 = 0.54
    assert summary_tiers(0.10) == {"recall@3": "excellent", "ndcg@5": "pass", "mrr@20": "fail", "hit@5": None}
    plain, lowered = score(WORKED, RUN), score(WORKED, RUN, domain_adjustment=0.10)
    note = "Acceptance thresholds lowered by 10% for a specialised domain."
    assert note in lowered.warnings and not any("lowered" in w for w in plain.warnings)
    assert lowered.warnings == [*plain.warnings, note]
    assert lowered.to_json_dict()["domain_adjustment"] == 0.10
    assert lowered.to_json_dict()["tiers"]["final"]["ndcg@5"] == "pass"


@pytest.mark.parametrize("adjustment", [0.02, 0.2, -0.05])
def test_score_refuses_a_bad_adjustment(adjustment):
    with pytest.raises(UsageError) as err:
        score(WORKED, RUN, domain_adjustment=adjustment)
    assert err.value.argument == "domain_adjustment" and err.value.got == adjustment
