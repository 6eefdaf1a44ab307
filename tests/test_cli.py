"""The command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from weknora_nb import write_results
from weknora_nb.core.testset import TestSet

from .conftest import failed, ranked, results_frame


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "weknora_nb", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def files(tmp_path):
    TestSet.from_records([
        {"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 2, "C": 1}},
        {"query_id": "q2", "query": "b", "relevant": {"A": 1}},
        {"query_id": "q3", "query": "c", "relevant": {}},
    ]).to_jsonl(tmp_path / "t.jsonl")
    rows = ranked("q1", ["X", "B", "A", "Y", "C"]) + ranked("q1", ["X", "B", "A", "Y", "C"], stage="hybrid") \
        + failed("q2", "timeout") + ranked("q2", ["A"], stage="hybrid") + ranked("q3", ["A"])
    write_results(results_frame(rows), tmp_path / "r.parquet")
    return tmp_path / "t.jsonl", tmp_path / "r.parquet"


def test_score_json(files):
    out = json.loads(run("score", *map(str, files), "--json").stdout)
    assert set(out) >= {"summary", "per_query", "excluded", "counts"}
    assert out["summary"]["final"]["ndcg@5"] == pytest.approx(0.615328, abs=1e-6)
    assert out["summary"]["hybrid"]["recall@3"] == pytest.approx((2 / 3 + 1) / 2)
    assert {(e["query_id"], e["reason"]) for e in out["excluded"]} == {
        ("q3", "invalid query (no chunk of grade >= 1)"), ("q2", "failed: timeout")}
    assert out["counts"]["n_failed"] == 1 and out["counts"]["n_invalid"] == 1
    assert {"query_id", "stage", "ndcg@10"} <= set(out["per_query"][0])
    assert out["complete"] is False


def test_score_json_single_stage_is_flat(files):
    out = json.loads(run("score", *map(str, files), "--json", "--stage", "final", "--metrics", "ndcg@5,hit@5").stdout)
    assert out["summary"] == {"ndcg@5": pytest.approx(0.615328, abs=1e-6), "hit@5": 1.0}


def test_score_table_shows_tiers_and_counts(files):
    out = run("score", *map(str, files)).stdout
    assert "stage" in out and "ndcg@5" in out and "fail" in out
    assert "invalid queries: q3" in out and "failed by kind: timeout=1" in out
    assert "not statistically significant" in out


def test_bad_input_exits_2_with_the_place(tmp_path, files):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_id": "q1", "query": "x", "relevant": {"a": 5}}\n')
    proc = run("score", str(bad), str(files[1]), check=False)
    assert proc.returncode == 2 and f"{bad}, line 1, field 'relevant'" in proc.stderr
    proc = run("score", str(files[0]), str(files[1]), "--metrics", "ndcg@x", check=False)
    assert proc.returncode == 2 and "family@K" in proc.stderr
    proc = run("score", str(files[0]), str(tmp_path / "none.parquet"), check=False)
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_console_script_is_installed():
    exe = shutil.which("weknora-nb", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert exe, "the weknora-nb console script is not on PATH"
    assert subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.startswith("weknora-nb ")
