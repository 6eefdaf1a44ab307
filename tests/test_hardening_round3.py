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


# ---------------------------------------------------------------------------------------
# label tools that lose or hide data
# ---------------------------------------------------------------------------------------
def _labels(path: Path, rows: list[tuple]) -> Path:
    from weknora_nb.core.labels import LabelsLog

    log = LabelsLog(path)
    for q, c, g, who in rows:
        log.append(q, c, g, assessor=who)
    return path


@pytest.fixture
def parent(tmp_path) -> Path:
    path = tmp_path / "t.jsonl"
    TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 3}},
                          {"query_id": "q2", "query": "b", "relevant": {}}]).to_jsonl(path)
    return path


def test_one_assessors_conflicting_grades_in_two_files_are_refused_whatever_their_order(capsys, tmp_path, parent):
    a = _labels(tmp_path / "a.jsonl", [("q2", "D", 3, "li")])
    b = _labels(tmp_path / "b.jsonl", [("q2", "D", 0, "li")])
    for i, files in enumerate(([a, b], [b, a])):
        code = cli.main(["testset", "merge-labels", "--testset", str(parent), "--labels", *map(str, files),
                         "--out", str(tmp_path / f"t{i}.jsonl")])
        err = capsys.readouterr().err
        assert code == 2 and "assessor 'li' graded query 'q2', chunk 'D'" in err and "disagree" in err
        assert not (tmp_path / f"t{i}.jsonl").exists()


def test_merging_the_same_files_in_another_order_gives_the_same_test_set(tmp_path, parent):
    from weknora_nb.core.lineage import merge_labels
    from weknora_nb.core.testset import load_testset

    li = _labels(tmp_path / "li.jsonl", [("q2", "E", 1, "li"), ("q2", "D", 2, "li")])
    wang = _labels(tmp_path / "wang.jsonl", [("q2", "D", 0, "wang"), ("q2", "F", 3, "wang")])
    one = merge_labels(parent, [li, wang], tmp_path / "one.jsonl").testset
    two = merge_labels(parent, [wang, li], tmp_path / "two.jsonl").testset
    assert one.hash == two.hash
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "two.jsonl").read_bytes()
    assert load_testset(tmp_path / "one.jsonl").hash == one.hash


def test_an_adjudicator_who_graded_nothing_is_refused(capsys, tmp_path, parent):
    li = _labels(tmp_path / "li.jsonl", [("q2", "D", 2, "li")])
    code = cli.main(["testset", "merge-labels", "--testset", str(parent), "--labels", str(li), "--out",
                     str(tmp_path / "t2.jsonl"), "--adjudicator", "zhang"])
    err = capsys.readouterr().err
    assert code == 2 and "--adjudicator must be one of the assessors of the labels files ['li']. Got 'zhang'" in err


@pytest.mark.parametrize("target", ["testset", "labels", "exists", "suffix"])
def test_merge_labels_never_overwrites_an_input_or_a_test_set_and_writes_the_format_its_name_says(
        capsys, tmp_path, parent, target):
    li = _labels(tmp_path / "li.jsonl", [("q2", "D", 2, "li")])
    (tmp_path / "old.jsonl").write_text("keep me\n", encoding="utf-8")
    out = {"testset": parent, "labels": li, "exists": tmp_path / "old.jsonl", "suffix": tmp_path / "m.csv"}[target]
    before = {p: p.read_bytes() for p in (parent, li, tmp_path / "old.jsonl")}
    code = cli.main(["testset", "merge-labels", "--testset", str(parent), "--labels", str(li), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--out" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in before} == before and not (tmp_path / "m.csv").exists()


def test_carry_over_to_an_empty_inventory_or_onto_an_existing_file_is_refused(capsys, tmp_path):
    from weknora_nb.core.testset import TestSet as TS

    from .test_carryover import _files, inventory

    ts, old, new = _files(tmp_path)
    empty = tmp_path / "empty.parquet"
    inventory({"n0": "x"}).iloc[:0].to_parquet(empty)   # the columns, no chunk
    code = cli.main(["testset", "carry-over", "--testset", str(ts), "--old-chunks", str(old), "--new-chunks",
                     str(empty), "--out", str(tmp_path / "t2.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "holds no chunk: every label would be lost" in err and not (tmp_path / "t2.jsonl").exists()
    kept = tmp_path / "kept.jsonl"
    TS.from_records([{"query_id": "z", "query": "kept", "relevant": {"x": 1}}]).to_jsonl(kept)
    before = kept.read_bytes()
    code = cli.main(["testset", "carry-over", "--testset", str(ts), "--old-chunks", str(old), "--new-chunks",
                     str(new), "--out", str(kept)])
    assert code == 2 and "exists" in capsys.readouterr().err and kept.read_bytes() == before


def test_a_worksheet_is_written_in_the_format_its_name_says_or_not_at_all(capsys, tmp_path):
    run = craft_run(tmp_path / "runs", "r", craft_testset(tmp_path), stages=["final"])
    for bad in ("p.txt", "p.jsonl", "p"):
        code = cli.main(["testset", "pool", "--testset", str(tmp_path / "testset.jsonl"), "--runs", str(run),
                         "--out", str(tmp_path / bad)])
        err = capsys.readouterr().err
        assert code == 2 and "a path ending in .csv or .xlsx" in err and not (tmp_path / bad).exists()


def test_exporting_a_repeat_the_run_lacks_is_refused(capsys, tmp_path):
    run = craft_run(tmp_path / "runs", "r", craft_testset(tmp_path), stages=["final"])   # repeats 1 and 2
    code = cli.main(["export", "--run", str(run), "--format", "trec", "--out", str(tmp_path / "x"), "--repeat", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--repeat must be a repeat the run holds: [1, 2]. Got 3 instead." in err
    assert not (tmp_path / "x").exists()
    (tmp_path / "file").write_text("x", encoding="utf-8")
    code = cli.main(["export", "--run", str(run), "--format", "trec", "--out", str(tmp_path / "file")])
    assert code == 2 and "--out must be a folder" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# unclear messages and wrong exit codes
# ---------------------------------------------------------------------------------------
def test_an_output_file_that_is_a_folder_is_refused_before_the_gate_runs(capsys, tmp_path):
    run = craft_run(tmp_path / "runs", "r", craft_testset(tmp_path), stages=["final"])
    for option in ("--summary-md", "--junit"):
        code = cli.main(["gate", "--run", str(run), option, str(tmp_path)])
        out, err = capsys.readouterr()
        assert code == 2 and f"argument {option}: must name a file to write, not a folder" in err
        assert "passed" not in out and "FAILED" not in out


def test_a_report_against_a_baseline_of_other_stages_or_another_test_set_is_refused_up_front(capsys, tmp_path):
    ts = craft_testset(tmp_path)
    run = craft_run(tmp_path / "runs", "r", ts, stages=["vector", "final"])
    other_stages = craft_run(tmp_path / "runs", "b", ts, stages=["vector"])
    other_ts = tmp_path / "other.jsonl"
    TestSet.from_records([{"query_id": "q0", "query": "x", "relevant": {"c0": 1}}]).to_jsonl(other_ts)
    other_set = craft_run(tmp_path / "runs", "c", other_ts, stages=["final"])
    for base, said in ((other_stages, "has no stage 'final'"), (other_set, "another test set")):
        code = cli.main(["report", "--run", str(run), "--baseline", str(base), "--out", str(tmp_path / "rep")])
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err
        assert not (tmp_path / "rep" / "r" / "05_compare.html").exists()


def test_a_dsn_whose_password_holds_an_unencoded_at_is_refused_and_never_shown(capsys, tmp_path):
    from weknora_nb.collect.checks.postgres import connect_readonly
    from weknora_nb.core.errors import UsageError

    dsn = "postgresql://reader:Secr3t@Pass@127.0.0.1:1/weknora"
    with pytest.raises(UsageError) as err:
        connect_readonly(dsn)
    assert "%40" in str(err.value)
    assert "Secr3t" not in str(err.value) and "Pass" not in str(err.value)


def test_a_run_compared_with_itself_is_called_degenerate_not_given_an_mde(capsys, tmp_path):
    run = craft_run(tmp_path / "runs", "r", craft_testset(tmp_path), stages=["final"])
    code = cli.main(["gate", "--run", str(run), "--baseline", str(run), "--detect", "ndcg@5=0.02"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("ndcg@5") and "degenerate" in x)
    assert code == 0 and line.split()[:4] == ["ndcg@5", "12", "+0.0000", "degenerate:"]   # no MDE, no query count


def test_the_judge_refuses_a_reply_that_writes_a_key_twice():
    from weknora_nb.collect.judge.prompts import InvalidReply, parse_verdict

    with pytest.raises(InvalidReply, match="writes the key 'better' twice"):
        parse_verdict('{"better": "1", "reason": "r", "better": "2"}')
    assert parse_verdict('{"better": "1", "reason": "r"}')["better"] == "1"


# ---------------------------------------------------------------------------------------
# one basis for every figure of a stage
# ---------------------------------------------------------------------------------------
def _one_repeat_failed(tmp_path: Path) -> tuple[Path, Path]:
    """A test set of two queries and a run of two repeats: q1 scores 1 then 0.5-ish, q2 fails in repeat 2."""
    from weknora_nb import write_results

    from .conftest import failed, ranked, results_frame

    ts = tmp_path / "t.jsonl"
    TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}},
                          {"query_id": "q2", "query": "b", "relevant": {"B": 1}}]).to_jsonl(ts)
    rows = [*ranked("q1", ["A"], repeat=1), *ranked("q1", ["X", "A"], repeat=2),
            *ranked("q2", ["Y", "Z", "B"], repeat=1), *failed("q2", "timeout", repeat=2)]
    res = tmp_path / "r.parquet"
    write_results(results_frame(rows), res)
    return ts, res


def test_a_stage_figure_and_its_interval_share_one_basis_when_a_repeat_failed(tmp_path):
    from weknora_nb import load_testset, score
    from weknora_nb.reports.tables import metric_table

    ts, res = _one_repeat_failed(tmp_path)
    sc = score(load_testset(ts), res, ["mrr@10", "hit@1"])
    per_query = sc.per_query_mean().set_index("query_id")
    expected = per_query["mrr@10"].mean()          # q1: (1 + 1/2) / 2 = 0.75; q2: 1/3 (its one scored repeat)
    assert expected == pytest.approx((0.75 + 1 / 3) / 2)
    row = sc.summary.set_index("metric").loc["mrr@10"]
    assert row["mean"] == pytest.approx(expected)
    table = metric_table(sc, resamples=500).set_index("metric")
    for m in ("mrr@10", "hit@1"):
        assert table.at[m, "ci_low"] <= table.at[m, "mean"] <= table.at[m, "ci_high"]


def test_a_gate_drop_is_the_paired_delta_of_the_same_queries(tmp_path, capsys):
    from weknora_nb.analysis.gate import gate

    ts = craft_testset(tmp_path)
    a = craft_run(tmp_path / "runs", "a", ts, stages=["final"], seed=0)
    b = craft_run(tmp_path / "runs", "b", ts, stages=["final"], seed=1)
    rows = pd.read_parquet(b / "results.parquet")
    drop = (rows["query_id"] == "q1") & (rows["repeat"] == 2)   # q1 fails in b's second repeat
    kept = rows[~drop]
    failed_row = rows[drop].iloc[:1].assign(chunk_id=None, rank=None, score=None, status="timeout")
    pd.concat([kept, failed_row], ignore_index=True).to_parquet(b / "results.parquet")
    result = gate(b, baseline=a, max_drops={"ndcg@5": 1.0}, non_inferior={"ndcg@5": 0.5}, allow_incomplete=True,
                  resamples=500)
    t = result.table.set_index("check")
    delta = result.bounds.set_index("metric").at["ndcg@5", "delta"]
    assert t.at["max-drop", "value"] == pytest.approx(-delta)


def test_a_run_whose_every_query_is_invalid_says_nothing_was_scored(capsys, tmp_path):
    ts = tmp_path / "t.jsonl"
    TestSet.from_records([{"query_id": f"q{i}", "query": f"x{i}", "relevant": {}} for i in range(12)]).to_jsonl(ts)
    run = craft_run(tmp_path / "runs", "r", ts, stages=["vector", "final"])
    assert cli.main(["score", str(ts), str(run / "results.parquet")]) == 1
    assert "error: nothing was scored: no query of the test set is valid" in capsys.readouterr().err
    assert cli.main(["gate", "--run", str(run), "--min", "ndcg@5=0.5"]) == 1
    err = capsys.readouterr().err
    assert "nothing could be scored at stage final: no query of the test set is valid" in err
    assert "must be one of ." not in err


def test_a_stage_whose_every_request_failed_is_named_as_failed_not_as_missing(capsys, tmp_path):
    run = craft_run(tmp_path / "runs", "r", craft_testset(tmp_path), stages=["vector", "final"], failing=("final",))
    assert cli.main(["gate", "--run", str(run), "--stage", "final", "--min", "ndcg@5=0.5"]) == 1
    err = capsys.readouterr().err
    assert "every request of stage final failed (server 12, timeout 12)" in err


@pytest.mark.slow
def test_the_reports_of_a_run_with_nothing_scored_render_and_say_why(tmp_path):
    from weknora_nb.reports.render import render_report

    ts = tmp_path / "t.jsonl"
    TestSet.from_records([{"query_id": f"q{i}", "query": f"x{i}", "relevant": {}} for i in range(12)]).to_jsonl(ts)
    run = craft_run(tmp_path / "runs", "r", ts, stages=["vector", "final"])
    report = render_report(run, out_root=tmp_path / "reports", notebooks=["02_metrics", "03_stratify", "04_degraded"])
    for page in report.pages.values():
        assert "Nothing was scored: no query of the test set is valid" in page.read_text(encoding="utf-8")


def test_collect_refuses_a_run_folder_whose_name_could_not_name_its_report(capsys, tmp_path):
    ts = craft_testset(tmp_path)
    out = tmp_path / "runs" / "a\\b"
    code = cli.main(["collect", "--base-url", "http://127.0.0.1:9", "--kb-id", "kb", "--testset", str(ts),
                     "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "field 'run_name': a run name" in err and "'a\\\\b'" in err
    assert not out.exists()
