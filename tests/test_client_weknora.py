"""The client and the collector against what WeKnora does (docs/weknora-contract.md), over real HTTP on loopback.

Two kinds of server: small stub servers that answer exactly as a contract fact says (for what
no sandbox release does: a server that lists fewer chunks than its total, gin's plain 404, a
stream whose references follow ``complete``), and the sandbox emulating each WeKnora release
(``SandboxServer(..., weknora_version=...)``), against which the whole collector runs.
Each test is marked with the facts it holds.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from weknora_nb import cli
from weknora_nb.collect import collect
from weknora_nb.collect.http.client import ClientSettings, WeKnoraClient
from weknora_nb.collect.run.inventory import content_escaping
from weknora_nb.collect.run.preflight import server_release
from weknora_nb.collect.run.stages import Stage, load_stage_file
from weknora_nb.core.errors import (
    AuthFailed,
    ConfigError,
    NotFound,
    RequestFailed,
    ServerFailed,
    UsageError,
)
from weknora_nb.core.run import read_manifest
from weknora_nb.core.testset import TestSet

from .conftest import BIG_SECTIONS, BIG_TITLE, write_big_documents

if TYPE_CHECKING:
    from weknora_nb.sandbox import SandboxServer

KEY = "sk-client-weknora-test-7a1c"


@pytest.fixture(autouse=True)
def key_in_env(monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    monkeypatch.delenv("WEKNORA_TENANT_ID", raising=False)


def fast(base_url: str, **kw: Any) -> ClientSettings:
    return ClientSettings(base_url, backoff_base_s=0.01, backoff_max_s=0.02, max_attempts=kw.pop("max_attempts", 3),
                          timeout_s=kw.pop("timeout_s", 5), **kw)


# -- stub servers ---------------------------------------------------------------------------------

class StubServer:
    """One uvicorn server on loopback for the module's stub servers, serving the routes :func:`serve` hands it:
    stopping a uvicorn server takes 0.2 s (its loop looks at ``should_exit`` every 0.1 s, then its shutdown
    pauses 0.1 s), which a server per test paid some 30 times."""

    def __init__(self) -> None:
        import uvicorn

        self.app: Starlette | None = None
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.asgi, interface="asgi3", log_level="warning",
                                                    lifespan="off", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    async def asgi(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.app is not None, "a request reached the stub server outside serve()"
        await self.app(scope, receive, send)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.sock.close()


_stub: StubServer | None = None


@pytest.fixture(scope="module", autouse=True)
def stub_server_stopped() -> Iterator[None]:
    """The module's stub server (started by the first :func:`serve`) stopped after its last test."""
    global _stub
    yield
    if _stub is not None:
        _stub.stop()
        _stub = None


@contextlib.contextmanager
def serve(routes: list[Route]) -> Iterator[str]:
    """Serve ``routes`` (a Starlette app: unknown paths are a plain-text 404, as gin's, C14) on loopback, on the
    module's stub server."""
    global _stub
    if _stub is None:
        _stub = StubServer()
    assert _stub.app is None, "one stub at a time"
    _stub.app = Starlette(routes=routes)
    try:
        yield _stub.url
    finally:
        _stub.app = None


def run(coro_fn: Callable[[WeKnoraClient], Any], base_url: str, **settings: Any) -> Any:
    """``coro_fn(client)`` run to its end with a client of ``base_url``."""
    import asyncio

    async def main() -> Any:
        async with WeKnoraClient(fast(base_url, **settings)) as c:
            return await coro_fn(c)
    return asyncio.run(main())


def failure(routes: list[Route], call: Callable[[WeKnoraClient], Any], **settings: Any) -> RequestFailed:
    """The :class:`RequestFailed` ``call(client)`` raises against a stub serving ``routes``."""
    with serve(routes) as url:
        try:
            run(call, url, **settings)
        except RequestFailed as exc:
            return exc
    raise AssertionError("the call did not fail")


def ok(data: Any, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": True, "data": data, **extra})


def app_error(status: int, code: int, message: str) -> JSONResponse:
    """C11: the handlers' error envelope."""
    return JSONResponse({"success": False, "error": {"code": code, "message": message, "details": None}},
                        status_code=status)


def chunk_listing(chunks: dict[str, list[dict[str, Any]]], *, cap: int = 100, lie_total: int = 0,
                  stuck: bool = False) -> Callable[[Request], Any]:
    """``GET /api/v1/chunks/{knowledge_id}`` as C52 says: page_size default 10, above 100 capped, chunk_type
    repeated or ``text``; ``lie_total`` adds to ``total``; ``stuck`` answers page 1 whatever is asked."""
    async def endpoint(request: Request) -> Response:
        kid = request.path_params["kid"]
        types = request.query_params.getlist("chunk_type") or ["text"]
        page = int(request.query_params.get("page", 1))
        size = int(request.query_params.get("page_size", 10))
        size = 10 if size < 1 else min(size, cap)
        rows = [c for c in chunks.get(kid, []) if c["chunk_type"] in types]
        start = 0 if stuck else (page - 1) * size
        return ok(rows[start:start + size], total=len(rows) + lie_total, page=page, page_size=size)
    return endpoint


def make_chunks(kid: str, n_text: int, n_faq: int = 0) -> list[dict[str, Any]]:
    rows = [{"id": f"{kid}-{i:03d}", "knowledge_id": kid, "chunk_index": i, "chunk_type": "text", "is_enabled": True,
             "content": f"text {i}"} for i in range(n_text)]
    rows += [{"id": f"faq-{i:03d}", "knowledge_id": kid, "chunk_index": i, "chunk_type": "faq", "is_enabled": i != 0,
              "content": f"Q{i}"} for i in range(n_faq)]
    return rows


# -- inventory paging (C50, C52, C54) ---------------------------------------------------------------

@pytest.mark.contract("C52", "C54")
def test_chunk_listing_pages_until_total_with_every_searchable_type():
    chunks = {"doc": make_chunks("doc", 250, 30)}
    with serve([Route("/api/v1/chunks/{kid}", chunk_listing(chunks))]) as url:
        got = run(lambda c: c.list_chunks("doc"), url)
        text_only = run(lambda c: c.list_chunks("doc", chunk_types=("text",)), url)
    assert len(got.items) == 280 and got.total == 280 and got.complete and got.pages == 3
    assert len({c["id"] for c in got.items}) == 280
    assert {c["chunk_type"] for c in got.items} == {"text", "faq"}
    assert len(text_only.items) == 250  # what a listing without chunk_type would have shown


@pytest.mark.contract("C52")
def test_a_server_with_a_smaller_cap_is_still_paged_to_total():
    chunks = {"doc": make_chunks("doc", 95)}
    with serve([Route("/api/v1/chunks/{kid}", chunk_listing(chunks, cap=20))]) as url:
        got = run(lambda c: c.list_chunks("doc"), url)
    assert len(got.items) == 95 and got.pages == 5 and got.complete


@pytest.mark.contract("C52")
@pytest.mark.parametrize("kind", ["total larger than the listing", "the same page forever"])
def test_a_listing_that_never_reaches_total_stops_safely(kind):
    chunks = {"doc": make_chunks("doc", 130)}
    endpoint = chunk_listing(chunks, lie_total=50) if kind.startswith("total") else chunk_listing(chunks, stuck=True)
    with serve([Route("/api/v1/chunks/{kid}", endpoint)]) as url:
        got = run(lambda c: c.list_chunks("doc"), url)
    assert not got.complete
    # each pass stops at the last page the total implies; a listing still short is read again (C101), 3 passes
    if kind.startswith("total"):
        assert len(got.items) == 130 and got.total == 180 and (got.pages, got.passes) == (6, 3)
    else:
        assert len(got.items) == 100 and (got.pages, got.passes) == (6, 3)


@pytest.mark.contract("C50")
def test_the_knowledge_list_asks_for_at_most_1000_per_page():
    asked = []

    async def knowledge(request: Request) -> Response:
        size = int(request.query_params["page_size"])
        asked.append(size)
        if size > 1000:  # C50: binding max=1000, a 400, never capped
            return app_error(400, 1000, "Invalid request parameters")
        page = int(request.query_params["page"])
        items = [{"id": f"k{i}", "title": f"K{i}", "parse_status": "completed"} for i in range(1500)]
        return ok(items[(page - 1) * size: page * size], total=1500, page=page, page_size=size)
    with serve([Route("/api/v1/knowledge-bases/{kb}/knowledge", knowledge)]) as url:
        got = run(lambda c: c.list_knowledge("kb", page_size=5000), url)
    assert len(got.items) == 1500 and asked == [1000, 1000]


# -- hybrid-search's method (C14, C15, C25) ---------------------------------------------------------

def hybrid_routes(*, post: str, seen: list[str]) -> list[Route]:
    """hybrid-search routed for GET only (v0.6.2); a POST gets gin's plain 404 (``post="404"``) or
    Starlette's 405 (``post="405"``); ``post="ok"`` routes both."""
    async def search(request: Request) -> Response:
        seen.append(request.method)
        body = json.loads(await request.body())  # C15: GET carries a JSON body too
        if body["match_count"] <= 0:
            return ok(None)
        return ok(None if body["query_text"] == "nothing" else [{"id": "c1", "score": 0.9, "match_type": 0}])

    async def no_route(request: Request) -> Response:
        seen.append(request.method)
        return PlainTextResponse("404 page not found", status_code=404)
    routes = [Route("/api/v1/knowledge-bases/{kb}/hybrid-search", search,
                    methods=["GET", "POST"] if post == "ok" else ["GET"])]
    if post == "404":
        routes.insert(0, Route("/api/v1/knowledge-bases/{kb}/hybrid-search", no_route, methods=["POST"]))
    return routes


@pytest.mark.contract("C14", "C15", "C25")
@pytest.mark.parametrize("post", ["404", "405"])
def test_hybrid_search_falls_back_to_get_once_and_remembers_it(post):
    seen: list[str] = []

    async def three(c: WeKnoraClient) -> Any:
        a = await c.hybrid_search("kb", "q", match_count=5)
        b = await c.hybrid_search("kb", "nothing", match_count=5)
        return a, b, c.hybrid_method
    with serve(hybrid_routes(post=post, seen=seen)) as url:
        first, empty, method = run(three, url)
    assert [r["id"] for r in first] == ["c1"] and empty == [] and method == "GET"
    # POST once, never again (Starlette's 405 is answered before the handler sees the request)
    assert seen == (["POST"] if post == "404" else []) + ["GET", "GET"]


@pytest.mark.contract("C15")
def test_hybrid_search_uses_post_where_it_is_routed():
    seen: list[str] = []
    with serve(hybrid_routes(post="ok", seen=seen)) as url:
        method = run(lambda c: _then(c.hybrid_search("kb", "q", match_count=5), lambda _: c.hybrid_method), url)
    assert method == "POST" and seen == ["POST"]


async def _then(awaitable: Any, after: Callable[[Any], Any]) -> Any:
    return after(await awaitable)


@pytest.mark.contract("C14", "C26")
def test_a_missing_knowledge_base_is_not_a_missing_route():
    seen: list[str] = []

    async def missing(request: Request) -> Response:
        seen.append(request.method)
        return app_error(404, 1003, "knowledge base not found")
    err = failure([Route("/api/v1/knowledge-bases/{kb}/hybrid-search", missing, methods=["GET", "POST"])],
                  lambda c: c.hybrid_search("kb", "q", match_count=5))
    assert isinstance(err, NotFound) and "code 1003" in str(err)
    assert err.code == 1003 and seen == ["POST"]  # no GET fallback, no retry


@pytest.mark.contract("C17")
@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True])
def test_a_hybrid_stage_without_a_positive_match_count_is_refused(value, tmp_path):
    with pytest.raises(UsageError, match="C17") as err:
        Stage("h", "hybrid-search", {"match_count": value})
    assert err.value.argument == "match_count of stage 'h'" and err.value.got == value
    p = tmp_path / "stages.yaml"
    p.write_text(f"stages:\n  h0:\n    endpoint: hybrid-search\n    params: {{match_count: {json.dumps(value)}}}\n")
    with pytest.raises(ConfigError) as cerr:
        load_stage_file(p)
    assert [(q.line, q.field) for q in cerr.value.problems] == [(4, "stages.h0.params.match_count")]
    assert "C17" in cerr.value.problems[0].message


@pytest.mark.contract("C17", "C45")
def test_match_count_is_always_sent():
    assert Stage("h", "hybrid-search").request_params()["match_count"] == 50
    assert Stage("h", "hybrid-search", {"match_count": 7}).request_params()["match_count"] == 7
    assert Stage("f", "faq-search").request_params() == {"match_count": 50, "vector_threshold": 0.7}  # C45
    assert Stage("k", "knowledge-search").request_params() == {}  # C27: no per-request settings


# -- errors from the envelope (C2, C4-C7, C11, C13, C28) ------------------------------------------------

def counted(response: Callable[[], Response], hits: list[int]) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        hits.append(1)
        return response()
    return endpoint


@pytest.mark.contract("C11", "C28")
def test_a_knowledge_search_error_names_its_envelope_code_and_is_retried():
    hits: list[int] = []
    fail = counted(lambda: app_error(500, 1007, "embedding service unavailable"), hits)
    err = failure([Route("/api/v1/knowledge-search", fail, methods=["POST"])],
                  lambda c: c.knowledge_search(["kb"], "q"), max_attempts=3)
    assert isinstance(err, ServerFailed) and err.code == 1007 and err.status == 500 and len(hits) == 3
    assert "HTTP 500 code 1007: embedding service unavailable" in str(err)


@pytest.mark.contract("C26", "C28")
def test_a_500_saying_the_knowledge_base_was_not_found_is_not_found_and_not_retried():
    hits: list[int] = []
    fail = counted(lambda: app_error(500, 1007, "search failed: knowledge base not found"), hits)
    err = failure([Route("/api/v1/knowledge-search", fail, methods=["POST"])],
                  lambda c: c.knowledge_search(["kb-x"], "q"), max_attempts=4)
    assert isinstance(err, NotFound) and err.kind == "not_found" and err.code == 1007 and len(hits) == 1


@pytest.mark.contract("C13")
def test_a_panic_body_is_a_server_failure_with_its_message():
    fail = counted(lambda: JSONResponse({"error": "Internal Server Error", "message": "slice bounds out of range"},
                                        status_code=500), [])
    err = failure([Route("/api/v1/knowledge-search", fail, methods=["POST"])],
                  lambda c: c.knowledge_search(["kb"], "q"), max_attempts=1)
    assert isinstance(err, ServerFailed) and "slice bounds out of range" in str(err)


AUTH_CASES = [
    # (status, body, tenant, the message's start, fact)
    (409, {"error": "Workspace required: platform API keys must send X-Tenant-ID", "code": "TENANT_REQUIRED"},
     None, "this is a platform key: pass --tenant-id", "C4"),
    (400, {"error": "Invalid X-Tenant-ID header"}, "abc", "the tenant is not valid (--tenant-id abc)", "C5"),
    (403, {"error": "Forbidden: workspace API key cannot switch workspaces"}, "7",
     "wrong tenant: the API key cannot act in the workspace of --tenant-id 7", "C5"),
    (401, {"error": "Unauthorized: invalid API key"}, "99", "the server rejected the API key, or --tenant-id 99 "
     "names no workspace", "C5"),
    (401, {"error": "Unauthorized: invalid API key"}, None, "the server rejected the API key.", "C2"),
    (403, {"error": "Forbidden: API key scope does not allow this operation"}, None,
     "the API key lacks the capability 'retrieve' that GET /api/v1/knowledge-bases/kb needs", "C6"),
    (403, {"success": False, "error": {"code": 1002, "message": "forbidden"}}, None,
     "the API key may not access this knowledge base", "C7"),
]


@pytest.mark.contract("C2", "C4", "C5", "C6", "C7")
@pytest.mark.parametrize("status, body, tenant, message, fact", AUTH_CASES, ids=[c[3][:30] for c in AUTH_CASES])
def test_auth_refusals_say_what_to_do(status, body, tenant, message, fact):
    hits: list[int] = []
    refuse = counted(lambda: JSONResponse(body, status_code=status), hits)
    err = failure([Route("/api/v1/knowledge-bases/{kb}", refuse)], lambda c: c.knowledge_base("kb"),
                  tenant_id=tenant)
    assert isinstance(err, AuthFailed) and str(err).startswith(message), str(err)
    assert err.status == status and len(hits) == 1 and KEY not in str(err)


@pytest.mark.contract("C7")
@pytest.mark.parametrize("path, capability", [
    ("/api/v1/sessions", "chat"), ("/api/v1/knowledge-chat/s1", "chat"), ("/api/v1/knowledge-search", "retrieve"),
    ("/api/v1/chunks/k1", "retrieve"), ("/api/v1/knowledge-bases/kb/faq/search", "retrieve"),
    ("/api/v1/tenants/kv/retrieval-config", "manage_tenant_settings"), ("/api/v1/system/info", "manage_vector_stores"),
    ("/api/v1/messages/search", "message_history"), ("/api/v1/messages/s1/load", "chat"),
])
def test_each_endpoint_names_the_capability_it_needs(path, capability):
    from weknora_nb.collect.http.envelope import capability_for

    assert capability_for(path) == capability


# -- chat stream (C62-C65) ----------------------------------------------------------------------------

def chat_routes(events: list[dict[str, Any]], sessions: dict[str, Any]) -> list[Route]:
    async def create(request: Request) -> Response:
        body = json.loads(await request.body())
        sid = f"s{len(sessions) + 1}"
        sessions[sid] = {"create": body}
        return JSONResponse({"success": True, "data": {"id": sid, "title": body["title"]}}, status_code=201)

    async def chat(request: Request) -> Response:
        sessions[request.path_params["sid"]]["chat"] = json.loads(await request.body())

        async def stream() -> Any:
            for ev in events:  # C62: event:message, data:<json> with no space
                yield b"event:message\ndata:" + json.dumps(ev).encode() + b"\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")

    async def delete(request: Request) -> Response:
        sessions[request.path_params["sid"]]["deleted"] = True
        return JSONResponse({"success": True, "message": "Session deleted successfully"})  # C10: no data
    return [Route("/api/v1/sessions", create, methods=["POST"]),
            Route("/api/v1/sessions/{sid}", delete, methods=["DELETE"]),
            Route("/api/v1/knowledge-chat/{sid}", chat, methods=["POST"])]


@pytest.mark.contract("C58", "C59", "C60", "C62", "C63", "C64", "C65")
def test_chat_reads_references_that_follow_complete_and_unescapes_citations():
    refs = [{"id": "c1", "score": 0.8}, {"id": "c&2", "score": 0.5}]
    events = [{"response_type": "agent_query", "done": True},
              {"response_type": "answer", "content": 'A <kb doc="D" chunk_id="c1" kb_id="kb" /> and ', "done": False},
              {"response_type": "answer", "content": 'B <kb doc="E" chunk_id="c&amp;2" />', "done": True},
              {"response_type": "complete", "done": True},
              {"response_type": "references", "knowledge_references": refs, "done": False}]
    sessions: dict[str, Any] = {}

    async def chat_and_delete(c: WeKnoraClient) -> Any:
        result = await c.chat(["kb"], "q", title="weknora-nb t")
        await c.delete_session(result.session_id)
        return result
    with serve(chat_routes(events, sessions)) as url:
        result = run(chat_and_delete, url)
    assert [r["id"] for r in result.references] == ["c1", "c&2"]
    assert result.citations == ["c1", "c&2"] and result.answer.startswith("A <kb")
    s = sessions["s1"]
    assert s["create"] == {"title": "weknora-nb t", "description": "created by weknora-nb"}  # C58
    assert s["chat"]["disable_title"] is True and s["chat"]["knowledge_base_ids"] == ["kb"]  # C60/C61
    assert s["deleted"] is True


@pytest.mark.contract("C63", "C64")
def test_a_chat_without_references_or_citations_is_an_empty_list_not_a_failure():
    events = [{"response_type": "answer", "content": "no tags at v0.6", "done": True},
              {"response_type": "complete", "done": True}]
    with serve(chat_routes(events, {})) as url:
        result = run(lambda c: c.chat(["kb"], "q"), url)
    assert result.references == [] and result.citations == [] and result.answer == "no tags at v0.6"


# -- system/info, the retrieval config, server versions (C10, C30, C53, C56, C57) ---------------------

@pytest.mark.contract("C10", "C56")
def test_system_info_is_read_from_its_own_envelope():
    info = {"version": "0.7.2", "edition": "standard", "keyword_index_engine": "postgres",
            "vector_store_engine": "postgres"}
    with serve([Route("/api/v1/system/info", lambda r: JSONResponse({"code": 0, "msg": "success", "data": info}))]) \
            as url:
        assert run(lambda c: c.system_info(), url) == info


@pytest.mark.contract("C56")
def test_server_versions_are_release_lines():
    assert server_release("0.7.2") == (0, 7, 2) and server_release("v0.6.3") == (0, 6, 3)
    assert server_release("unknown") is None and server_release(None) is None


@pytest.mark.contract("C53")
def test_escaped_content_is_recognised():
    assert content_escaping(["a &lt;b&gt;", "x"], "0.6.2")["escaped"] is True
    assert content_escaping(["a <b>"], "0.7.2")["escaped"] is False
    assert content_escaping(["Tom&#39;s &amp; co", "1 &lt; 2"], None)["escaped"] is True
    assert content_escaping(["Tom's & co", "1 &lt; 2"], None)["escaped"] is False
    assert content_escaping(["plain"], None)["escaped"] is False


# -- the collector on a stub WeKnora (C26, C49, C20/C47) -----------------------------------------------

QUERIES = TestSet.from_records([{"query_id": f"q{i}", "query": f"question {i}", "relevant": {"c1": 1}}
                                for i in range(3)])


def stub_weknora(kb_type: str = "document", *, missing: bool = False) -> list[Route]:
    """The endpoints a small collection needs, as the contract says; one knowledge base ``kb``."""
    def kb(request: Request) -> Response:
        if missing or request.path_params["kb"] != "kb":
            return app_error(404, 1003, "knowledge base not found")  # C26
        return ok({"id": "kb", "name": "KB", "type": kb_type, "chunking_config": {"chunk_size": 512},
                   "embedding_model_id": "m-emb", "indexing_strategy": {"vector_enabled": True,
                                                                         "keyword_enabled": kb_type != "faq"}})

    async def search(request: Request) -> Response:
        return ok([{"id": "c1", "score": 0.9, "match_type": 0, "knowledge_id": "k1", "chunk_index": 0}])

    async def faq(request: Request) -> Response:
        return ok([{"id": 1, "chunk_id": "c1", "knowledge_id": "k1", "score": 0.95, "matched_question": "Q?"}])
    return [Route("/api/v1/knowledge-bases/{kb}", kb),
            Route("/api/v1/knowledge-bases/{kb}/hybrid-search", search, methods=["GET", "POST"]),
            Route("/api/v1/knowledge-bases/{kb}/faq/search", faq, methods=["POST"]),
            Route("/api/v1/knowledge-search", search, methods=["POST"]),
            Route("/api/v1/tenants/kv/retrieval-config", lambda r: ok({
                "embedding_top_k": 0, "vector_threshold": 0, "keyword_threshold": 0, "rerank_top_k": 0,
                "rerank_threshold": 0, "rerank_model_id": ""})),
            Route("/api/v1/knowledge-bases/{kb}/knowledge", lambda r: ok([], total=0, page=1, page_size=1000))]


@pytest.mark.contract("C26", "C49")
def test_a_missing_knowledge_base_stops_the_collection_before_anything_is_written(tmp_path):
    with serve(stub_weknora(missing=True)) as url, \
            pytest.raises(NotFound, match="knowledge base 'kb' not found on this server"):
        collect(fast(url), "kb", QUERIES, tmp_path / "run", repeats=1, warmup=0, progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.contract("C20", "C45", "C46", "C47", "C49")
def test_an_faq_knowledge_base_gets_an_faq_stage_and_no_keyword_stage(tmp_path):
    with serve(stub_weknora("faq")) as url:
        s = collect(fast(url), "kb", QUERIES, tmp_path / "run", repeats=1, warmup=0, progress=False)
        with pytest.raises(UsageError, match="keyword path, which FAQ knowledge bases do not have"):
            collect(fast(url), "kb", QUERIES, tmp_path / "other", stages="keyword,final", repeats=1, progress=False)
    assert s.complete and list(s.counts) == ["vector", "hybrid", "final", "faq"]
    m = read_manifest(tmp_path / "run")
    assert any("keyword dropped" in n for n in m["notes"]) and any("faq added" in n for n in m["notes"])
    assert m["stages"]["faq"]["settings_source"] == "request" and m["knowledge_bases"]["kb"]["type"] == "faq"
    ckpt = [json.loads(x) for x in (tmp_path / "run" / "checkpoint.jsonl").read_text().splitlines()]
    faq = [r for r in ckpt if r["stage"] == "faq"]
    assert all(r["rows"][0][1] == "c1" and r["matched_questions"] == ["Q?"] for r in faq)
    assert not (tmp_path / "other").exists()


@pytest.mark.contract("C11", "C26", "C28")
def test_failed_requests_record_the_envelopes_code_and_message(tmp_path):
    hits: list[int] = []

    async def failing(request: Request) -> Response:
        hits.append(1)
        query = json.loads(await request.body())["query"]
        if query.endswith("0"):
            return app_error(500, 1007, "search failed: knowledge base not found")
        return app_error(500, 1007, "rerank model unavailable")
    routes = [Route("/api/v1/knowledge-search", failing, methods=["POST"]), *stub_weknora()]
    with serve(routes) as url:
        s = collect(fast(url, max_attempts=2), "kb", QUERIES, tmp_path / "run", stages="final", repeats=1, warmup=0,
                    progress=False, inventory=False)
    recs = {json.loads(x)["query_id"]: json.loads(x) for x in
            (tmp_path / "run" / "checkpoint.jsonl").read_text().splitlines()}
    assert not s.complete and s.counts["final"] == {"ok": 0, "not_found": 1, "server": 2}
    assert recs["q0"]["status"] == "not_found" and recs["q1"]["status"] == "server"
    assert all(r["error_code"] == 1007 and r["http_status"] == 500 for r in recs.values())
    assert "code 1007: rerank model unavailable" in recs["q1"]["error"]
    assert len(hits) == 1 + 1 + 2 * 2  # probe (q0, not retried), then q0 once and q1, q2 twice each


@pytest.mark.contract("C29", "C30", "C49", "C57")
def test_an_unset_retrieval_config_is_recorded_with_the_effective_settings(tmp_path):
    with serve(stub_weknora()) as url:
        collect(fast(url), "kb", QUERIES, tmp_path / "run", stages="final", repeats=1, warmup=0, progress=False,
                system={"chunking": {"strategy": "headings"}, "embedding": {"model_id": "mine"}})
    m = read_manifest(tmp_path / "run")
    eff = m["retrieval_config"]["effective"]
    assert m["retrieval_config"]["raw"]["vector_threshold"] == 0
    assert (eff["vector_threshold"], eff["keyword_threshold"], eff["rerank_threshold"]) == (0.15, 0.3, 0.2)
    assert eff["rerank_top_k"] == 10 and eff["embedding_top_k"] == 50 and eff["rerank_model"] == "first registered"
    assert m["system"]["chunking"] == {"chunk_size": 512, "strategy": "headings"}
    assert m["system"]["embedding"] == {"model_id": "mine"}
    assert m["system_sources"] == {"chunking.chunk_size": "server", "chunking.strategy": "user",
                                   "embedding.model_id": "user over server", "knowledge_base.type": "server",
                                   "indexing.vector_enabled": "server", "indexing.keyword_enabled": "server"}
    assert m["server"]["error"].startswith("not_found")  # the stub has no /system/info: recorded, not fatal
    assert m["stages"]["final"]["settings_source"] == "tenant retrieval config"


@pytest.mark.contract("C51", "C52", "C54", "C55")
def test_the_inventory_records_chunk_type_enabled_and_parse_status(tmp_path):
    chunks = {"k1": make_chunks("k1", 3, 2)}

    async def knowledge(request: Request) -> Response:
        return ok([{"id": "k1", "title": "K1", "parse_status": "completed"}], total=1, page=1, page_size=1000)
    routes = [Route("/api/v1/knowledge-bases/{kb}/knowledge", knowledge),  # first match wins
              Route("/api/v1/chunks/{kid}", chunk_listing(chunks)), *stub_weknora()]
    with serve(routes) as url:
        collect(fast(url), "kb", QUERIES, tmp_path / "run", stages="final", repeats=1, warmup=0, progress=False)
    inv = pd.read_parquet(tmp_path / "run" / "chunks.parquet")
    assert list(inv.columns) == ["chunk_id", "knowledge_base_id", "knowledge_id", "knowledge_title", "chunk_index",
                                 "chunk_type", "parent_chunk_id", "is_enabled", "index_status", "parse_status",
                                 "content"]
    assert inv["chunk_type"].tolist() == ["text"] * 3 + ["faq"] * 2 and inv["is_enabled"].sum() == 4
    assert set(inv["parse_status"]) == {"completed"}
    m = read_manifest(tmp_path / "run")
    assert m["inventory"]["chunk_types"] == {"text": 3, "faq": 2} and m["inventory"]["disabled"] == 1


# -- the collector on the sandbox, release by release (C3-C7, C15, C25, C52, C53, C58-C66) ------------

RELEASES = ("v0.6.2", "v0.6.3", "v0.7.2", "main")
MINI = Path(__file__).parent / "fixtures" / "mini_kb"
MINI_QUERIES = TestSet.from_records(
    [{"query_id": f"m{i}", "query": q, "relevant": {}} for i, q in enumerate(
        ["忘记管理员密码怎么办", "账号锁定多久", "VPN 连接失败 ZL-201", "管理 API 限流多少", "熔断多久恢复"])])
ALL_STAGES = "vector,keyword,hybrid,final,citations"


@pytest.fixture(scope="module")
def cache(embedding_cache):
    return embedding_cache


@contextlib.contextmanager
def sandbox(release: str, cache: Path, **kw: Any) -> Iterator[SandboxServer]:
    from weknora_nb.sandbox import SandboxServer

    with SandboxServer(kw.pop("version", "rerank"), data_dir=kw.pop("data_dir", MINI), cache_dir=cache, api_key=KEY,
                       weknora_version=release, **kw) as sb:
        yield sb


@pytest.fixture(scope="module")
def release_runs(tmp_path_factory, cache) -> dict[str, tuple[Any, Path]]:
    """Per release: a small collection of every default stage plus citations (its summary and folder)."""
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WEKNORA_API_KEY", KEY)
        for release in RELEASES:
            with sandbox(release, cache) as sb:
                out = tmp_path_factory.mktemp(release) / "run"
                s = collect(fast(sb.base_url), sb.kb_id, MINI_QUERIES, out, stages=ALL_STAGES, repeats=1, warmup=1,
                            progress=False)
                runs[release] = (s, out)
    return runs


@pytest.mark.contract("C15", "C56", "C58", "C59", "C60", "C65", "C66")
@pytest.mark.parametrize("release", RELEASES)
def test_the_collector_passes_on_each_release(release_runs, release):
    s, out = release_runs[release]
    assert s.complete and s.n_requests == 5 * 5
    assert all(c == {"ok": 5} for c in s.counts.values()), s.counts
    m = read_manifest(out)
    methods = {n: d.get("method") for n, d in m["stages"].items() if d["endpoint"] == "hybrid-search"}
    assert set(methods.values()) == {"GET" if release == "v0.6.2" else "POST"}
    assert m["stages"]["citations"]["settings_source"] == "agent configuration (builtin-quick-answer)"  # C103
    assert m["stages"]["final"]["settings_source"] == "tenant retrieval config"
    assert m["stages"]["hybrid"]["settings_source"] == "request"
    assert any(n.startswith("final and citations run different settings") for n in m["notes"])
    # one session per chat request and one for the probe, every one deleted
    assert m["sessions"] == {"created": 5 + 1 + 1, "deleted": 5 + 1 + 1, "kept": False}  # + the warm-up's
    cited = m["stages"]["citations"]["inline_citations"]
    if release.startswith("v0.6"):  # C65: no server-made citations before v0.7.2
        assert cited["with_citations"] == 0 and any("no inline citations" in n for n in m["notes"])
    else:
        assert cited["with_citations"] == cited["answers"] == 5
    assert m["server"].get("version") and "error" not in m["server"]
    assert m["inventory"]["chunks"] > 0 and m["inventory"]["content"]["escaped"] is release.startswith("v0.6")


@pytest.mark.contract("C15", "C18", "C19", "C20", "C21")
def test_hybrid_stages_give_the_same_figures_on_every_release_since_v0_6_3(release_runs):
    from weknora_nb import read_results

    def hybrid_rows(release: str) -> pd.DataFrame:
        df = read_results(release_runs[release][1] / "results.parquet")
        df = df[df["stage"].isin(["vector", "keyword", "hybrid"])]
        return df[["query_id", "stage", "rank", "chunk_id", "score"]].reset_index(drop=True)
    base = hybrid_rows("v0.7.2")
    assert len(base) > 0
    for release in ("v0.6.3", "main"):
        pd.testing.assert_frame_equal(hybrid_rows(release), base)


@pytest.mark.contract("C52", "C53")
def test_the_inventory_is_the_same_on_every_release(release_runs):
    frames = {r: pd.read_parquet(out / "chunks.parquet") for r, (_, out) in release_runs.items()}
    for release in RELEASES:   # index_status: from v0.7.2 only (C55)
        assert frames[release]["index_status"].isna().all() == release.startswith("v0.6")
        pd.testing.assert_frame_equal(frames[release].drop(columns="index_status"),
                                      frames["v0.7.2"].drop(columns="index_status"))


@pytest.mark.contract("C30", "C56", "C57", "C66")
def test_a_run_reads_the_servers_facts_from_new_and_old_manifests(release_runs, tmp_path):
    import shutil

    from weknora_nb.core.run import load_run

    run = load_run(release_runs["v0.7.2"][1], testset=MINI_QUERIES)
    m = run.manifest
    kb = m["target"]["knowledge_base_ids"][0]
    assert run.server == m["server"] and run.server["version"] and run.knowledge_bases[kb]["type"] == "document"
    assert run.retrieval_config == m["retrieval_config"]["raw"]
    assert run.effective_retrieval_config == m["retrieval_config"]["effective"]
    assert [run.settings_source(s) for s in ("vector", "final", "citations", "nosuch")] == [
        "request", "tenant retrieval config", "agent configuration (builtin-quick-answer)", None]
    assert run.sessions == {"created": 7, "deleted": 7, "kept": False} and run.notes == m["notes"]
    # a manifest written before these keys: the config as read, stages without their settings source
    old = tmp_path / "old"
    shutil.copytree(release_runs["v0.7.2"][1], old)
    zeros = {k: 0 for k in ("embedding_top_k", "vector_threshold", "keyword_threshold", "rerank_top_k",
                            "rerank_threshold")}
    legacy = {k: v for k, v in m.items() if k not in ("server", "knowledge_bases", "sessions", "notes")}
    legacy["retrieval_config"] = {**zeros, "rerank_model_id": ""}
    legacy["stages"] = {n: {k: d[k] for k in ("endpoint", "params", "keep_match_types")}
                        for n, d in m["stages"].items()}
    (old / "manifest.json").write_text(json.dumps(legacy))
    run = load_run(old, testset=MINI_QUERIES)
    assert run.retrieval_config == {**zeros, "rerank_model_id": ""}
    eff = run.effective_retrieval_config
    assert (eff["vector_threshold"], eff["keyword_threshold"], eff["rerank_threshold"]) == (0.15, 0.3, 0.2)
    assert run.settings_source("citations") == "server conversation config" and run.settings_source("hybrid") \
        == "request"
    assert run.server is None and run.knowledge_bases == {} and run.sessions is None and run.notes == []
    legacy["retrieval_config"] = {"unavailable": "auth: HTTP 403"}
    (old / "manifest.json").write_text(json.dumps(legacy))
    run = load_run(old, testset=MINI_QUERIES)
    assert run.retrieval_config is None and run.effective_retrieval_config is None


# -- a knowledge of 250 chunks, FAQ chunks, an unset tenant config (C30, C45-C47, C50-C57) -----------------

FAQ_ENTRIES = [{"id": f"faq-{i:03d}", "group": "g1" if i <= 6 else "g2", "standard_question": f"参数 P{i} 怎么设置？",
                "similar_questions": [f"P{i} 的默认值"], "negative_questions": [],
                "answers": [f"P{i} 默认为 {i * 3}。"]} for i in range(1, 13)]


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """A data folder: the document of 250 chunks (one per section) and a small one (tests/conftest.py:
    ``write_big_documents``), 12 FAQ entries in two groups; versions ``plain`` and ``faq`` (no rerank model,
    no saved tenant config)."""
    root = tmp_path_factory.mktemp("big")
    write_big_documents(root)
    (root / "faq").mkdir()
    (root / "faq" / "faq.jsonl").write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in FAQ_ENTRIES),
                                             encoding="utf-8")
    (root / "versions.yaml").write_text("defaults:\n  hnsw: {m: 8, ef_construction: 50, ef_search: 32}\n"
                                        "versions:\n  plain:\n    description: documents only\n"
                                        "  faq:\n    description: with the FAQ knowledge base\n"
                                        "    faq: {enabled: true}\n", encoding="utf-8")
    return root


BIG_QUERIES = TestSet.from_records([{"query_id": "b1", "query": "参数 P7 怎么设置", "relevant": {"big.long:007": 1}},
                                    {"query_id": "b2", "query": "P200 的默认值", "relevant": {"big.long:200": 1}}])


@pytest.fixture(scope="module")
def big_runs(tmp_path_factory, cache, big_corpus) -> dict[str, Path]:
    """Per release (v0.6.2 escapes listings, v0.7.2 does not): the default stages over the document and the
    FAQ knowledge base."""
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WEKNORA_API_KEY", KEY)
        for release in ("v0.6.2", "v0.7.2"):
            with sandbox(release, cache, version="faq", data_dir=big_corpus) as sb:
                out = tmp_path_factory.mktemp(f"big-{release}") / "run"
                collect(fast(sb.base_url), [sb.kb_id, sb.faq_kb_id], BIG_QUERIES, out, repeats=1, warmup=0,
                        progress=False)
                runs[release] = out
    return runs


@pytest.mark.slow
@pytest.mark.contract("C50", "C52", "C53", "C54", "C55")
@pytest.mark.parametrize("release", ["v0.6.2", "v0.7.2"])
def test_a_knowledge_of_250_chunks_and_the_faq_chunks_are_inventoried_whole(big_runs, release):
    inv = pd.read_parquet(big_runs[release] / "chunks.parquet")
    assert inv["chunk_type"].value_counts().to_dict() == {"text": BIG_SECTIONS + 1, "faq": 12}  # + big.short
    assert inv["chunk_id"].is_unique and {f"big.long:{i:03d}" for i in range(BIG_SECTIONS)} <= set(inv["chunk_id"])
    assert {e["id"] for e in FAQ_ENTRIES} <= set(inv["chunk_id"])
    assert inv.loc[inv["chunk_type"] == "text", "knowledge_id"].value_counts().to_dict() == {"big.long": BIG_SECTIONS,
                                                                                            "big.short": 1}
    assert inv["parse_status"].eq("completed").all() and inv["is_enabled"].all()
    # the content as written, whether or not the server escaped it (C53)
    text = inv.set_index("chunk_id")["content"]
    assert BIG_TITLE.format(i=7) in text["big.long:007"] and "&lt;" not in "".join(text)
    m = read_manifest(big_runs[release])
    assert m["inventory"]["content"]["escaped"] is (release == "v0.6.2")
    assert "incomplete" not in m["inventory"] and "failed" not in m["inventory"]
    # every label lies in the inventory
    assert set(BIG_QUERIES.qrels["chunk_id"]) <= set(inv["chunk_id"])


@pytest.mark.slow
@pytest.mark.contract("C29", "C30", "C57")
def test_an_unset_tenant_config_shows_weknoras_effective_thresholds(big_runs):
    m = read_manifest(big_runs["v0.7.2"])
    raw, eff = m["retrieval_config"]["raw"], m["retrieval_config"]["effective"]
    assert all(raw[k] == 0 for k in ("embedding_top_k", "vector_threshold", "keyword_threshold", "rerank_top_k",
                                     "rerank_threshold"))
    assert (eff["vector_threshold"], eff["keyword_threshold"], eff["rerank_threshold"]) == (0.15, 0.3, 0.2)
    assert (eff["embedding_top_k"], eff["rerank_top_k"], eff["rerank_threshold_assumed"]) == (50, 10, True)


@pytest.mark.slow
@pytest.mark.contract("C20", "C45", "C46", "C47", "C49")
def test_a_run_over_a_document_and_an_faq_knowledge_base(big_runs):
    m = read_manifest(big_runs["v0.7.2"])
    assert list(m["stages"]) == ["vector", "keyword", "hybrid", "final", "faq"]
    assert [m["knowledge_bases"][kb]["type"] for kb in m["target"]["knowledge_base_ids"]] == ["document", "faq"]
    assert any("measures the document knowledge bases only" in n for n in m["notes"])
    assert m["status"] == "complete"


@pytest.mark.slow
@pytest.mark.contract("C20", "C45", "C46", "C47")
def test_an_faq_only_run_has_no_keyword_stage(tmp_path, cache, big_corpus):
    with sandbox("v0.7.2", cache, version="faq", data_dir=big_corpus) as sb:
        s = collect(fast(sb.base_url), sb.faq_kb_id, BIG_QUERIES, tmp_path / "run", repeats=1, warmup=0,
                    progress=False, inventory=False)
        with pytest.raises(UsageError, match="C20/C47"):
            collect(fast(sb.base_url), sb.faq_kb_id, BIG_QUERIES, tmp_path / "kw", stages="keyword", repeats=1,
                    progress=False)
    assert s.complete and list(s.counts) == ["vector", "hybrid", "final", "faq"]
    ckpt = [json.loads(x) for x in (tmp_path / "run" / "checkpoint.jsonl").read_text().splitlines()]
    faq = {r["query_id"]: r for r in ckpt if r["stage"] == "faq"}
    assert faq["b1"]["rows"][0][1] == "faq-007" and faq["b1"]["matched_questions"][0]
    assert all(row[1].startswith("faq-") for r in faq.values() for row in r["rows"])
    m = read_manifest(tmp_path / "run")
    assert any(n.startswith("stage keyword dropped") for n in m["notes"])
    assert not (tmp_path / "kw").exists()


# -- keys, tenants, capabilities, knowledge bases on the sandbox (C3-C7, C26) ----------------------------------

PLATFORM, RETRIEVE_ONLY = "sk-platform-test-91c", "sk-retrieve-only-3e8"
KEYS = {PLATFORM: {"kind": "platform", "capabilities": ["retrieve", "chat"]},
        RETRIEVE_ONLY: {"kind": "workspace", "capabilities": ["retrieve"]}}


@pytest.fixture(scope="module")
def keyed(cache) -> Iterator[SandboxServer]:
    with sandbox("v0.7.2", cache, api_keys=KEYS, allow_fault_control=True) as sb:
        yield sb


@pytest.fixture
def cli_collect(tmp_path: Path, capsys, monkeypatch) -> Callable[..., tuple[int, str]]:
    """``cli_collect(sb, key, *extra)``: ``weknora-nb collect`` of the mini test set from ``sb`` with ``key`` (from
    the environment, as a user gives it), run in this process by :func:`weknora_nb.cli.main`: its exit code and
    what it wrote to standard error (the command as a process of its own, tracebacks included: test_cli)."""
    def run(sb: SandboxServer, key: str, *extra: str) -> tuple[int, str]:
        ts = tmp_path / "t.jsonl"
        MINI_QUERIES.to_jsonl(ts)
        args = ["collect", "--base-url", sb.base_url, "--testset", str(ts), "--repeats", "1", "--warmup", "0",
                "--quiet", "--max-attempts", "2", *extra]
        if "--kb-id" not in extra:
            args += ["--kb-id", sb.kb_id]
        if "--out" not in extra:
            args += ["--out", str(tmp_path / "run")]
        monkeypatch.setenv("WEKNORA_API_KEY", key)
        capsys.readouterr()
        code = cli.main(args)
        return code, capsys.readouterr().err
    return run


@pytest.mark.contract("C4")
def test_a_platform_key_without_tenant_stops_with_one_line(tmp_path, keyed, cli_collect):
    code, err = cli_collect(keyed, PLATFORM, "--stages", "final")
    assert code == 2 and err.startswith("error: this is a platform key: pass --tenant-id")
    assert err.count("\n") == 1 and "Traceback" not in err and PLATFORM not in err
    assert not (tmp_path / "run").exists()
    code, err = cli_collect(keyed, PLATFORM, "--stages", "final", "--tenant-id", "1")
    assert code == 0, err


@pytest.mark.contract("C5")
@pytest.mark.parametrize("key, tenant, message", [
    (KEY, "2", "error: wrong tenant: the API key cannot act in the workspace of --tenant-id 2"),  # 403
    (KEY, "x", "error: the tenant is not valid (--tenant-id x)"),  # 400
    (PLATFORM, "99", "error: the server rejected the API key, or --tenant-id 99 names no workspace"),  # 401
])
def test_a_wrong_tenant_stops_with_one_line(tmp_path, keyed, key, tenant, message, cli_collect):
    code, err = cli_collect(keyed, key, "--stages", "final", "--tenant-id", tenant)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.contract("C6", "C7")
def test_a_key_without_a_capability(tmp_path, keyed, cli_collect):
    # retrieve only: the collection runs, system/info and the tenant config are recorded as refused
    code, err = cli_collect(keyed, RETRIEVE_ONLY, "--stages", "final")
    assert code == 0, err
    m = read_manifest(tmp_path / "run")
    assert "manage_vector_stores" in m["server"]["error"] and "manage_tenant_settings" in m["retrieval_config"]["error"]
    assert m["retrieval_config"]["effective"] is None
    # the chat stage needs 'chat': stopped by the probe, before any request is recorded
    code, err = cli_collect(keyed, RETRIEVE_ONLY, "--stages", "final,citations", "--out",
                            str(tmp_path / "chat"))
    assert code == 2 and err.startswith("error: the API key lacks the capability 'chat' that POST /api/v1/sessions")
    m = read_manifest(tmp_path / "chat")
    assert m["status"] == "stopped" and "chat" in m["stopped_by"]
    assert not (tmp_path / "chat" / "checkpoint.jsonl").exists()


@pytest.mark.contract("C26")
def test_an_unknown_knowledge_base_stops_with_one_line(tmp_path, keyed, cli_collect):
    code, err = cli_collect(keyed, KEY, "--kb-id", "kb-nope")
    assert code == 2 and err.startswith("error: knowledge base 'kb-nope' not found on this server") \
        and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.contract("C58", "C59")
@pytest.mark.parametrize("keep", [False, True])
def test_sessions_are_deleted_unless_kept(tmp_path, keyed, keep):
    import httpx

    s = collect(fast(keyed.base_url), keyed.kb_id, MINI_QUERIES, tmp_path / "run", stages="citations", repeats=1,
                warmup=0, progress=False, inventory=False, keep_sessions=keep)
    assert s.complete
    m = read_manifest(tmp_path / "run")
    assert m["sessions"] == {"created": 6, "deleted": 0 if keep else 6, "kept": keep}
    ckpt = [json.loads(x) for x in (tmp_path / "run" / "checkpoint.jsonl").read_text().splitlines()]
    for rec in ckpt:
        got = httpx.get(f"{keyed.base_url}/api/v1/sessions/{rec['session_id']}", headers={"X-API-Key": KEY})
        assert got.status_code == (200 if keep else 404)


@pytest.mark.contract("C15")
def test_a_resumed_run_keeps_the_method_hybrid_search_answered_to(tmp_path, cache):
    with sandbox("v0.6.2", cache) as sb:
        one = MINI_QUERIES.subset(["m0"])
        collect(fast(sb.base_url), sb.kb_id, one, tmp_path / "run", stages="hybrid", repeats=1, warmup=0,
                progress=False, inventory=False)
        s = collect(fast(sb.base_url), sb.kb_id, one, tmp_path / "run", stages="hybrid", repeats=1, warmup=0,
                    progress=False, inventory=False, resume=True)
    assert s.n_requests == 0 and read_manifest(tmp_path / "run")["stages"]["hybrid"]["method"] == "GET"
