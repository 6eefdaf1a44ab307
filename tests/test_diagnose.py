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


CUSTOM_DEFS = {
    "vector": {"endpoint": "hybrid-search", "params": {"disable_keywords_match": True}},
    "keyword": {"endpoint": "hybrid-search", "params": {"disable_vector_match": True}},
    "hybrid-100": {"endpoint": "hybrid-search", "params": {"match_count": 100}},
    "final-b": {"endpoint": "knowledge-search", "params": {}},
}


def run_custom(labels: dict, stages: dict[str, list], definitions: dict | None):
    ts = TestSet.from_records([{"query_id": "q", "query": "问题", "relevant": labels}])
    rows = [("q", st, 1, i + 1, c, 1.0 - i * 0.01) for st, chunks in stages.items() for i, c in enumerate(chunks)]
    df = results_frame(rows)
    sc = score(ts, df, ["recall@3", "recall@10", "ndcg@10"])
    return diagnose(sc, ts, df, inventory=INV, k=K, stage_definitions=definitions)


def causes_at(d, stage: str) -> set:
    row = d.degraded[d.degraded["stage"] == stage]
    return set(row["causes"].iloc[0]) if len(row) else set()


def test_custom_stages_get_upstream_stages_and_causes_from_their_definition():
    # d:5: found by the keyword path, dropped by the merge (hybrid-100); d:6: in hybrid-100's top K, reranked out
    stages = {"final-b": ["d:1", "d:2", "d:3", "d:6"], "vector": ["d:1"], "keyword": ["d:5"],
              "hybrid-100": ["d:1", "d:2", "d:6"]}
    d = run_custom({"d:5": 3, "d:6": 3}, stages, CUSTOM_DEFS)
    assert causes_at(d, "hybrid-100") == {"vector miss", "chunk split"}
    assert causes_at(d, "final-b") == {"vector miss", "lost in merge", "rerank demoted"}
    builtin = run_custom({"d:5": 3, "d:6": 3}, {"vector": stages["vector"], "keyword": stages["keyword"],
                                                "hybrid": stages["hybrid-100"], "final": stages["final-b"]}, None)
    assert causes_at(builtin, "hybrid") == causes_at(d, "hybrid-100")
    assert causes_at(builtin, "final") == causes_at(d, "final-b")
    final_b = d.degraded.set_index("stage").loc["final-b", "evidence"]
    assert "rerank demoted: d:6 (grade 3): rank 3 before rerank, rank 4 after" in final_b
    assert list(d.summary().columns) == ["vector", "hybrid-100", "final-b"]  # pipeline order from the definitions
    # without the definitions the custom stages have no role: nothing upstream, only what the stage shows
    d = run_custom({"d:5": 3, "d:6": 3}, stages, None)
    assert causes_at(d, "hybrid-100") == {"chunk split"} and causes_at(d, "final-b") == set()
    assert list(d.summary().columns) == ["vector", "final-b", "hybrid-100"]


def test_a_builtin_stage_is_preferred_over_a_custom_one_of_its_role():
    # final's hybrid path is the built-in hybrid (d:5 in its top K: demoted), not hybrid-100 (d:5 absent)
    stages = {"hybrid-100": ["d:1", "d:2", "d:3"], "hybrid": ["d:5", "d:1", "d:2"], "final": ["d:1", "d:2", "d:3"]}
    d = run_custom({"d:5": 3}, stages, {"hybrid-100": CUSTOM_DEFS["hybrid-100"]})
    assert "rerank demoted" in causes_at(d, "final")


def test_a_new_cause_is_one_registered_function():
    from weknora_nb.analysis import diagnose as dg

    @dg.cause("test: lost grade 3", level="chunk")
    def _lost_grade_3(lost: dg.LostChunk) -> list[str]:
        return [f"{lost.chunk_id} at {lost.query.stage}"] if lost.grade == 3 else []
    try:
        d = run({"d:5": 3, "d:6": 2}, {"final": ["d:1", "d:2", "d:3"]})
        assert causes(d) == {"test: lost grade 3"}
        assert d.degraded["evidence"].iloc[0] == ["test: lost grade 3: d:5 at final"]
        assert d.summary().loc["test: lost grade 3", "final"] == 1
        assert dg.causes()[:len(dg.CAUSES)] == dg.CAUSES
    finally:
        del dg._REGISTRY["test: lost grade 3"]


def test_causes_keep_their_report_order():
    from weknora_nb.analysis.diagnose import CAUSES
    assert CAUSES == ("label/KB mismatch", "threshold filtered", "vector miss", "lost in merge", "rerank demoted",
                      "chunk split", "grade inversion")
