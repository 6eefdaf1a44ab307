"""A small WeKnora on loopback whose answers have the shapes WeKnora Lite v0.7.2 gave when it was run by hand
(the recordings of issue 45; the contract facts C100-C109 say where each comes from): a parent-child knowledge
base (``parent_text`` parents listed only when asked for, children carrying ``parent_chunk_id``, ``index_status``),
hybrid-search hits that are children, knowledge-search results merged as WeKnora merges them (the parent's
content, ``sub_chunk_id`` holding the merged children and the hit's own id), chunk listings paged with OFFSET
over ``ORDER BY chunk_index`` (ties ordered differently from one request to the next, as an unspecified order
may be), FAQ search, sessions, and knowledge-chat streams (the web UI's agent, intent skips, error events).

Used by tests/test_lite_shapes.py. :data:`STATE` holds what the server serves and what it was asked; a test
sets it up (:func:`reset`) before it collects.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

KB = "kb-pc"
KNOWLEDGE = "k1"
FAQ_KNOWLEDGE = "kf"
PARENT_1, PARENT_2 = "P1", "P2"
#: text children of P1 (chunk_index 0-3) and P2 (4-5), in document order; s1 a summary whose parent is c1
CHILDREN = {PARENT_1: ["c1", "c2", "c3", "c4"], PARENT_2: ["c5", "c6"]}
STATE: dict[str, Any] = {}


def chunk(cid: str, ctype: str, index: int, parent: str = "", status: str = "ready", knowledge: str = KNOWLEDGE,
          kb: str = KB) -> dict[str, Any]:
    """A chunk as ``GET /api/v1/chunks/{id}`` lists it at v0.7.2 (recording 22f)."""
    return {"id": cid, "seq_id": 0, "tenant_id": 1, "knowledge_id": knowledge, "knowledge_base_id": kb, "tag_id": "",
            "content": f"content of {cid}", "content_revision": 0, "index_status": status, "last_editor_id": "",
            "chunk_index": index, "is_enabled": True, "flags": 1, "status": 0, "start_at": 0, "end_at": 10,
            "pre_chunk_id": "", "next_chunk_id": "", "chunk_type": ctype, "parent_chunk_id": parent,
            "relation_chunks": None, "indirect_relation_chunks": None, "content_hash": "", "image_info": ""}


def document_chunks() -> list[dict[str, Any]]:
    """Knowledge k1: two parents (their chunk_index restarts at 0 beside the children's, 22f), six children (c6's
    index not ready: C102), a summary whose parent is the first child (22e)."""
    rows = [chunk(PARENT_1, "parent_text", 0), chunk(PARENT_2, "parent_text", 1)]
    index = 0
    for parent, kids in CHILDREN.items():
        for c in kids:
            rows.append(chunk(c, "text", index, parent, status="processing" if c == "c6" else "ready"))
            index += 1
    rows.append(chunk("s1", "summary", index, "c1"))
    return rows


def faq_chunks(n: int) -> list[dict[str, Any]]:
    """FAQ entries: every one of chunk_index 0 (C47, recording 23b)."""
    return [chunk(f"f{i:02d}", "faq", 0, knowledge=FAQ_KNOWLEDGE) for i in range(n)]


def reset(**overrides: Any) -> dict[str, Any]:
    """The default state, with ``overrides``: one parent-child knowledge base, version 0.7.2, no memory config."""
    STATE.clear()
    STATE.update({
        "version": "0.7.2", "memory": None, "seen": [], "chunk_cap": 100, "ties": False, "lie_total": {},
        "kbs": {KB: {"type": "document", "embedding_model_id": "m-emb", "vector": True}},
        "models": {"m-emb": {"name": "use-multilingual-v3", "base_url": "http://127.0.0.1:18083/v1"}},
        "knowledge": {KB: [{"id": KNOWLEDGE, "title": "Doc", "parse_status": "completed"}]},
        "chunks": {KNOWLEDGE: document_chunks()}, "requests": 0, "chat_attempts": 0,
    })
    STATE.update(overrides)
    return STATE


def ok(data: Any, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": True, "data": data, **extra})


def app_error(status: int, code: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "error": {"code": code, "message": message, "details": None}},
                        status_code=status)


async def _body(request: Request) -> Any:
    raw = await request.body()
    body = json.loads(raw) if raw else None
    STATE["seen"].append((request.method, request.url.path, body))
    return body


def _kb(request: Request) -> Response:
    kb = request.path_params["kb"]
    spec = STATE["kbs"].get(kb)
    if spec is None:
        return app_error(404, 1003, "knowledge base not found")
    return ok({"id": kb, "name": kb, "type": spec["type"], "embedding_model_id": spec["embedding_model_id"],
               "chunking_config": {"chunk_size": 512, "chunk_overlap": 80, "enable_parent_child": True,
                                   "parent_chunk_size": 4096, "child_chunk_size": 384},
               "indexing_strategy": {"vector_enabled": spec["vector"], "keyword_enabled": spec["type"] != "faq",
                                     "wiki_enabled": False, "graph_enabled": False},
               "chunk_count": 0, "knowledge_count": len(STATE["knowledge"].get(kb, []))})  # C101: 0 for documents


def _model(request: Request) -> Response:
    m = STATE["models"].get(request.path_params["mid"])
    if m is None:
        return app_error(404, 1003, "model not found")
    return ok({"id": request.path_params["mid"], "name": m["name"], "type": "Embedding", "source": "remote",
               "parameters": {"base_url": m["base_url"], "provider": "generic",
                              "embedding_parameters": {"dimension": 512}}})


def _system(request: Request) -> Response:
    return JSONResponse({"code": 0, "msg": "success", "data": {
        "version": STATE["version"], "edition": "lite", "commit_id": "3d5d8bf", "keyword_index_engine": "sqlite",
        "vector_store_engine": "sqlite", "graph_database_engine": "Not Enabled"}})


def _memory(request: Request) -> Response:
    if STATE["memory"] is None:   # v0.7.2: no such key
        return app_error(400, 1000, "unsupported key")
    return ok(STATE["memory"])


def _knowledge(request: Request) -> Response:
    items = STATE["knowledge"].get(request.path_params["kb"], [])
    return ok(items, total=len(items), page=1, page_size=1000)


def _chunks(request: Request) -> Response:
    """C52 paging (cap, repeated chunk_type, default text) over ``ORDER BY chunk_index``: with ``ties`` on, rows of
    one index come in ascending id order on odd requests and descending on even ones (OFFSET paging then repeats
    some and skips others, C101)."""
    kid = request.path_params["kid"]
    types = request.query_params.getlist("chunk_type") or ["text"]
    page = int(request.query_params.get("page", 1))
    size = min(int(request.query_params.get("page_size", 10)), STATE["chunk_cap"])
    rows = [c for c in STATE["chunks"].get(kid, []) if c["chunk_type"] in types]
    STATE["requests"] += 1
    flip = STATE["ties"] and STATE["requests"] % 2 == 0
    rows = sorted(sorted(rows, key=lambda c: c["id"], reverse=flip), key=lambda c: c["chunk_index"])
    total = len(rows) + STATE["lie_total"].get(kid, 0)
    return ok(rows[(page - 1) * size: page * size], total=total, page=page, page_size=size)


def child_hit(cid: str, match_type: int = 0) -> dict[str, Any]:
    """A hybrid-search hit on a parent-child knowledge base: the child's content, no sub_chunk_id (46-...-pc)."""
    parent = next(p for p, kids in CHILDREN.items() if cid in kids)
    return {"id": cid, "content": f"content of {cid}", "knowledge_id": KNOWLEDGE, "chunk_index": 1, "score": 0.5,
            "match_type": match_type, "sub_chunk_id": None, "chunk_type": "text", "parent_chunk_id": parent,
            "metadata": {"content": "# Doc"}, "matched_content": f"Doc\n{cid}", "knowledge_base_id": KB}


def merged_hit(cid: str, subs: list[str], match_type: int = 0) -> dict[str, Any]:
    """A knowledge-search result after WeKnora's merge (47-...-pc): the parent's content, the child's id, the merged
    children in sub_chunk_id with the hit's own id (C100)."""
    hit = child_hit(cid, match_type)
    return {**hit, "content": f"content of {hit['parent_chunk_id']}", "sub_chunk_id": subs}


def final_results(query: str) -> list[dict[str, Any]]:
    """knowledge-search's answer: c2 (merged with c3) and c5; all keyword hits when the query's embedding failed
    (``embed-fail``, C34)."""
    mt = 1 if "embed-fail" in query else 0
    summary = {**child_hit("c2"), "id": "s1", "chunk_type": "summary", "parent_chunk_id": "c1", "match_type": mt}
    return [merged_hit("c2", ["c2", "c3"], mt), merged_hit("c5", ["c5"], mt), summary]


async def _hybrid(request: Request) -> Response:
    await _body(request)
    return ok([child_hit("c2"), child_hit("c5"), child_hit("c1", 1)])


async def _final(request: Request) -> Response:
    body = await _body(request)
    return ok(final_results(body["query"]))


async def _faq(request: Request) -> Response:
    await _body(request)
    return ok([{"id": 1, "chunk_id": "f00", "knowledge_id": FAQ_KNOWLEDGE, "score": 0.9, "match_type": 0,
                "matched_question": "Q?"}])


async def _session(request: Request) -> Response:
    body = await _body(request)
    return JSONResponse({"success": True, "data": {"id": f"s{len(STATE['seen'])}", "title": body["title"]}},
                        status_code=201)


async def _delete(request: Request) -> Response:
    return JSONResponse({"success": True, "message": "Session deleted successfully"})


def event(kind: str, done: bool, **fields: Any) -> dict[str, Any]:
    return {"id": "req-1", "response_type": kind, "content": fields.pop("content", ""), "done": done, **fields}


def tool(name: str) -> list[dict[str, Any]]:
    """The progress events of a pipeline step (C104, recording 53)."""
    return [event("tool_call", False, content=f"Calling tool: {name}", data={"tool_name": name}),
            event("tool_result", False, data={"tool_name": name, "success": True})]


def rebuilt(ref: dict[str, Any]) -> dict[str, Any]:
    """A reference as the Redis stream manager rebuilds it at v0.7.2 (recording 100, C106)."""
    out = {k: v for k, v in ref.items() if k not in ("matched_content",)}
    return {**out, "match_type": 0, "sub_chunk_id": None, "metadata": None}


def chat_events(query: str) -> tuple[list[dict[str, Any]], bool]:
    """The events a chat of ``query`` streams, and whether the stream stays open after them (a terminal error,
    C105)."""
    start = [event("agent_query", True, session_id="s"), *tool("query_understand")]
    answer = [event("answer", False, content='Yes <kb doc="Doc" chunk_id="c2" kb_id="kb-pc" />'),
              event("answer", True), event("complete", True)]
    refs = final_results(query)
    if "你好" in query:   # greeting: no retrieval step, no references (54b)
        return [*start, event("answer", False, content="你好！"), event("answer", True), event("complete", True)], False
    if "nothing" in query:   # retrieval ran and the merge kept nothing: no references event either (C64)
        return [*start, *tool("knowledge_search"), event("answer", False, content="不知道"), event("answer", True),
                event("complete", True)], False
    if "no-model" in query:   # 52a
        return [event("agent_query", True), event("error", True, content="chat model is not configured: please "
                                                  "set model_id on agent builtin-quick-answer")], True
    if "boom-hard" in query:   # 110: the LLM failed after the references
        return [*start, *tool("knowledge_search"), event("references", False, knowledge_references=refs),
                event("error", True, content="create chat completion stream: status code: 500")], True
    if "boom-soft" in query:   # an agent tool step failed, the agent goes on (C105)
        soft = event("error", False, content="tool web_fetch failed: timeout")
        return [*start, soft, *tool("knowledge_search"), event("references", False, knowledge_references=refs),
                *answer], False
    if "redis" in query:
        refs = [rebuilt(r) for r in refs]
    return [*start, *tool("knowledge_search"), event("references", False, knowledge_references=refs), *answer], False


async def _chat(request: Request) -> Response:
    body = await _body(request)
    STATE["chat_attempts"] += 1
    events, hang = chat_events(body["query"])

    async def stream() -> Any:
        for ev in events:
            yield b"event:message\ndata:" + json.dumps(ev).encode() + b"\n\n"
        if hang:   # the server never closes the stream after a terminal error (C105)
            await asyncio.sleep(60)
    return StreamingResponse(stream(), media_type="text/event-stream")


ROUTES = [
    Route("/api/v1/system/info", _system), Route("/api/v1/tenants/kv/memory-config", _memory),
    Route("/api/v1/tenants/kv/retrieval-config", lambda r: ok({"embedding_top_k": 0, "vector_threshold": 0,
                                                               "keyword_threshold": 0, "rerank_top_k": 0,
                                                               "rerank_threshold": 0, "rerank_model_id": ""})),
    Route("/api/v1/models/{mid}", _model),
    Route("/api/v1/knowledge-bases/{kb}", _kb),
    Route("/api/v1/knowledge-bases/{kb}/knowledge", _knowledge),
    Route("/api/v1/knowledge-bases/{kb}/hybrid-search", _hybrid, methods=["POST"]),
    Route("/api/v1/knowledge-bases/{kb}/faq/search", _faq, methods=["POST"]),
    Route("/api/v1/knowledge-search", _final, methods=["POST"]),
    Route("/api/v1/chunks/{kid}", _chunks),
    Route("/api/v1/sessions", _session, methods=["POST"]),
    Route("/api/v1/sessions/{sid}", _delete, methods=["DELETE"]),
    Route("/api/v1/knowledge-chat/{sid}", _chat, methods=["POST"]),
]


class LiteStub:
    """The stub on a uvicorn server of its own, on loopback (``url``); :meth:`stop` ends it."""

    def __init__(self) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(Starlette(routes=ROUTES), log_level="warning", lifespan="off",
                                                    access_log=False, timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.sock.close()
