"""An httpx client for WeKnora's retrieval endpoints, with retries and one exception per failure kind.

Failures raise the :class:`~weknora_nb.core.errors.RequestFailed` kinds (``kind`` is the
status the results table records: connect, timeout, auth, not_found, bad_request,
rate_limited, server, protocol).

Retries (exponential backoff with full jitter, ``Retry-After`` honoured) on connection
errors, timeouts, 429 and 5xx; never on other 4xx or protocol errors.

The API key is read from the environment (``WEKNORA_API_KEY`` by default) and sent as
``X-API-Key``; it is never stored on disk, logged or included in an error message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import numbers
import os
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from weknora_nb.core.errors import (
    AuthFailed,
    BadRequest,
    ConnectFailed,
    NotFound,
    ProtocolFailed,
    RateLimited,
    RequestFailed,
    RequestTimeout,
    ServerFailed,
    UsageError,
)

__all__ = ["ClientSettings", "WeKnoraClient", "ChatResult",
           "redact_url", "API_KEY_ENV"]

log = logging.getLogger(__name__)

API_KEY_ENV = "WEKNORA_API_KEY"
TENANT_ENV = "WEKNORA_TENANT_ID"
_CITATION = re.compile(r"<kb\b[^>]*?chunk_id=\"([^\"]+)\"[^>]*/?>")
_T = TypeVar("_T")


def redact_url(url: str) -> str:
    """The URL without user info or query string (nothing secret goes into a manifest)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


@dataclass
class ClientSettings:
    """How to reach WeKnora. The key itself is never a setting: only the variable that holds it.

    Checked when made: ``base_url`` must be an http:// or https:// URL with a host,
    ``timeout_s`` > 0 seconds, ``max_attempts`` >= 1 (a :class:`UsageError` names the
    command-line option: ``--base-url``, ``--timeout``, ``--max-attempts``).
    """

    base_url: str
    api_key_env: str = API_KEY_ENV
    tenant_id: str | None = None
    timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    max_attempts: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 30.0
    max_connections: int = 32
    extra_headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _is_base_url(self.base_url):
            raise UsageError(argument="--base-url", allowed="an http:// or https:// URL with a host, e.g. "
                             "http://127.0.0.1:8080", got=_shown_url(self.base_url))
        if not _is_number(self.timeout_s) or not self.timeout_s > 0:
            raise UsageError(argument="--timeout", allowed="> 0 (seconds)", got=self.timeout_s)
        if (not isinstance(self.max_attempts, numbers.Integral) or isinstance(self.max_attempts, bool)
                or self.max_attempts < 1):
            raise UsageError(argument="--max-attempts", allowed=">= 1", got=self.max_attempts)

    def api_key(self) -> str:
        """The API key from the environment variable ``api_key_env``; AuthFailed when it is unset or empty."""
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise AuthFailed(f"no API key: set the environment variable {self.api_key_env}")
        return key


def _is_base_url(url: Any) -> bool:
    """Whether ``url`` is an http:// or https:// URL with a host (and, if any, a numeric port)."""
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _shown_url(url: Any) -> Any:
    """A URL as an error message may show it: no user info, query string or fragment."""
    if not isinstance(url, str):
        return url
    url = url.split("#", 1)[0].split("?", 1)[0]
    return re.sub(r"^([^/@]*//)?[^/@]*@", r"\1***@", url)


@dataclass
class ChatResult:
    """What the chat stream gave: the references list, the answer text and its inline citations."""

    references: list[dict[str, Any]]
    answer: str
    citations: list[str]


class WeKnoraClient:
    """Async client; use as ``async with WeKnoraClient(settings) as c: ...``."""

    def __init__(self, settings: ClientSettings, *, rng: random.Random | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        """``ssl_context``: share one between clients (building one loads the CA store, about 20 ms)."""
        self.settings = settings
        self._rng = rng or random.Random()
        headers = {"X-API-Key": settings.api_key(), "Accept": "application/json", **settings.extra_headers}
        tenant = settings.tenant_id or os.environ.get(TENANT_ENV)
        if tenant:
            headers["X-Tenant-ID"] = str(tenant)
        self._http = httpx.AsyncClient(
            base_url=settings.base_url.rstrip("/"), headers=headers,
            timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
            verify=ssl_context if ssl_context is not None else True,
            limits=httpx.Limits(max_connections=settings.max_connections,
                                max_keepalive_connections=settings.max_connections))

    async def __aenter__(self) -> WeKnoraClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the endpoints ------------------------------------------------------------------
    async def hybrid_search(self, kb_id: str, query_text: str, **params: Any) -> list[dict[str, Any]]:
        """``POST /api/v1/knowledge-bases/{kb_id}/hybrid-search``: raw recall before rerank."""
        body = {"query_text": query_text, **params}
        return _as_list(await self.request("POST", f"/api/v1/knowledge-bases/{kb_id}/hybrid-search", body))

    async def knowledge_search(self, kb_ids: list[str], query: str, **params: Any) -> list[dict[str, Any]]:
        """``POST /api/v1/knowledge-search``: search, rerank, merge and top-k, without the LLM."""
        body = {"query": query, "knowledge_base_ids": list(kb_ids), **params}
        return _as_list(await self.request("POST", "/api/v1/knowledge-search", body))

    async def chat(self, kb_ids: list[str], query: str, **params: Any) -> ChatResult:
        """Create a session, read the chat stream to its ``complete`` event."""
        async def once() -> ChatResult:
            session = await self.request("POST", "/api/v1/sessions", {"knowledge_base_id": kb_ids[0]},
                                         retry=False)
            sid = session.get("id") if isinstance(session, dict) else None
            if not sid:
                raise ProtocolFailed("session creation returned no id")
            return await self._chat_stream(sid, {"query": query, "knowledge_base_ids": list(kb_ids), **params})
        return await self._with_retries(once)

    async def retrieval_config(self) -> dict[str, Any]:
        """``GET /api/v1/tenants/kv/retrieval-config``."""
        data = await self.request("GET", "/api/v1/tenants/kv/retrieval-config")
        if not isinstance(data, dict):
            raise ProtocolFailed("retrieval-config: data is not an object")
        return data

    async def list_knowledge(self, kb_id: str, page_size: int = 100) -> list[dict[str, Any]]:
        """Every knowledge (document) of a knowledge base, all pages."""
        return await self._all_pages(f"/api/v1/knowledge-bases/{kb_id}/knowledge", page_size)

    async def list_chunks(self, knowledge_id: str, page_size: int = 200) -> list[dict[str, Any]]:
        """Every chunk of a knowledge, all pages."""
        return await self._all_pages(f"/api/v1/chunks/{knowledge_id}", page_size)

    # -- plumbing -----------------------------------------------------------------------
    async def _all_pages(self, path: str, page_size: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            body = await self.request("GET", path, params={"page": page, "page_size": page_size}, envelope=True)
            items = _as_list(body.get("data"))
            out.extend(items)
            total = body.get("total")
            if not items or (isinstance(total, int) and len(out) >= total) or len(items) < page_size:
                return out
            page += 1

    async def request(self, method: str, path: str, json_body: Any = None, *, params: dict | None = None,
                      retry: bool = True, envelope: bool = False) -> Any:
        """One call with retries; returns the envelope's ``data`` (or the whole envelope)."""
        async def once() -> Any:
            resp = await self._send(method, path, json_body, params)
            return _unwrap(resp, envelope=envelope)
        return await (self._with_retries(once) if retry else once())

    async def _send(self, method: str, path: str, json_body: Any, params: dict | None) -> httpx.Response:
        try:
            return await self._http.request(method, path, json=json_body, params=params)
        except httpx.TimeoutException as exc:
            raise RequestTimeout(f"{method} {path}: timed out ({type(exc).__name__})") from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise ConnectFailed(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def _chat_stream(self, sid: str, body: dict[str, Any]) -> ChatResult:
        path = f"/api/v1/knowledge-chat/{sid}"
        refs: list[dict[str, Any]] | None = None
        answer: list[str] = []
        try:
            async with self._http.stream("POST", path, json=body, headers={"Accept": "text/event-stream"}) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _unwrap(resp)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    try:
                        ev = json.loads(line[5:].strip())
                    except ValueError as exc:
                        raise ProtocolFailed(f"{path}: an SSE data line is not JSON") from exc
                    kind = ev.get("response_type")
                    if kind == "references":
                        refs = _as_list(ev.get("knowledge_references") or [])
                    elif kind == "answer":
                        answer.append(str(ev.get("content") or ""))
                    elif kind == "complete":
                        text = "".join(answer)
                        return ChatResult(refs or [], text, _CITATION.findall(text))
                    elif kind == "error":
                        raise ServerFailed(f"{path}: stream error event: {str(ev.get('content'))[:200]}")
        except httpx.TimeoutException as exc:
            raise RequestTimeout(f"POST {path}: timed out") from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise ProtocolFailed(f"POST {path}: stream broken: {type(exc).__name__}") from exc
        raise ProtocolFailed(f"POST {path}: stream ended before its 'complete' event")

    async def _with_retries(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()`` up to ``max_attempts`` times while it fails retryably, sleeping between attempts.

        The delay before attempt n + 1 is the server's ``Retry-After`` (at most
        ``retry_after_max_s``) or, without one, uniform in [0, min(backoff_max_s,
        backoff_base_s * 2^(n - 1))] seconds (exponential backoff with full jitter).
        """
        s = self.settings
        attempt = 1
        while True:
            try:
                return await call()
            except RequestFailed as exc:
                if not exc.retryable or attempt >= s.max_attempts:
                    raise
                if exc.retry_after is not None:
                    delay = min(exc.retry_after, s.retry_after_max_s)
                else:
                    delay = self._rng.uniform(0, min(s.backoff_max_s, s.backoff_base_s * 2 ** (attempt - 1)))
                log.debug("attempt %d failed (%s); retrying in %.2f s", attempt, exc.kind, delay)
                await asyncio.sleep(delay)
                attempt += 1


def _as_list(data: Any) -> list[dict[str, Any]]:
    if data is None:
        return []
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise ProtocolFailed("expected a list of objects in 'data'")
    return data


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _unwrap(resp: httpx.Response, *, envelope: bool = False) -> Any:
    """WeKnora's envelope to data, or the exception for its failure kind."""
    status = resp.status_code
    try:
        body = resp.json()
    except ValueError:
        body = None
    if status >= 400:
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code, msg = err.get("code"), str(err.get("message", ""))
        else:  # the auth middleware's bare {"error": "..."} or a non-JSON error page
            code, msg = None, str(err if err is not None else resp.text[:200])
        where = f"{resp.request.method} {resp.request.url.path}"
        text = f"{where}: HTTP {status}: {msg}"
        if status in (401, 403):
            raise AuthFailed(text, status=status, code=code)
        if status == 404:
            raise NotFound(text, status=status, code=code)
        if status == 429:
            raise RateLimited(text, status=status, code=code, retry_after=_retry_after(resp))
        if status >= 500:
            raise ServerFailed(text, status=status, code=code)
        raise BadRequest(text, status=status, code=code)
    if not isinstance(body, dict):
        raise ProtocolFailed(f"{resp.request.method} {resp.request.url.path}: HTTP {status} but the body is not "
                             "a JSON object", status=status)
    if body.get("success") is False:
        err = body.get("error") or {}
        raise ProtocolFailed(f"HTTP {status} with success=false: {str(err)[:200]}", status=status)
    if "data" not in body and not envelope:
        raise ProtocolFailed(f"{resp.request.method} {resp.request.url.path}: no 'data' in the envelope",
                             status=status)
    return body if envelope else body["data"]
