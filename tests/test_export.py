"""Results other tools read: the gate's Markdown and JUnit files, ranx and TREC exports, tables."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from weknora_nb import TestSet, cli, score, write_results
from weknora_nb.analysis.export import (
    export_run,
    gate_junit,
    gate_markdown,
    latex_table,
    markdown_table,
    ranx_metric_name,
    ranx_run,
)
from weknora_nb.analysis.gate import gate
from weknora_nb.core.errors import UsageError

from .conftest import failed, ranked, results_frame
from .test_gate_evidence import write_run, write_testset

METRICS = ["ndcg@5", "ndcg@10:linear", "recall@5", "hit@5", "mrr@20", "map@10", "precision@5"]


@pytest.fixture
def gated(tmp_path):
    """A gate with a passing min, an inconclusive non-inferior bound (fails) and an inconclusive
    not-worse bound (passes), a failing max-drop."""
    n = 60
    ts = write_testset(tmp_path, n)
    base = write_run(tmp_path, "base", ts, [1] * n)
    slip = write_run(tmp_path, "slip", ts, [2 if i in (5, 25, 45) else 1 for i in range(n)])
    return gate(slip, baseline=base, minimums={"ndcg@5": 0.5}, max_drops={"ndcg@5": 0.001},
                non_inferior={"ndcg@5": 0.02}, not_worse={"ndcg@5": 0.02}, detect={"ndcg@5": 0.01}, resamples=1000)


def test_gate_markdown_parses_as_a_table_of_every_check(gated):
    md = gate_markdown(gated)
    lines = md.splitlines()
    assert lines[0] == "## weknora-nb gate FAILED"
    table = [ln for ln in lines if ln.startswith("| ") and "check" not in ln and "metric | n" not in ln]
    checks = [[c.strip() for c in ln.strip("|").split("|")] for ln in table[:len(gated.table)]]
    assert [c[:3] for c in checks] == [["PASS", "min", "ndcg@5"], ["FAIL", "max-drop", "ndcg@5"],
                                       ["FAIL", "non-inferior", "ndcg@5"], ["PASS", "not-worse", "ndcg@5"],
                                       ["PASS", "complete", "requests"]]
    assert "inconclusive: fails this bound" in checks[2][4] and "95 % CI [" in checks[2][4]
    assert "queries needed" in md and "Rule: the gate passes only when every bound passes" in md
    needed = int(gated.effects["n_needed"].iloc[0])
    assert f"{needed:.4f}" in md or str(needed) in md


def test_gate_junit_has_one_case_per_bound_and_failures_for_the_broken_ones(gated, tmp_path):
    root = ET.fromstring(gate_junit(gated))
    assert root.tag == "testsuites" and root.get("tests") == "5" and root.get("failures") == "2"
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["min ndcg@5", "max-drop ndcg@5", "non-inferior ndcg@5",
                                              "not-worse ndcg@5", "complete requests"]
    failures = {c.get("name"): c.find("failure") for c in cases}
    assert failures["min ndcg@5"] is None and failures["not-worse ndcg@5"] is None
    assert failures["max-drop ndcg@5"].get("type") == "fail"
    assert failures["non-inferior ndcg@5"].get("type") == "inconclusive"
    assert "CI [" in failures["non-inferior ndcg@5"].get("message")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["baseline"] == "base" and props["rule"].startswith("rule: the gate passes only")


def test_gate_cli_writes_both_files(tmp_path):
    n = 60
    ts = write_testset(tmp_path, n)
    base = write_run(tmp_path, "base", ts, [1] * n)
    same = write_run(tmp_path, "same", ts, [1] * n)
    md, junit = tmp_path / "out" / "summary.md", tmp_path / "out" / "gate.xml"
    assert cli.main(["gate", "--run", str(same), "--baseline", str(base), "--non-inferior", "ndcg@5=0.02",
                     "--resamples", "200", "--summary-md", str(md), "--junit", str(junit)]) == 0
    assert md.read_text(encoding="utf-8").startswith("## weknora-nb gate passed")
    assert ET.parse(junit).getroot().get("failures") == "0"


def test_gate_summary_that_cannot_be_written_is_a_storage_error(tmp_path, capsys):
    n = 30
    ts = write_testset(tmp_path, n)
    base = write_run(tmp_path, "base", ts, [1] * n)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli.main(["gate", "--run", str(base), "--min", "ndcg@5=0.1", "--summary-md", str(blocker / "s.md")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write") and "a-file" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------
# ranx and TREC
# ---------------------------------------------------------------------------------------
@pytest.fixture
def messy_run(tmp_path):
    """Graded labels, a duplicate chunk id, a merged result (sub_chunk_ids), a failed request, an empty
    list, an invalid query; two stages, two repeats."""
    ts = TestSet.from_records([
        {"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 2, "C": 1, "Z": 0}},
        {"query_id": "q2", "query": "b", "relevant": {"D": 1, "E": 3}},
        {"query_id": "q3", "query": "c", "relevant": {"F": 2}},
        {"query_id": "q4", "query": "d", "relevant": {"G": 1}},
        {"query_id": "q5", "query": "none", "relevant": {"H": 0}},
    ])
    ts_path = tmp_path / "t.jsonl"
    ts.to_jsonl(ts_path)
    rows = []
    for rep in (1, 2):
        for stage in ("vector", "final"):
            shift = ["x1"] if (rep == 2 and stage == "final") else []
            rows += ranked("q1", [*shift, "Z", "B", "x", "B", "A", "C"], stage, rep)
            rows += ranked("q2", ["E", "y", "D"] if stage == "final" else ["D", "q", "w", "E"], stage, rep)
            rows += failed("q3", stage=stage, repeat=rep) if rep == 1 else ranked("q3", ["u", "F"], stage, rep)
            rows += ranked("q4", [], stage, rep)
            rows += ranked("q5", ["H"], stage, rep)
    df = results_frame(rows)
    df["sub_chunk_ids"] = pd.array([('["C"]' if (r.query_id == "q2" and r.chunk_id == "y") else None)
                                    for r in df.itertuples()], dtype="string")
    folder = tmp_path / "run"
    folder.mkdir()
    write_results(df, folder / "results.parquet")
    (folder / "manifest.json").write_text(json.dumps({"run_name": "messy",
                                                      "testset": {"path": str(ts_path), "hash": ts.hash}}))
    return folder, ts, df


def test_ranx_export_read_back_by_ranx_scores_the_same_figures(messy_run, tmp_path):
    from ranx import Qrels, Run, evaluate

    folder, ts, df = messy_run
    files = export_run(folder, tmp_path / "ranx", fmt="ranx")
    assert sorted(f.name for f in files) == ["qrels.json", "run.final.1.json", "run.final.2.json",
                                             "run.vector.1.json", "run.vector.2.json"]
    # ranx reads every file and scores it; what the files hold is checked on their JSON (ranx's to_dict compiles
    # numba code for seconds in every process)
    qrels = Qrels.from_file(str(tmp_path / "ranx" / "qrels.json"))
    labels = json.loads((tmp_path / "ranx" / "qrels.json").read_text())
    assert set(labels) == set(qrels.keys()) == {"q1", "q2", "q3", "q4"}           # the invalid query is left out
    ours = score(ts, df, metrics=METRICS).by_repeat.set_index(["stage", "repeat"])
    for stage in ("vector", "final"):
        for rep in (1, 2):
            run = Run.from_file(str(tmp_path / "ranx" / f"run.{stage}.{rep}.json"))
            scored = json.loads((tmp_path / "ranx" / f"run.{stage}.{rep}.json").read_text())
            assert set(scored) == set(run.keys())
            assert ("q3" in scored) == (rep == 2) and scored["q4"] == {}  # failed: left out; empty: kept
            sub = Qrels.from_dict({q: labels[q] for q in scored})
            theirs = evaluate(sub, run, [ranx_metric_name(m) for m in METRICS])
            for m in METRICS:
                expected = ours.loc[(stage, rep), m]
                assert 0 < expected < 1
                assert theirs[ranx_metric_name(m)] == pytest.approx(expected, abs=1e-9), (stage, rep, m)


def test_ranx_run_keeps_the_first_position_of_a_duplicate_and_unfolds_merged_results(messy_run):
    folder, ts, df = messy_run
    run = ranx_run(df, "final", 1)
    q1 = sorted(run["q1"].items(), key=lambda kv: -kv[1])
    assert [c for c, _ in q1] == ["Z", "B", "x", "A", "C"]
    q2 = sorted(run["q2"].items(), key=lambda kv: -kv[1])
    assert [c for c, _ in q2] == ["E", "y", "C", "D"]


def test_trec_export_read_back_by_ranx(messy_run, tmp_path):
    from ranx import Qrels, Run, evaluate

    folder, ts, df = messy_run
    files = export_run(folder, tmp_path / "trec", fmt="trec", stages=["final"], repeats=[2])
    assert [f.name for f in files] == ["qrels.txt", "run.final.2.trec"]
    qrels = Qrels.from_file(str(files[0]))
    run = Run.from_file(str(files[1]))
    scored = set(run.keys())
    assert scored == {"q1", "q2", "q3"}  # a TREC run has no line for an empty list
    labels: dict[str, dict[str, int]] = {}
    for line in files[0].read_text().splitlines():   # what ranx read (its to_dict compiles for seconds)
        q, _, doc, grade = line.split()
        labels.setdefault(q, {})[doc] = int(grade)
    assert set(labels) == set(qrels.keys())
    theirs = evaluate(Qrels.from_dict({q: labels[q] for q in scored}), run, ["ndcg_burges@5", "mrr@20"])
    ours = score(ts, df[df["query_id"] != "q4"], metrics=["ndcg@5", "mrr@20"]).by_repeat.set_index(["stage", "repeat"])
    assert theirs["ndcg_burges@5"] == pytest.approx(ours.loc[("final", 2), "ndcg@5"], abs=1e-9)
    assert theirs["mrr@20"] == pytest.approx(ours.loc[("final", 2), "mrr@20"], abs=1e-9)


def test_export_cli(messy_run, tmp_path, capsys):
    folder, ts, df = messy_run
    assert cli.main(["export", "--run", str(folder), "--format", "trec", "--out", str(tmp_path / "e"),
                     "--stage", "vector"]) == 0
    out = capsys.readouterr().out
    assert "run.vector.1.trec" in out and "run.vector.2.trec" in out and "final" not in out
    assert cli.main(["export", "--run", str(folder), "--format", "ranx", "--out", str(tmp_path / "e"),
                     "--stage", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert cli.main(["export", "--run", str(tmp_path), "--format", "ranx", "--out", str(tmp_path / "e")]) == 2
    with pytest.raises(UsageError, match="judged"):
        ranx_metric_name("judged@10")


# ---------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------
def test_markdown_and_latex_tables_escape_and_format():
    df = pd.DataFrame({"metric": ["ndcg@5", "a|b_c&%"], "mean": [0.71234, np.nan], "n": [336, 12],
                       "ok": [True, False]})
    md = markdown_table(df, digits=3).splitlines()
    assert md[0] == "| metric | mean | n | ok |"
    assert md[1] == "|---|---:|---:|---|"
    assert md[2] == "| ndcg@5 | 0.712 | 336 | True |"
    assert md[3] == "| a\\|b_c&% |  | 12 | False |"
    tex = latex_table(df, digits=2, caption="Metrics 100%", label="tab:m")
    assert r"\begin{tabular}{lrrl}" in tex and r"a|b\_c\&\% &  & 12 & False \\" in tex
    assert r"ndcg@5 & 0.71 & 336 & True \\" in tex and r"\caption{Metrics 100\%}" in tex
    assert tex.startswith(r"\begin{table}") and tex.rstrip().endswith(r"\end{table}")
    wide = markdown_table(pd.DataFrame({"x": [1.0]}, index=pd.Index(["final"], name="stage")), index=True)
    assert wide.splitlines()[2] == "| final | 1.0000 |"
