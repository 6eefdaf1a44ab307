"""Label coverage (docs/method.md section 10): judged@K per run, the comparison's warning and bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from weknora_nb.analysis.compare import compare_runs
from weknora_nb.analysis.coverage import coverage_bounds, coverage_table, coverage_warning, unjudged_as_relevant
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

from .conftest import failed, ranked, results_frame

TS = TestSet.from_records([
    {"query_id": "q1", "query": "a", "relevant": {"a1": 3, "a0": 0}},
    {"query_id": "q2", "query": "b", "relevant": {"b1": 2}},
    {"query_id": "q3", "query": "c", "relevant": {}},  # invalid: never scored, never widened
])


def _run(name: str, rows: list[tuple]) -> Run:
    res = results_frame(rows)
    return Run(Path(name), {"run_name": name}, res, TS, score(TS, res, ["ndcg@5", "recall@10", "judged@10"]))


# baseline returns only labelled chunks; the other puts unjudged chunks first
BASE = _run("base", ranked("q1", ["a1", "a0"]) + ranked("q2", ["b1"]) + ranked("q3", ["x"]))
NEW = _run("new", ranked("q1", ["n1", "a1", "a0"]) + ranked("q2", ["n2", "n3", "b1"]) + ranked("q3", ["x"]))


def test_coverage_table_by_hand():
    t = coverage_table([BASE, NEW])
    assert t.loc["base", "final"] == pytest.approx(1.0)
    assert t.loc["new", "final"] == pytest.approx((2 / 3 + 1 / 3) / 2)


def test_failed_requests_do_not_count_as_unjudged():
    run = _run("f", ranked("q1", ["a1"]) + failed("q2"))
    assert coverage_table([run]).loc["f", "final"] == pytest.approx(1.0)  # one request scored, fully judged


def test_unjudged_as_relevant_widens_valid_queries_only_to_depth():
    wide = unjudged_as_relevant(TS, [NEW.results], depth=1)
    rel = {r["query_id"]: r["relevant"] for r in wide.records()}
    assert rel["q1"] == {"a1": 3, "a0": 0, "n1": 1}  # rank 2+ out of depth; existing labels kept
    assert rel["q2"] == {"b1": 2, "n2": 1}
    assert rel["q3"] == {}  # an invalid query stays invalid
    assert wide.hash != TS.hash


def test_warning_when_the_compared_run_is_less_judged():
    text = coverage_warning(BASE, NEW, "final")
    assert text and "judged@10 0.50 vs 1.00" in text
    assert coverage_warning(NEW, BASE, "final") is None  # more coverage is not a bias against it
    assert coverage_warning(BASE, NEW, "final", threshold=0.6) is None


def test_bounds_span_both_labellings():
    b = coverage_bounds(BASE, NEW, "final", ["ndcg@5"], depth=10).set_index("metric").loc["ndcg@5"]
    assert b["a_irrelevant"] == pytest.approx(1.0)
    assert b["delta_irrelevant"] < 0  # the new run looks worse with its unjudged chunks as irrelevant
    assert b["delta_relevant"] > b["delta_irrelevant"]  # and much better if they were relevant
    assert (b["delta_low"], b["delta_high"]) == (b["delta_irrelevant"], b["delta_relevant"])


def test_compare_runs_carries_the_warning():
    cmp = compare_runs([BASE, NEW], metrics=["ndcg@5"], resamples=200)
    assert any("fewer labelled chunks" in w for w in cmp.warnings)


def test_judged_is_a_metric_like_any(tmp_path, capsys):
    from weknora_nb.cli import main

    ts_path = tmp_path / "t.jsonl"
    TS.to_jsonl(ts_path)
    res_path = tmp_path / "r.parquet"
    from weknora_nb.core.results import write_results

    write_results(NEW.results, res_path)
    assert main(["score", str(ts_path), str(res_path), "--metrics", "judged@10", "--json"]) == 0
    out = capsys.readouterr().out
    assert "judged@10" in out and "0.5" in out


def test_traffic_weighted_means_beside_the_plain_ones():
    from weknora_nb.reports.notebook import traffic_weighted

    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"a1": 3}, "weight": 9},
                               {"query_id": "q2", "query": "b", "relevant": {"b1": 2}, "weight": 1}])
    res = results_frame(ranked("q1", ["a1"]) + ranked("q2", ["x"]))
    run = Run(Path("w"), {"run_name": "w"}, res, ts, score(ts, res, ["hit@5"]))
    html = traffic_weighted(run, "final", resamples=200).data
    assert "0.5" in html and "0.9" in html  # plain 0.5; weighted (9 * 1 + 1 * 0) / 10
    assert "no traffic weight" in traffic_weighted(BASE, "final").data  # no weights: a sentence says so
