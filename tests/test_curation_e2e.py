"""From real traffic to a trusted test set, end to end over real HTTP (docs/method.md section 10).

The sandbox's generated conversation history -> ``testset sample`` -> two versions collected on
the sampled queries -> ``testset pool`` -> labels given through the labelling session's own API
by a process killed between two labels, then resumed -> ``testset merge-labels`` -> scores, and a
comparison that re-scores both runs on the new version.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from weknora_nb import cli
from weknora_nb.analysis.compare import compare_runs
from weknora_nb.core.labels import LabelsLog, latest
from weknora_nb.core.lineage import read_lineage
from weknora_nb.core.run import load_run
from weknora_nb.core.testset import load_testset
from weknora_nb.reports.labelling import LabellingSession
from weknora_nb.sandbox import SandboxServer

from .test_history import DOC_QUERIES, FAQ_QUERIES, FIXTURES, _write_testset

KEY = "sk-curation-e2e-0123456789"

#: grades every candidate by a fixed rule (3 for a chunk first in some run, else 0), printing each once
#: ``grade()`` has returned (it is on disk then); killed from outside part way
LABELLER = textwrap.dedent("""
    import sys
    from weknora_nb.reports.labelling import LabellingSession
    s = LabellingSession(sys.argv[1], sys.argv[2], "li")
    while s.current is not None:
        item = s.current
        g = 3 if item.best_rank == "1" else 0
        s.grade(g)
        print(item.query_id, item.chunk_id, g, flush=True)
""")


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("curation_kb")
    shutil.copytree(FIXTURES / "mini_kb" / "docs", d / "docs")
    shutil.copytree(FIXTURES / "mini_kb" / "cache", d / "cache")  # its embedding seed (tests/test_fixture_seeds.py)
    (d / "faq").mkdir()
    shutil.copy(FIXTURES / "faq_small.jsonl", d / "faq" / "faq.jsonl")
    (d / "versions.yaml").write_text(
        "defaults:\n  hnsw: {m: 8, ef_construction: 50, ef_search: 16}\n  tenant: {embedding_top_k: 10, "
        "rerank_top_k: 5}\nversions:\n  a:\n    description: a\n  b:\n    description: b\n"
        "    tenant: {embedding_top_k: 3, rerank_top_k: 3}\n", encoding="utf-8")
    _write_testset(d / "testset.jsonl", DOC_QUERIES, "d")
    _write_testset(d / "faq" / "testset.jsonl", FAQ_QUERIES, "f")
    return d


def _label_with_a_kill(sheet: Path, log: Path, after: int) -> list[list[str]]:
    """Run the labeller, SIGKILL it after ``after`` confirmed labels; return what it confirmed."""
    proc = subprocess.Popen([sys.executable, "-c", LABELLER, str(sheet), str(log)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        confirmed = [proc.stdout.readline().split() for _ in range(after)]  # type: ignore[union-attr]
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL, err
    return confirmed + [line.split() for line in out.splitlines()]


@pytest.mark.slow
def test_history_to_a_new_test_set_version_and_its_scores(kb, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    cand = tmp_path / "candidates.jsonl"
    runs = {v: tmp_path / "runs" / v for v in ("a", "b")}

    def collect(version: str, testset: Path, *, sample: bool = False) -> None:
        with SandboxServer(version, data_dir=kb, cache_dir=tmp_path / "cache", api_key=KEY) as sb:
            if sample:  # 1. sample real traffic
                assert cli.main(["testset", "sample", "--base-url", sb.base_url, "--n", "12", "--seed", "3",
                                 "--out", str(cand)]) == 0
            assert cli.main(["collect", "--base-url", sb.base_url, "--kb-id", sb.kb_id, "--testset", str(testset),
                             "--stages", "vector,final", "--repeats", "1", "--out", str(runs[version]),
                             "--quiet"]) == 0

    collect("a", cand, sample=True)  # 2. version a collected on the sampled queries
    assert json.loads(Path(f"{cand}.summary.json").read_text(encoding="utf-8"))
    v1 = load_testset(cand)
    # 3. pool the unlabelled top chunks of both runs
    sheet = tmp_path / "sheet.csv"
    assert v1.n_valid == 0  # sampled, nobody judged them yet
    assert cli.main(["testset", "pool", "--testset", str(cand), "--runs", str(runs["a"]),
                     "--depth", "5", "--out", str(sheet)]) == 0
    session = LabellingSession(sheet, tmp_path / "unused.jsonl", "li")
    n_items = len(session.items)
    assert n_items >= 12
    # 4. label through the session's API; the labeller is killed between two labels, then resumed
    log = tmp_path / "labels.jsonl"
    confirmed = _label_with_a_kill(sheet, log, after=n_items // 2)
    written = [[j.query_id, j.chunk_id, str(j.grade)] for j in LabelsLog(log).read()]
    assert written[:len(confirmed)] == confirmed and len(written) - len(confirmed) in (0, 1)  # nothing lost
    resumed = LabellingSession(sheet, log, "li")
    while resumed.current is not None:
        resumed.grade(3 if resumed.current.best_rank == "1" else 0)
    judgements = LabelsLog(log).read()
    keys = [(j.query_id, j.chunk_id) for j in judgements]
    assert len(keys) == len(set(keys)) == n_items  # every candidate once: none twice after the resume
    assert len(latest(judgements)) == n_items
    # 5. a new version of the test set, with its lineage
    v2_path = tmp_path / "v2.jsonl"
    assert cli.main(["testset", "merge-labels", "--testset", str(cand), "--labels", str(log),
                     "--out", str(v2_path)]) == 0
    v2 = load_testset(v2_path)
    lineage = read_lineage(v2_path)
    assert lineage["parent"]["hash"] == v1.hash and lineage["hash"] == v2.hash
    assert lineage["labels_added"] == n_items and lineage["assessors"] == ["li"]
    assert v2.n_valid > 0
    # 6. scores on the new version; version b is measured on it, and comparing the two re-scores a on it too
    sc = load_run(runs["a"], testset=v2, other_version=True).scores
    assert sc.counts.n_valid == v2.n_valid
    collect("b", v2_path)
    cmp = compare_runs([runs["a"], runs["b"]], metrics=["ndcg@5", "judged@10"], resamples=200)
    assert [r.testset.hash for r in cmp.runs] == [v2.hash, v2.hash]
    assert cmp.runs[0].rescored_on == v2.hash and cmp.runs[1].rescored_on is None
    assert any("re-scored on the newest" in w for w in cmp.warnings)
    judged = cmp.metrics.set_index("metric").loc["judged@10"]
    assert judged["mean_a"] > 0.5  # a's top 5 was pooled and judged whole (its ranks 6-10 were not)
    coverage_before = load_run(runs["a"], metrics=["judged@10"]).scores  # on v1: no query is valid yet
    assert coverage_before.counts.n_valid == 0


def test_runs_on_unrelated_test_sets_are_refused_with_the_reason(tmp_path):
    from weknora_nb.core.errors import NotComparableError

    from .conftest import ranked, results_frame

    folders = []
    for name, query in (("x", "问题一"), ("y", "问题二")):
        ts_path = tmp_path / f"{name}.jsonl"
        ts_path.write_text(json.dumps({"query_id": "q1", "query": query, "relevant": {"c": 1}},
                                      ensure_ascii=False) + "\n", encoding="utf-8")
        ts = load_testset(ts_path)
        run = tmp_path / name
        run.mkdir()
        from weknora_nb.core.results import write_results

        write_results(results_frame(ranked("q1", ["c"])), run / "results.parquet")
        (run / "manifest.json").write_text(json.dumps({"run_name": name, "testset": {
            "path": str(ts_path), "hash": ts.hash}}), encoding="utf-8")
        folders.append(run)
    with pytest.raises(NotComparableError, match="not versions of one another"):
        compare_runs(folders, metrics=["ndcg@5"], resamples=50)
