"""Prediction-powered inference (analysis/ppi.py, docs/method.md section 16): the same figures as ppi-python's
``ppi_mean_ci`` to 1e-9 for a mean and a paired delta, the strata, and a simulation with known truth."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from weknora_nb.analysis.corrected import estimate
from weknora_nb.analysis.ppi import Stratum, classical_mean, ppi_mean, projected_half_width, stratified
from weknora_nb.core.errors import UsageError

ppi_py = pytest.importorskip("ppi_py")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ppi_coverage  # noqa: E402


def _reference(y: np.ndarray, fl: np.ndarray, fu: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    lo, hi = ppi_py.ppi_mean_ci(y, fl, fu, alpha=alpha, lam=1)
    point = ppi_py.ppi_mean_pointestimate(y, fl, fu, lam=1)
    return float(np.squeeze(point)), float(np.squeeze(lo)), float(np.squeeze(hi))


def _case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-query metric values in [0, 1] as NDCG gives them: ties, zeros and ones, a biased prediction."""
    n, m = int(rng.integers(2, 60)), int(rng.integers(1, 400))
    y = np.clip(np.round(rng.beta(0.8, 0.8, n), int(rng.integers(1, 4))), 0, 1)
    fl = np.clip(y + rng.normal(rng.uniform(-0.2, 0.2), rng.uniform(0, 0.3), n), 0, 1)
    fu = np.clip(rng.beta(0.8, 0.8, m) + rng.uniform(-0.2, 0.2), 0, 1)
    return y, fl, fu


def test_the_mean_agrees_with_ppi_python_on_random_inputs():
    rng = np.random.default_rng(49)
    for _ in range(300):
        y, fl, fu = _case(rng)
        alpha = float(rng.choice([0.05, 0.1, 0.01]))
        got = ppi_mean(y, fl, fu, alpha=alpha)
        want = _reference(y, fl, fu, alpha)
        assert (got.estimate, got.low, got.high) == pytest.approx(want, abs=1e-9)
        # the stratified path with every query graded is the same estimator
        ids = pd.Index([f"q{i}" for i in range(len(y) + len(fu))])
        strata = pd.DataFrame({"graded": True, "labelled": [True] * len(y) + [False] * len(fu)}, index=ids)
        f = pd.Series(np.concatenate([fl, fu]), ids)
        yy = pd.Series(np.concatenate([y, np.full(len(fu), np.nan)]), ids)
        est = estimate(f, yy, strata)   # the mean of f runs over every query, the labelled ones included
        assert (est.estimate, est.low, est.high) == pytest.approx(_reference(y, fl, f.to_numpy()), abs=1e-9)


def test_the_paired_delta_agrees_with_ppi_python():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n, m = int(rng.integers(2, 50)), int(rng.integers(1, 300))
        ya, yb = rng.random(n), rng.random(n)
        fa, fb = np.clip(ya + rng.normal(0.1, 0.15, n), 0, 1), np.clip(yb + rng.normal(-0.05, 0.2, n), 0, 1)
        ua, ub = rng.random(m), rng.random(m)
        ids = pd.Index([f"q{i}" for i in range(n + m)])
        strata = pd.DataFrame({"graded": True, "labelled": [True] * n + [False] * m}, index=ids)
        f_d = pd.Series(np.concatenate([fb - fa, ub - ua]), ids)
        y_d = pd.Series(np.concatenate([yb - ya, np.full(m, np.nan)]), ids)
        est = estimate(f_d, y_d, strata)
        want = _reference(yb - ya, fb - fa, f_d.to_numpy())
        assert (est.estimate, est.low, est.high) == pytest.approx(want, abs=1e-9)


def test_a_stratum_known_exactly_mixes_in_by_its_share():
    rng = np.random.default_rng(3)
    exact_y = rng.random(40)
    y, fl, fu = rng.random(10), rng.random(10), rng.random(50)
    est = stratified([Stratum(exact_y, exact_y, np.empty(0), exact=True), Stratum(y, fl, fu)])
    part = ppi_mean(y, fl, fu)
    w_exact, w_graded = 40 / 90, 50 / 90      # the graded stratum: its 50 items, the 10 labelled among them
    assert est.estimate == pytest.approx(w_exact * exact_y.mean() + w_graded * part.estimate, abs=1e-12)
    se = math.sqrt((w_exact ** 2) * exact_y.var() / 40 + (w_graded * part.se) ** 2)
    assert est.se == pytest.approx(se, abs=1e-12) and est.high - est.estimate == pytest.approx(1.959963984540054 * se)
    assert (est.n_labelled, est.n_unlabelled) == (10, 40)


def test_too_few_labelled_items_give_no_figure_with_the_reason():
    for n in (0, 1):
        e = ppi_mean(np.ones(n), np.ones(n), np.arange(5.0))
        assert math.isnan(e.estimate) and "labelled item" in (e.reason or "")
    assert math.isnan(stratified([Stratum(np.ones(1), np.ones(1), np.ones(9))]).estimate)
    y3, f3 = np.array([0.2, 0.4, 0.9]), np.array([0.1, 0.5, 0.3])
    assert ppi_mean(y3, f3, np.empty(0)) == classical_mean(y3)
    assert ppi_mean(y3, f3, f3).estimate == pytest.approx(0.5)   # every item labelled: the mean of y
    with pytest.raises(UsageError, match="alpha"):
        ppi_mean(np.ones(3), np.ones(3), np.ones(3), alpha=1.5)
    with pytest.raises(UsageError, match="f_labelled"):
        ppi_mean(np.ones(3), np.ones(2), np.ones(3))


def test_the_projected_half_width_shrinks_as_queries_are_labelled():
    rng = np.random.default_rng(0)
    y, fl, fu = rng.random(10), rng.random(10), rng.random(200)
    now = projected_half_width(y, fl, fu, 0)
    assert now == pytest.approx(ppi_mean(y, fl, fu).half_width, abs=1e-12)
    widths = [projected_half_width(y, fl, fu, k) for k in (0, 5, 20, 80)]
    assert widths == sorted(widths, reverse=True)
    assert math.isnan(projected_half_width(y[:1], fl[:1], fu, 3))


def test_a_simulation_with_known_truth_covers_it_at_the_stated_rate():
    """benchmarks/ppi_coverage.py on fewer worlds (the script runs 1,000 at each of 5, 10 and 20 %): the corrected
    95 % interval covers the truth in about 95 % of worlds, the LLM-only estimate is biased, and the corrected
    interval is narrower than the one the human sample gives alone."""
    r = ppi_coverage.run(worlds=200, queries=400, pool=12, share=0.1, seed=1, truth_queries=100_000)
    assert 0.89 <= r["cover_mean"] <= 0.99 and 0.89 <= r["cover_delta"] <= 0.99
    assert abs(r["llm_bias_mean"]) > 0.03 and abs(r["llm_bias_delta"]) > 0.02
    assert r["width_mean"] < r["human_width_mean"] and r["width_delta"] < r["human_width_delta"]
    assert "covers it in" in ppi_coverage.describe(r)
