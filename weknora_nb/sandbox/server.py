"""The sandbox's HTTP server: WeKnora's endpoints, fields and envelopes on loopback.

Endpoints (``X-API-Key`` or ``Authorization: Bearer`` required on every path but ``/health``):

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

Layout: :class:`SandboxApp` holds the server's state and has one method per endpoint;
two ASGI middlewares wrap every route, outermost first: :class:`AuthMiddleware` (the bare
401) and :class:`FaultMiddleware` (the injected faults of :class:`FaultInjector`).

Fault injection (off by default, on ``/api/v1/`` paths only): added latency (fixed plus
uniform jitter, or lognormal), then a hang, then at most one of a 500, a 429 with
``Retry-After`` and a malformed body; SSE streams cut after their first event (the
references, before ``complete``). Rates are probabilities per request.

The engine is deterministic, so successful search answers are remembered by request body
(:data:`SEARCH_CACHE_SIZE` of them, :class:`AnswerMemory`); faults are injected before
that lookup, so they still apply to a remembered answer.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from weknora_nb.core.errors import UsageError
from weknora_nb.sandbox.engine import Hit, RetrievalEngine

__all__ = ["FaultConfig", "FaultInjector", "AnswerMemory", "AuthMiddleware", "FaultMiddleware", "SandboxApp",
           "create_app", "check_loopback", "ERROR_CODES", "SEARCH_CACHE_SIZE"]

log = logging.getLogger(__name__)

#: WeKnora-style application error codes used by the sandbox
ERROR_CODES = {"bad_request": 1000, "unauthorized": 1001, "forbidden": 1003, "not_found": 1004,
               "too_many_requests": 1005, "internal": 1007}
MATCH_TYPES = {0: "vector", 1: "keyword", 2: "nearby", 3: "history", 4: "parent", 5: "relation", 6: "graph", 7: "web"}

#: search responses the server keeps (its engine is deterministic, so a repeated body gets the same bytes)
SEARCH_CACHE_SIZE = 8192

#: the body of an injected malformed response: a 200 whose JSON stops mid-string
MALFORMED_BODY = b'{"success": true, "data": [{"id": "'

Endpoint = Callable[[Request], Awaitable[Response]]


# ---------------------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------------------
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

    #: the settings that are probabilities (each must lie in [0, 1])
    RATES: ClassVar[tuple[str, ...]] = ("error_rate", "rate_limit_rate", "hang_rate", "malformed_rate",
                                        "stream_cut_rate")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FaultConfig:
        """The faults of ``{setting: value}`` (missing settings keep their defaults).

        Raises :class:`UsageError` naming the setting for an unknown setting, a value that is
        not a number (every setting but ``seed``) or a rate outside [0, 1].
        """
        if data is not None and not isinstance(data, Mapping):
            raise UsageError(argument="the fault settings", allowed="a mapping of setting to value", got=data)
        data = dict(data or {})
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise UsageError(argument="a fault setting", allowed=known,
                             got=unknown[0] if len(unknown) == 1 else unknown)
        for name, value in data.items():
            if name == "seed":
                continue
            allowed = "a number between 0 and 1" if name in cls.RATES else "a number"
            if not isinstance(value, int | float):
                raise UsageError(argument=name, allowed=allowed, got=value)
            if name in cls.RATES and not 0.0 <= value <= 1.0:
                raise UsageError(argument=name, allowed=allowed, got=value)
        return cls(**data)


class FaultInjector:
    """The faults in force and the random stream that decides each one (seeded by ``cfg.seed``)."""

    def __init__(self, cfg: FaultConfig):
        self.set(cfg)

    def set(self, cfg: FaultConfig) -> None:
        """Put ``cfg`` in force and restart the random stream from its seed."""
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)

    def roll(self, rate: float) -> bool:
        """True with probability ``rate`` (a rate of 0 draws nothing from the stream)."""
        return rate > 0 and self.rng.random() < rate

    def latency_s(self) -> float:
        """Added latency in seconds: ``latency_ms * LogNormal(0, sigma)`` when ``latency_sigma > 0``,
        else ``max(0, latency_ms + Uniform(-jitter, jitter))``, over 1000."""
        c = self.cfg
        if c.latency_sigma > 0 and c.latency_ms > 0:
            return self.rng.lognormvariate(0.0, c.latency_sigma) * c.latency_ms / 1000.0
        jitter = self.rng.uniform(-c.latency_jitter_ms, c.latency_jitter_ms) if c.latency_jitter_ms else 0.0
        return max(0.0, c.latency_ms + jitter) / 1000.0

    async def before_request(self) -> Response | None:
        """Wait the added latency, then maybe hang, then roll at most one faulty response.

        In this order: latency; a hang of ``hang_s`` (rate ``hang_rate``); a 500
        (``error_rate``), else a 429 with ``Retry-After: retry_after_s`` (``rate_limit_rate``),
        else a malformed 200 (``malformed_rate``). Returns that response, or None to serve.
        """
        delay = self.latency_s()
        if delay:
            await asyncio.sleep(delay)
        if self.roll(self.cfg.hang_rate):
            await asyncio.sleep(self.cfg.hang_s)
        if self.roll(self.cfg.error_rate):
            return _err(500, "internal", "internal server error (injected fault)")
        if self.roll(self.cfg.rate_limit_rate):
            return _err(429, "too_many_requests", "too many requests (injected fault)",
                        headers={"Retry-After": f"{self.cfg.retry_after_s:g}"})
        if self.roll(self.cfg.malformed_rate):
            return Response(MALFORMED_BODY, media_type="application/json")
        return None

    def cutting_streams(self, send: Send) -> Send:
        """``send`` that may end an event stream after its first event (the references).

        One roll (rate ``stream_cut_rate``) per 200 ``text/event-stream`` response, when it
        starts; a cut stream ends with its first body message and the rest is dropped.
        """
        cut = done = False

        async def send_or_cut(message: Message) -> None:
            nonlocal cut, done
            if done:
                return
            if message["type"] == "http.response.start":
                cut = (message["status"] == 200 and _is_event_stream(message)
                       and self.roll(self.cfg.stream_cut_rate))
            elif cut and message["type"] == "http.response.body":
                message, done = {**message, "more_body": False}, True
            await send(message)
        return send_or_cut


def _is_event_stream(start: Message) -> bool:
    """Whether an ``http.response.start`` message announces a server-sent event stream."""
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in start.get("headers", ()))


class FaultMiddleware:
    """Injects the faults of ``faults`` into every ``/api/v1/`` request, before routing.

    So before the answer memory too: a remembered answer still gets its latency and faults.
    """

    def __init__(self, app: ASGIApp, *, faults: FaultInjector):
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/v1/"):
            fault = await self.faults.before_request()
            if fault is not None:
                await fault(scope, receive, send)
                return
            if self.faults.cfg.stream_cut_rate > 0:
                send = self.faults.cutting_streams(send)
        await self.app(scope, receive, send)


class AuthMiddleware:
    """WeKnora's auth layer: every path but ``/health`` needs ``api_key`` in ``X-API-Key`` or
    ``Authorization: Bearer``; without it, the bare ``{"error": ...}`` with 401."""

    def __init__(self, app: ASGIApp, *, api_key: str):
        self.app = app
        self.api_key = api_key

    def authorised(self, headers: Headers) -> bool:
        """Whether the request's key (``X-API-Key`` first, else the bearer token) is the API key."""
        key = headers.get("x-api-key")
        if key is None:
            auth = headers.get("authorization", "")
            key = auth[7:] if auth.lower().startswith("bearer ") else None
        return key is not None and secrets.compare_digest(key, self.api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and not self.authorised(Headers(scope=scope)):
            response = Response(_dumps({"error": "unauthorized: missing or invalid X-API-Key"}),
                                status_code=401, media_type="application/json")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def check_loopback(host: str) -> None:
    """Refuse to bind anywhere but loopback: the sandbox is for this machine only (:class:`UsageError`)."""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise UsageError(argument="host", allowed="a loopback address (127.0.0.0/8, ::1, localhost)", got=host)


# ---------------------------------------------------------------------------------------
# responses
# ---------------------------------------------------------------------------------------
def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _ok(data: Any, **extra: Any) -> Response:
    """WeKnora's success envelope ``{"success": true, "data": ..., **extra}``."""
    return Response(_dumps({"success": True, "data": data, **extra}), media_type="application/json")


def _err(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """WeKnora's error envelope ``{"success": false, "error": {"code", "message"}}`` with ``status``."""
    body = {"success": False, "error": {"code": ERROR_CODES[kind], "message": message}}
    return Response(_dumps(body), status_code=status, media_type="application/json", headers=headers)


class AnswerMemory:
    """Response bodies by ``(path, request body)``; the least recently used goes past ``size``."""

    def __init__(self, size: int = SEARCH_CACHE_SIZE):
        self.size = size
        self._bodies: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._bodies)

    def get(self, key: tuple[str, bytes]) -> bytes | None:
        """The remembered body (now the most recently used), or None."""
        body = self._bodies.get(key)
        if body is not None:
            self._bodies.move_to_end(key)
        return body

    def keep(self, key: tuple[str, bytes], body: bytes) -> None:
        """Remember ``body`` for ``key``, forgetting the least recently used past ``size``."""
        self._bodies[key] = body
        if len(self._bodies) > self.size:
            self._bodies.popitem(last=False)


# ---------------------------------------------------------------------------------------
# the application
# ---------------------------------------------------------------------------------------
class SandboxApp:
    """One sandbox server: its state, one method per endpoint, and the Starlette ``app`` serving them.

    State: ``faults`` (the :class:`FaultInjector` in force, shared with the middleware),
    ``sessions`` (session id -> knowledge base id), ``answers`` (the :class:`AnswerMemory`
    of the two search endpoints), ``knowledge`` (knowledge id -> its row in the knowledge
    list, in index order) and ``chunks_of`` (knowledge id -> positions of its chunks in the index).
    """

    def __init__(self, engine: RetrievalEngine, *, api_key: str, kb_id: str = "kb-demo",
                 faults: FaultConfig | None = None, allow_fault_control: bool = False):
        self.engine = engine
        self.index = engine.index
        self.kb_id = kb_id
        self.faults = FaultInjector(faults or FaultConfig())
        self.sessions: dict[str, str] = {}
        self.answers = AnswerMemory(SEARCH_CACHE_SIZE)
        self.knowledge: dict[str, dict[str, Any]] = self._knowledge_rows()
        self.chunks_of: dict[str, list[int]] = {}
        for i, c in enumerate(self.index.chunks):
            self.chunks_of.setdefault(c.knowledge_id, []).append(i)
        self.app = Starlette(routes=self.routes(allow_fault_control), middleware=[
            Middleware(AuthMiddleware, api_key=api_key), Middleware(FaultMiddleware, faults=self.faults)])
        self.app.state.faults = self.faults
        self.app.state.sandbox = self

    def routes(self, allow_fault_control: bool) -> list[Route]:
        """The routes; ``/_sandbox/faults`` only when ``allow_fault_control``."""
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/api/v1/knowledge-bases/{kb_id}/hybrid-search", self._remembered(self.hybrid_search),
                  methods=["POST"]),
            Route("/api/v1/knowledge-search", self._remembered(self.knowledge_search), methods=["POST"]),
            Route("/api/v1/sessions", self.create_session, methods=["POST"]),
            Route("/api/v1/knowledge-chat/{session_id}", self.knowledge_chat, methods=["POST"]),
            Route("/api/v1/tenants/kv/retrieval-config", self.retrieval_config, methods=["GET"]),
            Route("/api/v1/knowledge-bases/{kb_id}/knowledge", self.list_knowledge, methods=["GET"]),
            Route("/api/v1/chunks/{knowledge_id:path}", self.list_chunks, methods=["GET"]),
        ]
        if allow_fault_control:
            routes.append(Route("/_sandbox/faults", self.faults_endpoint, methods=["GET", "PUT"]))
        return routes

    # -- endpoints -----------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """``GET /health``: ``{"status": "ok", "version": <version name>}`` (no envelope, no auth)."""
        return JSONResponse({"status": "ok", "version": self.engine.version.name})

    async def hybrid_search(self, request: Request) -> Response:
        """``POST .../hybrid-search``: raw recall of both paths, RRF-merged (WeKnora's fields)."""
        if request.path_params["kb_id"] != self.kb_id:
            return _err(404, "not_found", f"knowledge base {request.path_params['kb_id']} not found")
        got = await self._query_body(request, "query_text")
        if isinstance(got, Response):
            return got
        data, q = got
        try:
            hits = self.engine.hybrid_search(
                q, match_count=int(data.get("match_count") or 0),
                vector_threshold=float(data.get("vector_threshold") or 0.0),
                keyword_threshold=float(data.get("keyword_threshold") or 0.0),
                disable_vector=bool(data.get("disable_vector_match")),
                disable_keyword=bool(data.get("disable_keywords_match")),
                skip_enrichment=bool(data.get("skip_context_enrichment")),
                knowledge_ids=data.get("knowledge_ids") or None)
        except (TypeError, ValueError) as exc:
            return _err(400, "bad_request", f"invalid parameter: {exc}")
        return _ok([self._result_json(h) for h in hits])

    async def knowledge_search(self, request: Request) -> Response:
        """``POST /api/v1/knowledge-search``: search, rerank, merge and top-k cut of the version."""
        got = await self._query_body(request, "query")
        if isinstance(got, Response):
            return got
        data, q = got
        refused = self._refuse_kb_ids(data)
        if refused is not None:
            return refused
        hits = self.engine.knowledge_search(q, knowledge_ids=data.get("knowledge_ids") or None)
        return _ok([self._result_json(h) for h in hits])

    async def create_session(self, request: Request) -> Response:
        """``POST /api/v1/sessions``: a new chat session (its id, title, knowledge base, creation time)."""
        data = await self._body_json(request)
        if isinstance(data, Response):
            return data
        sid = str(uuid.uuid4())
        self.sessions[sid] = data.get("knowledge_base_id") or self.kb_id
        return _ok({"id": sid, "title": data.get("title") or "", "knowledge_base_id": self.kb_id,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    async def knowledge_chat(self, request: Request) -> Response:
        """``POST /api/v1/knowledge-chat/{session_id}``: SSE events ``references``, ``answer``..., ``complete``."""
        sid = request.path_params["session_id"]
        if sid not in self.sessions:
            return _err(404, "not_found", f"session {sid} not found")
        got = await self._query_body(request, "query")
        if isinstance(got, Response):
            return got
        refs = [self._result_json(h) for h in self.engine.knowledge_search(got[1])]
        return StreamingResponse(self._chat_events(refs, str(uuid.uuid4())), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def retrieval_config(self, request: Request) -> Response:
        """``GET /api/v1/tenants/kv/retrieval-config``: the version's tenant retrieval config."""
        return _ok(self.engine.version.retrieval_config())

    async def list_knowledge(self, request: Request) -> Response:
        """``GET .../knowledge``: one page of the knowledge base's documents, with ``total``."""
        if request.path_params["kb_id"] != self.kb_id:
            return _err(404, "not_found", f"knowledge base {request.path_params['kb_id']} not found")
        page, size = _page_args(request)
        items = list(self.knowledge.values())
        return _ok(items[(page - 1) * size: page * size], total=len(items), page=page, page_size=size)

    async def list_chunks(self, request: Request) -> Response:
        """``GET /api/v1/chunks/{knowledge_id}``: one page of a document's chunks, with their neighbours' ids."""
        kid = request.path_params["knowledge_id"]
        if kid not in self.chunks_of:
            return _err(404, "not_found", f"knowledge {kid} not found")
        page, size = _page_args(request)
        idxs = self.chunks_of[kid]
        rows = [self._chunk_row(i) for i in idxs[(page - 1) * size: page * size]]
        return _ok(rows, total=len(idxs), page=page, page_size=size)

    async def faults_endpoint(self, request: Request) -> Response:
        """``GET|PUT /_sandbox/faults``: the faults in force; PUT replaces them (400 naming a bad setting)."""
        if request.method == "PUT":
            data = await self._body_json(request)
            if isinstance(data, Response):
                return data
            try:
                self.faults.set(FaultConfig.from_dict(data))
            except (TypeError, ValueError) as exc:
                return _err(400, "bad_request", str(exc))
        return _ok(asdict(self.faults.cfg))

    # -- helpers -------------------------------------------------------------------------
    def _remembered(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` answered from :attr:`answers` for a path and body it answered before (only 200s kept)."""
        async def answer(request: Request) -> Response:
            key = (request.scope["path"], await request.body())
            body = self.answers.get(key)
            if body is not None:
                return Response(body, media_type="application/json")
            response = await endpoint(request)
            if response.status_code == 200:
                self.answers.keep(key, bytes(response.body))
            return response
        return answer

    async def _body_json(self, request: Request) -> dict[str, Any] | Response:
        """The request's JSON object (an empty body is ``{}``), or the 400 that says what is wrong."""
        raw = await request.body()
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            return _err(400, "bad_request", "request body is not valid JSON")
        if not isinstance(data, dict):
            return _err(400, "bad_request", "request body must be a JSON object")
        return data

    async def _query_body(self, request: Request, field: str) -> tuple[dict[str, Any], str] | Response:
        """The JSON body and its non-empty query field, or the 400 that says what is wrong."""
        data = await self._body_json(request)
        if isinstance(data, Response):
            return data
        q = data.get(field)
        if not isinstance(q, str) or not q.strip():
            return _err(400, "bad_request", f"{field} is required")
        return data, q

    def _refuse_kb_ids(self, data: dict[str, Any]) -> Response | None:
        """The 400 (no knowledge base named) or 404 (an unknown one) for a knowledge-search body, else None."""
        ids = data.get("knowledge_base_ids") or ([data["knowledge_base_id"]] if data.get("knowledge_base_id") else [])
        if not ids:
            return _err(400, "bad_request", "knowledge_base_id or knowledge_base_ids is required")
        unknown = [i for i in ids if i != self.kb_id]
        if unknown:
            return _err(404, "not_found", f"knowledge base {unknown[0]} not found")
        return None

    def _result_json(self, h: Hit) -> dict[str, Any]:
        """One search result with WeKnora's fields (``metadata`` holds base and model scores when reranked)."""
        c = self.index.chunks[h.idx]
        meta: dict[str, str] = {}
        if h.base_score is not None:
            meta["base_score"] = f"{h.base_score:.8f}"
        if h.model_score is not None:
            meta["model_score"] = f"{h.model_score:.8f}"
        return {
            "id": c.id, "content": self.engine.merged_content(h) if h.sub_chunk_ids else c.content,
            "knowledge_id": c.knowledge_id, "chunk_index": c.chunk_index, "knowledge_title": c.knowledge_title,
            "start_at": c.start_at, "end_at": c.end_at, "seq": c.chunk_index, "score": round(h.score, 8),
            "match_type": h.match_type, "sub_chunk_id": list(h.sub_chunk_ids), "metadata": meta,
            "chunk_type": "text", "parent_chunk_id": "", "image_info": "",
            "knowledge_filename": f"{c.knowledge_id}.md", "knowledge_source": "file", "knowledge_base_id": self.kb_id,
        }

    def _chunk_row(self, i: int) -> dict[str, Any]:
        """Chunk ``i`` of the index as a row of the chunk listing (with its neighbours' ids, "" at an end)."""
        c = self.index.chunks[i]
        prev_i, next_i = self.index.neighbour(i, -1), self.index.neighbour(i, 1)
        return {"id": c.id, "knowledge_id": c.knowledge_id, "knowledge_base_id": self.kb_id,
                "content": c.content, "chunk_index": c.chunk_index, "is_enabled": True,
                "start_at": c.start_at, "end_at": c.end_at, "chunk_type": "text",
                "pre_chunk_id": self.index.chunks[prev_i].id if prev_i is not None else "",
                "next_chunk_id": self.index.chunks[next_i].id if next_i is not None else ""}

    def _knowledge_rows(self) -> dict[str, dict[str, Any]]:
        """Knowledge id -> its row in the knowledge list (one per document, in index order, with its chunk count)."""
        rows: dict[str, dict[str, Any]] = {}
        for c in self.index.chunks:
            row = rows.setdefault(c.knowledge_id, {
                "id": c.knowledge_id, "knowledge_base_id": self.kb_id, "title": c.knowledge_title,
                "file_name": f"{c.knowledge_id}.md", "type": "file", "parse_status": "completed",
                "enable_status": "enabled", "chunk_count": 0})
            row["chunk_count"] += 1
        return rows

    async def _chat_events(self, refs: list[dict[str, Any]], req_id: str) -> AsyncIterator[bytes]:
        """The SSE events of one chat answer: its references, the answer's pieces, ``complete``."""
        def event(payload: dict[str, Any]) -> bytes:
            return b"event:message\ndata:" + _dumps({"id": req_id, **payload}) + b"\n\n"
        yield event({"response_type": "references", "content": "", "done": False, "knowledge_references": refs})
        for piece in _extractive_answer(refs, self.kb_id):
            await asyncio.sleep(0)
            yield event({"response_type": "answer", "content": piece, "done": False})
        yield event({"response_type": "complete", "content": "", "done": True})


def create_app(engine: RetrievalEngine, *, api_key: str, kb_id: str = "kb-demo",
               faults: FaultConfig | None = None, allow_fault_control: bool = False) -> Starlette:
    """The ASGI application serving ``engine`` as knowledge base ``kb_id`` (see :class:`SandboxApp`).

    Its ``.state.faults`` is the :class:`FaultInjector` in force, ``.state.sandbox`` the :class:`SandboxApp`.
    """
    return SandboxApp(engine, api_key=api_key, kb_id=kb_id, faults=faults,
                      allow_fault_control=allow_fault_control).app


def _page_args(request: Request) -> tuple[int, int]:
    """``page`` (>= 1, default 1) and ``page_size`` (1..1000, default 20); both defaults if either is no integer."""
    try:
        page = max(1, int(request.query_params.get("page", 1)))
        size = min(1000, max(1, int(request.query_params.get("page_size", 20))))
    except ValueError:
        page, size = 1, 20
    return page, size


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
