"""Tied scores inside the top K: the range of each metric over the orders the ties allow."""

from __future__ import annotations

import math

import pytest

from weknora_nb import TestSet, score
from weknora_nb.analysis.ties import mark_ties, tie_ranges

from .conftest import failed, results_frame


def rows_of(query_id: str, chunks_scores: list[tuple[str, float]], stage: str = "final", repeat: int = 1):
    return [(query_id, stage, repeat, i + 1, c, s) for i, (c, s) in enumerate(chunks_scores)]


@pytest.fixture
def testset():
    return TestSet.from_records([
        {"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 1}},
        {"query_id": "q2", "query": "b", "relevant": {"C": 1}},
        {"query_id": "q3", "query": "c", "relevant": {"D": 2}},
        {"query_id": "q4", "query": "d", "relevant": {"E": 1}},
    ])


def summary(t, metric):
    return t.summary.set_index(["stage", "metric"]).loc[("final", metric)]


def test_best_and_worst_orders_of_a_tie_bound_the_figure(testset):
    """q1: x and A tie at the top (A grade 3); q2: C and y tie; q3: no tie; q4: a failed request."""
    df = results_frame(rows_of("q1", [("x", 1.0), ("A", 1.0), ("B", 0.5)]) + rows_of("q2", [("C", 0.9), ("y", 0.9)])
                       + rows_of("q3", [("z", 0.9), ("D", 0.8)]) + failed("q4"))
    t = tie_ranges(testset=testset, results=df, metrics=["mrr@5", "recall@1", "hit@5"])
    mrr = summary(t, "mrr@5")
    # observed: q1 1/2, q2 1, q3 1/2; best: 1, 1, 1/2; worst: 1/2, 1/2, 1/2 (q4 failed: excluded)
    assert (mrr["observed"], mrr["best"], mrr["worst"]) == pytest.approx((2 / 3, 5 / 6, 1 / 2))
    assert mrr["range"] == pytest.approx(1 / 3) and mrr["flagged"]
    assert mrr["requests"] == 3 and mrr["requests_with_ties"] == 2 and mrr["queries_wider"] == 2
    hit = summary(t, "hit@5")
    assert hit["range"] == 0 and not hit["flagged"]                # inside the top 5 the order does not matter
    r1 = summary(t, "recall@1")
    assert (r1["best"], r1["worst"]) == pytest.approx(((0.5 + 1 + 0) / 3, 0.0))
    assert any("mrr@5" in w and "range 0.3333" in w for w in t.warnings)
    pq = t.per_query.set_index(["query_id", "metric"])
    assert pq.loc[("q3", "mrr@5"), "range"] == 0
    assert (pq.loc[("q1", "mrr@5"), "best"], pq.loc[("q1", "mrr@5"), "worst"]) == (1.0, 0.5)
    assert "q4" not in set(t.per_query["query_id"])


def test_the_observed_figure_is_the_normal_score(testset):
    df = results_frame(rows_of("q1", [("x", 1.0), ("A", 1.0)]) + rows_of("q2", [("C", 0.3), ("y", 0.3)]))
    t = tie_ranges(testset=testset, results=df, metrics=["ndcg@5"])
    plain = score(testset, df, metrics=["ndcg@5"]).summary_wide().loc["final", "ndcg@5"]
    assert summary(t, "ndcg@5")["observed"] == pytest.approx(plain)
    assert summary(t, "ndcg@5")["worst"] <= plain <= summary(t, "ndcg@5")["best"]


def test_equal_scores_that_are_not_adjacent_are_not_ties(testset):
    df = results_frame(rows_of("q1", [("x", 1.0), ("B", 0.7), ("A", 1.0)]))
    marked = mark_ties(df)
    assert marked["tie_size"].tolist() == [1, 1, 1]
    t = tie_ranges(testset=testset, results=df, metrics=["ndcg@5", "mrr@5"])
    assert (t.summary["range"] == 0).all() and not t.summary["flagged"].any() and t.warnings == []


def test_a_tie_across_the_cutoff_decides_what_enters_the_top_k(testset):
    """A (grade 3) ties with x at positions 1-2: recall@1 is 0 or 1/2 for q1; ties starting past K do not
    count as inside the top K."""
    df = results_frame(rows_of("q1", [("x", 1.0), ("A", 1.0), ("y", 0.5), ("B", 0.5)]))
    t = tie_ranges(testset=testset, results=df, metrics=["recall@1", "recall@3", "ndcg@5"])
    r1, r3 = summary(t, "recall@1"), summary(t, "recall@3")
    assert (r1["worst"], r1["best"]) == (0.0, 0.5)
    assert (r3["worst"], r3["best"]) == (0.5, 1.0)   # the y/B tie straddles position 3
    assert r1["requests_with_ties"] == 1 and r3["requests_with_ties"] == 1
    assert summary(t, "ndcg@5")["range"] > 0


def test_threshold_and_repeats(testset):
    """Two repeats, a tie only in the second: per-query ranges are means over repeats; a threshold above
    the range does not flag."""
    df = results_frame(rows_of("q1", [("A", 0.9), ("x", 0.8)], repeat=1)
                       + rows_of("q1", [("x", 0.8), ("A", 0.8)], repeat=2))
    t = tie_ranges(testset=testset, results=df, metrics=["mrr@5"], threshold=0.5)
    s = summary(t, "mrr@5")
    assert (s["observed"], s["best"], s["worst"]) == pytest.approx((0.75, 1.0, 0.75))
    assert not s["flagged"] and s["requests_with_ties"] == 1
    assert math.isclose(t.per_query.iloc[0]["range"], 0.25)
    assert tie_ranges(testset=testset, results=df, metrics=["mrr@5"]).summary["flagged"].all()
