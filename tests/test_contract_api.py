"""The sandbox speaks WeKnora's API as WeKnora's source does, in each emulated release.

Every test holds one or more facts of docs/weknora-contract.md (``@pytest.mark.contract``) over real
HTTP: httpx against a :class:`SandboxServer` on loopback, one server per (release, system version).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from weknora_nb.collect.http.transport import default_tls
from weknora_nb.core.weknora import ERROR_CODES
from weknora_nb.sandbox import SandboxServer
from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES

from .conftest import BIG_SECTIONS, write_big_documents

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
KEY = "sk-contract-full-0123456789abcdef"
PLATFORM = "sk-contract-platform-0123456789"
#: keys by what they may do (C3-C7)
API_KEYS: dict[str, dict[str, Any]] = {
    PLATFORM: {"kind": "platform", "tenant_id": None, "capabilities": ["retrieve", "chat"]},
    "sk-contract-retrieve": {"kind": "workspace", "tenant_id": 1, "capabilities": ["retrieve"]},
    "sk-contract-chat": {"kind": "workspace", "tenant_id": 1, "capabilities": ["chat"]},
    "sk-contract-history": {"kind": "workspace", "tenant_id": 1, "capabilities": ["message_history"]},
    "sk-contract-settings": {"kind": "workspace", "tenant_id": 1, "capabilities": ["manage_tenant_settings"]},
    "sk-contract-stores": {"kind": "workspace", "tenant_id": 1, "capabilities": ["manage_vector_stores"]},
    "sk-contract-none": {"kind": "workspace", "tenant_id": 1, "capabilities": []},
    "sk-contract-other-kb": {"kind": "workspace", "tenant_id": 1, "capabilities": None,
                             "knowledge_base_ids": ["kb-elsewhere"]},
    "sk-contract-tenant-2": {"kind": "workspace", "tenant_id": 2, "capabilities": None},
}
V06 = ("v0.6.2", "v0.6.3")
V07 = ("v0.7.2", "main")
ALL = tuple(RELEASES)
KB = "kb-demo"
HYBRID = f"/api/v1/knowledge-bases/{KB}/hybrid-search"


@pytest.fixture(scope="module")
def cache_dir(embedding_cache: Path) -> Path:
    return embedding_cache


@pytest.fixture(scope="module")
def servers(cache_dir: Path) -> Iterator[Callable[..., SandboxServer]]:
    """``servers(release, version)``: a started server of the mini corpus (one per pair, kept for the module)."""
    started: dict[tuple[str, str], SandboxServer] = {}

    def get(release: str = DEFAULT_RELEASE, version: str = "rerank") -> SandboxServer:
        if (release, version) not in started:
            started[release, version] = SandboxServer(
                version, data_dir=MINI, cache_dir=cache_dir, api_key=KEY, api_keys=API_KEYS,
                allow_fault_control=True, weknora_version=release).start()
        sb = started[release, version]
        sb.set_faults()
        return sb
    yield get
    for sb in started.values():
        sb.stop()


def call(sb: SandboxServer, method: str, path: str, *, key: str | None = KEY, headers: dict[str, str] | None = None,
         **kw: Any) -> httpx.Response:
    """One request to ``sb`` with ``key`` in ``X-API-Key`` (None: no key)."""
    h = {"X-API-Key": key} if key is not None else {}
    return httpx.request(method, sb.base_url + path, headers={**h, **(headers or {})}, timeout=30,
                         verify=default_tls(), **kw)


def envelope_error(r: httpx.Response, code: int) -> dict[str, Any]:
    """The C11 error of ``r``, checked to carry ``code`` with its C12 status."""
    assert r.status_code == ERROR_CODES[code][1], r.text
    body = r.json()
    assert body["success"] is False and body["error"]["code"] == code, body
    return body["error"]


def sse_blocks(raw: bytes) -> list[dict[str, Any]]:
    """The events of an SSE body, each checked to be exactly ``event:message\\ndata:<json>`` (C62)."""
    blocks = raw.decode("utf-8").split("\n\n")
    assert blocks[-1] == "", "the stream must end with a blank line"
    out = []
    for block in blocks[:-1]:
        event, data = block.split("\n")
        assert event == "event:message" and data.startswith("data:{"), block
        out.append(json.loads(data[len("data:"):]))
    return out


# ---------------------------------------------------------------------------------------
# auth (C1-C8)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C2")
@pytest.mark.parametrize("release", ALL)
def test_no_credentials_is_a_bare_401(servers, release):
    r = call(servers(release), "GET", "/api/v1/knowledge-bases", key=None)
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized: missing authentication"}


@pytest.mark.contract("C1", "C2")
@pytest.mark.parametrize("release", ALL)
def test_a_bearer_token_is_never_an_api_key(servers, release):
    sb = servers(release)
    r = call(sb, "GET", "/api/v1/knowledge-bases", key=None, headers={"Authorization": f"Bearer {KEY}"})
    expected = "Unauthorized: invalid or expired token" if release in V07 else "Unauthorized: missing authentication"
    assert r.status_code == 401 and r.json() == {"error": expected}
    # a rejected JWT falls through to X-API-Key
    r = call(sb, "GET", "/api/v1/knowledge-bases", headers={"Authorization": "Bearer not-a-jwt"})
    assert r.status_code == 200 and r.json()["success"] is True


@pytest.mark.contract("C2", "C3")
@pytest.mark.parametrize("release", ALL)
def test_an_unknown_key_is_a_bare_401(servers, release):
    r = call(servers(release), "GET", "/api/v1/knowledge-bases", key="sk-nobody")
    expected = "Unauthorized: invalid API key" if release in V07 else "Unauthorized: invalid API key format"
    assert r.status_code == 401 and r.json() == {"error": expected}


@pytest.mark.contract("C3")
@pytest.mark.parametrize("release", V06)
def test_v06_ignores_x_tenant_id_and_has_no_platform_keys_or_capabilities(servers, release):
    sb = servers(release)
    for tenant in ("abc", "0", "2"):
        assert call(sb, "GET", "/api/v1/knowledge-bases", headers={"X-Tenant-ID": tenant}).status_code == 200
    r = call(sb, "GET", "/api/v1/knowledge-bases", key=PLATFORM, headers={"X-Tenant-ID": "1"})
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized: invalid API key format"}
    # no capabilities at v0.6.x: any tenant key has full access (C69 too)
    assert call(sb, "POST", "/api/v1/sessions", key="sk-contract-none", json={"title": "t"}).status_code == 201


@pytest.mark.contract("C4")
@pytest.mark.parametrize("release", V07)
def test_a_platform_key_without_tenant_is_409_tenant_required(servers, release):
    sb = servers(release)
    r = call(sb, "GET", "/api/v1/knowledge-bases", key=PLATFORM)
    assert r.status_code == 409
    assert r.json() == {"error": "Workspace required: platform API keys must send X-Tenant-ID",
                        "code": "TENANT_REQUIRED"}
    r = call(sb, "GET", "/api/v1/knowledge-bases", key=PLATFORM, headers={"X-Tenant-ID": "1"})
    assert r.status_code == 200 and [kb["id"] for kb in r.json()["data"]][0] == KB


@pytest.mark.contract("C5")
@pytest.mark.parametrize("release", V07)
def test_malformed_other_and_unknown_tenants(servers, release):
    sb = servers(release)
    for key in (KEY, PLATFORM):
        for bad in ("abc", "0", "-1", "1.0"):
            r = call(sb, "GET", "/api/v1/knowledge-bases", key=key, headers={"X-Tenant-ID": bad})
            assert r.status_code == 400 and r.json() == {"error": "Invalid X-Tenant-ID header"}, (key, bad)
    r = call(sb, "GET", "/api/v1/knowledge-bases", headers={"X-Tenant-ID": "2"})
    assert r.status_code == 403 and r.json() == {"error": "Forbidden: workspace API key cannot switch workspaces"}
    assert call(sb, "GET", "/api/v1/knowledge-bases", headers={"X-Tenant-ID": "1"}).status_code == 200
    r = call(sb, "GET", "/api/v1/knowledge-bases", key=PLATFORM, headers={"X-Tenant-ID": "2"})
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized: invalid API key"}
    r = call(sb, "GET", "/api/v1/knowledge-bases", key="sk-contract-tenant-2")  # its tenant does not exist
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized: invalid API key"}


#: C7: (method, path, body, the capability the route needs)
ROUTES = [
    ("POST", HYBRID, {"query_text": "密码"}, "retrieve"),
    ("GET", HYBRID, {"query_text": "密码"}, "retrieve"),
    ("POST", "/api/v1/knowledge-search", {"query": "密码", "knowledge_base_id": KB}, "retrieve"),
    ("GET", "/api/v1/knowledge-bases", None, "retrieve"),
    ("GET", f"/api/v1/knowledge-bases/{KB}", None, "retrieve"),
    ("GET", f"/api/v1/knowledge-bases/{KB}/knowledge", None, "retrieve"),
    ("GET", "/api/v1/knowledge/guide.01-passwords", None, "retrieve"),
    ("GET", "/api/v1/chunks/guide.01-passwords", None, "retrieve"),
    ("GET", "/api/v1/chunks/by-id/guide.01-passwords:000", None, "retrieve"),
    ("POST", "/api/v1/sessions", {"title": "t"}, "chat"),
    ("GET", "/api/v1/sessions", None, "chat"),
    ("POST", "/api/v1/messages/search", {"query": "密码"}, "message_history"),
    ("GET", "/api/v1/tenants/kv/retrieval-config", None, "manage_tenant_settings"),
    ("GET", "/api/v1/system/info", None, "manage_vector_stores"),
]
CAPABILITY_KEY = {"retrieve": "sk-contract-retrieve", "chat": "sk-contract-chat",
                  "message_history": "sk-contract-history", "manage_tenant_settings": "sk-contract-settings",
                  "manage_vector_stores": "sk-contract-stores"}


@pytest.mark.contract("C6", "C7", "C69")
@pytest.mark.parametrize("release", V07)
def test_each_route_needs_its_capability(servers, release):
    sb = servers(release)
    for method, path, body, capability in ROUTES:
        content = json.dumps(body).encode() if body is not None else None
        r = call(sb, method, path, key=CAPABILITY_KEY[capability], content=content)
        assert r.status_code in (200, 201), (path, capability, r.text)
        for other, key in CAPABILITY_KEY.items():
            if other != capability:
                r = call(sb, method, path, key=key, content=content)
                assert r.status_code == 403, (path, other)
                assert r.json() == {"error": "Forbidden: API key scope does not allow this operation"}
        assert call(sb, method, path, key="sk-contract-none", content=content).status_code == 403
        assert call(sb, method, path, content=content).status_code in (200, 201)  # full access


@pytest.mark.contract("C7")
@pytest.mark.parametrize("release", V07)
def test_a_kb_restricted_key_is_refused_other_kbs_with_code_1002(servers, release):
    sb = servers(release)
    key = "sk-contract-other-kb"
    for method, path, body in (("POST", HYBRID, {"query_text": "x"}), ("GET", f"/api/v1/knowledge-bases/{KB}", None),
                               ("GET", "/api/v1/chunks/guide.01-passwords", None)):
        err = envelope_error(call(sb, method, path, key=key, json=body), 1002)
        assert err["message"] == "API key scope does not allow one or more knowledge bases"
    r = call(sb, "POST", "/api/v1/knowledge-search", key=key, json={"query": "x", "knowledge_ids": ["guide.03-vpn"]})
    assert envelope_error(r, 1002)["message"] == ("API key scope does not allow knowledge_ids without a verified "
                                                 "knowledge base")
    assert call(sb, "GET", "/api/v1/knowledge-bases", key=key).json()["data"] == []


@pytest.mark.contract("C2")
def test_keys_are_never_logged(servers, caplog):
    caplog.set_level(logging.DEBUG)
    sb = servers()
    for key in (KEY, PLATFORM, "sk-nobody-secret"):
        call(sb, "GET", "/api/v1/knowledge-bases", key=key)
        call(sb, "POST", "/api/v1/knowledge-search", key=key, json={"query": "密码", "knowledge_base_id": KB})
    assert caplog.records, "the server logs something"
    for key in (KEY, PLATFORM, "sk-nobody-secret"):
        assert key not in caplog.text


# ---------------------------------------------------------------------------------------
# envelopes and errors (C9-C14)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C9", "C10")
def test_success_envelopes(servers):
    sb = servers()
    assert set(call(sb, "GET", "/api/v1/knowledge-bases").json()) == {"success", "data"}
    assert set(call(sb, "POST", HYBRID, json={"query_text": "密码", "match_count": 3}).json()) == {"success", "data"}
    paged = call(sb, "GET", f"/api/v1/knowledge-bases/{KB}/knowledge").json()
    assert set(paged) == {"success", "data", "total", "page", "page_size"}
    info = call(sb, "GET", "/api/v1/system/info").json()
    assert set(info) == {"code", "msg", "data"} and (info["code"], info["msg"]) == (0, "success")
    sid = call(sb, "POST", "/api/v1/sessions", json={}).json()["data"]["id"]
    r = call(sb, "DELETE", f"/api/v1/sessions/{sid}")
    assert r.status_code == 200 and r.json() == {"success": True, "message": "Session deleted successfully"}


@pytest.mark.contract("C11", "C12")
def test_app_errors_carry_code_status_and_details(servers):
    sb = servers()
    err = envelope_error(call(sb, "GET", "/api/v1/knowledge/nope"), 1003)
    assert err == {"code": 1003, "message": "Knowledge not found", "details": None}
    err = envelope_error(call(sb, "POST", HYBRID, content=b"{not json"), 1000)
    assert err["message"] == "Invalid request parameters" and isinstance(err["details"], str)
    assert envelope_error(call(sb, "POST", "/api/v1/knowledge-search", key="sk-contract-other-kb",
                               json={"query": "x", "knowledge_base_id": KB}), 1002)
    sb.set_faults(rate_limit_rate=1.0, retry_after_s=3)
    r = call(sb, "GET", "/api/v1/knowledge-bases")
    assert envelope_error(r, 1006) and r.headers["retry-after"] == "3"


@pytest.mark.contract("C11")
def test_an_error_that_is_no_app_error_is_500_1007_without_details(servers):
    sb = servers()
    sb.set_faults(error_rate=1.0)
    r = call(sb, "GET", "/api/v1/knowledge-bases")
    assert r.status_code == 500
    assert r.json() == {"success": False, "error": {"code": 1007, "message": "Internal server error"}}


@pytest.mark.contract("C14")
@pytest.mark.parametrize("release", ALL)
def test_unknown_routes_and_methods_are_gins_plain_404(servers, release):
    sb = servers(release)
    for method, path in (("GET", "/api/v1/nothing"), ("DELETE", "/api/v1/knowledge-search"),
                         ("PUT", f"/api/v1/knowledge-bases/{KB}/hybrid-search"), ("HEAD", "/api/v1/knowledge-bases"),
                         ("GET", "/api/v1/chunks")):
        r = call(sb, method, path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/plain"), (method, path)
        assert method == "HEAD" or r.text == "404 page not found"
    r = call(sb, "GET", "/api/v1/nothing", key=None)  # auth is global: it comes first
    assert r.status_code == 401 and set(r.json()) == {"error"}


# ---------------------------------------------------------------------------------------
# hybrid-search (C15-C26)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C15")
@pytest.mark.parametrize("release", ALL)
def test_hybrid_search_methods_per_release(servers, release):
    sb = servers(release)
    body = {"query_text": "忘记管理员密码怎么办", "match_count": 5}
    r = call(sb, "GET", HYBRID, json=body)  # GET with a JSON body
    assert r.status_code == 200 and r.json()["data"], r.text
    r = call(sb, "POST", HYBRID, json=body)
    if release == "v0.6.2":
        assert r.status_code == 404 and r.text == "404 page not found"
    else:
        assert r.status_code == 200 and r.json()["data"]


@pytest.mark.contract("C16")
@pytest.mark.parametrize("release", ALL)
def test_hybrid_search_body_errors(servers, release):
    sb = servers(release)
    method = "GET" if release == "v0.6.2" else "POST"
    err = envelope_error(call(sb, method, HYBRID, content=b"{not json"), 1000)
    assert err["message"] == "Invalid request parameters" and err["details"]
    err = envelope_error(call(sb, method, HYBRID, json={"query_text": "x", "match_count": "many"}), 1000)
    assert err["details"] == ("json: cannot unmarshal string into Go struct field SearchParams.match_count of "
                              "type int")
    r = call(sb, method, HYBRID, json={"query_text": "  ", "match_count": 3})
    if release in V07:
        assert envelope_error(r, 1000) == {"code": 1000, "message": "query_text is required", "details": None}
    else:
        assert r.status_code == 200 and r.json()["success"] is True  # no such check at v0.6.x
    # a precomputed embedding with keywords disabled needs no query_text (knowledgebase.go:305-309 @ v0.7.2)
    r = call(sb, method, HYBRID, json={"query_text": "", "query_embedding": [0.5, 0.5], "match_count": 3,
                                       "disable_keywords_match": True})
    assert r.status_code == 200 and r.json()["success"] is True


@pytest.mark.contract("C13")
def test_a_panic_is_recoverys_bare_500(servers, monkeypatch):
    sb = servers()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("assignment to entry in nil map")
    monkeypatch.setattr(sb.sandbox.engine, "knowledge_search", boom)
    r = call(sb, "POST", "/api/v1/knowledge-search", json={"query": "panic please", "knowledge_base_id": KB})
    assert r.status_code == 500
    assert r.json() == {"error": "Internal Server Error", "message": "assignment to entry in nil map"}


@pytest.mark.contract("C26")
@pytest.mark.parametrize("release", ALL)
def test_hybrid_search_on_an_unknown_kb_is_404_1003(servers, release):
    method = "GET" if release == "v0.6.2" else "POST"
    r = call(servers(release), method, "/api/v1/knowledge-bases/nope/hybrid-search", json={"query_text": "x"})
    assert envelope_error(r, 1003) == {"code": 1003, "message": "knowledge base not found", "details": None}
    # the KB is checked before the body
    r = call(servers(release), method, "/api/v1/knowledge-bases/nope/hybrid-search", content=b"{")
    assert envelope_error(r, 1003)


@pytest.mark.contract("C22", "C25")
def test_hybrid_search_results_and_no_hit(servers):
    sb = servers()
    data = call(sb, "POST", HYBRID, json={"query_text": "忘记管理员密码怎么办", "match_count": 3,
                                          "skip_context_enrichment": True}).json()["data"]
    assert 0 < len(data) <= 3
    first = data[0]
    for name in ("id", "content", "knowledge_id", "chunk_index", "knowledge_title", "start_at", "end_at", "seq",
                 "score", "match_type", "sub_chunk_id", "metadata", "chunk_type", "parent_chunk_id", "image_info",
                 "knowledge_filename", "knowledge_source", "knowledge_channel", "matched_content",
                 "knowledge_base_id"):
        assert name in first, name
    assert first["seq"] == first["chunk_index"] and first["sub_chunk_id"] is None and first["chunk_type"] == "text"
    assert first["knowledge_base_id"] == KB and first["metadata"] == {}
    assert first["matched_content"] == f"{first['knowledge_title']}\n{first['content'].strip()}"  # C76
    r = call(sb, "POST", HYBRID, json={"query_text": "密码", "match_count": 5, "disable_keywords_match": True,
                                       "vector_threshold": 0.999})
    assert r.status_code == 200 and r.json() == {"success": True, "data": None}


@pytest.mark.contract("C17")
@pytest.mark.parametrize("release", ALL)
def test_match_count_zero_and_negative(servers, release):
    sb = servers(release)
    method = "GET" if release == "v0.6.2" else "POST"
    zero = call(sb, method, HYBRID, json={"query_text": "密码", "match_count": 0, "skip_context_enrichment": True})
    negative = call(sb, method, HYBRID, json={"query_text": "密码", "match_count": -1})
    if release == "main":  # normalised to 50 first: every chunk of the mini corpus the paths find
        assert zero.json()["data"] and negative.status_code == 200 and negative.json()["data"]
    else:
        assert zero.json() == {"success": True, "data": None}
        assert negative.status_code == 500  # C13: the slice expression panics
        body = negative.json()
        assert set(body) == {"error", "message"} and body["error"] == "Internal Server Error"
        assert "slice bounds out of range" in body["message"]


# ---------------------------------------------------------------------------------------
# knowledge-search (C27-C44)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C27")
@pytest.mark.parametrize("release", ALL)
def test_knowledge_search_body_and_scope(servers, release):
    sb = servers(release)
    err = envelope_error(call(sb, "POST", "/api/v1/knowledge-search", json={"knowledge_base_id": KB}), 1000)
    assert err["message"] == ("Key: 'SearchKnowledgeRequest.Query' Error:Field validation for 'Query' failed on "
                              "the 'required' tag")
    err = envelope_error(call(sb, "POST", "/api/v1/knowledge-search", json={"query": "x"}), 1000)
    if release in V07:
        assert err["message"] == ("At least one knowledge_base_id, knowledge_base_ids, knowledge_ids, or scoped tag "
                                  "must be provided")
    else:
        assert err["message"] == "At least one knowledge_base_id, knowledge_base_ids or knowledge_ids must be provided"
    assert envelope_error(call(sb, "POST", "/api/v1/knowledge-search", content=b""), 1000)["message"] == "EOF"


@pytest.mark.contract("C28", "C34")
@pytest.mark.parametrize("release", ALL)
def test_an_unknown_kb_fails_the_search(servers, release):
    r = call(servers(release), "POST", "/api/v1/knowledge-search", json={"query": "密码", "knowledge_base_id": "nope"})
    if release in V07:  # the service error, as a 500
        err = envelope_error(r, 1007)
        assert err["message"] == "error code: 1003, error message: knowledge base not found"
    else:  # only logged: nothing found
        assert r.status_code == 200 and r.json() == {"success": True, "data": []}


@pytest.mark.contract("C39", "C44")
@pytest.mark.parametrize("release", ALL)
def test_rerank_scores_in_metadata_as_4_decimal_strings(servers, release):
    r = call(servers(release), "POST", "/api/v1/knowledge-search",
             json={"query": "账号被锁定了多久能解锁", "knowledge_base_id": KB})
    data = r.json()["data"]
    assert r.status_code == 200 and data
    for d in data:
        assert re.fullmatch(r"-?\d+\.\d{4}", d["metadata"]["base_score"])
        if release == "v0.6.2":
            assert "model_score" not in d["metadata"]
        else:
            assert re.fullmatch(r"-?\d+\.\d{4}", d["metadata"]["model_score"])


@pytest.mark.contract("C37", "C39")
def test_no_score_metadata_without_a_reranker_or_when_it_fails(servers):
    body = {"query": "账号被锁定了多久能解锁", "knowledge_base_id": KB}
    data = call(servers(version="baseline"), "POST", "/api/v1/knowledge-search", json=body).json()["data"]
    assert data and all(d["metadata"] == {} for d in data)
    sb = servers()
    reranked = call(sb, "POST", "/api/v1/knowledge-search", json=body).json()["data"]
    assert all("model_score" in d["metadata"] for d in reranked)
    sb.set_faults(rerank_error_rate=1.0)  # rolled per request, before the remembered answer
    failed = call(sb, "POST", "/api/v1/knowledge-search", json=body).json()["data"]
    assert failed and all("model_score" not in d["metadata"] for d in failed)
    sb.set_faults()
    assert call(sb, "POST", "/api/v1/knowledge-search", json=body).json()["data"] == reranked


@pytest.mark.contract("C44")
def test_knowledge_search_finding_nothing_is_an_empty_list(servers):
    r = call(servers(), "POST", "/api/v1/knowledge-search", json={"query": "密码", "knowledge_ids": ["nope"]})
    assert r.status_code == 200 and r.json() == {"success": True, "data": []}


# ---------------------------------------------------------------------------------------
# inventory and configuration (C48-C57)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C48", "C49")
def test_knowledge_base_list_and_object(servers):
    sb = servers()
    kbs = call(sb, "GET", "/api/v1/knowledge-bases").json()["data"]
    assert [kb["id"] for kb in kbs] == [KB]
    kb = call(sb, "GET", f"/api/v1/knowledge-bases/{KB}").json()["data"]
    assert kb == kbs[0] and kb["type"] == "document"
    assert kb["embedding_model_id"] == sb.version.embedding_model
    assert kb["indexing_strategy"] == {"vector_enabled": True, "keyword_enabled": True, "wiki_enabled": False,
                                       "graph_enabled": False}
    assert {"chunk_size", "chunk_overlap", "separators"} <= set(kb["chunking_config"])
    assert (kb["knowledge_count"], kb["chunk_count"]) == (3, 8)
    assert envelope_error(call(sb, "GET", "/api/v1/knowledge-bases/nope"), 1003)["message"] == \
        "knowledge base not found"


@pytest.mark.contract("C50", "C51")
def test_knowledge_list_paging_and_detail(servers):
    sb = servers()
    path = f"/api/v1/knowledge-bases/{KB}/knowledge"
    whole = call(sb, "GET", path).json()
    assert (whole["page"], whole["page_size"], whole["total"]) == (1, 20, 3)
    created = [k["created_at"] for k in whole["data"]]
    assert created == sorted(created, reverse=True)  # created_at DESC
    pages = [call(sb, "GET", path, params={"page": p, "page_size": 2}).json()["data"] for p in (1, 2)]
    assert [k["id"] for p in pages for k in p] == [k["id"] for k in whole["data"]]
    assert "Field validation for 'PageSize' failed on the 'max' tag" in envelope_error(
        call(sb, "GET", path, params={"page_size": 1001}), 1000)["message"]
    assert call(sb, "GET", path, params={"page_size": 1000}).json()["page_size"] == 1000  # not capped below
    k = call(sb, "GET", "/api/v1/knowledge/guide.01-passwords").json()["data"]
    assert k == next(x for x in whole["data"] if x["id"] == "guide.01-passwords")
    assert k["parse_status"] == "completed" and k["knowledge_base_id"] == KB and "chunk_count" not in k


@pytest.mark.contract("C52", "C55")
@pytest.mark.parametrize("release", ALL)
def test_chunk_listing_page_sizes(servers, release):
    sb = servers(release)
    path = "/api/v1/chunks/guide.01-passwords"
    r = call(sb, "GET", path).json()
    assert (r["page"], r["page_size"], r["total"]) == (1, 10, 3)  # default page size 10
    assert call(sb, "GET", path, params={"page_size": 500}).json()["page_size"] == 100  # capped at 100
    assert envelope_error(call(sb, "GET", path, params={"page_size": 1001}), 1000)  # fails binding first
    assert envelope_error(call(sb, "GET", path, params={"page": "x"}), 1000)
    p1 = call(sb, "GET", path, params={"page_size": 2}).json()
    p2 = call(sb, "GET", path, params={"page": 2, "page_size": 2}).json()
    rows = p1["data"] + p2["data"]
    assert [c["chunk_index"] for c in rows] == [0, 1, 2] and p2["page_size"] == 2
    assert rows[1]["pre_chunk_id"] == rows[0]["id"] and rows[1]["next_chunk_id"] == rows[2]["id"]
    extra = {"content_revision", "index_status", "last_editor_id"}
    assert (extra <= set(rows[0])) == (release in V07)
    for name in ("id", "seq_id", "tenant_id", "knowledge_id", "knowledge_base_id", "content", "chunk_index",
                 "is_enabled", "status", "start_at", "end_at", "chunk_type", "parent_chunk_id", "created_at"):
        assert name in rows[0], name
    assert envelope_error(call(sb, "GET", "/api/v1/chunks/nope"), 1003)["message"] == "Knowledge not found"
    one = call(sb, "GET", f"/api/v1/chunks/by-id/{rows[1]['id']}").json()["data"]
    assert one == rows[1]
    assert envelope_error(call(sb, "GET", "/api/v1/chunks/by-id/nope"), 1003)["message"] == "Chunk not found"


@pytest.mark.contract("C52", "C54")
def test_chunk_type_defaults_to_text_and_repeats_replace_it(servers):
    sb = servers()
    path = "/api/v1/chunks/guide.01-passwords"
    assert call(sb, "GET", path, params={"chunk_type": "faq"}).json()["total"] == 0
    both = call(sb, "GET", path, params=[("chunk_type", "faq"), ("chunk_type", "text")]).json()
    assert both["total"] == 3 and {c["chunk_type"] for c in both["data"]} == {"text"}


@pytest.mark.contract("C10", "C56")
@pytest.mark.parametrize("release", ALL)
def test_system_info_names_the_release_and_engines(servers, release):
    data = call(servers(release), "GET", "/api/v1/system/info").json()["data"]
    # the build's VERSION file: the release line (0.6.2 at v0.6.3 too, 0.7.2 at main); the commit names the tag
    assert data["version"] == {"v0.6.2": "0.6.2", "v0.6.3": "0.6.2", "v0.7.2": "0.7.2", "main": "0.7.2"}[release]
    assert data["commit_id"] == {"v0.6.2": "fc98f00", "v0.6.3": "974ca35", "v0.7.2": "3d5d8bf",
                                 "main": "412dcc4"}[release]
    assert (data["keyword_index_engine"], data["vector_store_engine"]) == ("postgres", "postgres")
    assert {"edition", "started_at", "uptime_seconds", "graph_database_engine"} <= set(data)


@pytest.mark.contract("C57")
def test_retrieval_config_is_the_stored_config(servers):
    sb = servers()
    r = call(sb, "GET", "/api/v1/tenants/kv/retrieval-config")
    assert r.status_code == 200 and r.json()["data"] == sb.sandbox.engine.tenant_config_raw()
    assert envelope_error(call(sb, "GET", "/api/v1/tenants/kv/other"), 1000)["message"] == "unsupported key"


# ---------------------------------------------------------------------------------------
# sessions and chat (C58-C66)
# ---------------------------------------------------------------------------------------
def stats(sb: SandboxServer) -> dict[str, int]:
    return call(sb, "GET", "/_sandbox/stats").json()["data"]


@pytest.mark.contract("C58", "C59")
def test_sessions_are_created_with_201_and_read_listed_deleted(servers):
    sb = servers()
    assert envelope_error(call(sb, "POST", "/api/v1/sessions", content=b""), 1000)["message"] == "EOF"
    r = call(sb, "POST", "/api/v1/sessions", json={"title": "评测", "description": "d", "knowledge_base_id": KB})
    assert r.status_code == 201
    s = r.json()["data"]
    assert (s["title"], s["description"], s["tenant_id"]) == ("评测", "d", 1) and "knowledge_base_id" not in s
    assert call(sb, "GET", f"/api/v1/sessions/{s['id']}").json()["data"] == s
    listed = call(sb, "GET", "/api/v1/sessions", params={"page_size": 1}).json()
    assert listed["page_size"] == 1 and listed["total"] >= 1 and listed["data"][0]["id"] == s["id"]  # newest first
    assert call(sb, "DELETE", f"/api/v1/sessions/{s['id']}").status_code == 200
    assert envelope_error(call(sb, "GET", f"/api/v1/sessions/{s['id']}"), 1003)
    assert envelope_error(call(sb, "DELETE", f"/api/v1/sessions/{s['id']}"), 1003)


def chat(sb: SandboxServer, sid: str, **body: Any) -> httpx.Response:
    return call(sb, "POST", f"/api/v1/knowledge-chat/{sid}", json={"knowledge_base_ids": [KB], **body})


@pytest.mark.contract("C60")
def test_chat_errors_before_the_stream(servers):
    sb = servers()
    sid = call(sb, "POST", "/api/v1/sessions", json={}).json()["data"]["id"]
    err = envelope_error(chat(sb, sid), 1000)
    assert "Field validation for 'Query' failed on the 'required' tag" in err["message"]
    assert envelope_error(chat(sb, "nope", query="x"), 1003)["message"] == "Session not found"


@pytest.mark.contract("C61")
def test_a_title_costs_one_llm_call_unless_disabled(servers):
    sb = servers()
    before = stats(sb)
    quiet = call(sb, "POST", "/api/v1/sessions", json={}).json()["data"]["id"]
    events = sse_blocks(chat(sb, quiet, query="密码", disable_title=True).content)
    assert "session_title" not in [e["response_type"] for e in events]
    assert stats(sb)["title_calls"] == before["title_calls"]
    loud = call(sb, "POST", "/api/v1/sessions", json={}).json()["data"]["id"]
    events = sse_blocks(chat(sb, loud, query="VPN 连接失败").content)
    assert events[-1]["response_type"] == "session_title" and events[-1]["content"]
    assert stats(sb)["title_calls"] == before["title_calls"] + 1
    chat(sb, loud, query="再问一次")  # the session has a title now: no second call
    titled = call(sb, "POST", "/api/v1/sessions", json={"title": "t"}).json()["data"]["id"]
    chat(sb, titled, query="密码")
    after = stats(sb)
    assert after["title_calls"] == before["title_calls"] + 1
    assert after["sessions_created"] == before["sessions_created"] + 3


@pytest.mark.contract("C62", "C63", "C65")
@pytest.mark.parametrize("release", ALL)
def test_chat_stream_bytes_events_and_citations(servers, release):
    sb = servers(release)
    sid = call(sb, "POST", "/api/v1/sessions", json={"title": "t"}).json()["data"]["id"]
    r = chat(sb, sid, query="VPN 连接失败 ZL-201")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_blocks(r.content)
    kinds = [e["response_type"] for e in events]
    assert kinds[0] == "agent_query" and events[0]["done"] is True and events[0]["session_id"] == sid
    assert kinds[-2:] == ["answer", "complete"] and events[-2]["done"] is True and events[-1]["done"] is True
    assert all(not e["done"] for e in events[1:-2] if e["response_type"] == "answer")
    assert len({e["id"] for e in events}) == 1  # one request id
    refs = next(e for e in events if e["response_type"] == "references")["knowledge_references"]
    answer = "".join(e["content"] for e in events if e["response_type"] == "answer")
    assert "抽取式回答" in answer  # the sandbox says it has no language model
    tag = f'<kb doc="{refs[0]["knowledge_title"]}" chunk_id="{refs[0]["id"]}" kb_id="{KB}" />'
    assert (tag in answer) == (release in V07)
    if release in V07:  # C62: encoding/json escapes < > & in the data line
        assert b"\\u003ckb doc=" in r.content and b"<kb" not in r.content


@pytest.mark.contract("C64")
@pytest.mark.parametrize("release", ALL)
def test_references_come_before_the_answer_from_v063(servers, release):
    sb = servers(release)
    sid = call(sb, "POST", "/api/v1/sessions", json={"title": "t"}).json()["data"]["id"]
    kinds = [e["response_type"] for e in sse_blocks(chat(sb, sid, query="VPN 连接失败").content)]
    first_answer, refs = kinds.index("answer"), kinds.index("references")
    assert (refs < first_answer) == (release != "v0.6.2")


@pytest.mark.contract("C66")
def test_chat_retrieval_uses_the_conversation_settings_not_the_tenant_config(servers):
    sb = servers()  # the rerank version: knowledge-search reranks, chat (no agent) does not
    query = "账号被锁定了多久能解锁"
    searched = call(sb, "POST", "/api/v1/knowledge-search", json={"query": query, "knowledge_base_id": KB}).json()
    assert all("model_score" in d["metadata"] for d in searched["data"])
    sid = call(sb, "POST", "/api/v1/sessions", json={"title": "t"}).json()["data"]["id"]
    events = sse_blocks(chat(sb, sid, query=query).content)
    refs = next(e for e in events if e["response_type"] == "references")["knowledge_references"]
    assert refs and all("model_score" not in d["metadata"] for d in refs)


@pytest.mark.contract("C67", "C68")
def test_message_history_load_and_search(servers):
    sb = servers()
    sid = call(sb, "POST", "/api/v1/sessions", json={"title": "history"}).json()["data"]["id"]
    chat(sb, sid, query="VPN 连接失败 ZL-201")
    chat(sb, sid, query="忘记管理员密码怎么办")
    msgs = call(sb, "GET", f"/api/v1/messages/{sid}/load").json()["data"]
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 2 and msgs[0]["content"] == "VPN 连接失败 ZL-201"
    assert [m["content"] for m in call(sb, "GET", f"/api/v1/messages/{sid}/load",
                                       params={"limit": 1}).json()["data"]] == [msgs[-1]["content"]]
    assert len(call(sb, "GET", f"/api/v1/messages/{sid}/load", params={"limit": "x"}).json()["data"]) == 4
    assert envelope_error(call(sb, "GET", f"/api/v1/messages/{sid}/load", params={"before_time": "yesterday"}), 1000)
    assert envelope_error(call(sb, "GET", "/api/v1/messages/nope/load"), 1003)
    found = call(sb, "POST", "/api/v1/messages/search", json={"query": "管理员密码", "session_ids": [sid]}).json()
    items = found["data"]["items"]
    assert found["data"]["total"] == len(items) >= 1 and items[0]["query_content"] == "忘记管理员密码怎么办"
    assert set(items[0]) == {"request_id", "session_id", "session_title", "query_content", "answer_content", "score",
                             "match_type", "created_at"}
    assert envelope_error(call(sb, "POST", "/api/v1/messages/search", json={"mode": "keyword"}), 1000)


# ---------------------------------------------------------------------------------------
# the answer memory
# ---------------------------------------------------------------------------------------
def test_the_answer_memory_keys_on_tenant_and_request_and_never_keeps_errors(servers):
    sb = servers()
    memory = sb.sandbox.answers
    body = {"query": "VPN 连接失败", "knowledge_base_id": KB}
    call(sb, "POST", "/api/v1/knowledge-search", json=body)
    n = len(memory)
    call(sb, "POST", "/api/v1/knowledge-search", json=body)
    assert len(memory) == n  # remembered
    call(sb, "POST", "/api/v1/knowledge-search", json=body, params={"resource_urls": "handle"})
    assert len(memory) == n + 1  # another query string is another answer
    call(sb, "POST", "/api/v1/knowledge-search", key=PLATFORM, headers={"X-Tenant-ID": "1"}, json=body)
    assert len(memory) == n + 1  # same tenant, same answer
    call(sb, "POST", "/api/v1/knowledge-search", json={"query": "x", "knowledge_base_id": "nope"})
    assert len(memory) == n + 1  # a 500 is never kept
    assert all(key[0] == sb.release.name for key in memory)  # keyed on the release


# ---------------------------------------------------------------------------------------
# a knowledge of 250 chunks, an FAQ knowledge base (C45-C47, C52, C53)
# ---------------------------------------------------------------------------------------
FAQ_ENTRIES = [
    {"id": "faq-001", "group": "account", "standard_question": "如何重置密码？",
     "similar_questions": ["忘记密码怎么办", "密码找回"], "answers": ["在登录页点击“忘记密码”，按邮件提示重置。"]},
    {"id": "faq-002", "group": "account", "standard_question": "账号被锁定怎么办？",
     "similar_questions": ["账号锁定"], "answers": ["等待 15 分钟自动解锁，或联系管理员。"],
     "negative_questions": ["如何锁定账号？"]},
    {"id": "faq-003", "group": "network", "standard_question": "VPN 连不上怎么办？",
     "similar_questions": [], "answers": ["检查客户端版本，并确认错误码 ZL-201 的处理步骤。"]},
]
LONG_SECTIONS = BIG_SECTIONS


@pytest.fixture(scope="module")
def big_kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder: the document of 250 sections (so 250 chunks, section 3 holding ``<b>`` and ``&``) and a
    small one (tests/conftest.py: ``write_big_documents``), three FAQ entries in two groups; versions ``faq``
    (serves them) and ``plain`` (does not)."""
    d = tmp_path_factory.mktemp("big_kb")
    write_big_documents(d)
    (d / "faq").mkdir()
    (d / "faq" / "faq.jsonl").write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in FAQ_ENTRIES),
                                         encoding="utf-8")
    (d / "versions.yaml").write_text("defaults:\n  hnsw: {m: 8, ef_construction: 50, ef_search: 32}\n"
                                     "versions:\n  faq:\n    faq: {enabled: true}\n  plain:\n    description: no FAQ\n",
                                     encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def big(big_kb: Path, cache_dir: Path) -> Iterator[Callable[..., SandboxServer]]:
    """``big(release, version)``: a started server of :func:`big_kb`."""
    started: dict[tuple[str, str], SandboxServer] = {}

    def get(release: str = DEFAULT_RELEASE, version: str = "faq") -> SandboxServer:
        if (release, version) not in started:
            started[release, version] = SandboxServer(version, data_dir=big_kb, cache_dir=cache_dir, api_key=KEY,
                                                      weknora_version=release).start()
        return started[release, version]
    yield get
    for sb in started.values():
        sb.stop()


def every_chunk(sb: SandboxServer, kid: str, types: list[str] | None = None, page_size: int = 100) -> list[dict]:
    """All chunks of a knowledge, paged until ``total`` with repeated ``chunk_type`` parameters."""
    out: list[dict] = []
    page = 1
    while True:
        params: list[tuple[str, Any]] = [("page", page), ("page_size", page_size)]
        params += [("chunk_type", t) for t in types or []]
        body = call(sb, "GET", f"/api/v1/chunks/{kid}", params=params).json()
        assert body["page_size"] == min(page_size, 100)
        out += body["data"]
        if not body["data"] or len(out) >= body["total"]:
            return out
        page += 1


@pytest.mark.slow
@pytest.mark.contract("C52", "C54")
def test_a_knowledge_of_250_chunks_and_the_faq_chunks_are_all_listed(big):
    sb = big()
    long = every_chunk(sb, "big.long", ["text", "faq"])
    assert [c["chunk_index"] for c in long] == list(range(LONG_SECTIONS))
    assert len({c["id"] for c in long}) == LONG_SECTIONS
    assert len(every_chunk(sb, "big.long", page_size=500)) == LONG_SECTIONS  # asked 500, served 100 a page
    assert call(sb, "GET", "/api/v1/chunks/faq.account").json()["total"] == 0  # the default type is text
    account = every_chunk(sb, "faq.account", ["text", "faq"])
    assert [c["id"] for c in account] == ["faq-001", "faq-002"] and {c["chunk_type"] for c in account} == {"faq"}
    listed = 0
    for kb in call(sb, "GET", "/api/v1/knowledge-bases").json()["data"]:
        for k in call(sb, "GET", f"/api/v1/knowledge-bases/{kb['id']}/knowledge").json()["data"]:
            listed += len(every_chunk(sb, k["id"], ["text", "faq"]))
    assert listed == len(sb.sandbox.engine.index.chunks) == LONG_SECTIONS + 1 + len(FAQ_ENTRIES)


@pytest.mark.slow
@pytest.mark.contract("C45", "C46", "C49")
def test_faq_knowledge_base_and_faq_search(big):
    sb = big()
    kbs = {kb["id"]: kb for kb in call(sb, "GET", "/api/v1/knowledge-bases").json()["data"]}
    assert {k: kb["type"] for k, kb in kbs.items()} == {KB: "document", "kb-faq": "faq"}
    assert kbs["kb-faq"]["indexing_strategy"]["keyword_enabled"] is False and kbs["kb-faq"]["faq_config"]
    r = call(sb, "POST", "/api/v1/knowledge-bases/kb-faq/faq/search", json={"query_text": "忘记密码了怎么办",
                                                                             "vector_threshold": 0.1})
    entries = r.json()["data"]
    assert r.status_code == 200 and entries and entries[0]["chunk_id"] == "faq-001"
    assert set(entries[0]) >= {"id", "chunk_id", "knowledge_id", "knowledge_base_id", "tag_id", "tag_name",
                               "is_enabled", "is_recommended", "standard_question", "similar_questions",
                               "negative_questions", "answers", "answer_strategy", "index_mode", "created_at",
                               "updated_at", "score", "chunk_type", "matched_question"}
    assert "match_type" not in entries[0]  # 0 (vector) is omitempty
    assert entries[0]["answers"] == FAQ_ENTRIES[0]["answers"] and entries[0]["knowledge_base_id"] == "kb-faq"
    scores = [e["score"] for e in entries]
    assert scores == sorted(scores, reverse=True)
    err = envelope_error(call(sb, "POST", f"/api/v1/knowledge-bases/{KB}/faq/search", json={"query_text": "x"}),
                         1000)
    assert err["message"] == "仅 FAQ 知识库支持该操作"
    err = envelope_error(call(sb, "POST", "/api/v1/knowledge-bases/kb-faq/faq/search", json={}), 1000)
    assert err["message"] == "请求参数不合法" and "'required' tag" in err["details"]


@pytest.mark.slow
@pytest.mark.contract("C20", "C47")
def test_an_faq_knowledge_base_has_no_keyword_path(big):
    sb = big()
    r = call(sb, "POST", "/api/v1/knowledge-bases/kb-faq/hybrid-search",
             json={"query_text": "VPN 连不上怎么办", "match_count": 5, "skip_context_enrichment": True})
    data = r.json()["data"]
    assert data and {d["match_type"] for d in data} == {0} and {d["chunk_type"] for d in data} == {"faq"}
    kw = call(sb, "POST", "/api/v1/knowledge-bases/kb-faq/hybrid-search",
              json={"query_text": "VPN 连不上怎么办", "match_count": 5, "disable_vector_match": True})
    assert kw.json() == {"success": True, "data": None}


@pytest.mark.slow
def test_a_version_without_faq_serves_no_faq_knowledge_base(big):
    sb = big(version="plain")
    assert [kb["id"] for kb in call(sb, "GET", "/api/v1/knowledge-bases").json()["data"]] == [KB]
    assert envelope_error(call(sb, "GET", "/api/v1/chunks/faq.account"), 1003)
    assert envelope_error(call(sb, "GET", "/api/v1/chunks/by-id/faq-001"), 1003)
    assert envelope_error(call(sb, "POST", "/api/v1/knowledge-bases/kb-faq/faq/search", json={"query_text": "x"}),
                          1003)


@pytest.mark.slow
@pytest.mark.contract("C53")
@pytest.mark.parametrize("release", ALL)
def test_chunk_listings_escape_html_at_v06(big, release):
    sb = big(release)
    listed = call(sb, "GET", "/api/v1/chunks/by-id/big.long:003").json()["data"]["content"]
    page = call(sb, "GET", "/api/v1/chunks/big.long", params={"page_size": 5}).json()["data"]
    assert page[3]["content"] == listed
    method = "GET" if release == "v0.6.2" else "POST"
    hits = call(sb, method, f"/api/v1/knowledge-bases/{KB}/hybrid-search",
                json={"query_text": "timeout retry app.yaml", "match_count": 3, "skip_context_enrichment": True})
    found = next(d["content"] for d in hits.json()["data"] if d["id"] == "big.long:003")
    assert "<b>timeout</b> & retry" in found  # search results are never escaped
    if release in V06:
        assert "&lt;b&gt;timeout&lt;/b&gt; &amp; retry" in listed and "&#39;app.yaml&#39;" in listed
    else:
        assert listed == sb.sandbox.engine.index.chunks[sb.sandbox.engine.index.by_id["big.long:003"]].content
