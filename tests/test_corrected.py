"""Corrected figures of runs (analysis/corrected.py, calibration.py, label_next.py, answer_ppi.py; ``corrected``,
``testset calibration``, ``testset label-next``, ``score --grades``, ``gate --grades``): the human-labelled sample
of a retrieval metric, the strata, agreement with ppi-python on the runs' own per-query values, the calibration
against scikit-learn, the worksheet of what to label next, the judge corrected by ratings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from weknora_nb import TestSet
from weknora_nb.analysis.answer_ppi import corrected_answers, read_ratings_file
from weknora_nb.analysis.calibration import calibration
from weknora_nb.analysis.corrected import corrected_estimates, query_strata
from weknora_nb.analysis.label_next import label_next, sample_order
from weknora_nb.cli import main
from weknora_nb.core.errors import InputError, UsageError
from weknora_nb.core.grades import MARKER, read_grades, with_labels
from weknora_nb.core.labels import Judgement
from weknora_nb.core.scoring import score
from weknora_nb.reports.labelling import read_worksheet

from .conftest import ranked
from .test_pooling import make_run

ppi_py = pytest.importorskip("ppi_py")
N = 40
EXACT = range(0, 5)          # pools labelled in full before grading: no fill grade
SAMPLE = range(5, 15)        # graded, then labelled in full by people: the human-labelled sample
PARTLY = 15                  # graded, one of its graded chunks labelled since: not in the sample


def _qid(i: int) -> str:
    return f"q{i:02d}"


@pytest.fixture
def world(tmp_path):
    """Two runs of 40 queries whose pools are chunks c0-c5 of each query; people labelled c0-c2 (and, for the
    exact queries, c3-c5 too); an LLM graded the others leniently; people labelled the sample's since."""
    rng = np.random.default_rng(5)
    truth = rng.integers(0, 4, size=(N, 6))
    truth[:, 0] = 3
    records, fill, later = [], [], []
    for i in range(N):
        known = range(6) if i in EXACT else range(3)
        records.append({"query_id": _qid(i), "query": f"问题 {i}", "query_type": "factual" if i % 2 else "technical",
                        "relevant": {f"{_qid(i)}-c{k}": int(truth[i, k]) for k in known}})
        for k in (range(3, 6) if i not in EXACT else ()):
            fill.append((_qid(i), f"{_qid(i)}-c{k}", int(min(3, truth[i, k] + rng.integers(0, 2)))))
            if i in SAMPLE or (i == PARTLY and k == 3):
                later.append(Judgement(_qid(i), f"{_qid(i)}-c{k}", int(truth[i, k]), "li", "2026-12-01T00:00:00Z"))
    ts_path = tmp_path / "t.jsonl"
    TestSet.from_records(records).to_jsonl(ts_path)
    order_a, order_b = [1, 0, 3, 2, 4, 5], [0, 3, 4, 1, 2, 5]
    runs = [make_run(tmp_path, name, [r for i in range(N) for r in ranked(_qid(i), [f"{_qid(i)}-c{k}" for k in o])],
                     ts_path, inventory={f"{_qid(i)}-c{k}": f"第 {i} 题的片段 {k}" for i in range(N) for k in range(6)})
            for name, o in (("base", order_a), ("new", order_b))]
    grades = tmp_path / "relevance-grades.jsonl"
    with open(grades, "w", encoding="utf-8") as f:
        for q, c, g in fill:
            f.write(json.dumps({"query_id": q, "chunk_id": c, "judge_repeat": 1, "status": "judged", "grade": g,
                                "purpose": "fill"}) + "\n")
        f.write(json.dumps({"query_id": "q00", "chunk_id": "q00-c1", "judge_repeat": 1, "status": "judged",
                            "grade": 3, "purpose": "calibration"}) + "\n")
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"query_id": j.query_id, "chunk_id": j.chunk_id, "grade": j.grade,
                                          "assessor": j.assessor, "at": j.at}) + "\n" for j in later), "utf-8")
    return ts_path, runs, grades, later, labels


def test_the_labelled_sample_is_the_graded_queries_people_labelled_in_full(world):
    ts_path, runs, grades, later, _ = world
    human = with_labels(TestSet.from_records([json.loads(x) for x in ts_path.read_text("utf-8").splitlines()]), later)
    s = query_strata(read_grades(grades), human)
    assert list(s.index[~s["graded"]]) == [_qid(i) for i in EXACT]
    assert list(s.index[s["labelled"]]) == [_qid(i) for i in SAMPLE]
    assert s.loc[_qid(PARTLY), "to_label"] == 2 and s.loc[_qid(20), "to_label"] == 3


def test_corrected_means_and_deltas_agree_with_ppi_python_on_the_runs_values(world):
    ts_path, runs, grades, later, _ = world
    out = corrected_estimates(runs, grades, labels=later, metrics=["ndcg@5", "recall@3"])
    assert out.n_labelled == len(SAMPLE) and out.n_graded == N - len(EXACT) and out.marker.startswith(MARKER)
    g = read_grades(grades)
    human = with_labels(TestSet.from_records([json.loads(x) for x in ts_path.read_text("utf-8").splitlines()]), later)
    filled = g.filled(human)
    ids = {k: [_qid(i) for i in r] for k, r in (("exact", EXACT), ("sample", SAMPLE))}
    other = [_qid(i) for i in range(N) if i not in EXACT and i not in SAMPLE]

    def per_query(ts: TestSet, run: Path, metric: str) -> pd.Series:
        from weknora_nb.core.run import load_run

        sc = score(ts, load_run(run, testset=human, other_version=True).codes, [metric])
        return sc.per_query_mean().set_index("query_id")[metric]

    for metric in ("ndcg@5", "recall@3"):
        f = {r.name: per_query(filled, r, metric) for r in runs}
        y = {r.name: per_query(human, r, metric) for r in runs}
        for kind, (fv, yv) in {"mean": (f["new"], y["new"]), "delta": (f["new"] - f["base"],
                                                                        y["new"] - y["base"])}.items():
            point, lo, hi = (float(np.squeeze(x)) for x in (
                ppi_py.ppi_mean_pointestimate(yv[ids["sample"]].to_numpy(), fv[ids["sample"]].to_numpy(),
                                              fv[ids["sample"] + other].to_numpy(), lam=1),
                *ppi_py.ppi_mean_ci(yv[ids["sample"]].to_numpy(), fv[ids["sample"]].to_numpy(),
                                    fv[ids["sample"] + other].to_numpy(), alpha=0.05, lam=1)))
            exact = yv[ids["exact"]].to_numpy()
            w_exact, w_graded = len(EXACT) / N, 1 - len(EXACT) / N
            want = w_exact * exact.mean() + w_graded * point
            graded_se = (hi - lo) / 2 / 1.959963984540054
            se = math.sqrt(w_exact ** 2 * exact.var() / len(exact) + (w_graded * graded_se) ** 2)
            table = out.means[out.means["run"] == "new"] if kind == "mean" else out.deltas
            row = table.set_index("metric").loc[metric]
            assert row["corrected"] == pytest.approx(want, abs=1e-9)
            assert row["high"] - row["corrected"] == pytest.approx(1.959963984540054 * se, abs=1e-9)
            assert row["llm"] == pytest.approx(fv.mean(), abs=1e-12) and row["human"] == pytest.approx(yv.mean())
            assert row["n_labelled"] == len(SAMPLE) and row["n"] == N
    means = out.means.set_index(["run", "metric"])
    assert means.loc[("new", "ndcg@5"), "judged_graded"] == 1.0 > means.loc[("new", "ndcg@5"), "judged_human"]
    assert "note:" in out.describe() and "deltas (run minus base)" in out.describe()


def test_without_a_sample_there_is_no_corrected_figure_and_it_says_why(world):
    _, runs, grades, _, _ = world
    out = corrected_estimates(runs, grades, metrics=["ndcg@5"])
    assert out.n_labelled == 0 and out.means["corrected"].isna().all()
    assert "0 labelled items" in out.means["reason"].iloc[0]
    assert any("label-next" in n for n in out.notes)


def test_calibration_agrees_with_scikit_learn_and_names_the_bias(world):
    from sklearn.metrics import cohen_kappa_score

    ts_path, _, grades, later, _ = world
    human = with_labels(TestSet.from_records([json.loads(x) for x in ts_path.read_text("utf-8").splitlines()]), later)
    cal = calibration(read_grades(grades), human)
    items = cal.items
    assert len(items) == len(later) + 1   # the sample's labels and the calibration grade
    for w in ("linear", "quadratic"):
        assert cal.overall[f"kappa_{w}"] == pytest.approx(
            cohen_kappa_score(items["human"], items["llm"], weights=w, labels=[0, 1, 2, 3]), abs=1e-12)
    assert cal.overall["mean_difference"] > 0 and cal.overall["direction"].startswith("lenient")
    assert int(cal.confusion.values.sum()) == len(items) and list(cal.confusion.index) == [0, 1, 2, 3]
    assert set(cal.by_type.index) == {"factual", "technical"} and set(cal.by_purpose.index) == {"fill", "calibration"}
    assert "weighted kappa" in cal.describe()


def test_label_next_lists_the_next_queries_of_a_fixed_random_order_blind(world, tmp_path):
    ts_path, runs, grades, later, labels = world
    human = with_labels(TestSet.from_records([json.loads(x) for x in ts_path.read_text("utf-8").splitlines()]), later)
    out = corrected_estimates(runs, grades, testset=human, metrics=["ndcg@5"])
    nxt = label_next(out, read_grades(grades), human, queries=6, seed=3)
    open_queries = [_qid(i) for i in range(N) if i not in EXACT and i not in SAMPLE]
    assert list(dict.fromkeys(nxt.rows["query_id"])) == [q for q in sample_order(
        [_qid(i) for i in range(N) if i not in EXACT], 3) if q in open_queries][:6]
    partly = nxt.rows[nxt.rows["query_id"] == _qid(PARTLY)]
    assert partly.empty or list(partly["chunk_id"]) == [f"{_qid(PARTLY)}-c4", f"{_qid(PARTLY)}-c5"]
    assert nxt.rows["grade"].isna().all() and "llm" not in nxt.rows.columns   # people label blind
    assert list(nxt.steps["half_width"]) == sorted(nxt.steps["half_width"], reverse=True) and nxt.now > 0
    ws = tmp_path / "next.csv"
    args = ["testset", "label-next", "--runs", *map(str, runs), "--grades", str(grades), "--testset", str(ts_path),
            "--labels", str(labels), "--queries", "6", "--seed", "3", "--out", str(ws)]
    assert main(args) == 0
    assert [i.key for i in read_worksheet(ws)] == list(zip(nxt.rows["query_id"], nxt.rows["chunk_id"], strict=True))
    with pytest.raises(UsageError, match="--metric"):
        label_next(out, read_grades(grades), human, metric="mrr@20")


def test_the_commands_say_grades_llm_everywhere(world, capsys):
    ts_path, runs, grades, _, labels = world
    assert main(["corrected", "--runs", *map(str, runs), "--grades", str(grades), "--labels", str(labels),
                 "--metrics", "ndcg@5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(MARKER) and "human-labelled sample: 10 of the 35 graded queries" in out
    assert main(["corrected", "--runs", *map(str, runs), "--grades", str(grades), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["marker"].startswith(MARKER)
    assert main(["score", str(ts_path), str(runs[1] / "results.parquet"), "--grades", str(grades), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"][0].startswith(MARKER)
    assert main(["testset", "calibration", "--grades", str(grades), "--testset", str(ts_path), "--labels",
                 str(labels)]) == 0
    assert "lenient" in capsys.readouterr().out
    gate = ["gate", "--run", str(runs[1]), "--baseline", str(runs[0]), "--min", "ndcg@5=0.2", "--not-worse",
            "ndcg@5=0.5", "--grades", str(grades), "--labels", str(labels)]
    assert main(gate) == 0
    text = capsys.readouterr().out
    assert "(corrected [" in text and "corrected 95 % CI" in text and f"warning: {MARKER}" in text
    assert main([*gate, "--adjust", "holm"]) == 2
    assert "--adjust" in capsys.readouterr().err
    assert main(["gate", "--run", str(runs[1]), "--min", "ndcg@5=0.2", "--labels", str(labels)]) == 2
    assert main(["corrected", "--runs", str(runs[0])]) == 2
    assert "--grades" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# the answer judge corrected by human ratings
# ---------------------------------------------------------------------------------------
def _answer_run(tmp: Path, name: str, ts_path: Path, judge: dict[int, int]) -> Path:
    run = make_run(tmp, name, [r for i in range(N) for r in ranked(_qid(i), [f"{_qid(i)}-c0"], stage="citations")],
                   ts_path)
    with open(run / "answers.jsonl", "w", encoding="utf-8") as f:
        for i in range(N):
            f.write(json.dumps({"query_id": _qid(i), "stage": "citations", "repeat": 1, "answer": "答",
                                "citations": []}) + "\n")
    with open(run / "judgements.jsonl", "w", encoding="utf-8") as f:
        for i, s in judge.items():
            f.write(json.dumps({"query_id": _qid(i), "stage": "citations", "repeat": 1, "judge_repeat": 1,
                                "status": "judged", "scores": {"correctness": s, "faithfulness": 4,
                                                               "relevance": 5}}) + "\n")
    (run / "judge.json").write_text(json.dumps({"served_models": ["sandbox-rule-judge"], "rule_based": True}))
    return run


def test_the_judge_corrected_by_ratings_agrees_with_ppi_python(world, tmp_path):
    ts_path, _, _, _, _ = world
    rng = np.random.default_rng(2)
    (tmp_path / "ans").mkdir()
    sa, sb = rng.integers(1, 6, N), rng.integers(2, 6, N)
    a = _answer_run(tmp_path / "ans", "a", ts_path, {i: int(sa[i]) for i in range(N)})
    b = _answer_run(tmp_path / "ans", "b", ts_path, {i: int(sb[i]) for i in range(N)})
    rated = range(0, 12)
    human_a = {i: int(max(1, sa[i] - 1)) for i in rated}
    human_b = {i: int(max(1, sb[i] - rng.integers(0, 2))) for i in rated}
    files = []
    for name, h in (("a", human_a), ("b", human_b)):
        p = tmp_path / f"ratings-{name}.csv"
        p.write_text("query_id,stage,correctness\n" + "".join(f"{_qid(i)},,{v}\n" for i, v in h.items()), "utf-8")
        files.append(p)
    means, deltas, notes = corrected_answers([a, b], files)
    row = means.set_index(["run", "criterion"]).loc[("b", "correctness")]
    lab = list(rated)
    want = ppi_py.ppi_mean_ci(np.array([human_b[i] for i in lab], float), sb[lab].astype(float),
                              sb.astype(float), alpha=0.05, lam=1)
    assert (row["low"], row["high"]) == pytest.approx((float(want[0][0]), float(want[1][0])), abs=1e-9)
    assert row["judge"] == pytest.approx(sb.mean()) and row["n_rated"] == 12
    d = deltas.set_index("criterion").loc["correctness"]
    yd = np.array([human_b[i] - human_a[i] for i in lab], float)
    want = ppi_py.ppi_mean_ci(yd, (sb - sa)[lab].astype(float), (sb - sa).astype(float), alpha=0.05, lam=1)
    assert (d["low"], d["high"]) == pytest.approx((float(want[0][0]), float(want[1][0])), abs=1e-9)
    assert "rule-based judge, not a language model" in notes[0]
    bad = tmp_path / "bad.csv"
    bad.write_text("query_id,correctness\nq00,7\nq01,x\n", "utf-8")
    with pytest.raises(InputError) as err:
        read_ratings_file(bad)
    assert "row 1, field 'correctness'" in str(err.value) and "row 2" in str(err.value)
    with pytest.raises(UsageError, match="one ratings file per run"):
        corrected_answers([a, b], files[:1])
