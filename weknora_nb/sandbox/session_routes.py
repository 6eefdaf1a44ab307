"""The routes that read sessions: ``GET /api/v1/sessions`` (C81-C83), ``GET /api/v1/sessions/{id}`` and
``GET /api/v1/messages/{session_id}/load`` (C67, C84-C86), over the server's sessions and the generated
history (:mod:`.history`), scoped per key or per first user as the release scopes them.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from weknora_nb.sandbox.auth import Principal, principal_of
from weknora_nb.sandbox.chat import Conversations, Session, in_scope
from weknora_nb.sandbox.emulation import WeKnoraRelease
from weknora_nb.sandbox.wire import BAD_REQUEST, INTERNAL, NOT_FOUND, BindError, app_error, bind_pagination, ok

#: ``types.EmbedSessionMarkerPrefix`` (embed_channel.go:148 @ v0.7.2): an embed widget's session description
EMBED_MARKER = "embed_channel:"
_NOT_ADMIN = "error code: 1002, error message: listing channel sessions requires tenant admin or owner role"
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")


def _api_owned(user_id: str) -> bool:
    """``types.IsAPISessionOwnerID`` (principal.go:36-40 @ v0.7.2)."""
    return user_id.strip().startswith(("api_tenant_key:", "api_external_user:"))


def _channel_managed(s: Session) -> bool:
    """``types.SessionRequiresAdminConsoleRead`` (session.go:158-170 @ v0.7.2; the sandbox has no IM sessions)."""
    return _api_owned(s.user_id) or s.description.startswith(EMBED_MARKER) or s.user_id.startswith("embed_session:")


def readable(principal: Principal, s: Session, release: WeKnoraRelease) -> bool:
    """Whether get and load find ``s`` for ``principal`` (C84): ``loadSessionForRead`` from v0.7.2 (its own
    scope, channel sessions for admins or their own API key, the admin fallback to other owners' channel
    sessions; never a console user's chats), the owner scope alone at v0.6.x."""
    if s.tenant_id != principal.tenant_id:
        return False
    if not release.per_key_sessions:
        return in_scope(principal, s)
    if in_scope(principal, s):
        own_key = principal.gated and principal.key.kind == "workspace" and s.user_id == principal.owner
        return not _channel_managed(s) or principal.admin or own_key
    return principal.admin and _channel_managed(s)


def source_matches(s: Session, source: str, release: WeKnoraRelease) -> bool:
    """The list's ``source`` filter (C83): from v0.7.2 ``api`` (API-key owners), ``web`` (neither API nor
    embed), ``embed``, ``embed:<id>``, else an IM platform; at v0.6.x ``web`` is every non-IM session and
    any other value an IM platform. The sandbox has no IM sessions."""
    src = source.strip().lower()
    if src == "":
        return True
    if not release.per_key_sessions:
        return src == "web"
    if src == "api":
        return _api_owned(s.user_id)
    if src == "web":
        return not s.description.startswith(EMBED_MARKER) and not _api_owned(s.user_id)
    if src == "embed":
        return s.description.startswith(EMBED_MARKER)
    if src.startswith("embed:") and source.strip()[6:].strip():
        return s.description == EMBED_MARKER + source.strip()[6:].strip()
    return False


def _order(s: Session) -> tuple[Any, ...]:
    """``is_pinned DESC, pinned_at DESC NULLS LAST, updated_at DESC`` (the id breaks ties)."""
    pinned = -s.pinned_at.timestamp() if s.pinned_at is not None else 0.0
    return (s.pinned_at is None, pinned, -s.last_change.timestamp(), s.id)


def parse_go_time(text: str) -> int | None:
    """``time.Parse`` with RFC3339Nano, then RFC3339: nanoseconds since the epoch, or None when it fails."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    y, mo, d, h, mi, sec, frac, zone = m.groups()
    try:
        offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])) if zone != "Z" else timedelta(0)
        tz = timezone(-offset if zone.startswith("-") else offset)
        at = datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), tzinfo=tz)
    except ValueError:
        return None
    return int(at.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0"))


def _atoi(text: str) -> int | None:
    """``strconv.Atoi``: an optionally signed decimal integer that fits 64 bits, else None."""
    if not re.fullmatch(r"[+-]?[0-9]+", text) or abs(int(text)) >= 2 ** 63:
        return None
    return int(text)


class HistoryRoutes:
    """``GET /sessions``, ``GET /sessions/{id}``, ``GET /messages/{id}/load`` over ``conversations``."""

    def __init__(self, conversations: Conversations, release: WeKnoraRelease):
        self.conversations = conversations
        self.release = release

    def _sessions(self) -> dict[str, Session]:
        self.conversations.load_history()
        return self.conversations.sessions

    async def list_sessions(self, request: Request) -> Response:
        """``GET /api/v1/sessions`` (C81-C83): ``page`` (default 1), ``page_size`` (default 20, 1-1000, else a
        400), ``keyword`` (in the title, any case), ``source``, ``agent_id`` (IM sessions only: none here);
        pinned first, then the last changed; ``total``, ``page``, ``page_size`` beside ``data``."""
        try:
            page, size = bind_pagination(request.query_params)
        except BindError as exc:
            return app_error(BAD_REQUEST, str(exc))
        page, size = page or 1, size or 20
        principal = principal_of(request.scope)
        source = request.query_params.get("source", "")
        channel_view = self.release.per_key_sessions and source.strip().lower() not in ("", "web")
        if channel_view and not principal.admin:
            return app_error(INTERNAL, _NOT_ADMIN)
        keyword = request.query_params.get("keyword", "").strip().lower()
        agent = request.query_params.get("agent_id", "")
        rows = sorted((s for s in self._sessions().values()
                       if s.tenant_id == principal.tenant_id and (channel_view or in_scope(principal, s))
                       and source_matches(s, source, self.release) and keyword in s.title.lower() and not agent),
                      key=_order)
        return ok([s.json() for s in rows[(page - 1) * size: page * size]], total=len(rows), page=page,
                  page_size=size)

    async def get_session(self, request: Request) -> Response:
        """``GET /api/v1/sessions/{id}``: the session, or 404 "session not found" (C59, C84)."""
        s = self._sessions().get(request.path_params["id"])
        if s is None or not readable(principal_of(request.scope), s, self.release):
            return app_error(NOT_FOUND, "session not found")
        return ok(s.json())

    async def load_messages(self, request: Request) -> Response:
        """``GET /api/v1/messages/{session_id}/load`` (C67, C86): the newest ``limit`` messages (default 20, a
        non-integer is 20, <= 0 all of them), those strictly before ``before_time`` when given (RFC 3339, else
        a 400 before the session is looked up), oldest first with the question before its answer at equal
        times; 404 when the session is not readable (C84)."""
        limit = _atoi(request.query_params.get("limit", "20").strip())
        limit = 20 if limit is None else limit
        before_text = request.query_params.get("before_time", "").strip()
        before = parse_go_time(before_text) if before_text else None
        if before_text and before is None:
            return app_error(BAD_REQUEST, "Invalid time format, please use RFC3339 or RFC3339Nano format")
        s = self._sessions().get(request.path_params["session_id"])
        if s is None or not readable(principal_of(request.scope), s, self.release):
            return app_error(NOT_FOUND, "session not found")
        def when(m: dict[str, Any]) -> tuple[int, bool]:  # at equal times the question comes first
            return parse_go_time(m["created_at"]) or 0, m["role"] != "user"
        kept = sorted((m for m in s.messages if before is None or when(m)[0] < before), key=when, reverse=True)
        kept = kept[:limit] if limit > 0 else kept
        return ok(sorted(kept, key=when))

