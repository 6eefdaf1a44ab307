"""Version comparison, history, stratification and the regression gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from weknora_nb import write_results
from weknora_nb.analysis.compare import compare_runs, config_diff, history
from weknora_nb.analysis.gate import gate, parse_bounds
from weknora_nb.analysis.stratify import classify, load_rules, stratify
from weknora_nb.cli import main
from weknora_nb.collect import collect
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.core.errors import ConfigError, NotComparableError
from weknora_nb.core.metrics import DEFAULT_METRICS
from weknora_nb.core.run import load_run
from weknora_nb.core.testset import TestSet
from weknora_nb.sandbox import SandboxServer, demo_dir

from .conftest import ranked, results_frame

N = 240


def make_testset(tmp: Path, n: int = N) -> Path:
    queries = ["如何重置密码", "DG-1003 是什么错误", "为什么同步慢", "默认端口是多少"]
    recs = [{"query_id": f"q{i:03d}", "query": queries[i % 4],
             "relevant": {f"c{i}a": 3, f"c{i}b": 1}, "query_type": ["procedural", "technical"][i % 2],
             "tags": ["frequent"] if i % 3 else ["vague", "long-tail"]} for i in range(n)]
    recs.append({"query_id": "zz", "query": "无答案", "relevant": {}})
    path = tmp / "t.jsonl"
    TestSet.from_records(recs).to_jsonl(path)
    return path


def make_run(tmp: Path, name: str, ts_path: Path, hit_rate: float, seed: int, system: dict,
             latency: float = 50.0, stage: str = "final", **manifest) -> Path:
    """A run folder where query i finds its grade-3 chunk first with probability hit_rate at ``stage``;
    ``manifest``: keys that replace the manifest's."""
    rng = np.random.default_rng(seed)
    ts = TestSet.from_records([json.loads(x) for x in ts_path.read_text().splitlines()])
    rows = []
    for qid in ts.queries["query_id"]:
        i = qid[1:]
        chunks = [f"c{i}a", "x1", f"c{i}b"] if rng.random() < hit_rate else ["x1", "x2", "x3", f"c{i}b"]
        rows += ranked(qid, chunks, stage=stage)
    df = results_frame(rows)
    df["latency_ms"] = latency + rng.random(len(df))
    d = tmp / name
    d.mkdir()
    write_results(df, d / "results.parquet")
    (d / "manifest.json").write_text(json.dumps({
        "run_name": name, "started_at": f"2026-11-0{seed}T00:00:00+00:00",
        "testset": {"path": str(ts_path), "hash": ts.hash}, "system": system,
        "retrieval_config": {"rerank_top_k": 10}, "stages": {"final": {"endpoint": "knowledge-search"}},
        **manifest}))
    return d


@pytest.fixture
def runs(tmp_path):
    ts = make_testset(tmp_path)
    base = {"hnsw": {"m": 16, "ef_search": 64}, "rerank": {"enabled": False}, "description": "base"}
    a = make_run(tmp_path, "a", ts, 0.5, 1, base)
    b = make_run(tmp_path, "b", ts, 0.8, 2, {**base, "rerank": {"enabled": True}, "description": "with rerank"},
                 latency=120)
    c = make_run(tmp_path, "c", ts, 0.5, 3, {**base, "hnsw": {"m": 4, "ef_search": 8}})
    same = make_run(tmp_path, "same", ts, 0.5, 4, base)
    return tmp_path, ts, a, b, c, same


def test_comparison_detects_a_clear_improvement(runs):
    tmp, ts, a, b, c, same = runs
    cmp = compare_runs([a, b], resamples=2000)
    row = cmp.metrics.set_index("metric").loc["ndcg@5"]
    assert row["delta"] > 0.1 and row["ci_low"] > 0 and row["p_holm"] < 0.01
    assert row["wins"] > row["losses"] and row["n_queries"] == N
    assert "better" in cmp.recommendation and "p95" in cmp.recommendation
    assert cmp.latency.set_index("run").loc["b", "delta_p50_ms"] == pytest.approx(70, abs=2)
    assert cmp.single_variable == {"b": True}
    assert set(cmp.per_query.columns) >= {"query_id", "ndcg@5_a", "ndcg@5_b"}


def test_comparison_of_equivalent_versions_is_honest(runs):
    tmp, ts, a, b, c, same = runs
    cmp = compare_runs([a, same], resamples=2000)
    row = cmp.metrics.set_index("metric").loc["ndcg@5"]
    assert row["ci_low"] <= 0 <= row["ci_high"] or row["p_holm"] >= 0.05
    assert "not statistically significant" in cmp.recommendation


def test_more_than_one_variable_is_warned(runs):
    tmp, ts, a, b, c, same = runs
    cmp = compare_runs([a, c], resamples=500)
    assert cmp.single_variable == {"c": False}
    assert any("2 variables" in w for w in cmp.warnings)
    diff = config_diff([load_run(a).manifest, load_run(c).manifest], ["a", "c"])
    assert set(diff["key"]) == {"system.hnsw.m", "system.hnsw.ef_search"}


ZEROS = {"embedding_top_k": 0, "vector_threshold": 0, "keyword_threshold": 0, "rerank_top_k": 0, "rerank_threshold": 0,
         "rerank_model_id": ""}


@pytest.mark.contract("C30", "C57")
def test_config_diff_compares_the_effective_retrieval_config():
    from weknora_nb.analysis.diagnose import effective_config
    old = {"retrieval_config": {**ZEROS, "vector_threshold": 0.15, "embedding_top_k": 50}}  # as read, older runs
    new = {"retrieval_config": {"raw": ZEROS, "effective": effective_config(ZEROS)}}
    diff = config_diff([old, new], ["old", "new"])
    # a 0 is the default it means: only the rerank threshold differs (saved 0 vs never saved: 0.2)
    assert set(diff["key"]) == {"retrieval_config.rerank_threshold"}
    raised = {"retrieval_config": {"raw": {**ZEROS, "vector_threshold": 0.3},
                                   "effective": effective_config({**ZEROS, "vector_threshold": 0.3})}}
    diff = config_diff([new, raised], ["new", "raised"])
    assert set(diff.loc[diff["counts"], "key"]) == {"retrieval_config.vector_threshold",
                                                    "retrieval_config.rerank_threshold"}


def test_config_diff_counts_the_server_release_not_how_a_stage_was_collected():
    a = {"server": {"version": "v0.6.2", "uptime_seconds": 5},
         "stages": {"hybrid": {"endpoint": "hybrid-search", "method": "GET", "settings_source": "request"}}}
    b = {"server": {"version": "v0.7.2", "uptime_seconds": 9},
         "stages": {"hybrid": {"endpoint": "hybrid-search", "method": "POST"},
                    "citations": {"endpoint": "chat", "inline_citations": {"answers": 3, "with_citations": 2}}}}
    diff = config_diff([a, b], ["a", "b"]).set_index("key")
    assert bool(diff.loc["server.version", "counts"]) and "server.uptime_seconds" not in diff.index
    assert not diff.loc["stages.hybrid.method", "counts"] and not diff.loc["stages.hybrid.settings_source", "counts"]
    assert not diff.loc["stages.citations.inline_citations.answers", "counts"]
    assert bool(diff.loc["stages.citations.endpoint", "counts"])


@pytest.mark.contract("C66")
def test_a_retrieval_config_change_is_said_not_to_reach_the_citations_stage(tmp_path):
    ts = make_testset(tmp_path)
    chat = {"citations": {"endpoint": "chat", "settings_source": "server conversation config"}}
    a = make_run(tmp_path, "a", ts, 0.5, 1, {}, stage="citations", stages=chat,
                 retrieval_config={"rerank_top_k": 10})
    b = make_run(tmp_path, "b", ts, 0.5, 2, {}, stage="citations", stages=chat,
                 retrieval_config={"rerank_top_k": 20})
    cmp = compare_runs([a, b], resamples=200)
    assert cmp.stage == "citations"
    assert any("ran the server's conversation settings" in w and "retrieval_config.rerank_top_k" in w
               for w in cmp.warnings)
    # an older manifest records no settings source: no note
    old = {"citations": {"endpoint": "chat"}}
    (tmp_path / "old").mkdir()
    a2 = make_run(tmp_path / "old", "a", ts, 0.5, 1, {}, stage="citations", stages=old,
                  retrieval_config={"rerank_top_k": 10})
    b2 = make_run(tmp_path / "old", "b", ts, 0.5, 2, {}, stage="citations", stages=old,
                  retrieval_config={"rerank_top_k": 20})
    assert not any("conversation settings" in w for w in compare_runs([a2, b2], resamples=200).warnings)


def test_different_test_sets_are_refused(runs, tmp_path):
    tmp, ts, a, b, c, same = runs
    other = tmp / "other"
    other.mkdir()
    ts2 = make_testset(other, n=10)
    d = make_run(other, "d", ts2, 0.5, 5, {})
    with pytest.raises(NotComparableError, match="different test sets"):
        compare_runs([a, d])
    # a test set edited after the run was collected is refused too
    m = json.loads((a / "manifest.json").read_text())
    m["testset"]["hash"] = "sha256:" + "0" * 64
    (a / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(NotComparableError, match="not the one"):
        load_run(a)


def test_history_lists_every_run(runs):
    tmp, *_ = runs
    h = history(tmp, metrics=["ndcg@5"])
    assert list(h["run"]) == ["a", "b", "c", "same"] and h["ndcg@5"].between(0, 1).all()


def test_stratify_groups_with_sizes_and_intervals(runs):
    tmp, ts_path, a, *_ = runs
    run = load_run(a)
    table = stratify(run.scores, run.testset, stage="final", metrics=["ndcg@5"], resamples=300)
    qt = table[(table["dimension"] == "query_type")].set_index("group")
    assert qt.loc["procedural", "n"] == 120 and qt.loc["technical", "n"] == 120
    tags = table[table["dimension"] == "tag"].set_index("group")
    assert tags.loc["frequent", "n"] == 160 and tags.loc["vague", "n"] == 80 and tags.loc["long-tail", "n"] == 80
    assert (table["ci_low"] <= table["mean"]).all() and (table["mean"] <= table["ci_high"]).all()
    rt = table[table["dimension"] == "rule_type"].set_index("group")
    assert rt.loc["technical", "n"] == 60 and rt.loc["procedural", "n"] == 60
    assert rt.loc["conceptual", "n"] == 60 and rt.loc["factual", "n"] == 60
    small = stratify(run.scores, run.testset.subset([f"q{i:03d}" for i in range(20)]), stage="final",
                     metrics=["ndcg@5"], resamples=100)
    assert small["warning"].notna().all()


@pytest.mark.parametrize("text, kind", [
    ("如何重置管理员密码", "procedural"), ("How do I rotate keys?", "procedural"),
    ("为什么同步会变慢", "conceptual"), ("Why is my token rejected?", "conceptual"),
    ("DG-1003 是什么错误", "technical"), ("rate_limit.fail_open 默认值", "technical"),
    ("What does HTTP 429 mean", "technical"), ("年假有几天", "factual"), ("Which port does the console use", "factual"),
])
def test_rule_based_types_work_in_chinese_and_english(text, kind):
    assert classify([text]) == [kind]


def test_rules_are_an_editable_file(tmp_path):
    f = tmp_path / "rules.yaml"
    f.write_text("order: [billing]\ndefault: other\ntypes:\n  billing: ['报销', 'invoice']\n", encoding="utf-8")
    rules = load_rules(f)
    assert classify(["差旅报销流程", "how to fix"], rules) == ["billing", "other"]
    f.write_text("order: [x]\ntypes: {}\n")
    with pytest.raises(ConfigError, match="without patterns"):
        load_rules(f)


def test_gate_function_and_cli(runs, capsys):
    tmp, ts, a, b, c, same = runs
    ok = gate(b, baseline=a, minimums=parse_bounds(["ndcg@5=0.4"]), max_drops=parse_bounds(["ndcg@5=0.02"]))
    assert ok.passed and ok.stage == "final"
    bad = gate(a, baseline=b, minimums={"ndcg@5": 0.95}, max_drops={"ndcg@5": 0.02})
    assert not bad.passed and list(bad.table["passed"]) == [False, False, True]

    assert main(["gate", "--run", str(b), "--baseline", str(a), "--min", "ndcg@5=0.4",
                 "--max-drop", "ndcg@5=0.02"]) == 0
    assert "gate passed" in capsys.readouterr().out
    # a failed gate as CI meets it: a process of its own, exit 1
    p = subprocess.run([sys.executable, "-m", "weknora_nb", "gate", "--run", str(a), "--min", "ndcg@5=0.95", "--min",
                        "hit@5=0.9"], capture_output=True, text=True)
    assert p.returncode == 1 and "FAIL" in p.stdout and "gate FAILED" in p.stdout
    # the refusals in this process (the command line's own exit codes are held in tests/test_cli.py)
    assert main(["gate", "--run", str(a), "--min", "ndcg@x=1"]) == 2
    assert main(["gate", "--run", str(tmp / "nope"), "--min", "ndcg@5=0.5"]) == 2
    assert main(["gate", "--run", str(a), "--max-drop", "ndcg@5=0.02"]) == 2  # needs --baseline
    assert main(["gate", "--run", str(a), "--min", "ndcg@5=0.1", "--stage", "vector"]) == 2


@pytest.fixture(scope="module")
def sandbox_runs(tmp_path_factory):
    """The demo test set collected at stage final for the three sandbox versions (one repeat)."""
    tmp = tmp_path_factory.mktemp("versions")
    os.environ.setdefault("WEKNORA_API_KEY", "sk-compare-test")
    out = {}
    for v in ("baseline", "rerank", "hnsw-m4"):
        with SandboxServer(v) as sb:
            collect(ClientSettings(sb.base_url), sb.kb_id, demo_dir() / "testset.jsonl", tmp / v,
                    stages="vector,final", repeats=1, warmup=0, progress=False, inventory=False,
                    system=sb.describe())
        out[v] = tmp / v
    return out


@pytest.mark.slow
def test_sandbox_rerank_gain_is_detected_with_its_interval(sandbox_runs):
    cmp = compare_runs([sandbox_runs["baseline"], sandbox_runs["rerank"]], resamples=2000)
    row = cmp.metrics.set_index("metric").loc["ndcg@5"]
    assert row["delta"] > 0.05 and row["ci_low"] > 0 and row["p_holm"] < 0.01
    assert cmp.single_variable == {"rerank": True}


@pytest.mark.slow
def test_sandbox_single_parameter_version_is_flagged_single_variable(sandbox_runs):
    cmp = compare_runs([sandbox_runs["baseline"], sandbox_runs["hnsw-m4"]], stage="vector", resamples=500)
    assert cmp.single_variable == {"hnsw-m4": True}
    keys = set(cmp.config_diff.loc[cmp.config_diff["counts"], "key"])
    assert "system.hnsw.m" in keys


def test_history_scores_runs_as_a_report_loads_them_so_a_rendering_finds_them_in_its_cache(runs, monkeypatch):
    import weknora_nb.core.run as core_run
    from weknora_nb.core.run import iter_runs
    from weknora_nb.reports.cache import _run_key

    tmp, *_ = runs
    asked = []

    def from_cache(path, *, metrics=None, domain_adjustment=0.0):
        asked.append(metrics)
        return load_run(path, metrics=metrics, domain_adjustment=domain_adjustment, cache=False)

    monkeypatch.setattr(core_run, "run_cache", from_cache)
    h = history(tmp, metrics=["ndcg@5", "hit@5"])
    assert asked == [list(DEFAULT_METRICS)] * 4   # the default metrics: the cache slot of every open_run
    keys = [(_run_key(p, list(DEFAULT_METRICS), 0.0), _run_key(p, None, 0.0)) for p in iter_runs(tmp)]
    assert len(keys) == 4 and all(a is not None and a == b for a, b in keys)
    assert list(h.columns[-2:]) == ["ndcg@5", "hit@5"] and "recall@3" not in h.columns
    asked.clear()
    h = history(tmp, metrics=["ndcg@5:linear"])   # a metric the defaults lack: scored beside them
    assert asked == [[*DEFAULT_METRICS, "ndcg@5:linear"]] * 4 and "ndcg@5:linear" in h.columns
