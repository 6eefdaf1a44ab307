"""WeKnora's conversation history over HTTP: every user question the API key may read (``testset sample``).

What WeKnora serves (docs/weknora-contract.md C81-C87, C67): ``GET /api/v1/sessions`` pages the
sessions (``page``, ``page_size`` <= 1000), pinned ones first, then by ``updated_at`` newest first;
``GET /api/v1/messages/{id}/load?limit=&before_time=`` gives a session's newest ``limit`` messages,
oldest first, and paging back means sending the oldest ``created_at`` of a page as ``before_time``
(strictly older ones come next) until a page is short. A user message's ``content`` is the raw
question as asked (C85). Both routes need the ``chat`` capability or full access (C7, C69).

Which sessions a key sees (C82, C83): from v0.7.2 a key lists its own sessions and legacy ones
without an owner; a full-access key also lists every API-key session of the tenant with
``source=api`` (the production bot's traffic), which other keys are refused (a 500 saying "requires
tenant admin or owner role": noted, not a failure). The web console's own chats are never visible
to an API key. At v0.6.x the key acts as the tenant's first user and ``source=api`` lists nothing.
So :func:`crawl_history` reads both listings and keeps each session once.

Filters are the client's, WeKnora has none for them:

- ``since``: questions asked at or after it. Every chat request moves a session's ``updated_at``
  (C87), so a session last changed more than :data:`SINCE_MARGIN` before ``since`` is not loaded,
  and the listing stops at the first such row that is not pinned (pinned rows come first, whatever
  their age); messages are paged back until older than ``since``.
- ``kb_id``: a session has no knowledge base (C87), so each question is tied to the knowledge bases
  its evidence names, best first: the ``knowledge_base_id`` of its answer's references; else its
  @-mentions; else the session's last request state (the last turn's scope only, weak evidence).

Failures are never dropped: a listing page that fails (after the client's retries) is counted with
the sessions it would have held; a session whose messages could not all be read is counted by
failure kind (what was read of it is kept). Log lines name request paths and session ids, never a
message's text.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from weknora_nb.collect.http.client import ClientSettings, WeKnoraClient
from weknora_nb.core.errors import AuthFailed, ProtocolFailed, RequestFailed, UsageError

log = logging.getLogger(__name__)

#: a session last changed this long before ``since`` holds no question asked since (C87, with room to spare)
SINCE_MARGIN = timedelta(days=1)
#: sessions per listing page (WeKnora allows 1 to 1000, C81)
PAGE_SIZE = 100
#: messages per load (WeKnora has no cap, C86; kept polite)
LOAD_LIMIT = 100
#: C83: the answer to a non-admin's ``source=api`` listing
_NOT_ADMIN = re.compile(r"requires tenant admin or owner role", re.IGNORECASE)


@dataclass(frozen=True)
class UserQuery:
    """One user question: its text as asked, where and when, and the knowledge bases its evidence names
    (``evidence``: ``references``, ``mention``, ``session`` or "" for none)."""

    text: str
    session_id: str
    request_id: str
    created_at: str
    kb_ids: tuple[str, ...] = ()
    evidence: str = ""


@dataclass
class HistoryCrawl:
    """The questions read and how the reading went (see :meth:`summary`)."""

    queries: list[UserQuery] = field(default_factory=list)
    listed: Counter[str] = field(default_factory=Counter)
    sessions_read: int = 0
    sessions_failed: Counter[str] = field(default_factory=Counter)
    failed_ids: list[str] = field(default_factory=list)
    sessions_older: int = 0
    pages_failed: int = 0
    sessions_unlisted: int = 0
    messages_seen: int = 0
    messages_malformed: int = 0
    user_messages: int = 0
    before_since: int = 0
    other_kb: Counter[str] = field(default_factory=Counter)
    evidence: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every listed page and every session could be read."""
        return not self.pages_failed and not self.sessions_failed

    def summary(self) -> dict[str, Any]:
        """The figures of the crawl, as the summary file keeps them (no text of any message)."""
        return {"sessions_listed": dict(self.listed), "sessions_read": self.sessions_read,
                "sessions_failed": sum(self.sessions_failed.values()),
                "sessions_failed_by_kind": dict(self.sessions_failed), "sessions_failed_ids": self.failed_ids,
                "sessions_older_than_since": self.sessions_older, "listing_pages_failed": self.pages_failed,
                "sessions_on_failed_pages": self.sessions_unlisted, "messages_seen": self.messages_seen,
                "messages_malformed": self.messages_malformed, "user_messages": self.user_messages,
                "user_messages_before_since": self.before_since,
                "user_messages_other_kb": dict(self.other_kb), "kb_evidence": dict(self.evidence),
                "notes": self.notes}


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 time as WeKnora writes it (``Z`` or an offset, up to nanoseconds), None if it is not one."""
    if not isinstance(text, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?"
                                                     r"([Zz]|[+-]\d{2}:\d{2})", text.strip()):
        return None
    t = re.sub(r"(\.\d{6})\d+", r"\1", text.strip())
    try:
        return datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", t))
    except ValueError:
        return None


def parse_since(text: str) -> datetime:
    """``--since``: a date (``2025-12-01``, midnight UTC) or a date and time, with an offset or read as UTC."""
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(argument="--since", allowed="a date such as 2025-12-01 or a time such as "
                         "2025-12-01T08:00+08:00", got=text) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


async def _list_page(client: WeKnoraClient, params: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """One listing page's sessions and the total it counts (C81). Tried once first, then with the client's
    retries when that failure is retryable, so C83's refusal (a 500) is known without the retries' waits."""
    try:
        body = await client.request("GET", "/api/v1/sessions", params=params, envelope=True, retry=False)
    except RequestFailed as exc:
        if not exc.retryable or _NOT_ADMIN.search(str(exc)):
            raise
        body = await client.request("GET", "/api/v1/sessions", params=params, envelope=True)
    data = body.get("data") if isinstance(body, dict) else None
    total = body.get("total") if isinstance(body, dict) else None
    data = [] if data is None else data
    if not isinstance(data, list) or not all(isinstance(r, dict) and r.get("id") for r in data) \
            or not isinstance(total, int):
        raise ProtocolFailed("GET /api/v1/sessions: the page is not a list of sessions with a total")
    return data, total


async def _listing(client: WeKnoraClient, crawl: HistoryCrawl, source: str, since: datetime | None,
                   page_size: int) -> list[dict[str, Any]]:
    """Every session of one listing (``source`` "" or ``api``) up to the ``since`` cut, in the server's order.

    Page 1 of the own listing failing raises (nothing can be read); ``source=api`` refused (the key is
    no admin, C83, or may not) is a note; any other failed page is counted with the sessions it held."""
    name = source or "own"
    rows: list[dict[str, Any]] = []
    page, total = 0, None
    while total is None or page * page_size < total:
        page += 1
        params = {"page": page, "page_size": page_size, **({"source": source} if source else {})}
        try:
            data, total = await _list_page(client, params)
        except RequestFailed as exc:
            if page == 1 and not source:
                raise
            if page == 1 and (isinstance(exc, AuthFailed) or _NOT_ADMIN.search(str(exc))):
                crawl.notes.append(f"source={source} refused ({exc.kind}): this key reads only its own and legacy "
                                   "sessions; other API keys' traffic needs a full-access key")
                break
            _page_failed(crawl, exc, page, page_size, total)
            if total is None:
                break
            continue
        for i, row in enumerate(data):
            changed = parse_time(row.get("updated_at"))
            if since is None or changed is None or changed >= since - SINCE_MARGIN:
                rows.append(row)
                continue
            crawl.sessions_older += 1
            if not row.get("is_pinned"):  # the rest are older still (C81): the listing ends here
                crawl.sessions_older += max(0, total - (page - 1) * page_size - i - 1)
                crawl.listed[name] += len(rows)
                return rows
        if not data:
            break
    crawl.listed[name] += len(rows)
    return rows


def _page_failed(crawl: HistoryCrawl, exc: RequestFailed, page: int, page_size: int, total: int | None) -> None:
    """Count a listing page that could not be read, and the sessions it would have held (a full page if unknown)."""
    crawl.pages_failed += 1
    crawl.sessions_unlisted += page_size if total is None else max(0, min(page_size, total - (page - 1) * page_size))
    log.warning("GET /api/v1/sessions page %d could not be read (%s): its sessions are not sampled", page, exc.kind)


async def _messages(client: WeKnoraClient, sid: str, since: datetime | None, limit: int) -> list[dict[str, Any]]:
    """A session's messages, paged back with ``before_time`` (C86) until a short page or one older than ``since``."""
    path = f"/api/v1/messages/{quote(sid, safe='')}/load"
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    before: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"before_time": before} if before else {})}
        page = await client.request("GET", path, params=params)
        if page is None:
            page = []
        if not isinstance(page, list) or not all(isinstance(m, dict) for m in page):
            raise ProtocolFailed(f"GET {path}: data is not a list of messages")
        new = [m for m in page if str(m.get("id")) not in seen]
        seen.update(str(m.get("id")) for m in new)
        out += new
        times = [(t, m["created_at"]) for m in page if (t := parse_time(m.get("created_at"))) is not None]
        if len(page) < limit or not new or not times:
            return out
        oldest = min(times)
        if since is not None and oldest[0] < since:
            return out
        before = oldest[1]


def _kb_evidence(user: dict[str, Any], answers: list[dict[str, Any]], session: dict[str, Any]) -> tuple[
        tuple[str, ...], str]:
    """The knowledge bases a question is tied to and by what (see the module docstring)."""
    refs = {str(r["knowledge_base_id"]) for a in answers for r in a.get("knowledge_references") or []
            if isinstance(r, dict) and r.get("knowledge_base_id")}
    if refs:
        return tuple(sorted(refs)), "references"
    mentions = {str(i.get("id") if i.get("type") == "kb" else i.get("kb_id")) for i in user.get("mentioned_items") or []
                if isinstance(i, dict) and (i.get("id") if i.get("type") == "kb" else i.get("kb_id"))}
    if mentions:
        return tuple(sorted(mentions)), "mention"
    state = session.get("last_request_state") or {}
    kbs = state.get("knowledge_base_ids") if isinstance(state, dict) else None
    if isinstance(kbs, list) and kbs:
        return tuple(sorted(str(k) for k in kbs)), "session"
    return (), ""


def _questions(crawl: HistoryCrawl, session: dict[str, Any], messages: list[dict[str, Any]],
               kb_id: str | None, since: datetime | None) -> None:
    """The session's user questions that pass ``since`` and ``kb_id``, added to ``crawl`` (and counted)."""
    answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in messages:
        if m.get("role") == "assistant":
            answers[str(m.get("request_id"))].append(m)
    for m in messages:
        crawl.messages_seen += 1
        asked = parse_time(m.get("created_at"))
        if not isinstance(m.get("content"), str) or m.get("role") not in ("user", "assistant") or asked is None:
            crawl.messages_malformed += 1
            continue
        if m["role"] != "user":
            continue
        crawl.user_messages += 1
        if since is not None and asked < since:
            crawl.before_since += 1
            continue
        kbs, evidence = _kb_evidence(m, answers[str(m.get("request_id"))], session)
        if kb_id is not None and kb_id not in kbs:
            crawl.other_kb[evidence or "none"] += 1
            continue
        crawl.evidence[evidence or "none"] += 1
        crawl.queries.append(UserQuery(m["content"], str(session["id"]), str(m.get("request_id") or ""),
                                       m["created_at"], kbs, evidence))


async def crawl_history(client: WeKnoraClient, *, kb_id: str | None = None, since: datetime | None = None,
                        page_size: int = PAGE_SIZE, limit: int = LOAD_LIMIT, in_flight: int = 4) -> HistoryCrawl:
    """Every user question ``client``'s key may read (see the module docstring), ``in_flight`` sessions at a time.

    Raises the :class:`RequestFailed` of the first listing page (an :class:`AuthFailed` when the key may
    not read sessions: it lacks ``chat``)."""
    if not 1 <= page_size <= 1000:
        raise UsageError(argument="page_size", allowed="1 to 1000 (WeKnora refuses more, C81)", got=page_size)
    if limit < 1:
        raise UsageError(argument="limit", allowed=">= 1", got=limit)
    crawl = HistoryCrawl()
    sessions: dict[str, dict[str, Any]] = {}
    for source in ("", "api"):
        for row in await _listing(client, crawl, source, since, page_size):
            sessions.setdefault(str(row["id"]), row)
    gate = asyncio.Semaphore(max(1, in_flight))

    async def read(sid: str, row: dict[str, Any]) -> None:
        async with gate:
            try:
                messages = await _messages(client, sid, since, limit)
            except RequestFailed as exc:
                crawl.sessions_failed[exc.kind] += 1
                crawl.failed_ids.append(sid)
                log.warning("session %s could not be read (%s, HTTP %s)", sid, exc.kind, exc.status)
                return
            crawl.sessions_read += 1
            _questions(crawl, row, messages, kb_id, since)
    await asyncio.gather(*(read(sid, row) for sid, row in sessions.items()))
    crawl.failed_ids.sort()
    crawl.queries.sort(key=lambda q: (parse_time(q.created_at), q.session_id, q.request_id))
    log.info("history: %d sessions read, %d failed, %d questions kept", crawl.sessions_read,
             sum(crawl.sessions_failed.values()), len(crawl.queries))
    return crawl


def fetch_history(settings: ClientSettings, **kwargs: Any) -> HistoryCrawl:
    """:func:`crawl_history` with a client of ``settings``, run to its end (its own event loop, in a thread
    where one already runs, e.g. Jupyter)."""
    async def main() -> HistoryCrawl:
        async with WeKnoraClient(settings) as client:
            return await crawl_history(client, **kwargs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()
