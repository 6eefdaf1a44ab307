"""Citation metrics on crafted answers with known values (docs/method.md section 11)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from weknora_nb.analysis.citations import citation_scores, citation_table, kendall_tau, rbo
from weknora_nb.core.answers import read_answers
from weknora_nb.core.errors import InputError
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

from .conftest import failed, ranked, results_frame

TS = TestSet.from_records([
    {"query_id": "q1", "query": "a", "relevant": {"r3": 3, "r1": 1, "z": 0}},
    {"query_id": "q2", "query": "b", "relevant": {"s2": 2}},
    {"query_id": "q3", "query": "c", "relevant": {}},  # invalid
    {"query_id": "q4", "query": "d", "relevant": {"t1": 1}},
])
# the chat's final references, in their order (the citations stage's results rows)
RESULTS = results_frame(ranked("q1", ["r3", "z", "r1"], stage="citations")
                        + ranked("q2", ["s2", "x"], stage="citations")
                        + ranked("q3", ["y"], stage="citations") + failed("q4", stage="citations"))
RUN = Run(Path("crafted"), {"run_name": "crafted"}, RESULTS, TS, score(TS, RESULTS, ["ndcg@5"]))


def _answers(tmp_path, lines):
    p = tmp_path / "answers.jsonl"
    p.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    return read_answers(p)


def test_known_values(tmp_path):
    ans = _answers(tmp_path, [
        # q1 cites r1 before r3 (the references list r3 first: reordered), z (grade 0), and w (not a reference)
        {"query_id": "q1", "stage": "citations", "repeat": 1, "answer": "...",
         "citations": ["r1", "r3", "r1", "z", "w"]},
        {"query_id": "q2", "stage": "citations", "repeat": 1, "answer": "无引用的回答", "citations": []},
        {"query_id": "q3", "stage": "citations", "repeat": 1, "answer": "...", "citations": ["y"]},
    ])
    cs = citation_scores(RUN, ans)
    assert (cs.n_answers, cs.n_failed, cs.n_invalid) == (3, 1, 1)
    q1 = cs.per_answer.set_index("query_id").loc["q1"]
    assert q1["citation_precision"] == pytest.approx(2 / 4)  # r1, r3 relevant of r1, r3, z, w (distinct)
    assert q1["citation_recall"] == pytest.approx(2 / 2)
    assert q1["cites_grade3"] == 1.0
    assert q1["cited_not_referenced"] == 1.0  # w
    assert q1["reordered"] == 1.0 and q1["kendall_tau"] < 1
    # NDCG@10 of [r1, r3, z, w] in citation order: gains 1, 7 at ranks 1, 2; ideal 7, 1
    dcg, idcg = 1 + 7 / np.log2(3), 7 + 1 / np.log2(3)
    assert q1["citation_ndcg@10"] == pytest.approx(dcg / idcg)
    q2 = cs.per_answer.set_index("query_id").loc["q2"]
    assert q2["no_citation"] == 1.0 and np.isnan(q2["citation_precision"]) and q2["citation_recall"] == 0.0
    assert cs.reordered()["query_id"].tolist() == ["q1"]
    table = citation_table(cs).set_index("metric")
    assert table.loc["citation_precision", "answers"] == 1  # q2 cites nothing: precision undefined, not 0


def test_citations_in_reference_order_are_not_reordered(tmp_path):
    ans = _answers(tmp_path, [{"query_id": "q1", "stage": "citations", "repeat": 1, "answer": "",
                               "citations": ["r3", "r1"]}])
    row = citation_scores(RUN, ans).per_answer.iloc[0]
    assert row["reordered"] == 0.0 and row["kendall_tau"] == pytest.approx(1.0)


def _rbo_by_sets(s, t, p):
    """Webber et al. (2010) eq. 32 computed from prefix sets, independently of rbo()."""
    short, long_ = (s, t) if len(s) <= len(t) else (t, s)
    n_s, n_l = len(short), len(long_)
    x = [len(set(short[:d]) & set(long_[:d])) for d in range(n_l + 1)]
    total = sum(x[d] / d * p ** d for d in range(1, n_l + 1))
    total += sum(x[n_s] * (d - n_s) / (n_s * d) * p ** d for d in range(n_s + 1, n_l + 1))
    return (1 - p) / p * total + ((x[n_l] - x[n_s]) / n_l + x[n_s] / n_s) * p ** n_l


@pytest.mark.parametrize("seed", range(30))
def test_rbo_matches_its_definition(seed):
    rng = np.random.default_rng(seed)
    pool = [f"c{i}" for i in range(12)]
    s = list(rng.choice(pool, size=int(rng.integers(1, 10)), replace=False))
    t = list(rng.choice(pool, size=int(rng.integers(1, 10)), replace=False))
    assert rbo(s, t) == pytest.approx(_rbo_by_sets(s, t, 0.9), abs=1e-12)
    assert 0.0 <= rbo(s, t) <= 1.0 + 1e-12


def test_rbo_and_tau_edges():
    assert rbo(["a", "b", "c"], ["a", "b", "c"]) == pytest.approx(1.0)
    assert rbo(["a", "b"], ["c", "d"]) == 0.0
    assert rbo([], []) == 1.0 and rbo(["a"], []) == 0.0
    assert kendall_tau(["b", "a"], ["a", "b"]) == pytest.approx(-1.0)
    assert np.isnan(kendall_tau(["a"], ["a", "b"]))


def test_bad_answers_file_names_line_and_field(tmp_path):
    p = tmp_path / "answers.jsonl"
    p.write_text('{"query_id": "q1", "stage": "citations", "repeat": 0, "answer": "", "citations": [1]}\nnot json\n',
                 encoding="utf-8")
    with pytest.raises(InputError) as e:
        read_answers(p)
    text = str(e.value)
    assert "line 1, field 'repeat'" in text and "line 1, field 'citations'" in text and "line 2" in text


def test_kendall_tau_equals_scipy_s_tau_b_on_random_orders_with_repeats_and_strangers():
    from scipy.stats import kendalltau

    rng = np.random.default_rng(11)
    for _ in range(500):
        refs = [f"c{i}" for i in rng.permutation(rng.integers(1, 12))]
        cited = [str(x) for x in rng.choice(refs + ["elsewhere", "c99"], size=rng.integers(0, 14))]
        pos = {c: i for i, c in enumerate(refs)}
        y = [pos[c] for c in cited if c in pos]
        want = kendalltau(np.arange(len(y)), y).statistic if len(y) >= 2 else float("nan")
        got = kendall_tau(cited, refs)
        assert (np.isnan(got) and np.isnan(want)) or got == pytest.approx(want, abs=1e-12), (cited, refs)
