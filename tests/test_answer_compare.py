"""Answers in the paired comparison: judge scores and citation metrics per query, paired like retrieval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from weknora_nb.analysis.answer_compare import compare_answers, deltas_by_type
from weknora_nb.analysis.answers import answer_values
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

from .conftest import ranked, results_frame

N = 40
TS = TestSet.from_records([{"query_id": f"q{i:02d}", "query": f"问题 {i}", "relevant": {f"c{i}": 3},
                            "query_type": "procedural" if i % 2 else "factual"} for i in range(N)])


def _write(path, name: str, cite_right: set[int], correctness: dict[int, list[int | None]]) -> Run:
    path.mkdir()
    rows = []
    for i in range(N):
        rows += ranked(f"q{i:02d}", [f"c{i}" if i in cite_right else "x", "y"], stage="final")
        rows += ranked(f"q{i:02d}", [f"c{i}", "x"], stage="citations")
    res = results_frame(rows)
    with open(path / "answers.jsonl", "w", encoding="utf-8") as f:
        for i in range(N):
            cites = [f"c{i}"] if i in cite_right else ["x"]
            f.write(json.dumps({"query_id": f"q{i:02d}", "stage": "citations", "repeat": 1, "answer": "答",
                                "citations": cites}, ensure_ascii=False) + "\n")
    with open(path / "judgements.jsonl", "w", encoding="utf-8") as f:
        for i, scores in correctness.items():
            for j, s in enumerate(scores):
                rec = {"query_id": f"q{i:02d}", "stage": "citations", "repeat": 1, "judge_repeat": j + 1}
                if s is None:
                    rec.update(status="failed", kind="unparseable", raw="??")
                else:
                    rec.update(status="judged", scores={"correctness": s, "faithfulness": 4, "relevance": 4})
                f.write(json.dumps(rec) + "\n")
        f.write('{"query_id": "q00", "stage": "cit')  # a torn last line: a judge killed while writing
    return Run(path, {"run_name": name}, res, TS, score(TS, res, ["ndcg@5"]))


@pytest.fixture
def runs(tmp_path):
    a = _write(tmp_path / "a", "a", set(range(0, N, 2)), {i: [2, 2, 3] for i in range(N)})
    b = _write(tmp_path / "b", "b", set(range(N)), {i: [4, 4, None] for i in range(N)})
    return a, b


def test_answer_values_per_query(runs):
    a, b = runs
    va = answer_values(a)
    assert va.loc["q00", "judge.correctness"] == pytest.approx(7 / 3)
    assert va.loc["q01", "citation_precision"] == 0.0 and va.loc["q00", "citation_precision"] == 1.0
    vb = answer_values(b)
    assert vb.loc["q05", "judge.correctness"] == 4.0  # the failed judgement is left out, never scored


def test_compare_answers_pairs_like_retrieval(runs):
    a, b = runs
    t = compare_answers(a, b, resamples=500).set_index("metric")
    row = t.loc["judge.correctness"]
    assert row["n_queries"] == N and row["delta"] == pytest.approx(4 - 7 / 3)
    assert row["ci_low"] <= row["delta"] <= row["ci_high"] and row["p_holm"] < 0.05
    assert t.loc["citation_precision", "delta"] == pytest.approx(0.5)
    assert set(t["run"]) == {"b"} and set(t["baseline"]) == {"a"}


def test_deltas_by_type_sets_retrieval_beside_answers(runs):
    a, b = runs
    t = deltas_by_type(a, b, stage="final", resamples=300).set_index("query_type")
    # odd queries (procedural) gained retrieval (c_i moved to rank 1) and answers; even ones only answers
    assert t.loc["procedural", "retrieval_delta"] == pytest.approx(1.0)
    assert t.loc["factual", "retrieval_delta"] == pytest.approx(0.0)
    assert t.loc["factual", "answer_delta"] == pytest.approx(4 - 7 / 3)
    assert t["answer_n"].sum() == N and np.isfinite(t["answer_low"]).all()


def test_a_run_without_answers_has_no_answer_metrics(tmp_path):
    res = results_frame(ranked("q00", ["c0"]))
    run = Run(tmp_path, {"run_name": "r"}, res, TS, score(TS, res, ["ndcg@5"]))
    assert answer_values(run).empty
    assert compare_answers(run, run).empty


def test_answer_values_are_computed_once_per_run_and_again_when_its_files_change(runs, monkeypatch):
    import weknora_nb.analysis.answers as answers

    a, b = runs
    computed = []
    real = answers._answer_values
    monkeypatch.setattr(answers, "_answer_values", lambda run, stage: computed.append(run.name) or real(run, stage))
    for _ in range(3):
        values = answer_values(a)
        assert values.loc["q00", "judge.correctness"] == pytest.approx(7 / 3)
        values.loc["q00", "judge.correctness"] = -1.0   # the caller's copy: changing it changes nothing kept
    assert computed == ["a"]
    assert answer_values(b).loc["q05", "judge.correctness"] == 4.0 and computed == ["a", "b"]
    judged = a.path / "judgements.jsonl"   # the judge resumed: its torn last line written whole, one more judgement
    lines = judged.read_text(encoding="utf-8").splitlines()[:-1]
    judged.write_text("\n".join([*lines, json.dumps({
        "query_id": "q01", "stage": "citations", "repeat": 1, "judge_repeat": 4, "status": "judged",
        "scores": {"correctness": 5, "faithfulness": 4, "relevance": 4}})]) + "\n", encoding="utf-8")
    assert answer_values(a).loc["q01", "judge.correctness"] == pytest.approx((2 + 2 + 3 + 5) / 4)
    assert computed == ["a", "b", "a"]
    twin = Run(a.path, a.manifest, a.results, a.testset, a.scores)   # another run object: its own values
    answer_values(twin)
    assert computed == ["a", "b", "a", "a"]
