"""Hardening, round three (issue 46): each class of the probe, held by a test that failed before its fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb import cli
from weknora_nb.core.testset import TestSet
from weknora_nb.reports import figures, vector_view

from .test_reports_hardening import craft_run, craft_testset


def test_a_stage_named_twice_is_scored_once(capsys, tmp_path):
    examples = Path(__file__).resolve().parents[1] / "data" / "examples"
    args = ["score", str(examples / "testset.jsonl"), str(examples / "results.jsonl"), "--json"]
    assert cli.main([*args, "--stage", "final"]) == 0
    once = capsys.readouterr().out
    assert cli.main([*args, "--stage", "final", "--stage", "final"]) == 0
    assert capsys.readouterr().out == once


def test_pooling_a_run_of_another_test_set_is_refused_naming_the_run(capsys, tmp_path):
    run = craft_run(tmp_path / "runs", "r", craft_testset(tmp_path / "a"), stages=["final"])
    other = tmp_path / "other.jsonl"
    TestSet.from_records([{"query_id": "z1", "query": "other", "relevant": {"c1": 1}}]).to_jsonl(other)
    code = cli.main(["testset", "pool", "--testset", str(other), "--runs", str(run), "--out", str(tmp_path / "w.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"--runs: {run} holds no query of the test set {other}" in err and "another test set" in err
    assert not (tmp_path / "w.csv").exists()


def test_a_run_and_its_baseline_of_one_name_are_compared_as_two_runs(tmp_path):
    from weknora_nb.analysis.compare import compare_runs

    ts = craft_testset(tmp_path)
    a = craft_run(tmp_path / "runs", "a", ts, stages=["final"], run_name="same", seed=0)
    b = craft_run(tmp_path / "copy", "a", ts, stages=["final"], run_name="same", seed=1)
    cmp = compare_runs([a, b], metrics=["ndcg@5", "recall@10"], resamples=200)
    assert list(cmp.metrics["run"].unique()) == ["same#2"] and set(cmp.metrics["baseline"]) == {"same"}
    assert cmp.recommendation.startswith("same#2 vs same (stage final")


def test_a_run_with_no_degraded_query_has_no_cause_chart_and_no_error():
    summary = pd.DataFrame({"final": [0, 0]}, index=["degraded queries", "unexplained"])
    assert figures.cause_bars(summary) is None
    assert figures.cause_bars(summary.iloc[:1]) is None   # only the count row


@pytest.mark.parametrize("sweep", [[], [{"ef_search": 10, "recall": {}}], [{"ef_search": 10}]])
def test_a_vector_trace_without_rows_draws_no_sweep_and_says_what_it_has(tmp_path, sweep):
    (tmp_path / "vector_trace.json").write_text(json.dumps({"sweep": sweep, "weknora": {"ef_search": 40}}),
                                                encoding="utf-8")
    assert vector_view.ef_sweep([tmp_path]) is None
    assert "<table" in vector_view.vector_store_table([tmp_path]).data


@pytest.mark.slow
def test_reports_of_a_run_with_no_degraded_query_and_an_empty_trace_render(tmp_path):
    """04 and 05 of a run none of whose queries is degraded, with an empty vector trace, against a baseline of the
    same run name (a copy): every page renders."""
    from weknora_nb.reports.render import render_report

    ts = craft_testset(tmp_path)
    base = craft_run(tmp_path / "runs", "base", ts, stages=["vector", "final"], run_name="same", seed=0)
    run = tmp_path / "runs" / "good"
    shutil.copytree(base, run)
    rows = pd.read_parquet(run / "results.parquet")
    good = rows.assign(chunk_id=[f"c{q[1:]}" if r == 1 else c for q, c, r in
                                 zip(rows["query_id"], rows["chunk_id"], rows["rank"], strict=True)])
    good.to_parquet(run / "results.parquet")
    for d in (base, run):
        (d / "vector_trace.json").write_text(json.dumps({"sweep": [], "weknora": {"ef_search": 40}}), encoding="utf-8")
    report = render_report(run, [base], out_root=tmp_path / "reports", notebooks=["04_degraded", "05_compare"])
    assert set(report.pages) == {"04_degraded", "05_compare"}
