"""The sandbox's HTTP server: WeKnora's endpoints, fields and envelopes on loopback.

Endpoints (``X-API-Key`` or ``Authorization: Bearer`` required on ``/api/v1``):

- ``POST /api/v1/knowledge-bases/{kb_id}/hybrid-search``
- ``POST /api/v1/knowledge-search``
- ``POST /api/v1/sessions`` and ``POST /api/v1/knowledge-chat/{session_id}`` (SSE)
- ``GET  /api/v1/tenants/kv/retrieval-config``
- ``GET  /api/v1/knowledge-bases/{kb_id}/knowledge`` (paginated knowledge list)
- ``GET  /api/v1/chunks/{knowledge_id}`` (paginated chunk listing)
- ``GET  /health`` (no auth)
- ``GET|PUT /_sandbox/faults`` (only when fault control is allowed: tests, benchmarks)

Envelopes: ``{"success": true, "data": ...}``; errors ``{"success": false, "error":
{"code": ..., "message": ...}}``; the auth layer's bare ``{"error": "..."}`` with 401.

Fault injection (off by default): added latency (fixed plus uniform jitter, or
lognormal), and rates of 500s, 429s with ``Retry-After``, hung requests, malformed
bodies and SSE streams cut before ``complete``.

The engine is deterministic, so successful search answers are remembered by request body
(:data:`SEARCH_CACHE_SIZE` of them); faults are injected before that lookup.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from weknora_nb.sandbox.engine import Hit, RetrievalEngine

__all__ = ["FaultConfig", "create_app", "check_loopback", "ERROR_CODES"]

log = logging.getLogger(__name__)

#: WeKnora-style application error codes used by the sandbox
ERROR_CODES = {"bad_request": 1000, "unauthorized": 1001, "forbidden": 1003, "not_found": 1004,
               "too_many_requests": 1005, "internal": 1007}
MATCH_TYPES = {0: "vector", 1: "keyword", 2: "nearby", 3: "history", 4: "parent", 5: "relation", 6: "graph", 7: "web"}


@dataclass
class FaultConfig:
    """What the server does wrong, on purpose. Rates are probabilities per request."""

    latency_ms: float = 0.0
    latency_jitter_ms: float = 0.0
    latency_sigma: float = 0.0  # > 0: lognormal latency with median latency_ms
    error_rate: float = 0.0
    rate_limit_rate: float = 0.0
    retry_after_s: float = 1.0
    hang_rate: float = 0.0
    hang_s: float = 30.0
    malformed_rate: float = 0.0
    stream_cut_rate: float = 0.0
    seed: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> FaultConfig:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault setting(s) {sorted(unknown)}; known: {sorted(known)}")
        cfg = cls(**data)
        for name in ("error_rate", "rate_limit_rate", "hang_rate", "malformed_rate", "stream_cut_rate"):
            v = getattr(cfg, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1. Got {v!r} instead.")
        return cfg


class _Faults:
    def __init__(self, cfg: FaultConfig):
        self.set(cfg)

    def set(self, cfg: FaultConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)

    def roll(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    def latency_s(self) -> float:
        c = self.cfg
        if c.latency_sigma > 0 and c.latency_ms > 0:
            return self.rng.lognormvariate(0.0, c.latency_sigma) * c.latency_ms / 1000.0
        jitter = self.rng.uniform(-c.latency_jitter_ms, c.latency_jitter_ms) if c.latency_jitter_ms else 0.0
        return max(0.0, c.latency_ms + jitter) / 1000.0


def check_loopback(host: str) -> None:
    """Refuse to bind anywhere but loopback: the sandbox is for this machine only."""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"the sandbox serves on loopback only (127.0.0.0/8, ::1, localhost). Got host {host!r}.")


#: search responses the server keeps (its engine is deterministic, so a repeated body gets the same bytes)
SEARCH_CACHE_SIZE = 8192


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _ok(data: Any, **extra: Any) -> Response:
    return Response(_dumps({"success": True, "data": data, **extra}), media_type="application/json")


def _err(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"success": False, "error": {"code": ERROR_CODES[kind], "message": message}}
    return Response(_dumps(body), status_code=status, media_type="application/json", headers=headers)


def create_app(engine: RetrievalEngine, *, api_key: str, kb_id: str = "kb-demo",
               faults: FaultConfig | None = None, allow_fault_control: bool = False):
    """The ASGI application serving ``engine`` as knowledge base ``kb_id`` (``.state.faults`` holds the faults)."""
    index = engine.index
    state = {"faults": _Faults(faults or FaultConfig()), "sessions": {}}
    knowledge = {}
    for c in index.chunks:
        knowledge.setdefault(c.knowledge_id, {"id": c.knowledge_id, "knowledge_base_id": kb_id,
                                              "title": c.knowledge_title, "file_name": f"{c.knowledge_id}.md",
                                              "type": "file", "parse_status": "completed", "enable_status": "enabled",
                                              "chunk_count": 0})
        knowledge[c.knowledge_id]["chunk_count"] += 1
    chunks_of: dict[str, list[int]] = {}
    for i, c in enumerate(index.chunks):
        chunks_of.setdefault(c.knowledge_id, []).append(i)
    # The engine is deterministic for the server's lifetime (one index, one version), so a search
    # answers the same body with the same bytes: successful search responses are kept (bounded,
    # least recently used out). Faults are injected before this, so they still apply.
    answers: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()

    async def remembered(request: Request, compute) -> Response:
        key = (request.url.path, await request.body())
        body = answers.get(key)
        if body is not None:
            answers.move_to_end(key)
            return Response(body, media_type="application/json")
        response = await compute(request)
        if response.status_code == 200:
            answers[key] = bytes(response.body)
            if len(answers) > SEARCH_CACHE_SIZE:
                answers.popitem(last=False)
        return response

    def result_json(h: Hit) -> dict[str, Any]:
        c = index.chunks[h.idx]
        meta: dict[str, str] = {}
        if h.base_score is not None:
            meta["base_score"] = f"{h.base_score:.8f}"
        if h.model_score is not None:
            meta["model_score"] = f"{h.model_score:.8f}"
        return {
            "id": c.id, "content": engine.merged_content(h) if h.sub_chunk_ids else c.content,
            "knowledge_id": c.knowledge_id, "chunk_index": c.chunk_index, "knowledge_title": c.knowledge_title,
            "start_at": c.start_at, "end_at": c.end_at, "seq": c.chunk_index, "score": round(h.score, 8),
            "match_type": h.match_type, "sub_chunk_id": list(h.sub_chunk_ids), "metadata": meta,
            "chunk_type": "text", "parent_chunk_id": "", "image_info": "",
            "knowledge_filename": f"{c.knowledge_id}.md", "knowledge_source": "file", "knowledge_base_id": kb_id,
        }

    def authorised(request: Request) -> bool:
        key = request.headers.get("x-api-key")
        if key is None:
            auth = request.headers.get("authorization", "")
            key = auth[7:] if auth.lower().startswith("bearer ") else None
        return key is not None and secrets.compare_digest(key, api_key)

    async def body_json(request: Request) -> dict[str, Any] | Response:
        raw = await request.body()
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            return _err(400, "bad_request", "request body is not valid JSON")
        if not isinstance(data, dict):
            return _err(400, "bad_request", "request body must be a JSON object")
        return data

    async def query_body(request: Request, field: str) -> tuple[dict[str, Any], str] | Response:
        """The JSON body and its non-empty query field, or the 400 that says what is wrong."""
        data = await body_json(request)
        if isinstance(data, Response):
            return data
        q = data.get(field)
        if not isinstance(q, str) or not q.strip():
            return _err(400, "bad_request", f"{field} is required")
        return data, q

    async def hybrid_search(request: Request) -> Response:
        return await remembered(request, _hybrid_search)

    async def _hybrid_search(request: Request) -> Response:
        if request.path_params["kb_id"] != kb_id:
            return _err(404, "not_found", f"knowledge base {request.path_params['kb_id']} not found")
        got = await query_body(request, "query_text")
        if isinstance(got, Response):
            return got
        data, q = got
        try:
            hits = engine.hybrid_search(
                q, match_count=int(data.get("match_count") or 0),
                vector_threshold=float(data.get("vector_threshold") or 0.0),
                keyword_threshold=float(data.get("keyword_threshold") or 0.0),
                disable_vector=bool(data.get("disable_vector_match")),
                disable_keyword=bool(data.get("disable_keywords_match")),
                skip_enrichment=bool(data.get("skip_context_enrichment")),
                knowledge_ids=data.get("knowledge_ids") or None)
        except (TypeError, ValueError) as exc:
            return _err(400, "bad_request", f"invalid parameter: {exc}")
        return _ok([result_json(h) for h in hits])

    def kb_ids_of(data: dict[str, Any]) -> list[str] | Response:
        ids = data.get("knowledge_base_ids") or ([data["knowledge_base_id"]] if data.get("knowledge_base_id") else [])
        if not ids:
            return _err(400, "bad_request", "knowledge_base_id or knowledge_base_ids is required")
        unknown = [i for i in ids if i != kb_id]
        if unknown:
            return _err(404, "not_found", f"knowledge base {unknown[0]} not found")
        return ids

    async def knowledge_search(request: Request) -> Response:
        return await remembered(request, _knowledge_search)

    async def _knowledge_search(request: Request) -> Response:
        got = await query_body(request, "query")
        if isinstance(got, Response):
            return got
        data, q = got
        ids = kb_ids_of(data)
        if isinstance(ids, Response):
            return ids
        hits = engine.knowledge_search(q, knowledge_ids=data.get("knowledge_ids") or None)
        return _ok([result_json(h) for h in hits])

    async def create_session(request: Request) -> Response:
        data = await body_json(request)
        if isinstance(data, Response):
            return data
        sid = str(uuid.uuid4())
        state["sessions"][sid] = {"knowledge_base_id": data.get("knowledge_base_id") or kb_id}
        return _ok({"id": sid, "title": data.get("title") or "", "knowledge_base_id": kb_id,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    async def knowledge_chat(request: Request) -> Response:
        sid = request.path_params["session_id"]
        if sid not in state["sessions"]:
            return _err(404, "not_found", f"session {sid} not found")
        got = await query_body(request, "query")
        if isinstance(got, Response):
            return got
        hits = engine.knowledge_search(got[1])
        refs = [result_json(h) for h in hits]
        cut = state["faults"].roll(state["faults"].cfg.stream_cut_rate)
        req_id = str(uuid.uuid4())

        async def events():
            def ev(payload: dict[str, Any]) -> bytes:
                return b"event:message\ndata:" + _dumps({"id": req_id, **payload}) + b"\n\n"
            yield ev({"response_type": "references", "content": "", "done": False, "knowledge_references": refs})
            if cut:
                return
            for piece in _extractive_answer(refs, kb_id):
                await asyncio.sleep(0)
                yield ev({"response_type": "answer", "content": piece, "done": False})
            yield ev({"response_type": "complete", "content": "", "done": True})
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def retrieval_config(request: Request) -> Response:
        return _ok(engine.version.retrieval_config())

    def page_args(request: Request) -> tuple[int, int]:
        try:
            page = max(1, int(request.query_params.get("page", 1)))
            size = min(1000, max(1, int(request.query_params.get("page_size", 20))))
        except ValueError:
            page, size = 1, 20
        return page, size

    async def list_knowledge(request: Request) -> Response:
        if request.path_params["kb_id"] != kb_id:
            return _err(404, "not_found", f"knowledge base {request.path_params['kb_id']} not found")
        page, size = page_args(request)
        items = list(knowledge.values())
        return _ok(items[(page - 1) * size: page * size], total=len(items), page=page, page_size=size)

    async def list_chunks(request: Request) -> Response:
        kid = request.path_params["knowledge_id"]
        if kid not in chunks_of:
            return _err(404, "not_found", f"knowledge {kid} not found")
        page, size = page_args(request)
        idxs = chunks_of[kid]
        rows = []
        for i in idxs[(page - 1) * size: page * size]:
            c = index.chunks[i]
            prev_i, next_i = index.neighbour(i, -1), index.neighbour(i, 1)
            rows.append({"id": c.id, "knowledge_id": c.knowledge_id, "knowledge_base_id": kb_id,
                         "content": c.content, "chunk_index": c.chunk_index, "is_enabled": True,
                         "start_at": c.start_at, "end_at": c.end_at, "chunk_type": "text",
                         "pre_chunk_id": index.chunks[prev_i].id if prev_i is not None else "",
                         "next_chunk_id": index.chunks[next_i].id if next_i is not None else ""})
        return _ok(rows, total=len(idxs), page=page, page_size=size)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": engine.version.name})

    async def faults_endpoint(request: Request) -> Response:
        if request.method == "PUT":
            data = await body_json(request)
            if isinstance(data, Response):
                return data
            try:
                state["faults"].set(FaultConfig.from_dict(data))
            except (TypeError, ValueError) as exc:
                return _err(400, "bad_request", str(exc))
        return _ok(asdict(state["faults"].cfg))

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/api/v1/knowledge-bases/{kb_id}/hybrid-search", hybrid_search, methods=["POST"]),
        Route("/api/v1/knowledge-search", knowledge_search, methods=["POST"]),
        Route("/api/v1/sessions", create_session, methods=["POST"]),
        Route("/api/v1/knowledge-chat/{session_id}", knowledge_chat, methods=["POST"]),
        Route("/api/v1/tenants/kv/retrieval-config", retrieval_config, methods=["GET"]),
        Route("/api/v1/knowledge-bases/{kb_id}/knowledge", list_knowledge, methods=["GET"]),
        Route("/api/v1/chunks/{knowledge_id:path}", list_chunks, methods=["GET"]),
    ]
    if allow_fault_control:
        routes.append(Route("/_sandbox/faults", faults_endpoint, methods=["GET", "PUT"]))
    app = Starlette(routes=routes)

    async def guarded(scope, receive, send):
        """Auth first (the bare 401 of WeKnora's auth layer), then injected faults, then the routes."""
        if scope["type"] != "http":
            return await app(scope, receive, send)
        request = Request(scope)
        path = request.url.path
        if path != "/health" and not authorised(request):
            response: Response = Response(_dumps({"error": "unauthorized: missing or invalid X-API-Key"}),
                                          status_code=401, media_type="application/json")
            return await response(scope, receive, send)
        if path.startswith("/api/v1/"):
            f = state["faults"]
            delay = f.latency_s()
            if delay:
                await asyncio.sleep(delay)
            if f.roll(f.cfg.hang_rate):
                await asyncio.sleep(f.cfg.hang_s)
            fault = None
            if f.roll(f.cfg.error_rate):
                fault = _err(500, "internal", "internal server error (injected fault)")
            elif f.roll(f.cfg.rate_limit_rate):
                fault = _err(429, "too_many_requests", "too many requests (injected fault)",
                             headers={"Retry-After": f"{f.cfg.retry_after_s:g}"})
            elif f.roll(f.cfg.malformed_rate):
                fault = Response(b'{"success": true, "data": [{"id": "', media_type="application/json")
            if fault is not None:
                return await fault(scope, receive, send)
        return await app(scope, receive, send)

    guarded.state = app.state  # type: ignore[attr-defined]
    app.state.faults = state["faults"]
    return guarded


def _extractive_answer(refs: list[dict[str, Any]], kb_id: str) -> list[str]:
    """An answer made of quoted sentences from the top references, with inline citations.

    The sandbox has no language model: it says so at the start of every answer.
    """
    pieces = ["（抽取式回答：sandbox 未接入大模型，以下为知识库原文摘录。）\n"]
    for r in refs[:2]:
        body = r["content"].split("\n", 1)[-1].strip()
        sentence = body.split("。")[0][:160]
        doc = r["knowledge_title"].replace('"', "'")
        pieces.append(f"{sentence}。<kb doc=\"{doc}\" chunk_id=\"{r['id']}\" kb_id=\"{kb_id}\" />\n")
    if len(pieces) == 1:
        pieces.append("知识库中没有找到相关内容。")
    return pieces
