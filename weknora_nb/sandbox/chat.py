"""The sandbox's sessions, knowledge-chat stream and message history (docs/weknora-contract.md C58-C69).

- Sessions (C58, C59): created with 201 from a body of ``title`` / ``description`` only (an empty
  body is a 400), owned by the caller (``user_id``, C82), and deleted (``{"success": true,
  "message": ...}``, C10) within the caller's scope. They are kept until deleted, as WeKnora keeps
  them. Reading them (get, list, load) is :mod:`.session_routes`', over these sessions and the
  generated history (:mod:`.history`) added on first use (:meth:`Conversations.load_history`).
- knowledge-chat (C60-C66, C113-C117): the SSE stream ``event:message\\ndata:<json>\\n\\n`` (C62) of
  ``agent_query``; from v0.6.3 the query understanding and the retrieval as ``tool_call`` /
  ``tool_result`` pairs (C116); ``references`` (before the answer; at v0.6.2 after its first piece,
  C64), rebuilt as the Redis stream manager rebuilds them when the server runs one (C117);
  ``answer`` pieces, a closing ``answer`` with ``done`` true, ``complete``; inline ``<kb .../>``
  citations on releases whose server writes them (C65). The retrieval runs the agent's settings
  when ``agent_id`` names one (C113), and not at all for a greeting or small talk (the sandbox's
  rule-based intent, C114: no ``knowledge_search`` events, no references). On a session with no
  title and ``disable_title`` false, the first message costs a (simulated) title LLM call and
  the stream ends with ``session_title`` (C61). The sandbox has no language model: its answer
  quotes the top references and says so.
- Search (C68, C88): ``POST /messages/search`` over every session's messages (the history's too),
  tenant-wide, or the caller's own and legacy ones on releases that scope it (main); a keyword
  match whatever ``mode`` says.

:class:`Conversations` holds the state and counts what cost money on a real server
(:attr:`stats`: title calls, sessions created and deleted).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from weknora_nb.core.tokenize import tokenize
from weknora_nb.sandbox.agent import classify_intent, needs_retrieval, small_talk_answer
from weknora_nb.sandbox.auth import Principal, principal_of, refuse_targets
from weknora_nb.sandbox.catalog import go_html_escape, go_time
from weknora_nb.sandbox.emulation import WeKnoraRelease
from weknora_nb.sandbox.wire import NOT_FOUND, Field, app_error, bind_request, go_json, ok

#: knowledge-chat's retrieval: (query, KB ids, knowledge ids, agent id) -> the references, as search results (C22)
ChatSearch = Callable[[str, list[str], list[str], str], list[dict[str, Any]]]

_SESSION_FIELDS = (Field("title", "string"), Field("description", "string"))
_CHAT_FIELDS = (Field("query", "string", "Query", required=True), Field("knowledge_base_ids", "[]string"),
                Field("knowledge_ids", "[]string"), Field("agent_enabled", "bool"), Field("agent_id", "string"),
                Field("web_search_enabled", "bool"), Field("summary_model_id", "string"),
                Field("mentioned_items", "any"), Field("disable_title", "bool"), Field("images", "any"),
                Field("channel", "string"))
_SEARCH_FIELDS = (Field("query", "string", "Query", required=True), Field("mode", "string"), Field("limit", "int"),
                  Field("session_ids", "[]string"))
_SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


def _now() -> datetime:
    return datetime.now(UTC)


def go_time_nano(at: datetime) -> str:
    """``at`` as Go marshals a ``time.Time`` (RFC 3339 with nanoseconds, trailing zeros of the fraction
    dropped, ``Z`` for UTC, else the offset): ``2025-11-03T09:15:02.5+08:00``."""
    text = at.isoformat()
    if "." in text[:26]:
        head, _, tail = text.partition(".")
        frac, zone = tail[:6].rstrip("0"), tail[6:]
        text = f"{head}.{frac}{zone}" if frac else head + zone
    return text[:-6] + "Z" if text.endswith("+00:00") else text


@dataclass
class Session:
    """One chat session and its messages (oldest first).

    ``user_id``: its owner (C82; "" for a legacy row every caller sees); ``updated``: bumped by every
    chat request (C87), ``created`` when None; ``pinned_at``: when it was pinned (None: not pinned);
    ``last_request_state``: the last chat request's input state (C87), None until one.
    """

    id: str
    title: str
    description: str
    tenant_id: int
    created: datetime
    messages: list[dict[str, Any]] = field(default_factory=list)
    user_id: str = ""
    updated: datetime | None = None
    pinned_at: datetime | None = None
    last_request_state: dict[str, Any] | None = None

    @property
    def last_change(self) -> datetime:
        """``updated_at``."""
        return self.updated or self.created

    def json(self) -> dict[str, Any]:
        """The session object as ``types.Session`` marshals (C58, C87): ``user_id``, ``pinned_at`` and
        ``last_request_state`` only when set; ``knowledge_base_id`` is no field of it."""
        out: dict[str, Any] = {"id": self.id, "title": self.title, "description": self.description,
                               "tenant_id": self.tenant_id}
        if self.user_id:
            out["user_id"] = self.user_id
        out["is_pinned"] = self.pinned_at is not None
        if self.pinned_at is not None:
            out["pinned_at"] = go_time_nano(self.pinned_at)
        if self.last_request_state:
            out["last_request_state"] = self.last_request_state
        out.update(created_at=go_time_nano(self.created), updated_at=go_time_nano(self.last_change), deleted_at=None)
        return out


def in_scope(principal: Principal, s: Session) -> bool:
    """``applySessionUserScope``: the caller's tenant, and its own session or a legacy one (no owner) (C82)."""
    return s.tenant_id == principal.tenant_id and s.user_id in ("", principal.owner)


class Conversations:
    """Sessions, chat and history of one sandbox server (see the module docstring)."""

    def __init__(self, *, release: WeKnoraRelease, search: ChatSearch,
                 history: Callable[[], Iterable[Session]] | None = None, stream_manager: str = "memory"):
        """``history``: the sessions of the generated history, made on the first :meth:`load_history`;
        ``stream_manager``: the server's (``memory`` or ``redis``, C117)."""
        self.release = release
        self.search = search
        self.stream_manager = stream_manager
        self.sessions: dict[str, Session] = {}
        self.stats: dict[str, int] = {"sessions_created": 0, "sessions_deleted": 0, "title_calls": 0,
                                      "chat_requests": 0}
        self._history = history

    def load_history(self) -> None:
        """Add the generated history's sessions, once (the routes that read sessions call it first)."""
        if self._history is not None:
            make, self._history = self._history, None
            for s in make():
                self.sessions.setdefault(s.id, s)

    # -- sessions ------------------------------------------------------------------------
    async def create_session(self, request: Request) -> Response:
        """``POST /api/v1/sessions``: 201 and the new session (C58)."""
        body = await bind_request(request, "session.CreateSessionRequest", _SESSION_FIELDS)
        if isinstance(body, Response):
            return body
        principal = principal_of(request.scope)
        s = Session(str(uuid.uuid4()), body["title"], body["description"], principal.tenant_id, _now(),
                    user_id=principal.owner)
        self.sessions[s.id] = s
        self.stats["sessions_created"] += 1
        return ok(s.json(), status=201)

    def _session(self, request: Request, param: str = "id") -> Session | None:
        """The session named by the path parameter ``param`` when it is in the caller's scope (the write
        paths' ``sessionRepo.Get`` with the owner, C82), or None."""
        s = self.sessions.get(request.path_params[param])
        return s if s is not None and in_scope(principal_of(request.scope), s) else None

    async def delete_session(self, request: Request) -> Response:
        """``DELETE /api/v1/sessions/{id}``: ``{"success": true, "message": ...}`` without data (C10), or 404."""
        s = self._session(request)
        if s is None:
            return app_error(NOT_FOUND, "session not found")
        del self.sessions[s.id]
        self.stats["sessions_deleted"] += 1
        return Response(go_json({"success": True, "message": "Session deleted successfully"}),
                        media_type="application/json")

    # -- chat ----------------------------------------------------------------------------
    async def knowledge_chat(self, request: Request) -> Response:
        """``POST /api/v1/knowledge-chat/{session_id}``: the SSE answer (C60-C66); errors before the
        stream use the envelope: 400 for the body, 404 "Session not found", 403 for a KB-restricted key."""
        body = await bind_request(request, "session.CreateKnowledgeQARequest", _CHAT_FIELDS)
        if isinstance(body, Response):
            return body
        s = self._session(request, "session_id")
        if s is None:
            return app_error(NOT_FOUND, "Session not found")
        kb_ids, knowledge_ids = _targets(body)
        refused = refuse_targets(principal_of(request.scope), kb_ids, knowledge_ids)
        if refused is not None:
            return refused
        self.stats["chat_requests"] += 1
        s.last_request_state = _request_state(body, kb_ids, knowledge_ids, self.release)
        rag = bool(kb_ids or knowledge_ids)   # no knowledge base: pure chat, no understanding step (C66)
        intent = classify_intent(body["query"]) if rag else "kb_search"
        searched = rag and needs_retrieval(intent)
        refs = self.search(body["query"], kb_ids, knowledge_ids, body["agent_id"]) if searched else []
        title = self._title_call(s, body)
        events = self._events(s, body["query"], refs, title, _Steps(rag, searched, intent))
        return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)

    def _title_call(self, s: Session, body: dict[str, Any]) -> str | None:
        """The title a first message on an untitled session generates (one LLM call, counted), or None (C61)."""
        if s.title or body["disable_title"]:
            return None
        self.stats["title_calls"] += 1
        s.title = body["query"].strip()[:20] or "新对话"
        return s.title

    async def _events(self, s: Session, query: str, refs: list[dict[str, Any]], title: str | None,
                      steps: _Steps) -> AsyncIterator[bytes]:
        """The stream's events in WeKnora's order (C63, C64, C116), recording the exchange as two messages (their
        references as the pipeline made them: the stream manager only carries the event, C117). The references
        event carries them twice: ``knowledge_references`` (rebuilt by a Redis stream manager) and the event's
        ``data.references``, every field kept (C97)."""
        request_id, answer_id = str(uuid.uuid4()), str(uuid.uuid4())
        pieces = _extractive_answer(refs, self.release.inline_citations) if steps.searched else \
            [small_talk_answer(steps.intent)]
        self._record(s, request_id, query, "".join(pieces), refs, answer_id)

        def event(kind: str, content: str = "", done: bool = False, **extra: Any) -> bytes:
            payload = {"id": request_id, "response_type": kind, "content": content, "done": done, **extra}
            return b"event:message\ndata:" + go_json(payload) + b"\n\n"
        yield event("agent_query", done=True, session_id=s.id, assistant_message_id=answer_id,
                    data={"session_id": s.id, "assistant_message_id": answer_id})
        if self.release.progress_events and steps.rag:
            for kind, content, data in _progress(query, refs, steps.searched):
                yield event(kind, content, data=data)
        answer = [event("answer", piece) for piece in pieces]
        if refs:  # only a non-empty merge result is sent (C64)
            sent = refs if self.stream_manager == "memory" else \
                [redis_round_trip(r, keep_metadata=self.release.redis_keeps_metadata) for r in refs]
            answer.insert(0 if self.release.references_first else 1, event("references", knowledge_references=sent,
                                                                             data={"references": refs}))
        for message in answer:
            await asyncio.sleep(0)
            yield message
        yield event("answer", done=True)
        yield event("complete", done=True)
        if title is not None:
            yield event("session_title", title, done=True, data={"session_id": s.id, "title": title})

    def _record(self, s: Session, request_id: str, query: str, answer: str, refs: list[dict[str, Any]],
                answer_id: str) -> None:
        """Keep the exchange in the session's history: the user's message and the answer."""
        now = _now()
        at = go_time(at=now)
        s.updated = now
        base = {"session_id": s.id, "request_id": request_id, "agent_steps": [], "is_completed": True,
                "created_at": at, "updated_at": at, "deleted_at": None}
        s.messages.append({"id": str(uuid.uuid4()), **base, "content": query, "role": "user",
                           "knowledge_references": []})
        s.messages.append({"id": answer_id, **base, "content": answer, "role": "assistant",
                           "knowledge_references": refs})

    # -- search --------------------------------------------------------------------------
    async def search_messages(self, request: Request) -> Response:
        """``POST /api/v1/messages/search``: exchanges whose question or answer shares a token with the
        query, best first, ``{"items": [...], "total": n}`` (C68); the caller's own and legacy sessions
        only where the release scopes search (main, C88). Score: the share of the query's
        tokens found in the question, times 0.7, plus the share found in the answer, times 0.3."""
        body = await bind_request(request, "handler.SearchMessagesRequest", _SEARCH_FIELDS)
        if isinstance(body, Response):
            return body
        self.load_history()
        wanted = set(tokenize(body["query"]))
        only = set(body["session_ids"])
        principal = principal_of(request.scope)
        items = []
        for s in self.sessions.values():
            if s.tenant_id != principal.tenant_id or (only and s.id not in only):
                continue
            if self.release.owner_scoped_message_search and not in_scope(principal, s):
                continue
            for q, a in zip(s.messages[::2], s.messages[1::2], strict=False):
                asked, answered = (len(wanted & set(tokenize(m["content"]))) / max(1, len(wanted)) for m in (q, a))
                score = round(0.7 * asked + 0.3 * answered, 4)
                if score > 0:
                    items.append({"request_id": q["request_id"], "session_id": s.id, "session_title": s.title,
                                  "query_content": q["content"], "answer_content": a["content"], "score": score,
                                  "match_type": "keyword", "created_at": q["created_at"]})
        items.sort(key=lambda it: -it["score"])
        return ok({"items": items[: body["limit"] or 20], "total": len(items)})


@dataclass(frozen=True)
class _Steps:
    """What a chat's pipeline did: ``rag`` (it had knowledge to search: query understanding ran), ``searched``
    (its intent needed retrieval, which ran) and the ``intent`` (C114)."""

    rag: bool
    searched: bool
    intent: str


def _progress(query: str, refs: list[dict[str, Any]], searched: bool) -> list[tuple[str, str, dict[str, Any]]]:
    """C116: ``(response_type, content, data)`` of the pipeline's progress events (chat_pipeline/progress.go:80-230,
    handler/session/agent_stream_handler.go:166-262 @ v0.7.2): ``query_understand``'s call and result, then, when
    it searched, ``knowledge_search``'s, whose result counts the references. Data keys in Go's map order (sorted)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    steps: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("query_understand", {"query": query}, {"output": "已完成问题理解"})]
    if searched:
        n = len(refs)
        steps.append(("knowledge_search", {"query": query, "search_source": "knowledge"},
                      {"count": n, "doc_count": n, "output": f"检索到 {n} 条相关内容" if n else "未检索到相关内容",
                       "search_source": "knowledge", "web_count": 0}))
    for tool, arguments, result in steps:
        call_id = str(uuid.uuid4())
        out.append(("tool_call", f"Calling tool: {tool}",
                    {"arguments": arguments, "tool_call_id": call_id, "tool_name": tool}))
        data = {**result, "duration_ms": 0, "error": "", "success": True, "tool_call_id": call_id, "tool_name": tool}
        out.append(("tool_result", "", dict(sorted(data.items()))))
    return out


#: C117: the fields of a reference the Redis stream manager's rebuild keeps (SearchResult's order), and their kind
_REBUILT = (("id", str), ("content", str), ("knowledge_id", str), ("chunk_index", int), ("knowledge_title", str),
            ("start_at", int), ("end_at", int), ("seq", int), ("score", float))
_REBUILT_TAIL = ("chunk_type", "parent_chunk_id", "image_info", "knowledge_filename", "knowledge_source")


def redis_round_trip(ref: dict[str, Any], *, keep_metadata: bool = False) -> dict[str, Any]:
    """A reference as it reaches the client through the Redis stream manager (C117): rebuilt from its JSON map by
    ``buildStreamResponse`` (handler/session/helpers.go:219-245 @ v0.7.2): ``match_type`` 0, ``sub_chunk_id`` and
    ``metadata`` null (main keeps ``metadata``: ``keep_metadata``), ``knowledge_channel`` "", ``matched_content``
    and the other omitempty fields gone but ``knowledge_description`` and ``knowledge_base_id``."""
    out: dict[str, Any] = {}
    for key, kind in _REBUILT:
        value = ref.get(key)
        if kind is str:
            out[key] = value if isinstance(value, str) else ""
        else:
            number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
            out[key] = int(number) if kind is int else number
    meta = ref.get("metadata") if keep_metadata else None
    out.update(match_type=0, sub_chunk_id=None,
               metadata={k: v for k, v in meta.items() if isinstance(v, str)} if isinstance(meta, dict) else None)
    out.update({key: ref.get(key) if isinstance(ref.get(key), str) else "" for key in _REBUILT_TAIL})
    out["knowledge_channel"] = ""
    for key in ("knowledge_description", "knowledge_base_id"):
        if isinstance(ref.get(key), str) and ref[key]:
            out[key] = ref[key]
    return out


def _request_state(body: dict[str, Any], kb_ids: list[str], knowledge_ids: list[str],
                   release: WeKnoraRelease) -> dict[str, Any]:
    """``SessionLastRequestState`` of a chat request (C87), fields in the struct's order, omitempty ones only
    when set; ``mentioned_items`` is a field from v0.7.2."""
    state: dict[str, Any] = {"agent_id": body["agent_id"], "agent_enabled": body["agent_enabled"],
                             "model_id": body["summary_model_id"], "knowledge_base_ids": kb_ids,
                             "knowledge_ids": knowledge_ids,
                             "mentioned_items": body["mentioned_items"] if release.per_key_sessions else None,
                             "web_search_enabled": body["web_search_enabled"]}
    return {k: v for k, v in state.items() if v or k in ("agent_enabled", "web_search_enabled")}


def _targets(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The chat's KB ids and knowledge ids, @mentions merged in, duplicates dropped (qa.go:524-562 @ v0.7.2)."""
    kb_ids = list(dict.fromkeys(i for i in body["knowledge_base_ids"] if i))
    knowledge_ids = list(dict.fromkeys(i for i in body["knowledge_ids"] if i))
    for item in body["mentioned_items"] or []:
        if isinstance(item, dict) and item.get("id"):
            target = kb_ids if item.get("type") == "kb" else knowledge_ids if item.get("type") == "file" else None
            if target is not None and item["id"] not in target:
                target.append(item["id"])
    return kb_ids, knowledge_ids


def _extractive_answer(refs: list[dict[str, Any]], citations: bool) -> list[str]:
    """An answer made of quoted sentences from the top two references.

    The sandbox has no language model: it says so at the start of every answer. With
    ``citations`` each quote ends with the server's ``<kb doc=".." chunk_id=".." kb_id=".." />``
    tag, attributes HTML-escaped (C65).
    """
    pieces = ["（抽取式回答：sandbox 未接入大模型，以下为知识库原文摘录。）\n"]
    for r in refs[:2]:
        body = r["content"].split("\n", 1)[-1].strip()
        sentence = body.split("。")[0][:160]
        tag = (f'<kb doc="{go_html_escape(r["knowledge_title"])}" chunk_id="{go_html_escape(r["id"])}" '
               f'kb_id="{go_html_escape(r["knowledge_base_id"])}" />') if citations else ""
        pieces.append(f"{sentence}。{tag}\n")
    if len(pieces) == 1:
        pieces.append("知识库中没有找到相关内容。")
    return pieces
