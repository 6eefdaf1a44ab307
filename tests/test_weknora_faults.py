"""Behaviours and faults of WeKnora v0.7.2 a client must survive, as the sandbox emulates them (C120-C125).

Each is seen on a running WeKnora Lite v0.7.2 (recordings named in docs/weknora-contract.md) and read in its source;
here a :class:`SandboxServer` on loopback serves the mini corpus (tests/fixtures/mini_kb) with the small FAQ
knowledge base and an empty knowledge base indexed with another embedding model, and a client talks to it over HTTP.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest

from weknora_nb.collect.http.transport import default_tls
from weknora_nb.sandbox import SandboxServer
from weknora_nb.sandbox.embedding_groups import MIXED_MODELS
from weknora_nb.sandbox.embeddings_api import EMBEDDING_FAILURE

FIXTURES = Path(__file__).parent / "fixtures"
MINI = FIXTURES / "mini_kb"
KEY = "sk-test-weknora-faults-0123"
QUERY = "忘记管理员密码怎么办"
OTHER = "kb-e5"  # an empty document knowledge base indexed with multilingual-e5-small (C122)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The mini corpus with ``faq_small.jsonl`` as its FAQ knowledge base, its embedding seed, version ``faq``."""
    root = tmp_path_factory.mktemp("faults-data")
    (root / "docs").symlink_to(MINI / "docs", target_is_directory=True)
    (root / "cache").symlink_to(MINI / "cache", target_is_directory=True)
    (root / "faq").mkdir()
    shutil.copy(FIXTURES / "faq_small.jsonl", root / "faq" / "faq.jsonl")
    text = (MINI / "versions.yaml").read_text(encoding="utf-8")
    (root / "versions.yaml").write_text(text + "  faq:\n    description: mini with FAQ\n    faq: {enabled: true}\n",
                                        encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def sb(data, embedding_cache):
    with SandboxServer("faq", data_dir=data, cache_dir=embedding_cache, api_key=KEY, allow_fault_control=True,
                       other_model_kbs={OTHER: "multilingual-e5-small-q4"}) as server:
        yield server


@pytest.fixture(scope="module")
def sb062(data, embedding_cache):
    with SandboxServer("faq", data_dir=data, cache_dir=embedding_cache, api_key=KEY, allow_fault_control=True,
                       weknora_version="v0.6.2") as server:
        yield server


@pytest.fixture
def c(sb):
    sb.set_faults()
    with httpx.Client(base_url=sb.base_url, headers={"X-API-Key": KEY}, timeout=30, verify=default_tls()) as client:
        yield client
    sb.set_faults()


def hybrid(c: httpx.Client, kb: str = "kb-demo", **body) -> httpx.Response:
    return c.post(f"/api/v1/knowledge-bases/{kb}/hybrid-search", json={"query_text": QUERY, **body})


def search(c: httpx.Client, *kbs: str, query: str = QUERY) -> httpx.Response:
    return c.post("/api/v1/knowledge-search", json={"query": query, "knowledge_base_ids": list(kbs)})


def error_of(r: httpx.Response, status: int, code: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False and body["error"]["code"] == code
    return body["error"]["message"]


# ---------------------------------------------------------------------------------------
# C120: faq/search without a vector threshold searches at 0.7
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C120", "C45")
def test_faq_search_with_match_count_only_applies_threshold_07(c):
    def entries(**body) -> list[dict]:
        r = c.post("/api/v1/knowledge-bases/kb-faq/faq/search",
                   json={"query_text": "账号被锁定了多久能解锁？", "match_count": 50, **body})
        assert r.status_code == 200, r.text
        return r.json()["data"]
    only_count, strict, loose = entries(), entries(vector_threshold=0.7), entries(vector_threshold=0.01)
    assert only_count == strict and only_count and all(e["score"] >= 0.7 for e in only_count)
    assert len(loose) == 6 > len(only_count)  # every entry passes 0.01: the 0.7 default is what hides them


# ---------------------------------------------------------------------------------------
# C121: the query's embedding fails (the embedding model answers 429)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C121")
def test_hybrid_search_fails_with_the_embedding_unless_the_vector_path_is_off(c, sb):
    sb.set_faults(embedding_error_rate=1.0)
    message = error_of(hybrid(c, match_count=10), 500, 1007)
    assert message == EMBEDDING_FAILURE
    assert message.startswith("EmbedBatch API error: Http Status 429 Too Many Requests, Response: {")
    keyword = hybrid(c, match_count=10, disable_vector_match=True, skip_context_enrichment=True)
    assert keyword.status_code == 200 and keyword.json()["data"]
    assert {h["match_type"] for h in keyword.json()["data"]} == {1}
    embedded = c.post("/v1/embeddings", json={"model": "use-multilingual-v3", "input": ["x"]},
                      headers={"Authorization": f"Bearer {KEY}"})
    assert embedded.status_code == 429 and embedded.json()["error"]["code"] == "rate_limit_exceeded"
    assert EMBEDDING_FAILURE.endswith(embedded.text)  # WeKnora quotes the provider's body


@pytest.mark.contract("C121")
def test_knowledge_search_and_chat_fall_back_to_keyword_hits(c, sb):
    whole = search(c, "kb-demo").json()["data"]
    assert 0 in {r["match_type"] for r in whole}  # both paths, normally
    sb.set_faults(embedding_error_rate=1.0)
    degraded = search(c, "kb-demo")
    assert degraded.status_code == 200 and degraded.json()["data"]
    assert {r["match_type"] for r in degraded.json()["data"]} == {1}  # keyword hits only, and 200
    sid = c.post("/api/v1/sessions", json={}).json()["data"]["id"]
    stream = c.post(f"/api/v1/knowledge-chat/{sid}", json={"query": QUERY, "knowledge_base_ids": ["kb-demo"]})
    refs = [e for e in sse(stream.text) if e["response_type"] == "references"][0]["knowledge_references"]
    assert refs and {r["match_type"] for r in refs} == {1}


@pytest.mark.contract("C121", "C34")
def test_an_faq_knowledge_base_has_no_keyword_fallback(c, sb):
    sb.set_faults(embedding_error_rate=1.0)
    message = error_of(search(c, "kb-faq"), 500, 1007)
    assert message == f"knowledge base kb-faq has no keyword fallback: {EMBEDDING_FAILURE}"
    both = search(c, "kb-demo", "kb-faq")
    assert both.status_code == 200 and both.json()["data"]  # the document KB's keyword hits
    assert {r["chunk_type"] for r in both.json()["data"]} == {"text"}
    assert error_of(c.post("/api/v1/knowledge-bases/kb-faq/faq/search", json={"query_text": QUERY}), 500,
                    1007) == "Internal server error"


@pytest.mark.contract("C121", "C34")
def test_before_v072_knowledge_search_has_no_fallback_and_answers_nothing(sb062):
    sb062.set_faults(embedding_error_rate=1.0)
    with httpx.Client(base_url=sb062.base_url, headers={"X-API-Key": KEY}, timeout=30) as c:
        r = search(c, "kb-demo")
    sb062.set_faults()
    assert r.status_code == 200 and r.json()["data"] == []  # the failure looks like an empty answer


# ---------------------------------------------------------------------------------------
# C122: one hybrid-search over knowledge bases with different embedding models
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C122", "C49")
def test_mixed_embedding_models_are_refused_in_one_hybrid_search(c):
    kbs = {kb["id"]: kb["embedding_model_id"] for kb in c.get("/api/v1/knowledge-bases").json()["data"]}
    assert kbs == {"kb-demo": "use-multilingual-v3", "kb-faq": "use-multilingual-v3",
                   OTHER: "multilingual-e5-small-q4"}
    assert error_of(hybrid(c, knowledge_base_ids=["kb-demo", OTHER], match_count=10), 400, 1000) == MIXED_MODELS
    assert error_of(hybrid(c, knowledge_base_ids=["kb-demo", OTHER], disable_vector_match=True), 400,
                    1000) == MIXED_MODELS  # before the paths: keyword-only is refused too
    same = hybrid(c, knowledge_base_ids=["kb-demo", "kb-faq"], match_count=10)
    assert same.status_code == 200 and same.json()["data"]
    alone = hybrid(c, OTHER, match_count=10)
    assert alone.status_code == 200 and alone.json()["data"] is None  # it holds nothing
    both = search(c, "kb-demo", OTHER)  # knowledge-search: one search per model, no error
    assert both.status_code == 200 and both.json()["data"] == search(c, "kb-demo").json()["data"]


# ---------------------------------------------------------------------------------------
# C123: index_status
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C123", "C55", "C92")
def test_chunks_being_indexed_are_listed_but_dropped_after_the_cut(c, sb):
    before = [h["id"] for h in hybrid(c, match_count=3, skip_context_enrichment=True).json()["data"]]
    victim = before[1]
    r = c.put("/_sandbox/index-status", json={victim: "processing"})
    assert r.status_code == 200 and r.json()["data"] == {victim: "processing"}
    try:
        after = [h["id"] for h in hybrid(c, match_count=3, skip_context_enrichment=True).json()["data"]]
        assert after == [before[0], before[2]]  # not refilled: the filter runs after the cut to match_count
        assert victim not in [h["id"] for h in search(c, "kb-demo").json()["data"]]
        listed = c.get(f"/api/v1/chunks/{victim.split(':')[0]}", params={"page_size": 100}).json()["data"]
        assert {row["id"]: row["index_status"] for row in listed}[victim] == "processing"
        c.put("/_sandbox/index-status", json={victim: "failed"})
        assert victim not in [h["id"] for h in hybrid(c, match_count=10).json()["data"]]
    finally:
        c.put("/_sandbox/index-status", json={victim: "ready"})
    assert [h["id"] for h in hybrid(c, match_count=3, skip_context_enrichment=True).json()["data"]] == before
    bad = c.put("/_sandbox/index-status", json={victim: "stale"})
    assert "index_status must be one of ready, processing, failed" in error_of(bad, 400, 1000)


@pytest.mark.contract("C123", "C55")
def test_before_v072_chunks_have_no_index_status(sb062):
    victim = "guide.01-passwords:000"
    sb062.set_index_status(**{victim: "processing"})
    try:
        with httpx.Client(base_url=sb062.base_url, headers={"X-API-Key": KEY}, timeout=30) as c:
            hits = c.request("GET", "/api/v1/knowledge-bases/kb-demo/hybrid-search",  # GET only at v0.6.2 (C15)
                             json={"query_text": QUERY, "match_count": 10}).json()["data"]
            listed = c.get("/api/v1/chunks/guide.01-passwords").json()["data"]
    finally:
        sb062.set_index_status(**{victim: "ready"})
    assert victim in [h["id"] for h in hits] and "index_status" not in listed[0]


# ---------------------------------------------------------------------------------------
# C124: chunk listings ordered by chunk_index only
# ---------------------------------------------------------------------------------------
def pages(c: httpx.Client, kid: str, size: int) -> list[str]:
    """Every page of a knowledge's FAQ chunk listing, concatenated."""
    out: list[str] = []
    for page in range(1, 20):
        rows = c.get(f"/api/v1/chunks/{kid}", params={"chunk_type": "faq", "page": page,
                                                       "page_size": size}).json()["data"]
        if not rows:
            return out
        out += [r["id"] for r in rows]
    return out


@pytest.mark.contract("C124", "C47", "C52")
def test_ties_of_chunk_index_may_come_in_another_order_on_every_page(c, sb):
    stable = pages(c, "faq.accounts", 1)
    assert stable == ["faq-001", "faq-002", "faq-003"] == pages(c, "faq.accounts", 1)  # all chunk_index 0
    sb.set_faults(unstable_tie_order_rate=1.0, seed=3)
    walks = [pages(c, "faq.accounts", 1) for _ in range(12)]
    assert all(len(w) == 3 for w in walks)
    assert any(len(set(w)) < 3 for w in walks)  # an entry twice, another never: what OFFSET paging meets
    assert any(w != stable and len(set(w)) == 3 for w in walks)
    text = c.get("/api/v1/chunks/guide.01-passwords", params={"page_size": 100}).json()["data"]
    assert [r["chunk_index"] for r in text] == sorted(r["chunk_index"] for r in text)  # no ties: unchanged


# ---------------------------------------------------------------------------------------
# C125: SSE error events
# ---------------------------------------------------------------------------------------
def sse(text: str) -> list[dict]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


@pytest.mark.contract("C125", "C63")
def test_a_tool_error_is_not_the_end_of_the_answer(c, sb):
    sid = c.post("/api/v1/sessions", json={}).json()["data"]["id"]
    sb.set_faults(sse_tool_error_rate=1.0)
    events = sse(c.post(f"/api/v1/knowledge-chat/{sid}", json={"query": QUERY, "knowledge_base_ids": ["kb-demo"],
                                                               "disable_title": True}).text)
    kinds = [(e["response_type"], e["done"]) for e in events]
    assert kinds[:2] == [("agent_query", True), ("error", False)] and kinds[-1] == ("complete", True)
    assert ("references", False) in kinds and ("answer", True) in kinds
    tool = events[1]
    assert tool["data"]["tool_name"] == "knowledge_search" and tool["data"]["success"] is False
    assert {e["id"] for e in events} == {events[0]["id"]}


@pytest.mark.contract("C125", "C63")
def test_a_terminal_error_leaves_the_stream_open(c, sb):
    sid = c.post("/api/v1/sessions", json={}).json()["data"]["id"]
    sb.set_faults(sse_terminal_error_rate=1.0, hang_s=2.0)
    body = {"query": QUERY, "knowledge_base_ids": ["kb-demo"], "disable_title": True}
    got = b""
    t0 = time.perf_counter()
    with c.stream("POST", f"/api/v1/knowledge-chat/{sid}", json=body,
                  timeout=httpx.Timeout(30, read=1.0)) as r, pytest.raises(httpx.ReadTimeout):
        for part in r.iter_bytes():
            got += part
    assert time.perf_counter() - t0 < 2.0  # the client gave up waiting: the server had not ended the stream
    events = sse(got.decode())
    kinds = [e["response_type"] for e in events]
    progress = ("tool_call", "tool_result")   # the pipeline's progress events come first (C116)
    assert [k for k in kinds if k not in progress] == ["agent_query", "references", "error"]
    assert all(k in progress for k in kinds[1:kinds.index("references")])
    assert events[-1]["done"] is True and events[-1]["data"]["stage"] == "chat_completion_stream"
    whole = c.post(f"/api/v1/knowledge-chat/{sid}", json=body, timeout=30)  # it ends after hang_s
    assert time.perf_counter() - t0 >= 2.0 and sse(whole.text)[-1]["response_type"] == "error"
