"""Properties every metric must have (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weknora_nb import MetricError, parse_metric, score
from weknora_nb.core.metrics import DEFAULT_METRICS, FAMILIES, parse_metrics
from weknora_nb.core.testset import TestSet

from .conftest import examples, ranked, results_frame

ALL = [f"{f}@{k}" for f in FAMILIES for k in (1, 2, 3, 5, 10, 20)] + [
    f"ndcg@{k}:{v}" for k in (1, 5, 10) for v in ("linear", "binary")]

labels = st.dictionaries(st.sampled_from([f"c{i}" for i in range(15)]), st.integers(0, 3), min_size=1, max_size=10)
lists = st.lists(st.sampled_from([f"c{i}" for i in range(20)]), max_size=30)


@settings(max_examples=examples(60), deadline=None)
@given(rel=labels, returned=lists)
def test_every_metric_is_between_0_and_1(rel, returned):
    ts = TestSet.from_records([{"query_id": "q", "query": "x", "relevant": rel}])
    sc = score(ts, results_frame(ranked("q", returned)), ALL)
    if sc.per_query.empty:  # invalid query: nothing scored
        assert not any(g >= 1 for g in rel.values())
        return
    vals = sc.per_query[ALL].to_numpy()
    assert np.all((vals >= 0) & (vals <= 1 + 1e-12)), dict(zip(ALL, vals[0], strict=True))


@settings(max_examples=examples(60), deadline=None)
@given(rel=labels, noise=lists)
def test_a_perfect_ranking_scores_1(rel, noise):
    relevant = {c: g for c, g in rel.items() if g >= 1}
    if not relevant:
        return
    perfect = sorted(relevant, key=lambda c: -relevant[c]) + [c for c in noise if c not in rel]
    ts = TestSet.from_records([{"query_id": "q", "query": "x", "relevant": rel}])
    n = len(relevant)
    names = [f"recall@{n}", "hit@1", "mrr@1", f"map@{n}", f"precision@{n}"] + [
        f"ndcg@{k}{v}" for k in (1, 3, n, 20) for v in ("", ":linear", ":binary")]
    sc = score(ts, results_frame(ranked("q", perfect)), names)
    for m in names:
        assert sc.per_query.iloc[0][m] == pytest.approx(1.0, abs=1e-12), m


@settings(max_examples=examples(60), deadline=None)
@given(rel=labels, returned=lists)
def test_recall_and_hit_never_fall_as_k_grows(rel, returned):
    ts = TestSet.from_records([{"query_id": "q", "query": "x", "relevant": rel}])
    ks = list(range(1, 32))
    sc = score(ts, results_frame(ranked("q", returned)), [f"recall@{k}" for k in ks] + [f"hit@{k}" for k in ks])
    if sc.per_query.empty:
        return
    row = sc.per_query.iloc[0]
    for fam in ("recall", "hit"):
        v = np.array([row[f"{fam}@{k}"] for k in ks])
        assert np.all(np.diff(v) >= -1e-15)


def test_inputs_are_not_mutated():
    ts = TestSet.from_records([{"query_id": "q", "query": "x", "relevant": {"a": 1}}])
    res = results_frame(ranked("q", ["b", "a", "a"])[::-1])
    before = res.copy()
    score(ts, res)
    assert res.equals(before)


@pytest.mark.parametrize("bad, fragment", [
    ("ndcg", "family@K"),
    ("foo@5", "Only the metric families"),
    ("recall@0", "K must be >= 1"),
    ("recall@5:linear", "no variant"),
    ("ndcg@5:cubic", "variants"),
])
def test_unknown_metric_names_are_refused_with_the_registry(bad, fragment):
    """The message says what is allowed (``fragment``) and quotes the name given."""
    with pytest.raises(MetricError) as err:
        parse_metric(bad)
    message = str(err.value)
    assert fragment in message, message
    assert repr(bad) in message, message
    assert isinstance(err.value, ValueError)


def test_metric_names_are_canonical():
    assert parse_metric("NDCG@10:exp").name == "ndcg@10"
    assert parse_metric("ndcg@10:linear").name == "ndcg@10:linear"
    assert [m.name for m in parse_metrics(None)] == list(DEFAULT_METRICS)
    assert [m.name for m in parse_metrics("recall@5, recall@5,ndcg@3")] == ["recall@5", "ndcg@3"]
