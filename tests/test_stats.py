"""Statistics on data where the right answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from weknora_nb.analysis.stats import bootstrap_ci, holm, paired_bootstrap_ci, randomization_test, small_group_warning
from weknora_nb.core.pipeline import significance_warning


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    small, big = rng.random(50), rng.random(5000)
    lo, hi = bootstrap_ci(small, resamples=2000)
    assert lo < small.mean() < hi
    lo2, hi2 = bootstrap_ci(big, resamples=2000)
    assert (hi2 - lo2) < (hi - lo) / 5
    assert bootstrap_ci(small, seed=3) == bootstrap_ci(small, seed=3)  # seedable


def test_bootstrap_matrix_matches_columns():
    rng = np.random.default_rng(2)
    v = rng.random((300, 3))
    lo, hi = bootstrap_ci(v, resamples=1000, seed=5)
    assert lo.shape == (3,) and np.all(lo < v.mean(axis=0)) and np.all(hi > v.mean(axis=0))
    assert np.isnan(bootstrap_ci(np.array([]))[0])


def test_known_null_gives_uniform_p_values_and_intervals_that_cover_zero():
    rng = np.random.default_rng(7)
    ps, covered = [], 0
    trials = 200
    for t in range(trials):
        a = rng.random(80)
        b = a + rng.normal(0, 0.1, 80)  # no true difference
        ps.append(randomization_test(a, b, resamples=500, seed=t))
        lo, hi = paired_bootstrap_ci(a, b, resamples=500, seed=t)
        covered += lo <= 0 <= hi
    ps = np.array(ps)
    # spread over [0, 1]: about 5 % below 0.05, about half below 0.5, every decile used
    assert 0.01 <= (ps < 0.05).mean() <= 0.11
    assert 0.38 <= (ps < 0.5).mean() <= 0.62
    assert len(np.unique(np.floor(ps * 10).clip(0, 9))) == 10
    assert 0.90 <= covered / trials <= 0.99  # about 95 %


def test_a_clear_improvement_is_detected():
    rng = np.random.default_rng(3)
    a = rng.random(300)
    b = np.clip(a + 0.08 + rng.normal(0, 0.1, 300), 0, 1)
    assert randomization_test(a, b) < 0.001
    lo, hi = paired_bootstrap_ci(a, b)
    assert 0.05 < lo < hi < 0.11


def test_randomization_test_per_metric():
    rng = np.random.default_rng(4)
    a = rng.random((200, 2))
    b = a.copy()
    b[:, 0] += 0.1
    p = randomization_test(a, b, resamples=999)
    assert p[0] == pytest.approx(1 / 1000) and p[1] == 1.0  # identical column: every flip ties


def test_holm_by_hand():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(holm([0.5, np.nan]), [0.5, np.nan])
    assert holm([0.9, 0.8]).max() <= 1.0


def test_warnings():
    assert "not statistically significant" in significance_warning(199)
    assert significance_warning(200) is None
    assert small_group_warning(5) and small_group_warning(30) is None
