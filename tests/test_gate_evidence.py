"""The gate on evidence: --non-inferior, --not-worse, --detect, answer metrics, several versions.

Run folders are real (results.parquet, manifest.json, a JSONL test set on disk), built so that
each query's NDCG@5 is known: query i has one relevant chunk ``c<i>`` (grade 3) returned at a
chosen position (NDCG@5 = 1 / log2(1 + position), 0 when absent).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from weknora_nb import cli, write_results
from weknora_nb.analysis.compare import compare_runs, rank_versions
from weknora_nb.analysis.gate import gate, parse_bounds
from weknora_nb.analysis.stats import paired_bootstrap_ci, queries_needed
from weknora_nb.core.errors import MetricError, UsageError
from weknora_nb.core.testset import TestSet

from .conftest import results_frame


def write_testset(tmp: Path, n: int, *, types: Sequence[str] = ("procedural", "factual"),
                  tags: dict[int, list[str]] | None = None) -> Path:
    """``n`` queries, query i of type ``types[i % len(types)]``, its relevant chunk ``c<i>``."""
    recs = [{"query_id": f"q{i:03d}", "query": f"question {i}", "relevant": {f"c{i}": 3},
             "query_type": types[i % len(types)], "tags": (tags or {}).get(i, [])} for i in range(n)]
    path = tmp / "testset.jsonl"
    TestSet.from_records(recs).to_jsonl(path)
    return path


def write_run(tmp: Path, name: str, testset: Path, positions: Sequence[int | None] | np.ndarray, *,
              latency: float | Sequence[float] = 50.0, system: dict | None = None) -> Path:
    """A run folder: query i returns its relevant chunk at ``positions[i]`` among 5 results (None: not at
    all); ``positions`` 2-D (repeats x queries) gives one row per repeat. ``latency``: ms per request."""
    ts = TestSet.from_records([json.loads(x) for x in testset.read_text().splitlines()])
    pos = np.asarray(positions, dtype=object)
    pos = pos[None, :] if pos.ndim == 1 else pos
    lat = np.broadcast_to(np.asarray(latency, dtype=float), (pos.shape[1],))
    rows, lats = [], []
    for rep, row in enumerate(pos, start=1):
        for i, p in enumerate(row):
            chunks = [f"x{j}" for j in range(1, 6)]
            if p is not None:
                chunks[int(p) - 1] = f"c{i}"
            rows += [(f"q{i:03d}", "final", rep, k + 1, c, float(5 - k)) for k, c in enumerate(chunks)]
            lats += [lat[i]] * len(chunks)
    df = results_frame(rows)
    df["latency_ms"] = lats
    folder = tmp / name
    folder.mkdir()
    write_results(df, folder / "results.parquet")
    (folder / "manifest.json").write_text(json.dumps({
        "run_name": name, "testset": {"path": str(testset), "hash": ts.hash},
        "system": system or {"description": name}, "stages": {"final": {"endpoint": "knowledge-search"}}}))
    return folder


def ndcg(position: int | None) -> float:
    return 0.0 if position is None else 1 / math.log2(1 + position)


@pytest.fixture
def folders(tmp_path):
    """60 queries: ``base`` finds every relevant chunk first; ``same`` too; ``slip`` moves it to
    position 2 on 3 queries (delta -0.0185, too few to tell); ``worse`` to position 3 on half."""
    n = 60
    ts = write_testset(tmp_path, n)
    base = write_run(tmp_path, "base", ts, [1] * n)
    same = write_run(tmp_path, "same", ts, [1] * n)
    slip = write_run(tmp_path, "slip", ts, [2 if i in (5, 25, 45) else 1 for i in range(n)])
    worse = write_run(tmp_path, "worse", ts, [3 if i % 2 else 1 for i in range(n)])
    return tmp_path, ts, base, same, slip, worse


def row(result, check, metric="ndcg@5"):
    t = result.table
    return t[(t["check"] == check) & (t["metric"] == metric)].iloc[0]


def test_non_inferior_and_not_worse_verdicts(folders):
    tmp, ts, base, same, slip, worse = folders
    kw = {"non_inferior": {"ndcg@5": 0.02}, "not_worse": {"ndcg@5": 0.02}, "resamples": 2000}
    equal = gate(same, baseline=base, **kw)
    assert row(equal, "non-inferior")["verdict"] == "pass" and equal.passed
    assert (row(equal, "non-inferior")["ci_low"], row(equal, "non-inferior")["ci_high"]) == (0.0, 0.0)
    unclear = gate(slip, baseline=base, **kw)
    ni, nw = row(unclear, "non-inferior"), row(unclear, "not-worse")
    assert ni["verdict"] == nw["verdict"] == "inconclusive"
    assert ni["value"] == pytest.approx(3 * (ndcg(2) - 1) / 60)
    assert ni["ci_low"] < -0.02 < ni["ci_high"]
    assert not ni["passed"] and nw["passed"] and not unclear.passed  # inconclusive fails non-inferior only
    loss = gate(worse, baseline=base, **kw)
    assert row(loss, "non-inferior")["verdict"] == row(loss, "not-worse")["verdict"] == "fail"
    assert not row(loss, "not-worse")["passed"]
    alone = gate(slip, baseline=base, not_worse={"ndcg@5": 0.02}, resamples=2000)
    assert alone.passed  # the data do not show a loss beyond the margin


def test_the_interval_is_the_comparisons_paired_bootstrap_interval(folders):
    tmp, ts, base, same, slip, worse = folders
    result = gate(slip, baseline=base, non_inferior={"ndcg@5": 0.02}, resamples=3000, seed=4)
    a = np.ones(60)
    b = np.array([ndcg(2) if i in (5, 25, 45) else 1.0 for i in range(60)])
    lo, hi = paired_bootstrap_ci(a, b, resamples=3000, seed=4)
    r = row(result, "non-inferior")
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi))
    cmp = compare_runs([base, slip], metrics=["ndcg@5"], resamples=3000, seed=4)
    assert (cmp.metrics["ci_low"].iloc[0], cmp.metrics["ci_high"].iloc[0]) == pytest.approx((lo, hi))


def test_detect_prints_the_queries_needed_and_effect_sizes(folders, capsys):
    tmp, ts, base, same, slip, worse = folders
    result = gate(worse, baseline=base, detect={"ndcg@5": 0.02}, improve_by=0.0, resamples=1000)
    d = np.array([ndcg(3) - 1 if i % 2 else 0.0 for i in range(60)])
    e = result.effects.set_index("metric").loc["ndcg@5"]
    assert e["n_needed"] == queries_needed(d.std(ddof=1), 0.02)
    assert e["d_z"] == pytest.approx(d.mean() / d.std(ddof=1))
    assert e["share_improved"] == 0.0
    assert cli.main(["gate", "--run", str(worse), "--baseline", str(base), "--detect", "ndcg@5=0.02",
                     "--resamples", "500"]) == 0
    out = capsys.readouterr().out
    assert f"{int(e['n_needed'])}" in out and "MDE" in out and "d_z" in out
    assert "gate passed" in out


def test_cli_exit_codes_and_printed_rule(folders, capsys):
    tmp, ts, base, same, slip, worse = folders
    args = ["gate", "--baseline", str(base), "--non-inferior", "ndcg@5=0.02", "--resamples", "1000"]
    assert cli.main([*args, "--run", str(same)]) == 0
    assert "rule: the gate passes only when every bound passes" in capsys.readouterr().out
    assert cli.main([*args, "--run", str(slip)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  non-inferior ndcg@5" in out and "inconclusive: fails this bound" in out and "95 % CI [" in out
    assert cli.main(["gate", "--run", str(slip), "--non-inferior", "ndcg@5=0.02"]) == 2
    assert "--non-inferior needs --baseline" in capsys.readouterr().err
    assert cli.main([*args, "--run", str(slip), "--adjust", "bonferroni", "--not-worse", "ndcg@5=0.02"]) == 1
    assert "97.5 % CI" in capsys.readouterr().out


def test_negative_margin_and_unknown_metric_are_usage_errors(capsys, folders):
    tmp, ts, base, same, slip, worse = folders
    assert cli.main(["gate", "--run", str(slip), "--baseline", str(base), "--not-worse", "ndcg@5=-0.1"]) == 2
    err = capsys.readouterr().err
    assert "argument --not-worse" in err and ">= 0" in err
    with pytest.raises(MetricError) as info:
        parse_bounds(["nosuch@5=0.1"])
    message = str(info.value)
    assert "'ndcg'" in message and "judge.correctness" in message and "citation_precision" in message
    assert parse_bounds(["judge.correctness=3.5"]) == {"judge.correctness": 3.5}
    assert parse_bounds(["NDCG@5=0.7"]) == {"ndcg@5": 0.7}


def fake_answers(values: dict[str, dict[str, float]]):
    """A provider of answer metrics: run name -> {query_id: judge.correctness}."""
    def provide(run):
        v = values[run.name]
        return pd.DataFrame({"query_id": list(v), "judge.correctness": list(v.values())})
    return provide


def test_answer_metrics_come_from_the_provider(folders):
    tmp, ts, base, same, slip, worse = folders
    qids = [f"q{i:03d}" for i in range(60)]
    provider = fake_answers({"base": {q: 4.0 for q in qids},
                             "slip": {q: (4.0 if i % 6 else 3.5) for i, q in enumerate(qids)}})
    result = gate(slip, baseline=base, minimums={"judge.correctness": 3.5}, non_inferior={"judge.correctness": 0.2},
                  not_worse={"judge.correctness": 0.02}, answer_values=provider, resamples=2000)
    m = row(result, "min", "judge.correctness")
    assert m["value"] == pytest.approx((50 * 4.0 + 10 * 3.5) / 60) and m["passed"]
    ni = row(result, "non-inferior", "judge.correctness")
    assert ni["value"] == pytest.approx(-0.5 / 6)
    assert ni["verdict"] == "pass" and ni["ci_low"] > -0.2            # any loss is below the margin 0.2
    assert row(result, "not-worse", "judge.correctness")["verdict"] == "fail"  # a loss beyond 0.02 is shown
    # a provider without the metric: a usage error naming it
    with pytest.raises(UsageError, match="judge.faithfulness"):
        gate(slip, baseline=base, minimums={"judge.faithfulness": 3}, answer_values=provider)


def test_holm_and_bonferroni_options_change_the_rule(folders):
    tmp, ts, base, same, slip, worse = folders
    kw = {"not_worse": {"ndcg@5": 0.02, "hit@5": 0.02}, "resamples": 1000}
    plain = gate(slip, baseline=base, **kw)
    bonf = gate(slip, baseline=base, adjust="bonferroni", **kw)
    holm = gate(slip, baseline=base, adjust="holm", **kw)
    assert "not adjusted" in plain.rule and "Bonferroni over the 2" in bonf.rule and "Holm" in holm.rule
    assert bonf.bounds["level"].tolist() == [0.975, 0.975]
    assert (holm.bounds["p_fail"] >= plain.bounds["p_fail"]).all()


def test_comparison_effect_columns_and_holm_across_versions(folders):
    tmp, ts, base, same, slip, worse = folders
    cmp = compare_runs([base, worse, slip], metrics=["ndcg@5", "hit@5"], resamples=1000, effects=True,
                       detect={"ndcg@5": 0.02})
    t = cmp.metrics.set_index(["run", "metric"])
    assert {"d_z", "share_improved", "mde", "n_needed", "p_holm_all"} <= set(cmp.metrics.columns)
    assert (t["p_holm_all"] >= t["p_holm"]).all()            # one family across versions x metrics
    d = np.array([ndcg(3) - 1 if i % 2 else 0.0 for i in range(60)])
    assert t.loc[("worse", "ndcg@5"), "n_needed"] == queries_needed(d.std(ddof=1), 0.02)
    assert math.isnan(t.loc[("worse", "hit@5"), "n_needed"])
    assert "mde" not in compare_runs([base, worse], metrics=["ndcg@5"], resamples=200).metrics.columns


def test_rank_versions_resolves_only_real_differences(tmp_path):
    n = 80
    ts = write_testset(tmp_path, n)
    base = write_run(tmp_path, "base", ts, [3] * n)
    better = write_run(tmp_path, "better", ts, [1] * n, latency=90)
    twin = write_run(tmp_path, "twin", ts, [3 if i != 7 else 2 for i in range(n)])
    cmp = compare_runs([base, better, twin], metrics=["ndcg@5", "mrr@20", "hit@5"], resamples=1000)
    ranking = rank_versions(cmp, resamples=1000)
    assert ranking.table["run"].tolist() == ["better", "twin", "base"]
    assert ranking.table["tier"].tolist() == [1, 2, 2]      # twin and base: not resolved
    pairs = ranking.pairs.set_index(["better", "worse"])
    assert pairs.loc[("better", "base"), "resolved"] and not pairs.loc[("twin", "base"), "resolved"]
    assert "tier 2" in ranking.describe()
    from weknora_nb.reports.evidence_figures import versions_chart

    fig = versions_chart(cmp, resamples=200)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["ndcg@5", "mrr@20", "hit@5", "latency (final)"]
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == pytest.approx([ndcg(3), 1.0, (79 * ndcg(3) + ndcg(2)) / 80])


def test_no_paired_query_is_not_comparable(folders):
    """A bound with nothing to pair must not pass by default (a not-worse bound would, on an empty interval)."""
    from weknora_nb.core.errors import NotComparableError

    tmp, ts, base, same, slip, worse = folders
    provider = fake_answers({"base": {"q000": 4.0}, "slip": {"q001": 4.0}})
    with pytest.raises(NotComparableError, match="nothing to pair"):
        gate(slip, baseline=base, not_worse={"judge.correctness": 0.1}, answer_values=provider)
