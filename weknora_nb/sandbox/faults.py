"""What the sandbox server does wrong on purpose: latency, hangs, errors, rate limits, bad bodies.

Off by default and only on ``/api/v1/`` paths (and the judge's ``/v1/``). Per request, in this
order: added latency (fixed plus uniform jitter, or lognormal), then a hang, then at most one of a 500, a 429 with
``Retry-After`` and a malformed 200 body. SSE streams (rolled when a 200 stream starts, in this order) may
carry an agent tool's failure, an ``error`` event with ``done: false`` after ``agent_query`` that does not
end the answer; may end in a terminal ``error`` with ``done: true`` right after ``references`` (or before the
first answer piece), after which the server sends nothing and keeps the stream open for ``hang_s``, as WeKnora
does (docs/weknora-contract.md C125); or may be cut: the stream ends right after its ``references`` event (or,
when it has none, just before ``complete``), so the client never sees ``complete``.

Rolled by the routes themselves: ``rerank_error_rate`` (knowledge-search's reranker fails for that request,
C37); ``embedding_error_rate`` (the query's embedding fails: the embedding model answers 429, and WeKnora's
search degrades or fails as C121 says; ``POST /v1/embeddings`` answers that 429 too);
``unstable_tie_order_rate`` (a chunk listing orders chunks of equal ``chunk_index`` at random, as Postgres
may, so that pages disagree, C124). Rates are probabilities per request.

With a ``seed``, each request's draws come from a stream of its own, seeded by the seed, the request
(method, path, query string, body) and how many times that same request came before: the same
requests get the same faults whatever order concurrency brings them in, and a retry draws afresh.
Without one, every draw comes from one unseeded stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from weknora_nb.core.errors import UsageError
from weknora_nb.sandbox.wire import TOO_MANY_REQUESTS, app_error, go_json, internal_error

#: the body of an injected malformed response: a 200 whose JSON stops mid-string
MALFORMED_BODY = b'{"success": true, "data": [{"id": "'

_REFERENCES = b'"response_type":"references"'
_COMPLETE = b'"response_type":"complete"'
_ANSWER = b'"response_type":"answer"'
_AGENT_QUERY = b'"response_type":"agent_query"'


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
    rerank_error_rate: float = 0.0  # knowledge-search: the reranker fails, results fall back (C37)
    embedding_error_rate: float = 0.0  # the query embedding answers 429: search degrades or fails (C121)
    unstable_tie_order_rate: float = 0.0  # a chunk listing shuffles chunks of equal chunk_index (C124)
    sse_tool_error_rate: float = 0.0  # chat: an agent tool's error event, done false, the answer goes on (C125)
    sse_terminal_error_rate: float = 0.0  # chat: an error event, done true, then the stream stays open (C125)
    seed: int | None = None

    #: the settings that are probabilities (each must lie in [0, 1])
    RATES: ClassVar[tuple[str, ...]] = ("error_rate", "rate_limit_rate", "hang_rate", "malformed_rate",
                                        "stream_cut_rate", "rerank_error_rate", "embedding_error_rate",
                                        "unstable_tie_order_rate", "sse_tool_error_rate", "sse_terminal_error_rate")
    #: the largest value of each setting that is no probability (a day of latency, a lognormal sigma of 4:
    #: its 99.99th percentile is 2.7 million times the median)
    LIMITS: ClassVar[dict[str, float]] = {"latency_ms": 86_400_000.0, "latency_jitter_ms": 86_400_000.0,
                                          "latency_sigma": 4.0, "retry_after_s": 86_400.0, "hang_s": 86_400.0}

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
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise UsageError(argument="seed", allowed="an integer or null", got=value)
                continue
            high = 1.0 if name in cls.RATES else cls.LIMITS[name]
            allowed = "a number between 0 and 1" if name in cls.RATES else f"a number between 0 and {high:.10g}"
            if (not isinstance(value, int | float) or isinstance(value, bool) or not _within(value, high)):
                raise UsageError(argument=name, allowed=allowed, got=value)
        return cls(**data)


def _within(value: float, high: float) -> bool:
    """``0 <= value <= high`` for a number a float can hold (NaN and integers too large for a float are not)."""
    try:
        return math.isfinite(float(value)) and 0.0 <= value <= high
    except OverflowError:
        return False


class FaultInjector:
    """The faults in force and the random streams that decide each one (see the module's docstring)."""

    def __init__(self, cfg: FaultConfig):
        self.set(cfg)

    def set(self, cfg: FaultConfig) -> None:
        """Put ``cfg`` in force and start its streams afresh (no request has come before)."""
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self._seen: dict[bytes, int] = {}

    def stream_for(self, request: bytes) -> random.Random:
        """The stream of one request's draws (``request``: its method, path, query string and body):
        with a seed, one seeded by the seed, the request and how many times it came before; else the shared
        unseeded stream."""
        if self.cfg.seed is None:
            return self.rng
        key = hashlib.blake2b(request, digest_size=16).digest()
        n = self._seen.get(key, 0)
        self._seen[key] = n + 1
        return random.Random(f"{self.cfg.seed}:{n}:{key.hex()}")

    def roll(self, rate: float, rng: random.Random | None = None) -> bool:
        """True with probability ``rate``, drawn from ``rng`` (default: the shared stream); a rate of 0 draws
        nothing."""
        return rate > 0 and (rng or self.rng).random() < rate

    def latency_s(self, rng: random.Random | None = None) -> float:
        """Added latency in seconds: ``latency_ms * LogNormal(0, sigma)`` when ``latency_sigma > 0``,
        else ``max(0, latency_ms + Uniform(-jitter, jitter))``, over 1000."""
        c, rng = self.cfg, rng or self.rng
        if c.latency_sigma > 0 and c.latency_ms > 0:
            return rng.lognormvariate(0.0, c.latency_sigma) * c.latency_ms / 1000.0
        jitter = rng.uniform(-c.latency_jitter_ms, c.latency_jitter_ms) if c.latency_jitter_ms else 0.0
        return max(0.0, c.latency_ms + jitter) / 1000.0

    async def before_request(self, rng: random.Random | None = None) -> Response | None:
        """Wait the added latency, then maybe hang, then roll at most one faulty response.

        In this order: latency; a hang of ``hang_s`` (rate ``hang_rate``); a 500, WeKnora's answer
        to an error that is no AppError (``error_rate``, C11), else a 429 with ``Retry-After:
        retry_after_s`` and code 1006 (``rate_limit_rate``, C12), else a malformed 200
        (``malformed_rate``). Returns that response, or None to serve. ``rng``: the request's stream
        (default: the shared one).
        """
        delay = self.latency_s(rng)
        if delay:
            await asyncio.sleep(delay)
        if self.roll(self.cfg.hang_rate, rng):
            await asyncio.sleep(self.cfg.hang_s)
        if self.roll(self.cfg.error_rate, rng):
            return internal_error()
        if self.roll(self.cfg.rate_limit_rate, rng):
            return app_error(TOO_MANY_REQUESTS, "too many requests (injected fault)",
                             headers={"Retry-After": f"{self.cfg.retry_after_s:g}"})
        if self.roll(self.cfg.malformed_rate, rng):
            return Response(MALFORMED_BODY, media_type="application/json")
        return None

    def streaming_faults(self, send: Send, rng: random.Random | None = None) -> Send:
        """``send`` with the SSE faults of one response: an agent tool's ``error`` (``done: false``) after
        ``agent_query``; a terminal ``error`` (``done: true``) right after ``references`` (or before the
        first ``answer``), then nothing for ``hang_s`` while the stream stays open, then its end; a cut right
        after ``references`` (or just before ``complete`` when no references came).

        Rolled once per 200 ``text/event-stream`` response, when it starts, in that order (a rate of 0 draws
        nothing); each event is one body message; what follows a terminal error or a cut is dropped.
        """
        faults = {"tool": False, "terminal": False, "cut": False}
        done = False
        stream_id = ""

        async def send_faulty(message: Message) -> None:
            nonlocal done, stream_id
            if done:
                return
            if message["type"] == "http.response.start":
                if message["status"] == 200 and _is_event_stream(message):
                    for name, rate in (("tool", self.cfg.sse_tool_error_rate),
                                       ("terminal", self.cfg.sse_terminal_error_rate),
                                       ("cut", self.cfg.stream_cut_rate)):
                        faults[name] = self.roll(rate, rng)
                await send(message)
                return
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            stream_id = stream_id or _event_id(body)
            if faults["tool"] and _AGENT_QUERY in body:
                faults["tool"] = False
                await send(message)
                await send(_event(tool_error_event(stream_id)))
                return
            if faults["terminal"] and (_REFERENCES in body or _ANSWER in body or _COMPLETE in body):
                if _REFERENCES in body:
                    await send(message)
                await send(_event(terminal_error_event(stream_id)))
                await asyncio.sleep(self.cfg.hang_s)  # a client that leaves cancels it (Starlette's disconnect watch)
                message, done = {"type": "http.response.body", "body": b"", "more_body": False}, True
            elif faults["cut"] and _COMPLETE in body:
                message, done = {"type": "http.response.body", "body": b"", "more_body": False}, True
            elif faults["cut"] and _REFERENCES in body:
                message, done = {**message, "more_body": False}, True
            await send(message)
        return send_faulty


#: the message of the injected failures (WeKnora's own texts around it, recordings 110 and the agent's tool results)
INJECTED = "injected failure (sandbox fault)"


def tool_error_event(stream_id: str) -> dict[str, Any]:
    """An agent tool's failure as WeKnora streams it: ``response_type`` error, ``done`` false, the tool result's
    fields in ``data`` (agent_stream_handler.go:231-266 @ v0.7.2); the agent goes on (C125)."""
    error = f"knowledge_search failed: {INJECTED}"
    return {"id": stream_id, "response_type": "error", "content": error, "done": False,
            "data": {"tool_name": "knowledge_search", "success": False, "error": error, "duration_ms": 0,
                     "tool_call_id": f"{stream_id}-tool"}}


def terminal_error_event(stream_id: str) -> dict[str, Any]:
    """The pipeline's failure as WeKnora streams it: ``done`` true, ``data.error`` and ``data.stage``
    (qa.go:981-999 @ v0.7.2; recording 110, the chat model answering 500); nothing follows (C125)."""
    error = f"create chat completion stream: error, status code: 500, status: 500 Internal Server Error, " \
            f"message: {INJECTED}"
    return {"id": stream_id, "response_type": "error", "content": error, "done": True,
            "data": {"error": error, "stage": "chat_completion_stream"}}


def _event(payload: dict[str, Any]) -> Message:
    """One SSE event as a body message of a stream that goes on (C62's framing)."""
    return {"type": "http.response.body", "body": b"event:message\ndata:" + go_json(payload) + b"\n\n",
            "more_body": True}


def _event_id(body: bytes) -> str:
    """The ``id`` of the SSE event in ``body`` (every event of a stream carries the request's), or ""."""
    start = body.find(b"data:")
    if start < 0:
        return ""
    try:
        value = json.loads(body[start + 5:].split(b"\n", 1)[0])
    except ValueError:
        return ""
    return str(value.get("id", "")) if isinstance(value, dict) else ""


def _is_event_stream(start: Message) -> bool:
    """Whether an ``http.response.start`` message announces a server-sent event stream."""
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in start.get("headers", ()))


class FaultMiddleware:
    """Injects the faults of ``faults`` into every ``/api/v1/`` (and ``/v1/``) request, before routing.

    So before the answer memory too: a remembered answer still gets its latency and faults. The request's
    stream is left in ``scope["state"]["fault_rng"]`` for the draws routes make themselves (the reranker's).
    With a seed the body is read first (it is part of what seeds the stream) and handed on unchanged.
    """

    def __init__(self, app: ASGIApp, *, faults: FaultInjector):
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(("/api/v1/", "/v1/")):
            rng = None
            if self.faults.cfg.seed is not None:
                body, receive = await _buffered(receive)
                rng = self.faults.stream_for(request_key(scope["method"], scope["path"],
                                                         scope.get("query_string", b""), body))
                scope.setdefault("state", {})["fault_rng"] = rng
            fault = await self.faults.before_request(rng)
            if fault is not None:
                await fault(scope, receive, send)
                return
            c = self.faults.cfg
            if c.stream_cut_rate > 0 or c.sse_tool_error_rate > 0 or c.sse_terminal_error_rate > 0:
                send = self.faults.streaming_faults(send, rng)
        await self.app(scope, receive, send)


def request_key(method: str, path: str, query_string: bytes, body: bytes) -> bytes:
    """What names a request for :meth:`FaultInjector.stream_for`: its method, path, query string and body."""
    return b"\0".join((method.encode(), path.encode(), query_string, body))


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request's whole body, and a ``receive`` that hands it on as one message (then what ``receive``
    says next: a disconnect)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts), _replay([message], receive)
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            body = b"".join(parts)
            return body, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)


def _replay(first: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that returns the messages of ``first``, then those of ``receive``."""
    pending = list(first)

    async def again() -> Message:
        return pending.pop(0) if pending else await receive()
    return again
