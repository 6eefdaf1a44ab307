"""Each cause of a degraded query on a crafted case that must produce it, and one that must not.

The results tables are built by hand (no server): which steps of WeKnora's knowledge-search a
stage ran is read from them (model scores) and from the manifest's records (retrieval config,
server, stage definitions), as `diagnose` does for a real run.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from weknora_nb import score
from weknora_nb.analysis.diagnose import UNEXPLAINED, diagnose, effective_config
from weknora_nb.core.testset import TestSet

from .conftest import results_frame

K = 3
INV = pd.DataFrame({
    "chunk_id": [f"d:{i}" for i in range(10)] + ["off:0"],
    "knowledge_id": ["d"] * 10 + ["off"],
    "chunk_index": list(range(10)) + [0],
    "is_enabled": [True] * 10 + [False],
    "content": [f"topic{i} detail{i} fact{i} note{i}" for i in range(10)] + ["disabled"],
})
#: a tenant that saved a config: thresholds off, three results kept (K), a reranker named
RERANK_CFG = {"embedding_top_k": 50, "vector_threshold": 0.01, "keyword_threshold": 0.01, "rerank_top_k": K,
              "rerank_threshold": 0.3, "rerank_model_id": "bge-reranker"}
NO_RERANK_CFG = {**RERANK_CFG, "rerank_model_id": ""}
POSTGRES = {"version": "v0.7.2", "keyword_index_engine": "postgres", "vector_store_engine": "postgres"}


def frame(stages: dict[str, list], *, scores: dict | None = None, model: dict | None = None, base: dict | None = None,
          sub: dict | None = None, repeat: int = 1, query: str = "q") -> pd.DataFrame:
    """A results table: each stage's list in order; scores falling unless given; model / base scores
    per (stage, chunk) (absent: no rerank score); sub: (stage, chunk) -> JSON list of merged chunk ids."""
    rows = []
    for st, chunks in stages.items():
        if not chunks:
            rows.append((query, st, repeat, None, None, None, "ok"))
        for i, c in enumerate(chunks):
            rows.append((query, st, repeat, i + 1, c, (scores or {}).get((st, c), 1.0 - i * 0.01), "ok"))
    df = results_frame(rows)
    for col, values in (("model_score", model), ("base_score", base)):
        df[col] = [(values or {}).get((r.stage, r.chunk_id), math.nan) for r in df.itertuples()]
    if sub:
        df["sub_chunk_ids"] = pd.array([sub.get((r.stage, r.chunk_id)) for r in df.itertuples()], dtype="string")
    return df


def run(labels: dict, stages: dict[str, list] | pd.DataFrame, *, cfg=None, server=None, definitions=None,
        inventory=INV, only: list[str] | None = None, ndcg_below: float = 0.5, trace=None, **kw):
    """Diagnose one query ``q`` (plus any other queries a given table holds) at K = 3."""
    df = stages if isinstance(stages, pd.DataFrame) else frame(stages, **kw)
    recs = [{"query_id": q, "query": "问题", "relevant": labels} for q in df["query_id"].astype(str).unique()]
    ts = TestSet.from_records(recs)
    sc = score(ts, df, ["recall@3", "recall@10", "ndcg@10"])
    return diagnose(sc, ts, df, inventory=inventory, retrieval_config=cfg, server=server, k=K, ndcg_below=ndcg_below,
                    stages=only if only is not None else ["final"], stage_definitions=definitions, vector_trace=trace)


def causes(d, stage: str = "final", query: str = "q") -> set:
    row = d.degraded[(d.degraded["stage"] == stage) & (d.degraded["query_id"] == query)]
    return set(row["causes"].iloc[0]) if len(row) else set()


def evidence(d, stage: str = "final", query: str = "q") -> list[str]:
    row = d.degraded[(d.degraded["stage"] == stage) & (d.degraded["query_id"] == query)]
    return list(row["evidence"].iloc[0]) if len(row) else []


def test_label_kb_mismatch():
    assert "label/KB mismatch" in causes(run({"nope:1": 3}, {"final": ["d:1", "d:2", "d:3"]}))
    assert "label/KB mismatch" in causes(run({"off:0": 3}, {"final": ["d:1", "d:2", "d:3"]}))
    assert "label/KB mismatch" not in causes(run({"d:5": 3}, {"final": ["d:1", "d:2", "d:3"]}))


def test_threshold_filtered():
    stages = {"vector": ["d:1", "d:5"], "final": ["d:1", "d:2", "d:3"]}
    sc = {("vector", "d:5"): 0.2}
    assert "threshold filtered" in causes(run({"d:5": 3}, stages, scores=sc, cfg={"vector_threshold": 0.5}))
    assert "threshold filtered" not in causes(run({"d:5": 3}, stages, scores=sc, cfg={"vector_threshold": 0.1}))
    # nothing recorded: the thresholds are not known, so none is claimed
    assert "threshold filtered" not in causes(run({"d:5": 3}, stages, scores=sc))


@pytest.mark.contract("C30", "C57")
def test_threshold_filtered_uses_the_effective_thresholds_of_an_all_zero_config():
    zeros = {"embedding_top_k": 0, "vector_threshold": 0.0, "keyword_threshold": 0.0, "rerank_top_k": 0,
             "rerank_threshold": 0.0, "rerank_model_id": ""}
    stages = {"vector": ["d:1", "d:5"], "keyword": ["d:1"], "final": ["d:1", "d:2", "d:3"]}
    low, high = {("vector", "d:5"): 0.12}, {("vector", "d:5"): 0.2}
    for recorded in (zeros, {"raw": zeros, "effective": effective_config(zeros)}):
        d = run({"d:5": 3}, stages, scores=low, cfg=recorded, server=POSTGRES)
        assert "threshold filtered" in causes(d)
        assert any("vector score 0.120 < vector_threshold 0.15" in e for e in evidence(d))
        assert "threshold filtered" not in causes(run({"d:5": 3}, stages, scores=high, cfg=recorded, server=POSTGRES))
    # a hybrid-search stage runs the thresholds of its request (none here), not the tenant's
    d = run({"d:5": 3}, {**stages, "hybrid": ["d:1", "d:2", "d:3"]}, scores=low, cfg=zeros, only=["hybrid"])
    assert "threshold filtered" not in causes(d, "hybrid")
    defs = {"hybrid": {"endpoint": "hybrid-search", "params": {"vector_threshold": 0.3}}}
    d = run({"d:5": 3}, {**stages, "hybrid": ["d:1", "d:2", "d:3"]}, scores=high, cfg=zeros, only=["hybrid"],
            definitions=defs)
    assert any("vector_threshold 0.3 (request)" in e for e in evidence(d, "hybrid"))


@pytest.mark.contract("C19", "C56", "C109")
def test_a_keyword_threshold_is_claimed_only_on_opensearch():
    stages = {"vector": ["d:1"], "keyword": ["d:1", "d:5"], "final": ["d:1", "d:2", "d:3"]}
    sc = {("keyword", "d:5"): 0.1}  # below the default keyword threshold 0.3
    cfg = {"embedding_top_k": 50, "rerank_top_k": 10}  # keyword_threshold 0: the default 0.3
    ignoring = ("postgres", "postgres,opensearch", "elasticsearch_v8", "elasticsearch_v7", "weaviate", "sqlite",
                "milvus")
    for server in (None, POSTGRES, *({**POSTGRES, "keyword_index_engine": e} for e in ignoring)):
        assert "threshold filtered" not in causes(run({"d:5": 3}, stages, scores=sc, cfg=cfg, server=server))
    d = run({"d:5": 3}, stages, scores=sc, cfg=cfg, server={**POSTGRES, "keyword_index_engine": "opensearch"})
    assert any("keyword score 0.100 < keyword_threshold 0.3" in e for e in evidence(d))
    assert "0.3, ignored by the Postgres keyword path (C19)" in set(
        run({"d:5": 3}, stages, scores=sc, cfg=cfg, server=POSTGRES).what_ran()["keyword_threshold"])
    notes = {e: set(run({"d:5": 3}, stages, scores=sc, cfg=cfg, server={**POSTGRES, "keyword_index_engine": e})
                    .what_ran()["keyword_threshold"]) for e in ("elasticsearch_v8", "sqlite", "weaviate", "milvus")}
    assert "0.3, ignored by the Elasticsearch keyword path (C109)" in notes["elasticsearch_v8"]
    assert "0.3, ignored by the SQLite keyword path (C109)" in notes["sqlite"]
    assert "0.3, ignored by the Weaviate keyword path (C109)" in notes["weaviate"]
    assert any("not known whether the milvus keyword path applies it" in n for n in notes["milvus"])


def test_vector_miss():
    assert "vector miss" in causes(run({"d:5": 3}, {"vector": ["d:1"], "final": ["d:1", "d:2", "d:3"]}))
    assert "vector miss" not in causes(run({"d:5": 3}, {"vector": ["d:5"], "final": ["d:1", "d:2", "d:3"]}))


def test_lost_in_fusion():
    stages = {"keyword": ["d:5"], "hybrid": ["d:1", "d:2"], "final": ["d:1", "d:2", "d:3"]}
    assert "lost in fusion" in causes(run({"d:5": 3}, stages))
    stages["hybrid"] = ["d:1", "d:5"]
    assert "lost in fusion" not in causes(run({"d:5": 3}, stages))


# --------------------------------------------------------------------------- knowledge-search's steps

HYBRID = ["d:5", "d:1", "d:2", "d:3", "d:7"]
FULL = ["d:1", "d:2", "d:3"]  # rerank_top_k (3) results, d:5 not among them
SCORED = {("final", c): s for c, s in zip(FULL, (0.9, 0.8, 0.7), strict=True)}


@pytest.mark.contract("C35", "C39")
def test_rerank_demoted_only_when_a_reranker_ran():
    stages = {"hybrid": HYBRID, "final": FULL}
    d = run({"d:5": 3}, stages, cfg=RERANK_CFG, model=SCORED)
    assert "rerank demoted" in causes(d)
    assert "rerank demoted: d:5 (hybrid rank 1) is not among what the reranker kept (3 results once merged, lowest " \
           "model score 0.7000)" in evidence(d)
    # the same lists without model scores: no reranker ran, the loss is the top-k cut
    for cfg in (NO_RERANK_CFG, None):
        d = run({"d:5": 3}, stages, cfg=cfg)
        assert "rerank demoted" not in causes(d) and "below rerank threshold" not in causes(d)
    assert "cut by top-k" in causes(run({"d:5": 3}, stages, cfg=NO_RERANK_CFG))
    # ranked below the first K by the reranker (rerank_top_k 10 > K)
    d = run({"d:5": 3}, {"hybrid": HYBRID, "final": [*FULL, "d:5"]}, cfg={**RERANK_CFG, "rerank_top_k": 10},
            model={**SCORED, ("final", "d:5"): 0.6})
    assert "rerank demoted: d:5 (hybrid rank 1): result 4 after rerank (model score 0.6000), below the first 3" in \
        evidence(d)


@pytest.mark.contract("C39")
def test_at_v062_the_base_score_shows_the_reranker_ran():
    stages = {"hybrid": HYBRID, "final": FULL}
    v062 = {**POSTGRES, "version": "v0.6.2"}
    base = {("final", c): 0.01 for c in FULL}
    assert "rerank demoted" in causes(run({"d:5": 3}, stages, cfg=RERANK_CFG, server=v062, base=base))
    # a later release writes model scores: a base score alone is no evidence, the reranker failed
    d = run({"d:5": 3}, stages, cfg=RERANK_CFG, server=POSTGRES, base=base)
    assert "rerank demoted" not in causes(d) and "rerank failed" in causes(d)


@pytest.mark.contract("C43")
def test_cut_by_top_k():
    stages = {"hybrid": HYBRID, "final": FULL}
    d = run({"d:5": 3}, stages, cfg=NO_RERANK_CFG)
    assert evidence(d) == ["cut by top-k: d:5 (hybrid rank 1) is not among the rerank_top_k 3 results kept"]
    # a list shorter than rerank_top_k was not cut
    assert "cut by top-k" not in causes(run({"d:5": 3}, stages, cfg={**NO_RERANK_CFG, "rerank_top_k": 10}))
    # below the search depth (embedding_top_k)
    d = run({"d:7": 3}, stages, cfg={**NO_RERANK_CFG, "embedding_top_k": 4, "rerank_top_k": 10})
    assert "cut by top-k: d:7: hybrid rank 5 > embedding_top_k 4 (the search depth)" in evidence(d)
    # v0.6.x does not sort before the cut
    d = run({"d:5": 3}, stages, cfg=NO_RERANK_CFG, server={**POSTGRES, "version": "v0.6.3"})
    assert any("not by score" in e for e in evidence(d))


@pytest.mark.contract("C42")
def test_dropped_in_merge():
    inv = INV.copy()
    inv.loc[inv["chunk_id"] == "d:5", "content"] = "detail2 fact2"  # inside kept result d:2's text
    stages = {"hybrid": HYBRID, "final": FULL}
    for cfg, model in ((NO_RERANK_CFG, None), (RERANK_CFG, SCORED)):
        d = run({"d:5": 3}, stages, cfg=cfg, model=model, inventory=inv)
        assert causes(d) == {"dropped in merge"}
        assert evidence(d) == ["dropped in merge: d:5 (hybrid rank 1): its text is contained in kept result d:2 "
                               "(overlap drop)"]
    # >= 85 % of the shorter text's tokens shared (whatever the order)
    inv.loc[inv["chunk_id"] == "d:5", "content"] = "fact3 note3 detail3 topic3 extra3 more3 words3"
    assert "dropped in merge" in causes(run({"d:5": 3}, stages, cfg=NO_RERANK_CFG, inventory=inv))
    # texts that differ: not dropped in merge
    assert "dropped in merge" not in causes(run({"d:5": 3}, stages, cfg=NO_RERANK_CFG))


@pytest.mark.contract("C41")
def test_pushed_down_by_merge():
    # d:5 is the third result, but d:1's merged neighbours take ranks 2-3 once unfolded
    sub = {("final", "d:1"): '["d:8", "d:9"]'}
    d = run({"d:5": 3}, {"final": ["d:1", "d:2", "d:5"]}, sub=sub)
    assert evidence(d)[0] == ("pushed down by merge: d:5 is in result 3 (of the first 3); 2 neighbours merged into "
                              "the results above it put it at rank 5 once unfolded")
    # a result below the first K is not pushed down by the merge
    assert "pushed down by merge" not in causes(run({"d:5": 3}, {"final": ["d:1", "d:2", "d:3", "d:5"]}, sub=sub))


@pytest.mark.contract("C36", "C40")
def test_below_rerank_threshold_and_not_selected_by_mmr():
    stages = {"hybrid": HYBRID, "final": FULL}
    # the model score of d:5 is known from another repeat of the stage, where it was kept (third)

    def with_score(m: float) -> pd.DataFrame:
        second = frame({"hybrid": HYBRID, "final": ["d:1", "d:2", "d:5"]}, repeat=2, base={("final", "d:5"): 0.0},
                       model={("final", "d:1"): 0.9, ("final", "d:2"): 0.8, ("final", "d:5"): m})
        return pd.concat([frame(stages, model=SCORED), second], ignore_index=True)
    assert causes(run({"d:5": 3}, with_score(0.1), cfg=RERANK_CFG)) == {"below rerank threshold"}
    d = run({"d:5": 3}, with_score(0.95), cfg=RERANK_CFG)
    assert causes(d) == {"not selected by MMR"}
    assert any("composite 0.6700 above the lowest kept result's 0.5200" in e for e in evidence(d))
    assert causes(run({"d:5": 3}, with_score(0.5), cfg=RERANK_CFG)) == {"rerank demoted"}
    # its score unknown: a list shorter than rerank_top_k means fewer passed the threshold
    d = run({"d:5": 3}, {"hybrid": HYBRID, "final": ["d:1", "d:2"]}, cfg=RERANK_CFG, model=SCORED)
    assert causes(d) == {"below rerank threshold"}
    assert any("accounts for only 2 chunks < rerank_top_k 3" in e for e in evidence(d))


@pytest.mark.contract("C36", "C37")
def test_rerank_failed():
    stages = {"hybrid": HYBRID, "final": FULL}
    # the tenant config names a reranker, the list carries no model scores: the rerank call failed
    d = run({"d:5": 3}, stages, cfg=RERANK_CFG)
    assert causes(d) == {"rerank failed", "cut by top-k"}
    assert any("the rerank call failed" in e and "d:5 (hybrid rank 1)" in e for e in evidence(d))
    # an empty list: the reranker rejected every candidate
    d = run({"d:5": 3}, {"hybrid": HYBRID, "final": []}, cfg=RERANK_CFG)
    assert causes(d) == {"rerank failed"} and any("#2391" in e for e in evidence(d))
    # no rerank model named, but other queries' lists carry model scores: this query's reranking failed
    both = pd.concat([frame(stages), frame(stages, model=SCORED, query="q2")], ignore_index=True)
    d = run({"d:5": 3}, both, cfg=NO_RERANK_CFG)
    assert "rerank failed" in causes(d) and "rerank failed" not in causes(d, query="q2")
    assert "rerank demoted" in causes(d, query="q2")
    # no reranker anywhere: nothing failed
    assert "rerank failed" not in causes(run({"d:5": 3}, {"hybrid": HYBRID, "final": []}, cfg=NO_RERANK_CFG))
    # hybrid did not find the chunk: the reranker is not to blame
    assert "rerank failed" not in causes(run({"d:5": 3}, {"hybrid": ["d:1"], "final": []}, cfg=RERANK_CFG))


@pytest.mark.contract("C66")
def test_citations_are_not_blamed_on_knowledge_search():
    stages = {"hybrid": HYBRID, "final": FULL, "citations": FULL}
    model = {**SCORED, **{("citations", c): s for (_, c), s in SCORED.items()}}
    d = run({"d:5": 3}, stages, cfg=RERANK_CFG, model=model, only=["final", "citations"])
    assert "rerank demoted" in causes(d, "final")
    assert causes(d, "citations") == {UNEXPLAINED}
    d = run({"d:5": 3}, stages, cfg=NO_RERANK_CFG, only=["final", "citations"])
    assert "cut by top-k" in causes(d, "final") and causes(d, "citations") == {UNEXPLAINED}
    assert d.what_ran().set_index("stage").loc["citations", "settings"] == "server conversation config"


def test_unexplained_is_listed_and_counted():
    d = run({"d:5": 3}, {"final": ["d:1", "d:2", "d:3"]})
    assert causes(d) == {UNEXPLAINED}
    assert evidence(d) == ["unexplained: d:5 (grade 3): in none of the lists"]
    assert d.summary().loc[UNEXPLAINED, "final"] == 1 and d.summary().index[-1] == "degraded queries"
    # every relevant chunk in the top K, ranked low: unexplained too, with the ranks
    d = run({"d:3": 3}, {"final": ["d:1", "d:2", "d:3"]}, ndcg_below=0.6)
    assert evidence(d) == ["unexplained: every relevant chunk is in the top 3 (d:3 at rank 3), ranked too low for "
                           "NDCG@10"]


def test_what_ran_says_where_settings_came_from_and_whether_a_reranker_ran():
    stages = {"hybrid": HYBRID, "final": FULL}
    zeros = {"embedding_top_k": 0, "vector_threshold": 0, "keyword_threshold": 0, "rerank_top_k": 0,
             "rerank_threshold": 0, "rerank_model_id": ""}
    t = run({"d:5": 3}, stages, cfg={"raw": zeros, "effective": effective_config(zeros)},
            server=POSTGRES).what_ran().set_index("stage")
    assert t.loc["final"].to_dict() == {
        "settings": "tenant retrieval config", "vector_threshold": "0.15",
        "keyword_threshold": "0.3, ignored by the Postgres keyword path (C19)", "embedding_top_k": 50,
        "rerank_top_k": 10, "rerank_threshold": "0.2 (assumed: config never saved)",
        "reranker": "none (no model_score in the results)"}
    assert t.loc["hybrid", "settings"] == "request"
    t = run({"d:5": 3}, stages, cfg=RERANK_CFG, model=SCORED).what_ran().set_index("stage")
    assert t.loc["final", "reranker"] == "ran: 1 queries' lists carry model_score"


def test_settings_source_of_the_manifest_decides_the_steps_looked_at():
    stages = {"hybrid": HYBRID, "final-x": FULL}
    defs = {"final-x": {"endpoint": "knowledge-search", "params": {}}}
    assert "cut by top-k" in causes(run({"d:5": 3}, stages, cfg=NO_RERANK_CFG, definitions=defs, only=["final-x"]),
                                    "final-x")
    defs["final-x"]["settings_source"] = "server conversation config"
    assert causes(run({"d:5": 3}, stages, cfg=NO_RERANK_CFG, definitions=defs, only=["final-x"]),
                  "final-x") == {UNEXPLAINED}


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
    assert s.loc[UNEXPLAINED, "final"] == 0 and s.loc["degraded queries", "final"] == 1


def test_merged_sub_chunks_count_as_returned():
    # d:5 absorbed into d:4's merged result: not lost, so neither split nor anything else
    d = run({"d:5": 3}, {"final": ["d:4", "d:8", "d:9"]}, sub={("final", "d:4"): '["d:5"]'})
    assert d.degraded.empty


def test_drilldown_shows_labels_and_stage_lists():
    d = run({"d:5": 3, "d:6": 1}, {"vector": ["d:1", "d:6"], "final": ["d:4", "d:8", "d:9"]})
    dd = d.drilldown("q")
    assert dd["query"] == "问题"
    assert list(dd["labels"]["chunk_id"]) == ["d:5", "d:6"] and dd["labels"]["content"].iloc[0] == INV["content"][5]
    assert list(dd["returned"]["final"]["chunk_id"]) == ["d:4", "d:8", "d:9"]
    assert list(dd["returned"]["vector"]["grade"]) == [0, 1]


CUSTOM_DEFS = {
    "vector": {"endpoint": "hybrid-search", "params": {"disable_keywords_match": True}},
    "keyword": {"endpoint": "hybrid-search", "params": {"disable_vector_match": True}},
    "hybrid-100": {"endpoint": "hybrid-search", "params": {"match_count": 100}},
    "final-b": {"endpoint": "knowledge-search", "params": {}},
}


def run_custom(labels: dict, stages: dict[str, list], definitions: dict | None, model: dict | None = None):
    return run(labels, stages, definitions=definitions, model=model, cfg=RERANK_CFG, only=[])


def causes_at(d, stage: str) -> set:
    return causes(d, stage)


def test_custom_stages_get_upstream_stages_and_causes_from_their_definition():
    # d:5: found by the keyword path, dropped by the fusion (hybrid-100); d:6: in hybrid-100's top K, reranked out
    stages = {"final-b": ["d:1", "d:2", "d:3", "d:6"], "vector": ["d:1"], "keyword": ["d:5"],
              "hybrid-100": ["d:1", "d:2", "d:6"]}
    model = {(st, c): 0.9 - 0.1 * i for st in ("final-b", "final") for i, c in enumerate(stages["final-b"])}
    d = run_custom({"d:5": 3, "d:6": 3}, stages, CUSTOM_DEFS, model)
    assert causes_at(d, "hybrid-100") == {"vector miss", "chunk split"}
    assert causes_at(d, "final-b") == {"vector miss", "lost in fusion", "rerank demoted"}
    builtin = run_custom({"d:5": 3, "d:6": 3}, {"vector": stages["vector"], "keyword": stages["keyword"],
                                                "hybrid": stages["hybrid-100"], "final": stages["final-b"]}, None,
                         model)
    assert causes_at(builtin, "hybrid") == causes_at(d, "hybrid-100")
    assert causes_at(builtin, "final") == causes_at(d, "final-b")
    final_b = d.degraded.set_index("stage").loc["final-b", "evidence"]
    assert "rerank demoted: d:6 (hybrid rank 3): result 4 after rerank (model score 0.6000), below the first 3" \
        in final_b
    assert list(d.summary().columns) == ["vector", "hybrid-100", "final-b"]  # pipeline order from the definitions
    # without the definitions the custom stages have no role: nothing upstream, only what the stage shows
    d = run_custom({"d:5": 3, "d:6": 3}, stages, None, model)
    assert causes_at(d, "hybrid-100") == {"chunk split"} and causes_at(d, "final-b") == {UNEXPLAINED}
    assert list(d.summary().columns) == ["vector", "final-b", "hybrid-100"]


def test_a_builtin_stage_is_preferred_over_a_custom_one_of_its_role():
    # final's hybrid path is the built-in hybrid (d:5 in it: demoted by the reranker), not hybrid-100 (d:5 absent)
    stages = {"hybrid-100": ["d:1", "d:2", "d:3"], "hybrid": ["d:5", "d:1", "d:2"], "final": ["d:1", "d:2", "d:3"]}
    d = run_custom({"d:5": 3}, stages, {"hybrid-100": CUSTOM_DEFS["hybrid-100"]}, SCORED)
    assert "rerank demoted" in causes_at(d, "final")


def test_a_new_cause_is_one_registered_function():
    from weknora_nb.analysis import diagnose as dg
    from weknora_nb.analysis.diagnose import rules

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
        del rules._REGISTRY["test: lost grade 3"]


def _trace(*rows) -> pd.DataFrame:
    """Chunk rows of a vector-store trace (collect.vectortrace's columns) for query ``q``."""
    cols = ("query_id", "chunk_id", "grade", "k", "status", "exact_rank", "planned_rank", "exact_distance",
            "has_vector", "status_index", "index_rank")
    return pd.DataFrame([("q", *r) for r in rows], columns=cols)


def test_a_vector_store_trace_splits_a_vector_miss_into_index_and_embedding_misses():
    stages = {"vector": ["d:1"], "final": ["d:1", "d:2", "d:3"]}
    labels = {"d:5": 3, "d:6": 3, "d:7": 2}
    trace = _trace(("d:5", 3, 50, "index_miss", 4, None, 0.2, True, "index_miss", None),
                   ("d:6", 3, 50, "embedding_miss", 70, None, 0.6, True, "embedding_miss", None),
                   ("d:7", 2, 50, "embedding_miss", None, None, None, False, "embedding_miss", None),
                   ("d:5", 3, 10, "index_miss", 4, None, 0.2, True, "index_miss", None))  # the largest K counts
    d = run(labels, stages, trace=trace)
    assert {"index miss", "embedding miss"} <= causes(d) and "vector miss" not in causes(d)
    ev = evidence(d)
    assert any(e.startswith("index miss: d:5") and "ranks it 4 of 50" in e for e in ev)
    assert any(e.startswith("embedding miss: d:6") and "ranks it 70, beyond the top 50" in e for e in ev)
    assert any(e.startswith("embedding miss: d:7") and "no vector in the store" in e for e in ev)
    # without a trace (or for a chunk the trace finds), it stays a vector miss
    assert "vector miss" in causes(run(labels, stages)) and "index miss" not in causes(run(labels, stages))
    found = run({"d:5": 3}, stages, trace=_trace(("d:5", 3, 50, "hit", 2, 2, 0.1, True, "hit", 2)))
    assert causes(found) >= {"vector miss"} and any("trace finds it at rank 2 of 50" in e for e in evidence(found))


def test_causes_keep_their_report_order():
    from weknora_nb.analysis.diagnose import CAUSES
    assert CAUSES == ("label/KB mismatch", "threshold filtered", "vector miss", "index miss", "embedding miss",
                      "lost in fusion",
                      "below rerank threshold", "not selected by MMR", "rerank demoted", "rerank failed",
                      "dropped in merge", "pushed down by merge", "cut by top-k", "chunk split", "grade inversion")
