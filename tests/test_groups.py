"""Which query types gain: per-group deltas, Holm across groups, the recommendation with latency."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from weknora_nb.analysis.compare import compare_runs
from weknora_nb.analysis.groups import group_gains
from weknora_nb.analysis.stats import holm
from weknora_nb.core.errors import UsageError

from .test_gate_evidence import ndcg, write_run, write_testset

N = 120


@pytest.fixture
def comparison(tmp_path):
    """Procedural queries (even i) find their chunk at 1 instead of 3 with the reranker; factual ones
    (odd i) stay at 3. The reranker costs 60 ms on procedural queries and 20 ms on factual ones. Tags:
    ``frequent`` on i % 4 == 0 (procedural), ``rare`` on 5 queries."""
    tags = {i: (["frequent"] if i % 4 == 0 else []) + (["rare"] if i < 10 and i % 2 else []) for i in range(N)}
    ts = write_testset(tmp_path, N, types=("procedural", "factual"), tags=tags)
    base = write_run(tmp_path, "base", ts, [3] * N, latency=40.0)
    rerank = write_run(tmp_path, "rerank", ts, [1 if i % 2 == 0 else 3 for i in range(N)],
                       latency=[100.0 if i % 2 == 0 else 60.0 for i in range(N)])
    return compare_runs([base, rerank], metrics=["ndcg@5", "hit@5"], resamples=500)


def test_the_type_that_gains_pays_and_the_other_does_not(comparison):
    gains = group_gains(comparison, metrics=["hit@5"], resamples=1000)
    t = gains.table.set_index(["dimension", "group", "metric"])
    proc, fact = t.loc[("query_type", "procedural", "ndcg@5")], t.loc[("query_type", "factual", "ndcg@5")]
    assert proc["n"] == fact["n"] == N // 2
    assert proc["delta"] == pytest.approx(1 - ndcg(3)) and proc["ci_low"] > 0
    assert fact["delta"] == 0 and fact["ci_low"] == fact["ci_high"] == 0
    assert proc["verdict"] == "pays" and fact["verdict"] == "no clear difference"
    assert proc["delta_p50_ms"] == pytest.approx(60.0) and fact["delta_p50_ms"] == pytest.approx(20.0)
    assert t.loc[("tag", "frequent", "ndcg@5"), "verdict"] == "pays"
    assert isinstance(t.loc[("tag", "rare", "ndcg@5"), "warning"], str)       # 5 queries: too few
    assert t.loc[("query_type", "procedural", "hit@5"), "delta"] == 0           # hit@5 does not move
    assert t.loc[("query_type", "procedural", "hit@5"), "p_value"] == 1.0
    assert pd.isna(t.loc[("query_type", "procedural", "hit@5"), "verdict"])    # verdicts: the headline metric


def test_holm_is_applied_across_every_group(comparison):
    gains = group_gains(comparison, resamples=1000)
    t = gains.table[gains.table["metric"] == "ndcg@5"]
    assert len(t) == 4  # procedural, factual, frequent, rare
    assert np.allclose(t["p_holm"].to_numpy(), holm(t["p_value"].to_numpy()), equal_nan=True)
    assert (t["p_holm"].fillna(1) >= t["p_value"].fillna(1)).all()


def test_the_recommendation_names_where_it_pays_and_what_it_costs(comparison):
    text = group_gains(comparison, resamples=1000).recommendation
    lines = text.splitlines()
    pays = next(ln for ln in lines if ln.startswith("- Apply rerank to the query types"))
    assert "procedural" in pays and "factual" not in pays and "p95 latency +60 ms" in pays
    assert any(ln.startswith("- No clear difference on factual") and "+20 ms" in ln for ln in lines)
    assert "Holm across 4 groups" in lines[0]


def test_unknown_run_metric_or_dimension(comparison):
    with pytest.raises(UsageError, match="run"):
        group_gains(comparison, run="nosuch")
    with pytest.raises(UsageError, match="metric"):
        group_gains(comparison, metric="recall@10")
    with pytest.raises(UsageError, match="dimensions"):
        group_gains(comparison, dimensions=["colour"])


def test_group_gain_chart(comparison):
    from weknora_nb.reports.evidence_figures import group_gain_chart

    fig = group_gain_chart(group_gains(comparison, resamples=200))
    ax = fig.axes[0]
    labels = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels()), strict=True), reverse=True)
    assert [text for _, text in labels] == ["query_type: factual (n 60)", "query_type: procedural (n 60)",
                                            "tag: frequent (n 30)", "tag: rare (n 5)"]  # top to bottom
    assert "after Holm across the groups" in ax.get_xlabel()  # why an interval clear of 0 may be hollow
    fig.canvas.draw()
    shown = ax.xaxis.label.get_window_extent()
    assert fig.bbox.x0 <= shown.x0 and shown.x1 <= fig.bbox.x1  # the whole sentence inside the figure
