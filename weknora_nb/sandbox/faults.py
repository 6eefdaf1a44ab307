"""What the sandbox server does wrong on purpose: latency, hangs, errors, rate limits, bad bodies.

Off by default and only on ``/api/v1/`` paths (and the judge's ``/v1/``). Per request, in this
order: added latency (fixed plus uniform jitter, or lognormal), then a hang, then at most one of a 500, a 429 with
``Retry-After`` and a malformed 200 body. SSE streams may be cut: the stream ends right after its
``references`` event (or, when it has none, just before ``complete``), so the client never sees
``complete``. ``rerank_error_rate`` is rolled by knowledge-search itself (the reranker fails for
that request, docs/weknora-contract.md C37). Rates are probabilities per request, drawn from one
random stream seeded by ``seed``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from weknora_nb.core.errors import UsageError
from weknora_nb.sandbox.wire import TOO_MANY_REQUESTS, app_error, internal_error

__all__ = ["FaultConfig", "FaultInjector", "FaultMiddleware", "MALFORMED_BODY"]

#: the body of an injected malformed response: a 200 whose JSON stops mid-string
MALFORMED_BODY = b'{"success": true, "data": [{"id": "'

_REFERENCES = b'"response_type":"references"'
_COMPLETE = b'"response_type":"complete"'


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
    seed: int | None = None

    #: the settings that are probabilities (each must lie in [0, 1])
    RATES: ClassVar[tuple[str, ...]] = ("error_rate", "rate_limit_rate", "hang_rate", "malformed_rate",
                                        "stream_cut_rate", "rerank_error_rate")

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

        In this order: latency; a hang of ``hang_s`` (rate ``hang_rate``); a 500, WeKnora's answer
        to an error that is no AppError (``error_rate``, C11), else a 429 with ``Retry-After:
        retry_after_s`` and code 1006 (``rate_limit_rate``, C12), else a malformed 200
        (``malformed_rate``). Returns that response, or None to serve.
        """
        delay = self.latency_s()
        if delay:
            await asyncio.sleep(delay)
        if self.roll(self.cfg.hang_rate):
            await asyncio.sleep(self.cfg.hang_s)
        if self.roll(self.cfg.error_rate):
            return internal_error()
        if self.roll(self.cfg.rate_limit_rate):
            return app_error(TOO_MANY_REQUESTS, "too many requests (injected fault)",
                             headers={"Retry-After": f"{self.cfg.retry_after_s:g}"})
        if self.roll(self.cfg.malformed_rate):
            return Response(MALFORMED_BODY, media_type="application/json")
        return None

    def cutting_streams(self, send: Send) -> Send:
        """``send`` that may cut an event stream: it ends right after the ``references`` event, or
        just before ``complete`` when no references came.

        One roll (rate ``stream_cut_rate``) per 200 ``text/event-stream`` response, when it
        starts; each event is one body message, and the rest of a cut stream is dropped.
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
                body = message.get("body", b"")
                if _COMPLETE in body:
                    message, done = {"type": "http.response.body", "body": b"", "more_body": False}, True
                elif _REFERENCES in body:
                    message, done = {**message, "more_body": False}, True
            await send(message)
        return send_or_cut


def _is_event_stream(start: Message) -> bool:
    """Whether an ``http.response.start`` message announces a server-sent event stream."""
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in start.get("headers", ()))


class FaultMiddleware:
    """Injects the faults of ``faults`` into every ``/api/v1/`` (and ``/v1/``) request, before routing.

    So before the answer memory too: a remembered answer still gets its latency and faults.
    """

    def __init__(self, app: ASGIApp, *, faults: FaultInjector):
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(("/api/v1/", "/v1/")):
            fault = await self.faults.before_request()
            if fault is not None:
                await fault(scope, receive, send)
                return
            if self.faults.cfg.stream_cut_rate > 0:
                send = self.faults.cutting_streams(send)
        await self.app(scope, receive, send)
