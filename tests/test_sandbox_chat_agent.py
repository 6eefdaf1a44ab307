"""The sandbox's knowledge-chat as WeKnora's web UI runs it (docs/weknora-contract.md C113-C117): the built-in
quick-answer agent's settings, the intent that skips retrieval, query expansion, the progress events, and the
references as the Redis stream manager rebuilds them.

Over real HTTP against sandboxes of the mini corpus (tests/fixtures/mini_kb); the pipeline's query expansion also on
an engine whose search is replaced by fixed answers.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from weknora_nb.collect.http.transport import default_tls
from weknora_nb.core.errors import ConfigError, UsageError
from weknora_nb.sandbox import SandboxServer, load_demo_versions
from weknora_nb.sandbox.agent import BUILTIN_AGENTS, QUICK_ANSWER, chat_settings, classify_intent, needs_retrieval
from weknora_nb.sandbox.chat import redis_round_trip
from weknora_nb.sandbox.chunking import Chunk
from weknora_nb.sandbox.emulation import RELEASES
from weknora_nb.sandbox.engine import RetrievalEngine
from weknora_nb.sandbox.expansion import expand_queries
from weknora_nb.sandbox.index import SandboxIndex
from weknora_nb.sandbox.pipeline import CONVERSATION_SETTINGS, Hit, knowledge_search
from weknora_nb.sandbox.runner import demo_dir
from weknora_nb.sandbox.versions import VersionConfig, load_versions

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
KEY = "sk-test-chat-agent-0123"
QUERY = "忘记管理员密码怎么办"


@pytest.fixture(scope="module")
def serve(embedding_cache):
    """``serve(version, release="v0.7.2", **options)``: a running mini sandbox (one per arguments, for the module)."""
    versions = load_versions(MINI / "versions.yaml")
    running: dict[tuple, SandboxServer] = {}
    with ExitStack() as stack:
        def get(version: str, release: str = "v0.7.2", **options: str) -> SandboxServer:
            key = (version, release, tuple(sorted(options.items())))
            if key not in running:
                running[key] = stack.enter_context(SandboxServer(
                    versions[version], data_dir=MINI, cache_dir=embedding_cache, api_key=KEY,
                    weknora_version=release, **options))
            return running[key]
        yield get


def chat(server: SandboxServer, query: str, **body) -> list[dict]:
    with httpx.Client(base_url=server.base_url, headers={"X-API-Key": KEY}, timeout=60, verify=default_tls()) as c:
        sid = c.post("/api/v1/sessions", json={"title": "t"}).json()["data"]["id"]
        text = c.post(f"/api/v1/knowledge-chat/{sid}",
                      json={"query": query, "knowledge_base_ids": [server.kb_id], **body}).text
        history = c.get(f"/api/v1/messages/{sid}/load").json()["data"]
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    return events + [{"response_type": "_history", "messages": history}]


def references(events: list[dict]) -> list[dict] | None:
    got = [e["knowledge_references"] for e in events if e["response_type"] == "references"]
    return got[0] if got else None


# ---------------------------------------------------------------------------------------
# the agent (C113)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C113", "C66")
def test_the_quick_answer_agents_settings_replace_config_yamls():
    assert chat_settings("", rerank_model=True) == (CONVERSATION_SETTINGS, None)   # no agent: no rerank (C66)
    assert chat_settings("no-such-agent", rerank_model=True) == (CONVERSATION_SETTINGS, None)
    settings, agent = chat_settings(QUICK_ANSWER, rerank_model=False)
    assert agent is BUILTIN_AGENTS[QUICK_ANSWER]
    got = (settings.embedding_top_k, settings.vector_threshold, settings.keyword_threshold, settings.rerank_top_k,
           settings.rerank_threshold, settings.rerank, settings.query_expansion)
    assert got == (10, 0.5, 0.3, 10, 0.3, False, True)
    assert settings.rrf == CONVERSATION_SETTINGS.rrf
    assert chat_settings(QUICK_ANSWER, rerank_model=True)[0].rerank   # the agent reranks with the version's model


@pytest.mark.contract("C113", "C66", "C39")
def test_a_chat_with_the_ui_agent_reranks_and_keeps_its_top_10(serve):
    rerank = serve("rerank")
    plain = references(chat(rerank, QUERY))
    agent = references(chat(rerank, QUERY, agent_id=QUICK_ANSWER))
    assert plain and agent and len(agent) <= 10
    assert all("model_score" not in r["metadata"] for r in plain)        # no agent: no rerank model, no rerank
    assert all("model_score" in r["metadata"] for r in agent)            # the agent's: the version's model
    unknown = references(chat(rerank, QUERY, agent_id="no-such-agent"))
    assert [r["id"] for r in unknown or []] == [r["id"] for r in plain]  # an unknown agent: as none
    baseline = references(chat(serve("baseline"), QUERY, agent_id=QUICK_ANSWER))
    assert baseline and all("model_score" not in r["metadata"] for r in baseline)   # no model registered


# ---------------------------------------------------------------------------------------
# the intent (C114)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C114")
@pytest.mark.parametrize(("query", "intent"), [
    ("你好", "greeting"), ("您好！", "greeting"), (" Hello ", "greeting"), ("早上好~", "greeting"),
    ("你是谁", "chitchat"), ("谢谢！", "chitchat"), ("Thank you.", "chitchat"), ("再见", "chitchat"),
    ("你好，忘记管理员密码怎么办", "kb_search"), ("VPN 连接失败 ZL-201", "kb_search"),
    ("谁能审批权限申请", "kb_search")])
def test_the_rule_based_intent(query, intent):
    assert classify_intent(query) == intent and needs_retrieval(intent) is (intent == "kb_search")


@pytest.mark.contract("C114")
def test_no_demo_test_query_is_taken_for_small_talk():
    for path in (demo_dir() / "testset.jsonl", demo_dir() / "faq" / "testset.jsonl"):
        queries = [json.loads(line)["query"] for line in path.read_text(encoding="utf-8").splitlines() if line]
        assert [q for q in queries if classify_intent(q) != "kb_search"] == []


@pytest.mark.contract("C114", "C116", "C64")
def test_a_greeting_gets_no_retrieval_and_no_references(serve):
    events = chat(serve("rerank"), "你好", agent_id=QUICK_ANSWER)
    kinds = [e["response_type"] for e in events]
    assert kinds[:3] == ["agent_query", "tool_call", "tool_result"] and "references" not in kinds
    assert [e["data"]["tool_name"] for e in events if e["response_type"] == "tool_call"] == ["query_understand"]
    answer = "".join(e["content"] for e in events if e["response_type"] == "answer")
    assert "未检索知识库" in answer and "<kb " not in answer
    assert events[-1]["messages"][-1]["knowledge_references"] == []


# ---------------------------------------------------------------------------------------
# query expansion (C115)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C115")
def test_query_variants_as_weknora_makes_them():
    # keywords (Han runs cut by jieba, letter and digit runs whole; stopwords and one-character words out), pieces
    # between delimiters longer than 5 bytes, the query without its question word; never the query itself
    assert expand_queries("如何配置 rate-limit, 以及熔断") == [
        "如何 配置 rate limit 以及 熔断", "如何配置", "rate-limit", "以及熔断", "配置 rate-limit, 以及熔断"]
    # quoted text; a piece that is the whole query is no variant
    assert expand_queries('请问"灰度发布"怎么回滚') == ["请问 灰度 发布 怎么 回滚", "灰度发布", '"灰度发布"怎么回滚']
    assert expand_queries("ok") == [] and expand_queries("   ") == []
    # at most five: "eeeee" is 5 bytes (too short), the question-word variant would be the sixth
    assert expand_queries("什么是 a, bb, ccc, dddd, eeeee, ffffff, ggggggg, hhhhhhhh") == [
        "什么 bb ccc dddd eeeee ffffff ggggggg hhhhhhhh", "什么是", "ffffff", "ggggggg", "hhhhhhhh"]


def _few(chunks: list[Chunk], answers: dict[str, list[str]]) -> RetrievalEngine:
    """An engine whose search answers each query with the chunks ``answers`` names (none for others)."""
    engine = RetrievalEngine(SandboxIndex(chunks), VersionConfig(name="few"), release=RELEASES["v0.7.2"])
    asked: list[tuple[str, int]] = []

    def search(query, **kw):
        asked.append((query, kw["match_count"]))
        return [Hit(engine.index.by_id[c], 1.0 / (k + 1), 0) for k, c in enumerate(answers.get(query, []))]
    engine.primary_search = search  # type: ignore[method-assign]
    engine.asked = asked  # type: ignore[attr-defined]
    return engine


@pytest.mark.contract("C115")
def test_a_chat_that_finds_too_little_searches_the_variants_too():
    chunks = [Chunk(id=f"d:{k:03d}", knowledge_id="d", knowledge_title="文档", chunk_index=k * 2,
                    content=f"第{k}块 " + " ".join(f"w{k}x{j}" for j in range(90)), heading_path=(), start_at=0,
                    end_at=10) for k in range(4)]
    query = "如何配置限流"
    variants = expand_queries(query)
    assert variants == ["如何 配置 限流", "配置限流"]
    engine = _few(chunks, {query: ["d:000"], variants[0]: ["d:001", "d:000"], variants[1]: ["d:002"]})
    hits = knowledge_search(engine, query, settings=CONVERSATION_SETTINGS)
    assert {engine.index.chunks[h.idx].id for h in hits} == {"d:000", "d:001", "d:002"}
    assert engine.asked == [(query, 30), (variants[0], 60), (variants[1], 60)]   # max(2 x 30, 2 x 30) each
    # knowledge-search never expands; neither does a chat that found embedding_top_k results
    engine = _few(chunks, {query: ["d:000"]})
    knowledge_search(engine, query, settings=replace(CONVERSATION_SETTINGS, query_expansion=False))
    assert engine.asked == [(query, 30)]
    engine = _few(chunks, {query: ["d:000"]})
    knowledge_search(engine, query, settings=replace(CONVERSATION_SETTINGS, embedding_top_k=1))
    assert engine.asked == [(query, 1)]


@pytest.mark.slow
@pytest.mark.contract("C115")
def test_the_demo_seed_holds_every_query_variant_a_demo_chat_searches():
    from weknora_nb.sandbox import build_index
    from weknora_nb.sandbox.agent import chat_variants
    from weknora_nb.sandbox.embedders import UseEmbedder

    queries = [json.loads(line)["query"] for line in (demo_dir() / "testset.jsonl").read_text(
        encoding="utf-8").splitlines() if line]
    versions = [v for v in load_demo_versions().values() if not v.faq_enabled]
    variants = chat_variants(queries, versions, lambda v: build_index(parent_child=v.parent_child))
    assert variants   # a few demo queries find too little for the chat
    with np.load(demo_dir() / "cache" / f"queries-{UseEmbedder.name}.npz") as seed:
        keys = set(seed["keys"].tolist())
    missing = [v for v in variants if UseEmbedder.key(v) not in keys]
    assert not missing, f"run weknora-nb sandbox build --write-seed: {missing[:3]}"


# ---------------------------------------------------------------------------------------
# progress events (C116)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C116", "C63")
def test_a_chat_shows_its_query_understanding_and_its_retrieval_as_tool_calls(serve):
    events = chat(serve("baseline"), QUERY)
    kinds = [e["response_type"] for e in events]
    assert kinds[:6] == ["agent_query", "tool_call", "tool_result", "tool_call", "tool_result", "references"]
    understand_call, understand, search_call, search = events[1:5]
    assert understand_call["content"] == "Calling tool: query_understand" and understand_call["done"] is False
    assert understand_call["data"] == {"arguments": {"query": QUERY}, "tool_name": "query_understand",
                                       "tool_call_id": understand["data"]["tool_call_id"]}
    assert understand["data"]["output"] == "已完成问题理解" and understand["data"]["success"] is True
    assert search_call["data"]["arguments"] == {"query": QUERY, "search_source": "knowledge"}
    n = len(events[5]["knowledge_references"])
    assert search["data"]["count"] == search["data"]["doc_count"] == n and search["data"]["web_count"] == 0
    assert search["data"]["output"] == f"检索到 {n} 条相关内容" and list(search["data"]) == sorted(search["data"])
    assert search["content"] == "" and search["data"]["tool_call_id"] == search_call["data"]["tool_call_id"]
    # v0.6.2 has no progress events; its references follow the answer's first piece (C64)
    old = [e["response_type"] for e in chat(serve("baseline", "v0.6.2"), QUERY)]
    assert "tool_call" not in old and old[:3] == ["agent_query", "answer", "references"]


# ---------------------------------------------------------------------------------------
# the stream manager (C117)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C117", "C22", "C41")
def test_references_through_the_redis_stream_manager_lose_what_its_rebuild_drops(serve):
    memory = chat(serve("rerank"), QUERY, agent_id=QUICK_ANSWER)
    redis = chat(serve("rerank", stream_manager="redis"), QUERY, agent_id=QUICK_ANSWER)
    full, rebuilt = references(memory), references(redis)
    assert full and rebuilt and [r["id"] for r in full] == [r["id"] for r in rebuilt]
    assert any(r["sub_chunk_id"] for r in full) and any(r["metadata"] for r in full)
    assert all("matched_content" in r and r["knowledge_channel"] == "web" for r in full)
    for before, after in zip(full, rebuilt, strict=True):
        assert after["match_type"] == 0 and after["sub_chunk_id"] is None and after["metadata"] is None
        assert "matched_content" not in after and after["knowledge_channel"] == ""
        kept = {k: v for k, v in before.items() if k not in ("match_type", "sub_chunk_id", "metadata",
                                                             "matched_content", "knowledge_channel")}
        assert {k: after[k] for k in kept} == kept and list(after) == [k for k in before if k != "matched_content"]
    # the message history keeps what the pipeline made: only the stream's event is rebuilt
    assert redis[-1]["messages"][-1]["knowledge_references"] == full


@pytest.mark.contract("C117")
def test_main_keeps_the_metadata_and_the_version_or_the_server_picks_the_manager(tmp_path):
    ref = {"id": "c", "content": "x", "knowledge_id": "k", "chunk_index": 3, "knowledge_title": "t", "start_at": 0,
           "end_at": 9, "seq": 3, "score": 0.5, "match_type": 1, "sub_chunk_id": ["c", "d"],
           "metadata": {"base_score": "0.4000", "n": 3}, "chunk_type": "text", "parent_chunk_id": "p",
           "image_info": "", "knowledge_filename": "k.md", "knowledge_source": "", "knowledge_channel": "web",
           "matched_content": "t\nx", "knowledge_base_id": "kb"}
    assert redis_round_trip(ref)["metadata"] is None
    assert redis_round_trip(ref, keep_metadata=True)["metadata"] == {"base_score": "0.4000"}
    assert RELEASES["main"].redis_keeps_metadata and not RELEASES["v0.7.2"].redis_keeps_metadata
    assert load_demo_versions()["baseline"].stream_manager == "memory"
    f = tmp_path / "versions.yaml"
    f.write_text("versions:\n  r:\n    server: {stream_manager: redis}\n  x:\n    server: {stream_manager: kafka}\n",
                 encoding="utf-8")
    with pytest.raises(ConfigError, match="server.stream_manager 'kafka' is not one of memory, redis"):
        load_versions(f)
    with pytest.raises(UsageError, match="stream_manager"):
        SandboxServer("baseline", data_dir=MINI, stream_manager="kafka")


# ---------------------------------------------------------------------------------------
# the agent's FAQ priority (C119)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C119", "C38", "C39")
def test_the_agent_boosts_reranked_faq_entries():
    from weknora_nb.sandbox.catalog import Catalog
    from weknora_nb.sandbox.chunking import FaqEntry

    doc = Chunk(id="d:000", knowledge_id="d", knowledge_title="文档", chunk_index=0,
                content="文档 " + " ".join(f"词x{j}" for j in range(90)), heading_path=(), start_at=0, end_at=10)
    faq = Chunk(id="faq-1", knowledge_id="faq.g", knowledge_title="g", chunk_index=0, content="Q: 问题",
                heading_path=(), start_at=0, end_at=0, chunk_type="faq",
                faq=FaqEntry("g", "问题", (), ("答案是这样的。",)))
    version = VersionConfig(name="boost", rerank_enabled=True, faq_enabled=True)
    engine = RetrievalEngine(SandboxIndex([doc, faq]), version, release=RELEASES["v0.7.2"])
    engine.primary_search = lambda query, **kw: [Hit(0, 0.5, 0), Hit(1, 0.5, 0)]  # type: ignore[method-assign]
    engine.rerank_scores = lambda query, idxs: np.array([0.6 for _ in idxs])  # type: ignore[method-assign]
    agent, _ = chat_settings(QUICK_ANSWER, rerank_model=True)
    assert agent.faq_score_boost == 1.2 and chat_settings("", rerank_model=True)[0].faq_score_boost == 1.0
    plain = knowledge_search(engine, "问题", settings=replace(agent, faq_score_boost=1.0), kb_types=("document", "faq"))
    boosted = knowledge_search(engine, "问题", settings=agent, kb_types=("document", "faq"))
    composite = 0.6 * 0.6 + 0.3 * 0.5 + 0.1   # C38
    assert {h.idx: h.score for h in plain} == pytest.approx({0: composite, 1: composite})
    assert {h.idx: h.score for h in boosted} == pytest.approx({0: composite, 1: composite * 1.2})
    assert [h.idx for h in boosted] == [1, 0] and boosted[0].faq_original_score == pytest.approx(composite)
    catalog = Catalog(engine, kb_id="kb", faq_kb_id="kb-faq", release=RELEASES["v0.7.2"])
    meta = catalog.result_json(boosted[0])["metadata"]
    assert meta == {"base_score": "0.5000", "faq_boosted": "true", "faq_original_score": f"{composite:.4f}",
                    "model_score": "0.6000"} and list(meta) == sorted(meta)
    assert "faq_boosted" not in catalog.result_json(boosted[1])["metadata"]
