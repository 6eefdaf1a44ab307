"""An httpx client for WeKnora's retrieval endpoints, with retries and one exception per failure kind.

Every call follows ``docs/weknora-contract.md`` (facts cited as Cnn): hybrid-search by POST,
or GET where POST is not routed (C15); chunk listings paged to ``total`` with every
searchable chunk type (C52); chat sessions titled and created by ``POST /api/v1/sessions``
(C58), chat with ``disable_title`` (C60/C61), the stream read as gin writes it (C62-C65).

Failures raise the :class:`~weknora_nb.core.errors.RequestFailed` kinds (``kind`` is the
status the results table records: connect, timeout, auth, not_found, bad_request,
rate_limited, server, protocol); :mod:`weknora_nb.collect.http.envelope` reads WeKnora's error
shapes into them, with the envelope's code and message.

Retries (exponential backoff with full jitter, ``Retry-After`` honoured) on connection
errors, timeouts, 429 and 5xx; never on other 4xx or protocol errors.

The API key is read from the environment (``WEKNORA_API_KEY`` by default) and sent as
``X-API-Key``; it is never stored on disk, logged or included in an error message.
"""

from __future__ import annotations

import asyncio
import html
import logging
import numbers
import os
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from weknora_nb.collect.http.envelope import json_value, route_missing, unwrap
from weknora_nb.collect.http.redact import install_log_redaction, redact_text, settings_repr
from weknora_nb.collect.http.retry import with_retries
from weknora_nb.core.errors import (
    AuthFailed,
    ConnectFailed,
    ProtocolFailed,
    RequestFailed,
    RequestTimeout,
    ServerFailed,
    UsageError,
)
from weknora_nb.core.weknora import LISTED_CHUNK_TYPES, RETRIEVAL_PROGRESS_TOOL

log = logging.getLogger(__name__)

API_KEY_ENV = "WEKNORA_API_KEY"
TENANT_ENV = "WEKNORA_TENANT_ID"
#: C65: an inline citation ``<kb doc="TITLE" chunk_id="ID" kb_id="KB" />`` (attributes HTML-escaped)
_CITATION = re.compile(r"<kb\b[^>]*?chunk_id=\"([^\"]+)\"[^>]*/?>")
#: the most pages :meth:`WeKnoraClient.all_pages` asks for in one pass (a guard against a server that never ends)
MAX_PAGES = 10_000
#: how many times a listing that fell short of its total is read from its first page (C101: OFFSET paging over an
#: order with ties can repeat some rows and skip others; the passes' union is kept)
LISTING_PASSES = 3
#: C103: the error a chat answers with when its agent has no chat model (a fresh tenant's built-in agent)
_NO_CHAT_MODEL = "chat model is not configured"
_T = TypeVar("_T")


def server_address(url: str) -> str:
    """The server a base URL names, as a manifest records it: scheme, host, port and path (no trailing
    ``/``), without user info or query string (nothing secret goes into a manifest)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def split_base_url(url: str) -> tuple[str, tuple[str, str] | None, str]:
    """A base URL as httpx is given it: (the URL without user info, query or fragment; the user name and
    password of its user info, sent as HTTP basic auth; its query string, sent with every request).

    httpx would append every path to a base URL's query string (``/?token=x/api/v1/...``), and log the
    user info with every request; taken apart, both reach the server as meant and the log line shows
    neither (the query string's secrets are redacted there, :func:`~.redact.redact_url`).
    """
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    auth = (unquote(parts.username or ""), unquote(parts.password or "")) if "@" in parts.netloc else None
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", "")), auth, parts.query


@dataclass
class ClientSettings:
    """How to reach WeKnora. The key itself is never a setting: only the variable that holds it.

    Checked when made: ``base_url`` must be an http:// or https:// URL with a host,
    ``timeout_s`` > 0 seconds, ``deadline_s`` > 0 seconds, ``max_attempts`` >= 1 (a :class:`UsageError` names
    the command-line option: ``--base-url``, ``--timeout``, ``--deadline``, ``--max-attempts``).

    ``timeout_s`` bounds each wait for bytes (a read, a connection); ``deadline_s`` bounds a whole request, its
    retries and a chat's stream included: a body that trickles in a byte a second, or a stream that never sends
    its last event, is a :class:`RequestTimeout` once the deadline has passed.
    """

    base_url: str
    api_key_env: str = API_KEY_ENV
    tenant_id: str | None = None
    timeout_s: float = 30.0
    deadline_s: float = 300.0
    connect_timeout_s: float = 5.0
    max_attempts: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 30.0
    max_connections: int = 32
    extra_headers: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        """The settings with the base URL's secrets masked (:func:`~.redact.redact_url`)."""
        return settings_repr(self)

    def __post_init__(self) -> None:
        if not _is_base_url(self.base_url):
            raise UsageError(argument="--base-url", allowed="an http:// or https:// URL with a host, e.g. "
                             "http://127.0.0.1:8080", got=_shown_url(self.base_url))
        if not _is_number(self.timeout_s) or not self.timeout_s > 0:
            raise UsageError(argument="--timeout", allowed="> 0 (seconds)", got=self.timeout_s)
        if not _is_number(self.deadline_s) or not self.deadline_s > 0:
            raise UsageError(argument="--deadline", allowed="> 0 (seconds)", got=self.deadline_s)
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
    """What a chat stream gave: its references, the answer text, its inline citations, the session it ran in.

    ``retrieval_skipped``: the server showed its pipeline's progress (``tool_call`` events, C104) without a
    ``knowledge_search`` step and sent no references: it decided not to retrieve (a greeting, chit-chat).
    ``stream_errors``: the messages of non-terminal ``error`` events (``done: false``, C105), passed over.
    """

    references: list[dict[str, Any]]
    answer: str
    citations: list[str]
    session_id: str | None = None
    retrieval_skipped: bool = False
    stream_errors: list[str] = field(default_factory=list)


@dataclass
class Listing:
    """Every item of a paged list (C9: ``total``, ``page``, ``page_size``), and how the paging ended.

    ``total`` is the server's count (None when it sent none); ``complete`` is False when the
    server stopped giving new items before ``total`` was reached.
    """

    items: list[dict[str, Any]]
    total: int | None
    pages: int
    passes: int = 1

    @property
    def complete(self) -> bool:
        return self.total is None or len(self.items) >= self.total


class WeKnoraClient:
    """Async client; use as ``async with WeKnoraClient(settings) as c: ...``.

    State kept for the run: :attr:`hybrid_method` (the method hybrid-search answers to once
    known, C15) and :attr:`sessions` (the ids of the chat sessions this client created, C58,
    for the collector to delete at the end).
    """

    def __init__(self, settings: ClientSettings, *, rng: random.Random | None = None):
        """TLS is verified as httpx does by default, with one context shared by the process's clients
        (:func:`~weknora_nb.collect.http.transport.default_tls`)."""
        self.settings = settings
        self._rng = rng or random.Random()
        headers = {"X-API-Key": settings.api_key(), "Accept": "application/json", **settings.extra_headers}
        tenant = settings.tenant_id or os.environ.get(TENANT_ENV)
        self.tenant_id: str | None = str(tenant) if tenant else None
        if self.tenant_id:
            headers["X-Tenant-ID"] = self.tenant_id
        self.hybrid_method: str | None = None
        self.sessions: list[str] = []
        install_log_redaction()  # httpx logs every request's URL (INFO): its secrets masked
        base_url, auth, query = split_base_url(settings.base_url)
        from weknora_nb.collect.http.transport import async_client  # aiohttp's import waits for a client

        self._http = async_client(
            base_url=base_url, headers=headers, auth=httpx.BasicAuth(*auth) if auth else None,
            params=httpx.QueryParams(query),
            timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(max_connections=settings.max_connections,
                                max_keepalive_connections=settings.max_connections))

    async def __aenter__(self) -> WeKnoraClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- search ---------------------------------------------------------------------------
    async def hybrid_search(self, kb_id: str, query_text: str, **params: Any) -> list[dict[str, Any]]:
        """``/api/v1/knowledge-bases/{kb_id}/hybrid-search``: raw recall before rerank (C15-C25).

        POST first; when the server has no POST route (v0.6.2 routes GET only and gin answers
        a plain 404, C14/C15) the same JSON body goes by GET. The method that worked is kept in
        :attr:`hybrid_method` and used from then on. ``data: null`` (no hit, C25) is an empty list.
        """
        path = f"/api/v1/knowledge-bases/{kb_id}/hybrid-search"
        body = {"query_text": query_text, **params}
        if self.hybrid_method is not None:
            return _as_list(await self.request(self.hybrid_method, path, body))
        try:
            data = await self.request("POST", path, body)
        except RequestFailed as exc:
            if not route_missing(exc):
                raise
            log.info("hybrid-search has no POST route here (WeKnora <= v0.6.2, C15): using GET")
            data = await self.request("GET", path, body)
            self.hybrid_method = "GET"
        else:
            self.hybrid_method = self.hybrid_method or "POST"
        return _as_list(data)

    async def knowledge_search(self, kb_ids: list[str], query: str, **params: Any) -> list[dict[str, Any]]:
        """``POST /api/v1/knowledge-search``: search, rerank, merge and top-k, without the LLM (C27-C44)."""
        body = {"query": query, "knowledge_base_ids": list(kb_ids), **params}
        return _as_list(await self.request("POST", "/api/v1/knowledge-search", body))

    async def faq_search(self, kb_id: str, query_text: str, **params: Any) -> list[dict[str, Any]]:
        """``POST /api/v1/knowledge-bases/{kb_id}/faq/search``: FAQ entries (C45/C46; ``chunk_id``, ``score``,
        ``matched_question``)."""
        body = {"query_text": query_text, **params}
        return _as_list(await self.request("POST", f"/api/v1/knowledge-bases/{kb_id}/faq/search", body))

    # -- chat -----------------------------------------------------------------------------
    async def chat(self, kb_ids: list[str], query: str, *, title: str = "weknora-nb", **params: Any) -> ChatResult:
        """A new session (titled, so no title is generated), then the chat stream read to its end (C58-C65).

        ``disable_title`` is always sent (C60/C61: without it the first message of an untitled
        session costs an extra LLM call); ``params`` go into the body as they are (``agent_id``,
        ``agent_enabled``: the web UI's chat, C103). Each attempt creates its own session; all are in
        :attr:`sessions`.
        """
        async def once() -> ChatResult:
            sid = await self.create_session(title)
            body = {"query": query, "knowledge_base_ids": list(kb_ids), "disable_title": True, **params}
            result = await self._chat_stream(sid, body)
            result.session_id = sid
            return result
        return await self._within_deadline("knowledge-chat", self._with_retries(once))

    async def create_session(self, title: str, description: str = "created by weknora-nb") -> str:
        """``POST /api/v1/sessions`` (C58: body title and description only; answers 201); the new session's id."""
        session = await self.request("POST", "/api/v1/sessions", {"title": title, "description": description},
                                     retry=False)
        sid = session.get("id") if isinstance(session, dict) else None
        if not sid:
            raise ProtocolFailed("POST /api/v1/sessions: the session returned has no id")
        self.sessions.append(str(sid))
        return str(sid)

    async def delete_session(self, session_id: str) -> None:
        """``DELETE /api/v1/sessions/{id}`` (C59; the answer has no ``data``, C10)."""
        await self.request("DELETE", f"/api/v1/sessions/{session_id}", envelope=True)

    # -- configuration and inventory ------------------------------------------------------
    async def retrieval_config(self) -> dict[str, Any]:
        """``GET /api/v1/tenants/kv/retrieval-config``: the stored config, zeros when never saved (C57)."""
        data = await self.request("GET", "/api/v1/tenants/kv/retrieval-config")
        if not isinstance(data, dict):
            raise ProtocolFailed("retrieval-config: data is not an object")
        return data

    async def system_info(self) -> dict[str, Any]:
        """``GET /api/v1/system/info``: version and engines (C56), from its ``{code, msg, data}`` envelope (C10)."""
        body = await self.request("GET", "/api/v1/system/info", envelope=True)
        data = body.get("data")
        if body.get("code", 0) != 0 or not isinstance(data, dict):
            raise ProtocolFailed(f"system/info: code {body.get('code')!r}, data not an object: {str(body)[:200]}")
        return data

    async def knowledge_base(self, kb_id: str) -> dict[str, Any]:
        """``GET /api/v1/knowledge-bases/{kb_id}``: the knowledge base object (C49); NotFound code 1003 (C26)."""
        data = await self.request("GET", f"/api/v1/knowledge-bases/{kb_id}")
        if not isinstance(data, dict):
            raise ProtocolFailed(f"knowledge-bases/{kb_id}: data is not an object")
        return data

    async def model(self, model_id: str) -> dict[str, Any]:
        """``GET /api/v1/models/{id}``: a registered model (C94, C107: ``name`` and ``parameters.base_url``)."""
        data = await self.request("GET", f"/api/v1/models/{model_id}")
        if not isinstance(data, dict):
            raise ProtocolFailed(f"models/{model_id}: data is not an object")
        return data

    async def memory_config(self) -> dict[str, Any]:
        """``GET /api/v1/tenants/kv/memory-config``: the tenant's memory switch (main only, C108; other releases
        answer 400 "unsupported key")."""
        data = await self.request("GET", "/api/v1/tenants/kv/memory-config", retry=False)
        if not isinstance(data, dict):
            raise ProtocolFailed("memory-config: data is not an object")
        return data

    async def list_knowledge(self, kb_id: str, page_size: int = 1000) -> Listing:
        """Every knowledge (document) of a knowledge base (C50: ``page_size`` above 1000 is a 400)."""
        return await self.all_pages(f"/api/v1/knowledge-bases/{kb_id}/knowledge", min(page_size, 1000),
                                    passes=LISTING_PASSES)

    async def list_chunks(self, knowledge_id: str, page_size: int = 100,
                          chunk_types: Sequence[str] = LISTED_CHUNK_TYPES) -> Listing:
        """Every chunk of a knowledge of the given types (C52: pages of at most 100; ``chunk_type``
        repeated, else only ``text`` chunks come back; by default every searchable type and the
        ``parent_text`` chunks, C101). Read again from page 1 while it falls short of its total
        (:data:`LISTING_PASSES`)."""
        return await self.all_pages(f"/api/v1/chunks/{knowledge_id}", page_size,
                                    {"chunk_type": list(chunk_types)} if chunk_types else None, passes=LISTING_PASSES)

    async def all_pages(self, path: str, page_size: int, params: dict[str, Any] | None = None, *,
                        passes: int = 1) -> Listing:
        """Page 1, 2, ... of a paged list, whatever page size the server applies; items de-duplicated by id.

        A pass reads pages until an empty page, the last page ``total`` implies (at the page size the
        server says it used), or, without ``total``, a page shorter than that size; never more than
        :data:`MAX_PAGES`. A list whose distinct items fall short of ``total`` (an OFFSET paging over an
        order with ties repeats some rows and skips others, C101) is read again from page 1, up to
        ``passes`` passes, and the union kept; still short, :attr:`Listing.complete` says so.
        """
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        total: int | None = None
        pages = done = 0
        while done < max(1, passes):
            done += 1
            total, read = await self._one_pass(path, page_size, params, items, seen)
            pages += read
            if total is None or len(items) >= total:
                break
        if total is not None and len(items) < total:
            log.warning("%s: the server lists %d distinct items of the %d its total counts (%d passes)", path,
                        len(items), total, done)
        return Listing(items, total, pages, done)

    async def _one_pass(self, path: str, page_size: int, params: dict[str, Any] | None,
                        items: list[dict[str, Any]], seen: set[str]) -> tuple[int | None, int]:
        """One pass of :meth:`all_pages`: new items appended to ``items``; (the server's total, pages read)."""
        total: int | None = None
        page = 0
        while page < MAX_PAGES:
            page += 1
            body = await self.request("GET", path, params={**(params or {}), "page": page, "page_size": page_size},
                                      envelope=True)
            got = _as_list(body.get("data"))
            total = _int_or_none(body.get("total"))
            size = _int_or_none(body.get("page_size")) or page_size
            new = [x for x in got if x.get("id") is None or str(x["id"]) not in seen]
            seen.update(str(x["id"]) for x in new if x.get("id") is not None)
            items += new
            if not got or (total is not None and (page * size >= total or len(items) >= total)):
                break
            if total is None and len(got) < size:
                break
        return total, page

    # -- plumbing -------------------------------------------------------------------------
    async def request(self, method: str, path: str, json_body: Any = None, *, params: dict | None = None,
                      retry: bool = True, envelope: bool = False) -> Any:
        """One call with retries; returns the envelope's ``data`` (or the whole envelope)."""
        async def once() -> Any:
            resp = await self._send(method, path, json_body, params)
            return unwrap(resp, envelope=envelope, tenant_id=self.tenant_id)
        return await self._within_deadline(f"{method} {path}", self._with_retries(once) if retry else once())

    async def _within_deadline(self, what: str, work: Awaitable[_T]) -> _T:
        """``work``, or :class:`RequestTimeout` once :attr:`ClientSettings.deadline_s` has passed (each read has its
        own timeout; this bounds the whole request, retries and a stream's events included)."""
        try:
            async with asyncio.timeout(self.settings.deadline_s):
                return await work
        except TimeoutError:
            raise RequestTimeout(f"{what}: no whole answer within the deadline of {self.settings.deadline_s:g} s "
                                 "(--deadline)") from None

    async def _send(self, method: str, path: str, json_body: Any, params: dict | None) -> httpx.Response:
        try:
            return await self._http.request(method, path, json=json_body, params=params)
        except httpx.TimeoutException as exc:
            raise RequestTimeout(f"{method} {path}: timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:  # refused, reset, a proxy that failed: the URLs it names redacted
            raise ConnectFailed(f"{method} {path}: {type(exc).__name__}: {redact_text(str(exc))}") from exc

    async def _chat_stream(self, sid: str, body: dict[str, Any]) -> ChatResult:
        """Read ``POST /api/v1/knowledge-chat/{sid}``'s events (C62/C63) into a :class:`ChatResult`.

        Ends at ``complete`` once the references arrived, else at the end of the stream (at
        v0.6.2 the references may follow the answer, C64; no references event: none found, or, when the
        server's progress events show no retrieval step, retrieval skipped, C104). An ``error`` event
        with ``done: false`` (a failed agent tool step, C105) is kept and passed over; any other ``error``
        is a :class:`ServerFailed` and the stream is left at once (the server does not close it after a
        terminal error, C105); an agent without a chat model (C103) is one that is not retried. A stream
        that ends before ``complete`` is a :class:`ProtocolFailed`.
        """
        path = f"/api/v1/knowledge-chat/{sid}"
        refs: list[dict[str, Any]] | None = None
        answer: list[str] = []
        errors: list[str] = []
        tools: list[str] = []
        completed = False
        try:
            async with self._http.stream("POST", path, json=body, headers={"Accept": "text/event-stream"}) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    unwrap(resp, tenant_id=self.tenant_id)
                async for ev in _sse_events(resp, path):
                    kind = ev.get("response_type")
                    if kind == "references":
                        refs = _as_list(ev.get("knowledge_references") or [])
                    elif kind == "answer":
                        answer.append(str(ev.get("content") or ""))
                    elif kind == "tool_call":
                        tools.append(_tool_name(ev))
                    elif kind == "error":
                        if ev.get("done") is False:
                            errors.append(str(ev.get("content"))[:500])
                            continue
                        raise _stream_error(path, ev, body)
                    elif kind == "complete":
                        completed = True
                    if completed and refs is not None:
                        break
        except httpx.TimeoutException as exc:
            raise RequestTimeout(f"POST {path}: timed out") from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise ProtocolFailed(f"POST {path}: stream broken: {type(exc).__name__}") from exc
        if not completed:
            raise ProtocolFailed(f"POST {path}: stream ended before its 'complete' event")
        text = "".join(answer)
        skipped = refs is None and bool(tools) and RETRIEVAL_PROGRESS_TOOL not in tools
        return ChatResult(refs or [], text, [html.unescape(c) for c in _CITATION.findall(text)],
                          retrieval_skipped=skipped, stream_errors=errors)

    async def _with_retries(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()`` with the collection's retry policy (:func:`weknora_nb.collect.http.retry.with_retries`)."""
        return await with_retries(call, self.settings, self._rng)


async def _sse_events(resp: httpx.Response, path: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an SSE stream's ``data:`` lines (C62: gin writes ``data:`` with no space;
    one with a space is read too); other lines (``event:message``, blank lines) are skipped."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        try:
            ev = json_value(line[5:].strip())
        except ValueError as exc:
            raise ProtocolFailed(f"{path}: an SSE data line is not JSON") from exc
        if isinstance(ev, dict):
            yield ev


def _tool_name(ev: dict[str, Any]) -> str:
    """The step a ``tool_call`` event announces (C104: ``data.tool_name``; the content reads "Calling tool: X")."""
    data = ev.get("data")
    name = data.get("tool_name") if isinstance(data, dict) else None
    if isinstance(name, str) and name:
        return name
    content = str(ev.get("content") or "")
    return content.split(":", 1)[1].strip() if content.startswith("Calling tool:") else content


def _stream_error(path: str, ev: dict[str, Any], body: dict[str, Any]) -> ServerFailed:
    """The failure a terminal ``error`` event means; an agent without a chat model (C103) says what to do and is
    not retried (every attempt would fail the same way)."""
    message = str(ev.get("content"))[:300]
    exc = ServerFailed(f"{path}: stream error event: {message}")
    if _NO_CHAT_MODEL in message:
        agent = body.get("agent_id") or "the agent"
        exc = ServerFailed(f"{path}: stream error event: {message} (the chat agent {agent!r} has no chat model: set "
                           "one in WeKnora's agent settings, or collect with --chat-agent none)")
        exc.retryable = False
    return exc


def _as_list(data: Any) -> list[dict[str, Any]]:
    """``data`` as a list of objects (``null`` is an empty list, C25); anything else a ProtocolFailed."""
    if data is None:
        return []
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise ProtocolFailed("expected a list of objects in 'data'")
    return data


def _int_or_none(x: Any) -> int | None:
    return int(x) if isinstance(x, numbers.Integral) and not isinstance(x, bool) else None
