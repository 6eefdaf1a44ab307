"""Agreement between assessors (analysis/agreement.py, ``testset agreement``), cross-checked against
scikit-learn's ``cohen_kappa_score`` and statsmodels' ``fleiss_kappa``."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from weknora_nb.analysis.agreement import agreement, fleiss_kappa, weighted_kappa
from weknora_nb.cli import main
from weknora_nb.core.labels import Judgement, LabelsLog

from .conftest import examples


def J(q: str, c: str, grade: int | None, who: str, at: str = "2026-12-01T10:00:00Z") -> Judgement:
    return Judgement(q, c, grade, who, at)


def from_grades(grades: dict[str, list[int | None]]) -> list[Judgement]:
    """Judgements of item i (query q{i}, chunk c{i}) by each assessor; None: the assessor did not judge it."""
    return [J(f"q{i}", f"c{i}", g, who) for who, gs in grades.items() for i, g in enumerate(gs) if g is not None]


def test_worked_example_by_hand():
    # items: (0,0) (1,2) (2,2) (3,1); marginals x: 1/4 each grade, y: 1/4, 1/4, 1/2, 0
    x, y = [0, 1, 2, 3], [0, 2, 2, 1]
    # unweighted: observed agreement 2/4, by chance 1/16 + 1/16 + 1/8 = 1/4
    assert weighted_kappa(x, y, None)[0] == pytest.approx((0.5 - 0.25) / 0.75)
    # linear: observed mean |i-j| (0+1+0+2)/4 = 0.75; by chance (1.25 + 0.75 + 0.75 + 1.75)/4 = 1.125
    assert weighted_kappa(x, y, "linear")[0] == pytest.approx(1 - 0.75 / 1.125)
    # quadratic: observed (0+1+0+4)/4 = 1.25; by chance (2.25 + 0.75 + 1.25 + 3.75)/4 = 2
    assert weighted_kappa(x, y, "quadratic")[0] == pytest.approx(1 - 1.25 / 2)
    assert weighted_kappa([0, 1, 2, 3], [0, 1, 2, 3], "linear") == (1.0, None)


@pytest.mark.parametrize("weights", ["linear", "quadratic", None])
def test_cohen_agrees_with_scikit_learn_on_random_grades(weights):
    from sklearn.metrics import cohen_kappa_score

    rng = np.random.default_rng(13)
    for _ in range(examples(300)):
        n = int(rng.integers(2, 60))
        x = rng.integers(0, 4, n)
        # correlated assessors: y often copies x, sometimes a neighbour grade
        y = np.clip(np.where(rng.random(n) < 0.6, x, x + rng.integers(-2, 3, n)), 0, 3)
        ours, reason = weighted_kappa(x.tolist(), y.tolist(), weights)
        if reason:
            continue
        theirs = cohen_kappa_score(x, y, labels=[0, 1, 2, 3], weights=weights)
        assert ours == pytest.approx(theirs, abs=1e-12)


def test_fleiss_agrees_with_statsmodels_on_random_tables():
    from statsmodels.stats.inter_rater import fleiss_kappa as sm_fleiss

    rng = np.random.default_rng(7)
    for _ in range(examples(200)):
        items, raters = int(rng.integers(1, 40)), int(rng.integers(3, 6))
        truth = rng.integers(0, 4, items)
        grades = np.clip(truth[:, None] + rng.integers(-1, 2, (items, raters)) * (rng.random((items, raters)) < 0.4),
                         0, 3)
        table = np.stack([(grades == c).sum(axis=1) for c in range(4)], axis=1)
        ours, reason = fleiss_kappa(table)
        if reason:
            continue
        assert ours == pytest.approx(sm_fleiss(table, method="fleiss"), abs=1e-12)


def test_agreement_of_three_assessors_matches_the_references():
    from sklearn.metrics import cohen_kappa_score
    from statsmodels.stats.inter_rater import fleiss_kappa as sm_fleiss

    rng = np.random.default_rng(3)
    truth = rng.integers(0, 4, 80)
    grades = {who: np.clip(truth + rng.integers(-1, 2, 80) * (rng.random(80) < 0.3), 0, 3).tolist()
              for who in ("li", "wang", "zhao")}
    grades["zhao"][:10] = [None] * 10                     # zhao skipped the first ten items entirely
    a = agreement(from_grades(grades))
    assert a.assessors == ["li", "wang", "zhao"] and a.items_per_assessor == {"li": 80, "wang": 80, "zhao": 70}
    for p in a.pairs:
        both = [(x, y) for x, y in zip(grades[p.a], grades[p.b], strict=True) if x is not None and y is not None]
        x, y = zip(*both, strict=True)
        assert p.n_items == len(both)
        assert p.linear == pytest.approx(cohen_kappa_score(x, y, labels=[0, 1, 2, 3], weights="linear"))
        assert p.quadratic == pytest.approx(cohen_kappa_score(x, y, labels=[0, 1, 2, 3], weights="quadratic"))
    full = [[g[i] for g in grades.values()] for i in range(10, 80)]
    table = np.array([[row.count(c) for c in range(4)] for row in full])
    assert a.fleiss is not None and a.fleiss.n_items == 70
    assert a.fleiss.kappa == pytest.approx(sm_fleiss(table, method="fleiss"))


def test_identical_grades_give_nan_with_a_reason_not_a_crash():
    a = agreement(from_grades({"li": [2, 2, 2], "wang": [2, 2, 2], "zhao": [2, 2, 2]}))
    p = a.pairs[0]
    assert math.isnan(p.linear) and math.isnan(p.quadratic) and "agreement by chance is 1" in p.reason
    assert p.observed == 1.0
    assert a.fleiss is not None and math.isnan(a.fleiss.kappa) and "same grade" in a.fleiss.reason
    assert a.disagreements.empty
    assert "kappa undefined" in a.describe() and json.dumps(a.to_json_dict())   # NaN never reaches JSON


def test_one_item_and_missing_overlaps():
    one = agreement(from_grades({"li": [3], "wang": [1]}))
    assert one.pairs[0].n_items == 1 and one.pairs[0].linear == 0.0        # chance explains a single item fully
    apart = agreement(from_grades({"li": [3, None], "wang": [None, 1]}))
    p = apart.pairs[0]
    assert p.n_items == 0 and math.isnan(p.linear) and p.reason == "no item graded by both"
    assert apart.n_shared == 0 and apart.fleiss is None
    three = agreement(from_grades({"li": [3, None], "wang": [None, 1], "zhao": [1, 1]}))
    assert three.fleiss is not None and three.fleiss.n_items == 0 and "no item" in three.fleiss.reason


def test_disagreements_are_sorted_by_spread_with_each_assessors_grade():
    a = agreement(from_grades({"li": [0, 3, 2, 1], "wang": [1, 0, 2, None], "zhao": [0, 2, 0, 1]}))
    d = a.disagreements
    assert d[["query_id", "spread"]].values.tolist() == [["q1", 3], ["q2", 2], ["q0", 1]]
    assert d.loc[0, ["li", "wang", "zhao"]].tolist() == [3, 0, 2]
    assert "3 disagreements to adjudicate (spread 3: 1, spread 2: 1, spread 1: 1)" in a.describe()


def test_the_latest_graded_judgement_counts_and_skips_do_not():
    js = [J("q", "c", 0, "li", "t1"), J("q", "c", 3, "li", "t2"), J("q", "c", None, "wang"), J("q", "c", 3, "zhao"),
          J("q", "d", None, "li")]
    a = agreement(js)
    assert a.assessors == ["li", "zhao"] and a.n_items == 1 and a.disagreements.empty


def test_cli_agreement_prints_json(tmp_path, capsys):
    for who, grades in {"li": [0, 1, 2, 3, 3], "wang": [0, 1, 1, 3, 2]}.items():
        log = LabelsLog(tmp_path / f"{who}.jsonl")
        for i, g in enumerate(grades):
            log.append(f"q{i}", "c", g, assessor=who)
    assert main(["testset", "agreement", "--labels", str(tmp_path / "li.jsonl"), str(tmp_path / "wang.jsonl"),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["pairs"][0]["n_items"] == 5 and got["pairs"][0]["kappa_quadratic"] > 0.8
    assert [d["query_id"] for d in got["disagreements"]] == ["q2", "q4"]
    assert main(["testset", "agreement", "--labels", str(tmp_path / "li.jsonl"), str(tmp_path / "wang.jsonl")]) == 0
    assert "li vs wang: 5 shared items, weighted kappa linear" in capsys.readouterr().out


def test_pairs_cover_every_combination():
    a = agreement(from_grades({w: [0, 1, 2] for w in ("a", "b", "c", "d")}))
    assert [(p.a, p.b) for p in a.pairs] == list(itertools.combinations("abcd", 2))
    assert all(p.linear == 1.0 for p in a.pairs) and a.fleiss is not None and a.fleiss.kappa == 1.0
