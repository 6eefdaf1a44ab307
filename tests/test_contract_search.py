"""The sandbox's retrieval does what WeKnora's does (docs/weknora-contract.md C15-C47, C66, C76).

Facts about the API are checked over real HTTP against a :class:`SandboxServer` on the mini corpus
(tests/fixtures/mini_kb, 8 chunks); facts about the pipeline's inside on the engine, with the
retrieval and the rerank model replaced by fixed answers where the fact is about what a step
does with them.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from weknora_nb.collect.http.transport import default_tls
from weknora_nb.core.weknora import effective_retrieval_config
from weknora_nb.sandbox import SandboxServer
from weknora_nb.sandbox.chunking import Chunk, corpus_chunks, index_text
from weknora_nb.sandbox.emulation import RELEASES
from weknora_nb.sandbox.engine import NegativeMatchCount, RetrievalEngine, candidates_per_path
from weknora_nb.sandbox.index import SandboxIndex
from weknora_nb.sandbox.pipeline import CONVERSATION_SETTINGS, Hit, PipelineSettings
from weknora_nb.sandbox.textutil import clean_passage
from weknora_nb.sandbox.versions import VersionConfig, load_versions

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
FAQ_SMALL = Path(__file__).parent / "fixtures" / "faq_small.jsonl"
KEY = "sk-test-contract-search-0123"
QUERY = "忘记管理员密码怎么办"


# ---------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cache_dir(embedding_cache):
    return embedding_cache


@pytest.fixture(scope="module")
def mini_index(cache_dir):
    return SandboxIndex(corpus_chunks(MINI), cache_dir=cache_dir, seed_dir=MINI / "cache")


@pytest.fixture(scope="module")
def mini_versions():
    return load_versions(MINI / "versions.yaml")


def mini_engine(index, versions, name="baseline", release="v0.7.2", **over) -> RetrievalEngine:
    return RetrievalEngine(index, replace(versions[name], **over), release=RELEASES[release])


@pytest.fixture(scope="module")
def serve(cache_dir):
    """``serve(version, release)``: a running server (one per version and release, for the module)."""
    running: dict[tuple, SandboxServer] = {}
    with ExitStack() as stack:
        def get(version: VersionConfig, release: str = "v0.7.2") -> SandboxServer:
            key = (version, release)
            if key not in running:
                running[key] = stack.enter_context(SandboxServer(
                    version, data_dir=MINI, cache_dir=cache_dir, api_key=KEY, weknora_version=release,
                    allow_fault_control=True))
            return running[key]
        yield get


@pytest.fixture(scope="module")
def baseline(serve, mini_versions):
    return serve(mini_versions["baseline"])


def client(server: SandboxServer) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"X-API-Key": KEY}, timeout=30, verify=default_tls())


def hybrid(server: SandboxServer, **body) -> httpx.Response:
    with client(server) as c:
        return c.post(f"/api/v1/knowledge-bases/{server.kb_id}/hybrid-search", json=body)


def knowledge_search(server: SandboxServer, query: str) -> httpx.Response:
    with client(server) as c:
        return c.post("/api/v1/knowledge-search", json={"query": query, "knowledge_base_id": server.kb_id})


# -- a synthetic index: the pipeline's steps on chunks and scores chosen by the test ----------
def words(doc: int, k: int, n: int = 80, prefix: str = "w") -> list[str]:
    return [f"{prefix}{doc}x{k}y{j}" for j in range(n)]


def long_text(doc: int, k: int, n: int = 80) -> str:
    """At least 350 characters of tokens no other chunk has (no widening, no overlap)."""
    text = f"文档{doc} 第{k}节\n" + " ".join(words(doc, k, n))
    assert len(text) >= 350
    return text


def chunk(doc: int, k: int, content: str, *, start: int = 0, end: int | None = None) -> Chunk:
    return Chunk(id=f"d{doc}:{k:03d}", knowledge_id=f"d{doc}", knowledge_title=f"文档{doc}", chunk_index=k,
                 content=content, heading_path=(), start_at=start, end_at=len(content) if end is None else end)


def synthetic(chunks: list[Chunk], found: dict[str, float], model: dict[str, float] | None = None,
              release: str = "v0.7.2") -> RetrievalEngine:
    """An engine whose hybrid search answers ``found`` (chunk id -> retrieval score, in that order) and
    whose rerank model scores ``model`` (chunk id -> score)."""
    engine = RetrievalEngine(SandboxIndex(chunks), VersionConfig(name="synthetic", rerank_enabled=True),
                             release=RELEASES[release])
    by_id = engine.index.by_id
    engine.primary_search = lambda query, **kw: [Hit(by_id[c], s, 0) for c, s in found.items()]  # type: ignore
    engine.rerank_scores = lambda query, idxs: np.array(  # type: ignore[method-assign]
        [(model or {})[engine.index.chunks[i].id] for i in idxs])
    return engine


def settings(rerank: bool = True, top_k: int = 10, threshold: float = 0.2) -> PipelineSettings:
    return replace(CONVERSATION_SETTINGS, embedding_top_k=50, rerank_top_k=top_k, rerank_threshold=threshold,
                   rerank=rerank, query_expansion=False)  # knowledge-search's: no query expansion (C115)


def ids(engine: RetrievalEngine, hits) -> list[str]:
    return [engine.index.chunks[h.idx].id for h in hits]


# ---------------------------------------------------------------------------------------
# hybrid-search (C15-C26), over HTTP
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C17", "C25")
def test_match_count_zero_is_data_null_and_negative_is_a_panic_before_main(serve, mini_versions):
    v072 = serve(mini_versions["baseline"], "v0.7.2")
    r = hybrid(v072, query_text=QUERY, match_count=0)
    assert r.status_code == 200 and r.json() == {"success": True, "data": None}
    r = hybrid(v072, query_text=QUERY, match_count=-1)
    assert r.status_code == 500 and set(r.json()) == {"error", "message"}
    assert r.json()["error"] == "Internal Server Error"
    main = serve(mini_versions["baseline"], "main")
    fifty = hybrid(main, query_text=QUERY, match_count=50, skip_context_enrichment=True).json()["data"]
    assert len(fifty) >= 5
    for count in (0, -1):  # main: <= 0 means 50
        assert hybrid(main, query_text=QUERY, match_count=count, skip_context_enrichment=True).json()["data"] == fifty


@pytest.mark.contract("C17")
def test_a_negative_match_count_without_candidates_is_null_not_a_panic(mini_index, mini_versions):
    engine = mini_engine(mini_index, mini_versions)
    got = engine.hybrid_search("zzqqxx", match_count=-1, vector_threshold=0.999)
    assert got is None
    with pytest.raises(NegativeMatchCount):
        engine.hybrid_search(QUERY, match_count=-1)


@pytest.mark.contract("C19", "C25")
def test_vector_threshold_is_a_cosine_floor_and_the_keyword_threshold_is_ignored(baseline):
    vec = hybrid(baseline, query_text=QUERY, match_count=50, vector_threshold=0.3, disable_keywords_match=True,
                 skip_context_enrichment=True).json()["data"]
    assert vec and all(r["score"] >= 0.3 and r["match_type"] == 0 for r in vec)
    nothing = hybrid(baseline, query_text=QUERY, match_count=50, vector_threshold=0.999,
                     disable_keywords_match=True).json()
    assert nothing == {"success": True, "data": None}
    plain = hybrid(baseline, query_text=QUERY, match_count=50, disable_vector_match=True).json()["data"]
    high = hybrid(baseline, query_text=QUERY, match_count=50, disable_vector_match=True,
                  keyword_threshold=1e9).json()["data"]
    assert plain and high == plain


@pytest.mark.contract("C20", "C21", "C23")
def test_fusion_keeps_raw_scores_of_one_path_and_fuses_two_by_weighted_rrf(baseline):
    body = {"query_text": QUERY, "match_count": 50, "skip_context_enrichment": True}
    vec = hybrid(baseline, **body, disable_keywords_match=True).json()["data"]
    kw = hybrid(baseline, **body, disable_vector_match=True).json()["data"]
    both = hybrid(baseline, **body).json()["data"]
    assert {r["match_type"] for r in vec} == {0} and {r["match_type"] for r in kw} == {1}
    assert max(r["score"] for r in kw) > 1.0  # raw BM25, not normalised
    for path in (vec, kw):
        assert [r["score"] for r in path] == sorted((r["score"] for r in path), reverse=True)
        assert len({r["id"] for r in path}) == len(path)
    v_rank = {r["id"]: n for n, r in enumerate(vec, start=1)}
    k_rank = {r["id"]: n for n, r in enumerate(kw, start=1)}
    assert {r["id"] for r in both} == set(v_rank) | set(k_rank)
    for r in both:
        expected = (0.7 / (60 + v_rank[r["id"]]) if r["id"] in v_rank else 0.0) + \
                   (0.3 / (60 + k_rank[r["id"]]) if r["id"] in k_rank else 0.0)
        assert r["score"] == pytest.approx(expected, abs=1e-12)
        assert r["match_type"] == (0 if r["id"] in v_rank else 1)
    assert [r["score"] for r in both] == sorted((r["score"] for r in both), reverse=True)


@pytest.mark.contract("C17", "C23", "C24")
def test_results_are_cut_to_match_count_then_neighbours_appended_with_score_0(baseline):
    plain = hybrid(baseline, query_text="DG-1010 锁定", match_count=1, disable_vector_match=True,
                   skip_context_enrichment=True).json()["data"]
    rich = hybrid(baseline, query_text="DG-1010 锁定", match_count=1, disable_vector_match=True).json()["data"]
    assert [r["id"] for r in plain] == ["guide.01-passwords:001"]
    assert rich[0]["id"] == plain[0]["id"]
    assert sorted((r["id"], r["match_type"], r["score"]) for r in rich[1:]) == [
        ("guide.01-passwords:000", 2, 0), ("guide.01-passwords:002", 2, 0)]
    two = hybrid(baseline, query_text=QUERY, match_count=2).json()["data"]
    primary = [r for r in two if r["match_type"] in (0, 1)]
    assert len(primary) == 2 and two[:2] == primary
    assert len({r["id"] for r in two}) == len(two)


@pytest.mark.contract("C18")
def test_candidates_per_path(mini_index, mini_versions, monkeypatch):
    assert [candidates_per_path(n, k) for n, k in [(0, 1), (1, 1), (10, 1), (11, 1), (60, 1), (30, 2), (40, 3),
                                                     (200, 1)]] == [50, 50, 50, 55, 300, 300, 500, 500]
    engine = mini_engine(mini_index, mini_versions)
    asked: list[tuple[str, int]] = []
    monkeypatch.setattr(engine, "_vector", lambda q, kb, top_k, t, allowed: asked.append(("vector", top_k)) or [])
    monkeypatch.setattr(engine, "_keyword", lambda q, top_k, allowed: asked.append(("keyword", top_k)) or [])
    engine.hybrid_search(QUERY, match_count=20, n_kbs=3)
    engine.hybrid_search(QUERY, match_count=3)
    assert asked == [("vector", 300), ("keyword", 300), ("vector", 50), ("keyword", 50)]


@pytest.mark.contract("C20")
def test_disabled_paths_and_indexing_strategy(mini_index, mini_versions):
    keyword_only = mini_engine(mini_index, mini_versions, vector_enabled=False)
    hits = keyword_only.hybrid_search(QUERY, match_count=50, skip_enrichment=True)
    assert hits and {h.match_type for h in hits} == {1}
    vector_only = mini_engine(mini_index, mini_versions, keyword_enabled=False)
    hits = vector_only.hybrid_search(QUERY, match_count=50, skip_enrichment=True)
    assert hits and {h.match_type for h in hits} == {0}
    assert vector_only.hybrid_search(QUERY, match_count=50, disable_vector=True) is None


@pytest.mark.contract("C76")
def test_both_paths_index_the_title_and_the_content():
    chunks = [chunk(1, 0, "只有正文，没有标题里的词。"), chunk(2, 0, "另一篇文档的正文。")]
    chunks[0] = replace(chunks[0], knowledge_title="熔断器手册")
    index = SandboxIndex(chunks)
    assert index.texts("index")[0] == "熔断器手册\n只有正文，没有标题里的词。" == index_text(chunks[0])
    engine = RetrievalEngine(index, VersionConfig(name="kw", vector_enabled=False))
    hits = engine.hybrid_search("熔断器手册", match_count=5, skip_enrichment=True)
    assert hits is not None and ids(engine, hits) == ["d1:000"]


# ---------------------------------------------------------------------------------------
# knowledge-search (C27-C44)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C29", "C30", "C57")
def test_a_never_saved_config_reads_as_zeros_and_runs_the_defaults(serve):
    server = serve(VersionConfig(name="unsaved"))
    with client(server) as c:
        raw = c.get("/api/v1/tenants/kv/retrieval-config").json()["data"]
    assert raw == {"embedding_top_k": 0, "vector_threshold": 0, "keyword_threshold": 0, "rerank_top_k": 0,
                   "rerank_threshold": 0, "rerank_model_id": ""}
    s = server.sandbox.engine.tenant_settings()
    assert (s.embedding_top_k, s.vector_threshold, s.keyword_threshold, s.rerank_top_k, s.rerank_threshold,
            s.rrf, s.rerank) == (50, 0.15, 0.3, 10, 0.2, (60, 0.7, 0.3), False)


@pytest.mark.contract("C29", "C30", "C57")
def test_a_saved_config_keeps_its_values_and_zero_means_default_except_the_rerank_threshold(mini_index,
                                                                                             mini_versions):
    engine = mini_engine(mini_index, mini_versions, "rerank")
    raw = engine.tenant_config_raw()
    assert raw["embedding_top_k"] == 10 and raw["rerank_top_k"] == 5 and raw["rrf_k"] == 60
    assert "rrf_vector_weight" not in raw and raw["rerank_model_id"] == "e5-bm25-features"
    s = engine.tenant_settings()
    assert (s.embedding_top_k, s.rerank_top_k, s.vector_threshold, s.rerank_threshold, s.rerank) == \
        (10, 5, 0.15, 0.0, True)
    cfg = effective_retrieval_config({"rerank_threshold": 0.4, "embedding_top_k": 7}, saved=True)
    assert PipelineSettings.from_effective(cfg, rerank=False) == PipelineSettings(
        7, 0.15, 0.3, 10, 0.4, 60, 0.7, 0.3, rerank=False)


@pytest.mark.contract("C31", "C44")
def test_nothing_found_is_an_empty_list_not_null(serve):
    strict = VersionConfig(name="strict", keyword_enabled=False, tenant_saved=True, tenant_vector_threshold=0.999)
    r = knowledge_search(serve(strict), QUERY)
    assert r.status_code == 200 and r.json() == {"success": True, "data": []}


@pytest.mark.contract("C35", "C39")
def test_rerank_runs_iff_a_rerank_model_is_registered(serve, mini_versions, baseline):
    plain = knowledge_search(baseline, "账号被锁定了多久能解锁").json()["data"]
    assert plain and all("model_score" not in r["metadata"] and "base_score" not in r["metadata"] for r in plain)
    reranked = knowledge_search(serve(mini_versions["rerank"]), "账号被锁定了多久能解锁").json()["data"]
    assert reranked and all({"model_score", "base_score"} <= set(r["metadata"]) for r in reranked)
    assert 0 < len(reranked) <= 5  # the saved rerank_top_k


@pytest.mark.contract("C37")
def test_a_failing_reranker_returns_the_candidates_without_model_scores(serve, mini_versions, baseline):
    server = serve(mini_versions["rerank"])
    server.set_faults(rerank_error_rate=1.0)
    try:
        failed = knowledge_search(server, "账号被锁定了多久能解锁").json()["data"]
    finally:
        server.set_faults()
    assert failed and all("model_score" not in r["metadata"] for r in failed)
    engine = server.sandbox.engine
    s = engine.tenant_settings()
    fallback = engine.knowledge_search("账号被锁定了多久能解锁", settings=s, rerank_fails=True)
    unreranked = engine.knowledge_search("账号被锁定了多久能解锁", settings=replace(s, rerank=False))
    assert fallback == unreranked and all(h.model_score is None and h.base_score is None for h in fallback)
    assert [r["id"] for r in failed] == ids(engine, fallback)


@pytest.mark.contract("C35", "C38")
def test_the_final_score_is_the_composite_of_model_and_retrieval_scores():
    chunks = [chunk(d, 0, long_text(d, 0)) for d in range(1, 4)]
    found = {"d1:000": 0.03, "d2:000": 0.02, "d3:000": 0.01}
    engine = synthetic(chunks, found, {"d1:000": 0.8, "d2:000": 1.7, "d3:000": 0.5})
    hits = engine.knowledge_search("q", settings=settings())
    got = {engine.index.chunks[h.idx].id: h for h in hits}
    assert got["d1:000"].score == pytest.approx(0.6 * 0.8 + 0.3 * 0.03 + 0.1)
    assert got["d2:000"].score == 1.0  # clamped
    assert (got["d3:000"].base_score, got["d3:000"].model_score) == (0.01, 0.5)
    assert engine.index.texts("rerank") == [clean_passage(c.content) for c in chunks]
    plain = synthetic(chunks, found).knowledge_search("q", settings=settings(rerank=False))
    assert [h.score for h in plain] == [0.03, 0.02, 0.01] and all(h.model_score is None for h in plain)


@pytest.mark.contract("C38")
def test_v06_multiplies_the_composite_by_a_position_factor():
    c = chunk(1, 0, long_text(1, 0), start=980, end=1000)
    factor = 1 + min(0.05, max(-0.05, 1 - 980 / 1001))
    for release, expected in (("v0.6.2", (0.6 * 0.5 + 0.3 * 0.02 + 0.1) * factor),
                              ("v0.7.2", 0.6 * 0.5 + 0.3 * 0.02 + 0.1)):
        engine = synthetic([c], {"d1:000": 0.02}, {"d1:000": 0.5}, release=release)
        assert engine.knowledge_search("q", settings=settings())[0].score == pytest.approx(expected)


@pytest.mark.contract("C36")
def test_rerank_threshold_then_the_fallback_to_the_first_result():
    chunks = [chunk(d, 0, long_text(d, 0)) for d in range(1, 4)]
    found = {"d1:000": 0.03, "d2:000": 0.02, "d3:000": 0.01}

    def run(model: dict[str, float], threshold: float, **kw) -> list[str]:
        engine = synthetic(chunks, found, model)
        return ids(engine, engine.knowledge_search("q", settings=settings(threshold=threshold), **kw))

    assert sorted(run({"d1:000": 0.1, "d2:000": 0.9, "d3:000": 0.25}, 0.2)) == ["d2:000", "d3:000"]
    assert run({"d1:000": 0.4, "d2:000": 0.36, "d3:000": 0.1}, 0.5) == ["d1:000"]  # the model's first, >= 0.15
    assert run({"d1:000": 0.12, "d2:000": 0.1, "d3:000": 0.05}, 0.5) == []  # retried at 0.35: still nothing
    assert run({"d1:000": 0.14, "d2:000": 0.1, "d3:000": 0.05}, 0.2) == []  # below the 0.15 floor: nothing


@pytest.mark.contract("C36", "C33")
def test_an_explicit_document_scope_keeps_its_best_candidate_from_v072(mini_index, mini_versions):
    engine = mini_engine(mini_index, mini_versions, "rerank")
    engine.rerank_scores = lambda query, idxs: np.full(len(idxs), 0.01)  # type: ignore[method-assign]
    s = replace(engine.tenant_settings(), rerank_threshold=0.2)
    assert engine.knowledge_search(QUERY, settings=s) == []
    scoped = engine.knowledge_search(QUERY, settings=s, knowledge_ids=["guide.03-vpn"])
    assert len(scoped) == 1 and mini_index.chunks[scoped[0].idx].knowledge_id == "guide.03-vpn"


@pytest.mark.contract("C35")
def test_a_candidate_whose_passage_cleans_to_nothing_is_not_reranked():
    chunks = [chunk(1, 0, long_text(1, 0)), chunk(2, 0, "![架构图](http://img.example/a.png)")]
    found = {"d1:000": 0.03, "d2:000": 0.02}
    engine = synthetic(chunks, found, {"d1:000": 0.9})
    assert ids(engine, engine.knowledge_search("q", settings=settings())) == ["d1:000"]
    assert sorted(ids(engine, engine.knowledge_search("q", settings=settings(rerank=False)))) == ["d1:000", "d2:000"]


@pytest.mark.contract("C40")
def test_mmr_prefers_a_different_passage_to_a_near_duplicate():
    a = long_text(1, 0)
    near = a.replace("w1x0y0 ", "v0 ").replace("w1x0y1 ", "v1 ").replace("w1x0y2 ", "v2 ")
    chunks = [chunk(1, 0, a), chunk(2, 0, near), chunk(3, 0, long_text(3, 0))]
    found = {"d1:000": 0.02, "d2:000": 0.02, "d3:000": 0.02}
    engine = synthetic(chunks, found, {"d1:000": 0.95, "d2:000": 0.94, "d3:000": 0.6})
    assert ids(engine, engine.knowledge_search("q", settings=settings(top_k=2))) == ["d1:000", "d3:000"]
    assert len(engine.knowledge_search("q", settings=settings(top_k=0))) == 1  # k = max(1, rerank_top_k)


@pytest.mark.contract("C41")
def test_consecutive_chunks_merge_under_the_first_id_with_the_best_score():
    chunks = [chunk(1, k, long_text(1, k)) for k in range(4)] + [chunk(2, 0, long_text(2, 0))]
    found = {"d1:002": 0.9, "d2:000": 0.6, "d1:001": 0.5, "d1:000": 0.3}
    engine = synthetic(chunks, found)
    hits = engine.knowledge_search("q", settings=settings(rerank=False))
    assert ids(engine, hits) == ["d1:000", "d2:000"]
    merged = hits[0]
    assert merged.score == 0.9 and merged.sub_chunk_ids == ["d1:001", "d1:002"]
    assert merged.content == "\n\n".join(c.content for c in chunks[:3])


@pytest.mark.contract("C41")
def test_short_results_are_widened_with_neighbours_to_350_characters_at_most_850():
    tiny = [chunk(1, k, f"{k:02d}" + "短" * 58) for k in range(10)]
    engine = synthetic(tiny, {"d1:005": 0.5})
    hit = engine.knowledge_search("q", settings=settings(rerank=False))[0]
    assert ids(engine, [hit]) == ["d1:005"]
    assert hit.sub_chunk_ids == ["d1:002", "d1:003", "d1:004", "d1:006", "d1:007"]
    assert hit.content == "\n\n".join(c.content for c in tiny[2:8]) and len(hit.content) == 370
    wide = [chunk(2, 0, "长" * 800), chunk(2, 1, "短" * 100), chunk(2, 2, "尾" * 300)]
    engine = synthetic(wide, {"d2:001": 0.5})
    hit = engine.knowledge_search("q", settings=settings(rerank=False))[0]
    assert len(hit.content) == 850 and hit.content.startswith("长" * 800) and hit.sub_chunk_ids == ["d2:000",
                                                                                                      "d2:002"]


@pytest.mark.contract("C41", "C42")
def test_duplicates_and_contained_results_are_dropped_unless_they_score_higher():
    base = long_text(1, 0)
    chunks = [chunk(1, 0, base), chunk(2, 0, base + "\n" + " ".join(words(2, 0, 20))), chunk(3, 0, base),
              chunk(4, 0, " ".join(reversed(base.split())))]
    engine = synthetic(chunks, {"d2:000": 0.8, "d1:000": 0.5, "d3:000": 0.4})
    assert ids(engine, engine.knowledge_search("q", settings=settings(rerank=False))) == ["d2:000"]
    engine = synthetic(chunks, {"d1:000": 0.9, "d2:000": 0.8})
    assert ids(engine, engine.knowledge_search("q", settings=settings(rerank=False))) == ["d1:000"]
    engine = synthetic(chunks, {"d2:000": 0.8, "d4:000": 0.5})  # not a substring, but every token is shared
    assert ids(engine, engine.knowledge_search("q", settings=settings(rerank=False))) == ["d2:000"]


@pytest.mark.contract("C43")
def test_filter_top_k_sorts_from_v072_and_keeps_document_groups_before():
    chunks = [chunk(1, 5, long_text(1, 5)), chunk(2, 5, long_text(2, 5)), chunk(1, 8, long_text(1, 8)),
              chunk(3, 1, long_text(3, 1)), chunk(3, 0, long_text(3, 0))]
    found = {"d1:005": 0.9, "d2:005": 0.8, "d1:008": 0.7}
    for release, expected in (("v0.7.2", ["d1:005", "d2:005", "d1:008"]), ("main", ["d1:005", "d2:005", "d1:008"]),
                              ("v0.6.3", ["d1:005", "d1:008", "d2:005"]), ("v0.6.2", ["d1:005", "d1:008", "d2:005"])):
        engine = synthetic(chunks, found, release=release)
        assert ids(engine, engine.knowledge_search("q", settings=settings(rerank=False))) == expected
        assert ids(engine, engine.knowledge_search("q", settings=settings(rerank=False, top_k=2))) == expected[:2]
    ties = synthetic(chunks, {"d3:001": 0.5, "d2:005": 0.5, "d1:008": 0.5})
    assert ids(ties, ties.knowledge_search("q", settings=settings(rerank=False))) == ["d1:008", "d2:005", "d3:001"]


@pytest.mark.contract("C32", "C33")
def test_documents_named_on_their_own_are_searched_without_thresholds_from_v072(mini_index, mini_versions):
    strict = dict(keyword_enabled=False, tenant_saved=True, tenant_vector_threshold=0.999)
    engine = mini_engine(mini_index, mini_versions, **strict)
    s = engine.tenant_settings()
    assert engine.knowledge_search(QUERY, settings=s) == []
    scoped = engine.knowledge_search(QUERY, settings=s, knowledge_ids=["guide.03-vpn"])
    assert scoped and {mini_index.chunks[h.idx].knowledge_id for h in scoped} == {"guide.03-vpn"}
    whole = engine.knowledge_search(QUERY, settings=s, kb_types=("document",), knowledge_ids=["guide.03-vpn"])
    assert whole == []  # a knowledge id of a knowledge base searched whole is ignored (C32)


@pytest.mark.contract("C23", "C33")
def test_v06_loads_small_documents_directly(mini_index, mini_versions):
    engine = mini_engine(mini_index, mini_versions, release="v0.6.2")
    hits = engine.knowledge_search("完全无关的问题", settings=engine.tenant_settings(), knowledge_ids=["guide.03-vpn"])
    assert [(mini_index.chunks[h.idx].id, h.score, h.match_type, h.sub_chunk_ids) for h in hits] == [
        ("guide.03-vpn:000", 1.0, 8, ["guide.03-vpn:001"])]


@pytest.mark.contract("C66")
def test_chat_runs_the_conversation_settings_without_rerank():
    config_yaml = PipelineSettings(embedding_top_k=30, vector_threshold=0.2, keyword_threshold=0.3, rerank_top_k=30,
                                   rerank_threshold=0.3, rrf_k=60, rrf_vector_weight=0.7, rrf_keyword_weight=0.3,
                                   rerank=False, query_expansion=True)
    assert config_yaml == CONVERSATION_SETTINGS


# ---------------------------------------------------------------------------------------
# FAQ knowledge bases (C45-C47)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def faq_engine(tmp_path_factory, cache_dir):
    data = tmp_path_factory.mktemp("faq-data")
    (data / "docs").symlink_to(MINI / "docs", target_is_directory=True)
    (data / "faq").mkdir()
    shutil.copy(FAQ_SMALL, data / "faq" / "faq.jsonl")
    index = SandboxIndex(corpus_chunks(data), cache_dir=cache_dir, seed_dir=MINI / "cache")  # seeds faq_small too
    return RetrievalEngine(index, VersionConfig(name="faq", faq_enabled=True))


@pytest.mark.contract("C45", "C47")
def test_faq_chunks_hold_the_entry_as_weknora_builds_it(faq_engine):
    index = faq_engine.index
    faq = [index.chunks[i] for i in index.positions("faq")]
    assert [c.id for c in faq] == [f"faq-00{n}" for n in range(1, 7)] and faq_engine.serves_faq
    assert {c.knowledge_id for c in faq} == {"faq.accounts", "faq.gateway", "faq.vpn"}
    assert all(c.chunk_type == "faq" and c.chunk_index == 0 for c in faq)
    second = faq[1]
    question, similar = "账号被锁定了多久能解锁？", ["密码输错五次被锁了", "DG-1010 是什么意思"]
    answers = ["连续输错 5 次锁定 15 分钟，期满自动解锁；", "也可以请超级管理员执行 `dgctl user unlock`。"]
    assert second.content == (f"Q: {question}\nSimilar Questions:\n- {similar[0]}\n- {similar[1]}\n"
                              f"Answers:\n- {answers[0]}\n- {answers[1]}\n")
    assert index_text(second) == "\n".join([question, *similar, *answers])
    assert len(index.positions("document")) == 8


@pytest.mark.contract("C45", "C46", "C47")
def test_faq_search_defaults_caps_and_vector_path_only(faq_engine, monkeypatch):
    hits = faq_engine.faq_search("账号被锁定了多久能解锁？")
    assert ids(faq_engine, hits)[0] == "faq-002"
    assert all(h.match_type == 0 and h.score >= 0.7 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    loose = faq_engine.faq_search("账号被锁定了多久能解锁？", vector_threshold=0.05, match_count=3)
    assert len(loose) == 3 and {faq_engine.index.chunks[h.idx].chunk_type for h in loose} == {"faq"}
    asked = []
    real = faq_engine.hybrid_search
    monkeypatch.setattr(faq_engine, "hybrid_search", lambda q, **kw: asked.append(kw) or real(q, **kw))
    for count, threshold in ((0, 0.0), (80, -1.0), (300, 0.5), (5, 0.2)):
        faq_engine.faq_search("x", match_count=count, vector_threshold=threshold)
    assert [(kw["match_count"], kw["vector_threshold"], kw["disable_keyword"]) for kw in asked] == [
        (10, 0.7, True), (50, 0.7, True), (50, 0.5, True), (5, 0.2, True)]


@pytest.mark.contract("C20", "C47")
def test_hybrid_search_of_an_faq_knowledge_base_has_no_keyword_path(faq_engine):
    hits = faq_engine.hybrid_search("DG-1010", match_count=10, kb_types=("faq",))
    assert hits and {h.match_type for h in hits} == {0}
    assert {faq_engine.index.chunks[h.idx].chunk_type for h in hits} == {"faq"}
    by_groups = faq_engine.hybrid_search("DG-1010", match_count=10, knowledge_ids=["faq.accounts"])
    assert by_groups and {faq_engine.index.chunks[h.idx].knowledge_id for h in by_groups} == {"faq.accounts"}
    docs = faq_engine.hybrid_search("DG-1010", match_count=50)
    assert docs and {faq_engine.index.chunks[h.idx].chunk_type for h in docs} == {"text"}


@pytest.mark.contract("C46")
def test_an_faq_entry_whose_negative_question_is_the_query_is_left_out(faq_engine):
    hits = faq_engine.faq_search("VPN 账号被锁定怎么办？", vector_threshold=0.01, match_count=50)
    assert len(hits) == 5 and "faq-002" not in ids(faq_engine, hits)
    other = faq_engine.faq_search("VPN 账号被锁定了怎么办？", vector_threshold=0.01, match_count=50)
    assert len(other) == 6 and "faq-002" in ids(faq_engine, other)  # only the exact question is negative


@pytest.mark.contract("C41")
def test_knowledge_search_of_faq_entries_returns_question_and_answers(faq_engine):
    hits = faq_engine.knowledge_search("账号被锁定了多久能解锁？", settings=faq_engine.tenant_settings(),
                                       kb_types=("faq",))
    assert hits and ids(faq_engine, hits)[0] == "faq-002"
    assert hits[0].content == ("Q: 账号被锁定了多久能解锁？\nAnswer:\n- 连续输错 5 次锁定 15 分钟，期满自动解锁；\n"
                               "- 也可以请超级管理员执行 `dgctl user unlock`。")
    assert all(faq_engine.index.chunks[h.idx].chunk_type == "faq" for h in hits)


@pytest.mark.contract("C47", "C21")
def test_separate_question_indexing_keeps_each_entrys_best_question(faq_engine):
    ui = RetrievalEngine(faq_engine.index, VersionConfig(name="ui", faq_enabled=True, faq_index_mode="question_only",
                                                         faq_question_index_mode="separate"))
    rows = ui.index.rows(ui.version.faq_role)
    assert len(rows) == 6 + 9  # every standard and similar question is an index row
    assert ui.index.texts(ui.version.faq_role)[:3] == ["忘记管理员密码怎么重置？", "管理员密码忘了咋办",
                                                       "admin password forgotten"]
    hits = ui.faq_search("密码输错五次被锁了", vector_threshold=0.01, match_count=50)
    assert ids(ui, hits)[0] == "faq-002" and hits[0].score == pytest.approx(1.0, abs=1e-3)
    assert len(ids(ui, hits)) == len(set(ids(ui, hits))) == 6
    combined = faq_engine.faq_search("密码输错五次被锁了", vector_threshold=0.01, match_count=50)
    assert combined[0].score < hits[0].score - 0.1  # one entry holding every question and the answers


def test_an_unknown_faq_mode_is_a_config_error(tmp_path):
    from weknora_nb.core.errors import ConfigError

    p = tmp_path / "versions.yaml"
    p.write_text("versions:\n  a:\n    faq: {enabled: true, index_mode: answers_only}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="faq.index_mode 'answers_only' is not one of question_answer, question_only"):
        load_versions(p)
    p.write_text("versions:\n  a:\n    tenant: {rerank_model_id: bge-reranker}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="names no registered rerank model"):
        load_versions(p)
