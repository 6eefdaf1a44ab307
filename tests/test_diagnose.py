"""Each cause of a degraded query on a crafted case that must produce it, and one that must not."""

from __future__ import annotations

import pandas as pd

from weknora_nb import score
from weknora_nb.analysis.diagnose import diagnose
from weknora_nb.core.testset import TestSet

from .conftest import results_frame

K = 3
INV = pd.DataFrame({
    "chunk_id": [f"d:{i}" for i in range(10)] + ["off:0"],
    "knowledge_id": ["d"] * 10 + ["off"],
    "chunk_index": list(range(10)) + [0],
    "is_enabled": [True] * 10 + [False],
    "content": [f"chunk {i}" for i in range(10)] + ["disabled"],
})


def run(labels: dict, stages: dict[str, list], *, scores: dict | None = None, cfg=None, sub=None):
    ts = TestSet.from_records([{"query_id": "q", "query": "问题", "relevant": labels}])
    rows = []
    for st, chunks in stages.items():
        for i, c in enumerate(chunks):
            s = (scores or {}).get((st, c), 1.0 - i * 0.01)
            rows.append(("q", st, 1, i + 1, c, s, "ok"))
    df = results_frame(rows)
    if sub:
        df["sub_chunk_ids"] = pd.array([sub.get((r.stage, r.chunk_id)) for r in df.itertuples()], dtype="string")
    sc = score(ts, df, ["recall@3", "recall@10", "ndcg@10"])
    return diagnose(sc, ts, df, inventory=INV, retrieval_config=cfg, k=K, stages=["final"])


def causes(d):
    row = d.degraded[d.degraded["stage"] == "final"]
    return set(row["causes"].iloc[0]) if len(row) else set()


def test_label_kb_mismatch():
    assert "label/KB mismatch" in causes(run({"nope:1": 3}, {"final": ["d:1", "d:2", "d:3"]}))
    assert "label/KB mismatch" in causes(run({"off:0": 3}, {"final": ["d:1", "d:2", "d:3"]}))
    assert "label/KB mismatch" not in causes(run({"d:5": 3}, {"final": ["d:1", "d:2", "d:3"]}))


def test_threshold_filtered():
    stages = {"vector": ["d:1", "d:5"], "final": ["d:1", "d:2", "d:3"]}
    sc = {("vector", "d:5"): 0.2}
    assert "threshold filtered" in causes(run({"d:5": 3}, stages, scores=sc, cfg={"vector_threshold": 0.5}))
    assert "threshold filtered" not in causes(run({"d:5": 3}, stages, scores=sc, cfg={"vector_threshold": 0.1}))


def test_vector_miss():
    assert "vector miss" in causes(run({"d:5": 3}, {"vector": ["d:1"], "final": ["d:1", "d:2", "d:3"]}))
    assert "vector miss" not in causes(run({"d:5": 3}, {"vector": ["d:5"], "final": ["d:1", "d:2", "d:3"]}))


def test_lost_in_merge():
    stages = {"keyword": ["d:5"], "hybrid": ["d:1", "d:2"], "final": ["d:1", "d:2", "d:3"]}
    assert "lost in merge" in causes(run({"d:5": 3}, stages))
    stages["hybrid"] = ["d:1", "d:5"]
    assert "lost in merge" not in causes(run({"d:5": 3}, stages))


def test_rerank_demoted():
    stages = {"hybrid": ["d:5", "d:1", "d:2"], "final": ["d:1", "d:2", "d:3", "d:5"]}
    d = run({"d:5": 3}, stages)
    assert "rerank demoted" in causes(d)
    assert any("rank 1 before rerank, rank 4 after" in e for e in d.degraded["evidence"].iloc[0])
    stages["hybrid"] = ["d:1", "d:2", "d:3", "d:7", "d:5"]  # was not in the top K before rerank either
    assert "rerank demoted" not in causes(run({"d:5": 3}, stages))


def test_chunk_split():
    assert "chunk split" in causes(run({"d:5": 3}, {"final": ["d:4", "d:8", "d:9"]}))
    assert "chunk split" not in causes(run({"d:5": 3}, {"final": ["d:3", "d:8", "d:9"]}))


def test_grade_inversion():
    labels = {"d:1": 1, "d:2": 3, "d:7": 3, "d:8": 3, "d:9": 3}
    assert "grade inversion" in causes(run(labels, {"final": ["d:1", "d:2", "d:3"]}))
    assert "grade inversion" not in causes(run(labels, {"final": ["d:2", "d:1", "d:3"]}))


def test_healthy_query_is_not_degraded_and_summary_counts():
    d = run({"d:1": 3}, {"final": ["d:1", "d:2", "d:3"]})
    assert d.degraded.empty
    d = run({"d:5": 3, "d:6": 2}, {"vector": ["d:1"], "final": ["d:4", "d:8", "d:9"]})
    s = d.summary()
    assert s.loc["vector miss", "final"] == 1 and s.loc["chunk split", "final"] == 1
    assert s.loc["degraded queries", "final"] == 1


def test_merged_sub_chunks_count_as_returned():
    # d:5 absorbed into d:4's merged result: not lost, so neither split nor anything else
    d = run({"d:5": 3}, {"final": ["d:4", "d:8", "d:9"]}, sub={("final", "d:4"): '["d:5"]'})
    assert d.degraded.empty


def test_drilldown_shows_labels_and_stage_lists():
    d = run({"d:5": 3, "d:6": 1}, {"vector": ["d:1", "d:6"], "final": ["d:4", "d:8", "d:9"]})
    dd = d.drilldown("q")
    assert dd["query"] == "问题"
    assert list(dd["labels"]["chunk_id"]) == ["d:5", "d:6"] and dd["labels"]["content"].iloc[0] == "chunk 5"
    assert list(dd["returned"]["final"]["chunk_id"]) == ["d:4", "d:8", "d:9"]
    assert list(dd["returned"]["vector"]["grade"]) == [0, 1]
