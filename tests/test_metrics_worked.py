"""docs/method.md section 3 worked example and section 2 rules, computed by hand."""

import math

import pytest

from weknora_nb import score
from weknora_nb.core.testset import TestSet

from .conftest import failed, ranked, results_frame

RUN = ["X", "B", "A", "Y", "C"]


def one(ts, chunks, metrics):
    sc = score(ts, results_frame(ranked("q1", chunks)), metrics)
    return sc.per_query.iloc[0]


@pytest.mark.parametrize("metric, expected", [
    ("recall@3", 2 / 3),
    ("recall@5", 1.0),
    ("recall@10", 1.0),
    ("hit@1", 0.0),
    ("hit@3", 1.0),
    ("mrr@20", 0.5),
    ("ndcg@3", 5.392789 / 9.392789),
    ("ndcg@5", 5.779642 / 9.392789),
    ("ndcg@10", 5.779642 / 9.392789),
    ("ndcg@5:linear", 0.661236),
    ("ndcg@3:binary", 0.530721),
    ("ndcg@5:binary", 0.712263),
    ("precision@5", 3 / 5),
    ("precision@10", 3 / 10),
    ("map@5", (1 / 2 + 2 / 3 + 3 / 5) / 3),
])
def test_worked_example(worked_testset, metric, expected):
    assert one(worked_testset, RUN, [metric])[metric] == pytest.approx(expected, abs=1e-6)


def test_worked_example_dcg_by_hand(worked_testset):
    # DCG@5 = (2^2-1)/log2(3) + (2^3-1)/log2(4) + (2^1-1)/log2(6); IDCG@5 = 7 + 3/log2(3) + 1/2
    dcg = 3 / math.log2(3) + 7 / 2 + 1 / math.log2(6)
    idcg = 7 + 3 / math.log2(3) + 1 / 2
    assert dcg == pytest.approx(5.779642, abs=1e-6)
    assert idcg == pytest.approx(9.392789, abs=1e-6)
    assert one(worked_testset, RUN, ["ndcg@5"])["ndcg@5"] == pytest.approx(dcg / idcg, abs=1e-12)


def test_idcg_uses_all_labels_not_the_run(worked_testset):
    # returning only C (grade 1) at rank 1 must not score 1: IDCG comes from the labels
    v = one(worked_testset, ["C"], ["ndcg@5"])["ndcg@5"]
    assert v == pytest.approx(1 / 9.392789, abs=1e-6)


def test_duplicates_count_once_at_first_position(worked_testset):
    sc = score(worked_testset, results_frame(ranked("q1", ["B", "B", "A"])), ["ndcg@5", "mrr@20", "recall@2"])
    dedup = score(worked_testset, results_frame(ranked("q1", ["B", "A"])), ["ndcg@5", "mrr@20", "recall@2"])
    for m in ("ndcg@5", "mrr@20", "recall@2"):
        assert sc.per_query.iloc[0][m] == pytest.approx(dedup.per_query.iloc[0][m], abs=1e-15)
    assert sc.per_query.iloc[0]["recall@2"] == pytest.approx(2 / 3)  # A moved up to position 2
    assert sc.counts.n_duplicates_removed == 1
    assert sc.per_query.iloc[0]["n_duplicates"] == 1
    assert any("duplicate" in w for w in sc.warnings)


def test_failed_request_is_excluded_and_empty_list_scores_zero():
    ts = TestSet.from_records([
        {"query_id": "ok", "query": "a", "relevant": {"A": 3}},
        {"query_id": "empty", "query": "b", "relevant": {"A": 3}},
        {"query_id": "broken", "query": "c", "relevant": {"A": 3}},
    ])
    rows = ranked("ok", ["A"]) + ranked("empty", []) + failed("broken", "server")
    sc = score(ts, results_frame(rows), ["recall@5"])
    pq = sc.per_query.set_index("query_id")["recall@5"]
    assert pq.to_dict() == {"ok": 1.0, "empty": 0.0}
    assert sc.summary.loc[0, "mean"] == pytest.approx(0.5)  # failed is not a zero
    assert sc.counts.n_failed == 1 and sc.counts.failed_by_kind == {"server": 1}
    assert not sc.complete
    ex = sc.excluded.set_index("query_id")["reason"]
    assert ex["broken"] == "failed: server"


def test_invalid_queries_are_counted_and_listed_never_scored():
    ts = TestSet.from_records([
        {"query_id": "v", "query": "a", "relevant": {"A": 1}},
        {"query_id": "zero", "query": "b", "relevant": {"A": 0}},
        {"query_id": "none", "query": "c", "relevant": {}},
    ])
    rows = ranked("v", ["A"]) + ranked("zero", ["A"]) + ranked("none", ["A"])
    sc = score(ts, results_frame(rows), ["recall@5", "ndcg@5"])
    assert sc.per_query["query_id"].tolist() == ["v"]
    assert sc.counts.n_invalid == 2 and sc.counts.invalid_ids == ["zero", "none"]
    assert set(sc.excluded["query_id"]) == {"zero", "none"}
    assert sc.complete  # invalid queries do not make the run incomplete
    assert any("invalid" in w for w in sc.warnings)
    assert any("not statistically significant" in w for w in sc.warnings)


def test_rank_order_is_used_not_score(worked_testset):
    # scores rise with rank: re-sorting by score would put C first
    rows = [("q1", "final", 1, i + 1, c, float(i)) for i, c in enumerate(RUN)]
    sc = score(worked_testset, results_frame(rows), ["ndcg@5"])
    assert sc.per_query.iloc[0]["ndcg@5"] == pytest.approx(0.615328, abs=1e-6)


def test_rows_in_any_order_are_sorted_by_rank(worked_testset):
    rows = ranked("q1", RUN)[::-1]
    sc = score(worked_testset, results_frame(rows), ["ndcg@5"])
    assert sc.per_query.iloc[0]["ndcg@5"] == pytest.approx(0.615328, abs=1e-6)


def test_repeats_are_averaged_with_spread():
    ts = TestSet.from_records([{"query_id": "q", "query": "a", "relevant": {"A": 3, "B": 3}}])
    rows = ranked("q", ["A", "B"], repeat=1) + ranked("q", ["A"], repeat=2) + ranked("q", [], repeat=3)
    sc = score(ts, results_frame(rows), ["recall@5"])
    row = sc.summary.iloc[0]
    assert row["mean"] == pytest.approx(0.5)
    assert row["min"] == 0.0 and row["max"] == 1.0 and row["n_repeats"] == 3
    assert row["std"] == pytest.approx(0.5)
    assert sc.by_repeat["recall@5"].tolist() == [1.0, 0.5, 0.0]


def test_missing_and_unknown_requests_are_reported():
    ts = TestSet.from_records([
        {"query_id": "a", "query": "a", "relevant": {"A": 1}},
        {"query_id": "b", "query": "b", "relevant": {"A": 1}},
    ])
    rows = ranked("a", ["A"], repeat=1) + ranked("a", ["A"], repeat=2) + ranked("b", ["A"], repeat=1) \
        + ranked("stranger", ["A"])
    sc = score(ts, results_frame(rows), ["hit@1"])
    assert sc.counts.n_missing == 1 and sc.counts.n_unknown_query == 1
    reasons = sc.excluded.set_index(["query_id"])["reason"].to_dict()
    assert reasons["b"].startswith("missing") and reasons["stranger"].startswith("unknown")
    assert not sc.complete


def test_several_stages_are_summarised_separately():
    ts = TestSet.from_records([{"query_id": "q", "query": "a", "relevant": {"A": 1}}])
    rows = ranked("q", ["A"], stage="vector") + ranked("q", ["B"], stage="keyword")
    sc = score(ts, results_frame(rows), ["hit@1"])
    assert sc.summary_wide()["hit@1"].to_dict() == {"vector": 1.0, "keyword": 0.0}
    js = sc.to_json_dict()
    assert js["summary"] == {"vector": {"hit@1": 1.0}, "keyword": {"hit@1": 0.0}}


def test_repeat_numbers_need_not_be_consecutive():
    ts = TestSet.from_records([{"query_id": "q", "query": "a", "relevant": {"A": 3}}])
    rows = ranked("q", ["A"], repeat=1) + ranked("q", ["B", "A"], repeat=5)
    sc = score(ts, results_frame(rows), ["mrr@10"])
    assert sc.by_repeat[["repeat", "mrr@10"]].values.tolist() == [[1, 1.0], [5, 0.5]]
    assert sc.counts.repeats == [1, 5]
