"""The sandbox's HTTP server: WeKnora's API on loopback, as WeKnora's source serves it, per release.

Each behaviour follows a fact of docs/weknora-contract.md; the release emulated
(:class:`~weknora_nb.sandbox.emulation.WeKnoraRelease`) decides the ones that differ. Routes:

- ``GET|POST /api/v1/knowledge-bases/{id}/hybrid-search`` (POST not at v0.6.2, C15-C26)
- ``POST /api/v1/knowledge-search`` (C27-C44) and ``POST /api/v1/knowledge-bases/{id}/faq/search`` (C45-C47)
- ``GET /api/v1/knowledge-bases``, ``GET /api/v1/knowledge-bases/{id}``, ``GET .../{id}/knowledge``,
  ``GET /api/v1/knowledge/{id}``, ``GET /api/v1/chunks/{knowledge_id}``, ``GET /api/v1/chunks/by-id/{id}``,
  ``GET /api/v1/system/info``, ``GET /api/v1/tenants/kv/{key}`` (C48-C57)
- ``POST /api/v1/sessions``, ``DELETE /api/v1/sessions/{id}``, ``POST /api/v1/knowledge-chat/{id}``,
  ``POST /api/v1/messages/search`` (C58-C69, C88, :mod:`.chat`); ``GET /api/v1/sessions``, ``GET
  /api/v1/sessions/{id}``, ``GET /api/v1/messages/{session_id}/load`` (C59, C67, C81-C87,
  :mod:`.session_routes`, over the server's sessions and the generated history of ``history``, made on first use)
- ``POST /v1/chat/completions``, ``GET /v1/models``: a rule-based judge and a rule-based relevance grader in
  OpenAI's format, bearer-key auth (:mod:`.judge`, :mod:`.grader`; not a WeKnora route), and a rule-based question
  generator (:mod:`.generator`)
- ``POST /v1/embeddings``: the version's embedding model in OpenAI's format (:mod:`.embeddings_api`; not a
  WeKnora route), for the vector-store trace of ``weknora-nb check`` and for a WeKnora's embedding model
- ``POST /v1/rerank``: the sandbox's rerank model in the format WeKnora's remote reranker calls
  (:mod:`.rerank_api`; not a WeKnora route, C126)
- ``GET /health`` (no auth); ``GET|PUT /_sandbox/faults``, ``GET /_sandbox/stats`` and ``PUT
  /_sandbox/index-status`` only when fault control is allowed (tests, benchmarks).

Any other path or method: gin's plain-text ``404 page not found`` (C14), after auth. Layout:
:class:`SandboxApp` holds the state and one method per endpoint; around its router, outermost
first, :class:`~weknora_nb.sandbox.auth.AuthMiddleware` (C1-C5) and
:class:`~weknora_nb.sandbox.faults.FaultMiddleware`; after routing, the capability gate (C6, C7);
an exception no endpoint handles is answered as WeKnora's ``Recovery`` does (C13).

The engine is deterministic, so successful search answers are remembered (:class:`AnswerMemory`,
:data:`SEARCH_CACHE_SIZE` of them) by everything that can change them: release, method, path,
query string, tenant and body. Errors are never kept, and faults come first, so a remembered
answer still gets its latency and faults; a request whose reranker is made to fail bypasses it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute

from weknora_nb.core.errors import UsageError
from weknora_nb.sandbox import auth, generator
from weknora_nb.sandbox import embedding_groups as groups
from weknora_nb.sandbox.agent import chat_settings
from weknora_nb.sandbox.auth import AuthMiddleware, KeyRing, principal_of
from weknora_nb.sandbox.catalog import Catalog
from weknora_nb.sandbox.chat import Conversations, Session
from weknora_nb.sandbox.embeddings_api import EmbeddingsEndpoint
from weknora_nb.sandbox.emulation import WeKnoraRelease
from weknora_nb.sandbox.emulation import release as named_release
from weknora_nb.sandbox.engine import NegativeMatchCount, RetrievalEngine
from weknora_nb.sandbox.faults import FaultConfig, FaultInjector, FaultMiddleware
from weknora_nb.sandbox.grader import RuleGrader
from weknora_nb.sandbox.history import HistoryPlan, materialise
from weknora_nb.sandbox.memory import AnswerMemory
from weknora_nb.sandbox.pipeline import Hit
from weknora_nb.sandbox.rerank_api import RerankEndpoint
from weknora_nb.sandbox.session_routes import HistoryRoutes
from weknora_nb.sandbox.wire import (
    BAD_REQUEST,
    INTERNAL,
    NOT_FOUND,
    BindError,
    Field,
    app_error,
    bind_pagination,
    bind_request,
    go_json,
    internal_error,
    ok,
    panic_body,
    route_not_found,
)

log = logging.getLogger(__name__)

#: search responses the server keeps (its engine is deterministic, so a repeated request gets the same bytes)
SEARCH_CACHE_SIZE = 8192

Endpoint = Callable[[Request], Awaitable[Response]]

#: C16: ``types.SearchParams``
_HYBRID_FIELDS = (Field("query_text", "string"), Field("query_embedding", "[]float32"),
                  Field("vector_threshold", "float64"), Field("keyword_threshold", "float64"),
                  Field("match_count", "int"), Field("disable_keywords_match", "bool"),
                  Field("disable_vector_match", "bool"), Field("knowledge_ids", "[]string"),
                  Field("tag_ids", "[]string"), Field("scope_tag_ids", "[]string"), Field("only_recommended", "bool"),
                  Field("knowledge_base_ids", "[]string"), Field("skip_context_enrichment", "bool"))
#: C27: ``session.SearchKnowledgeRequest``
_SEARCH_FIELDS = (Field("query", "string", "Query", required=True), Field("knowledge_base_id", "string"),
                  Field("knowledge_base_ids", "[]string"), Field("knowledge_ids", "[]string"),
                  Field("tag_ids", "[]string"), Field("mentioned_items", "any"))
#: C27: knowledge-search's 400 without a scope, before v0.7.2 (False) and from it (True)
_NO_SCOPE = {False: "At least one knowledge_base_id, knowledge_base_ids or knowledge_ids must be provided",
             True: "At least one knowledge_base_id, knowledge_base_ids, knowledge_ids, or scoped tag must be provided"}
#: C45: ``types.FAQSearchRequest``
_FAQ_FIELDS = (Field("query_text", "string", "QueryText", required=True), Field("vector_threshold", "float64"),
               Field("match_count", "int"), Field("first_priority_tag_ids", "[]int64"),
               Field("second_priority_tag_ids", "[]int64"), Field("only_recommended", "bool"))


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class Route:
    """One route: method, gin path template (``:name`` is one path segment), endpoint and the
    capability an API key needs for it (C7; None: no gate)."""

    method: str
    template: str
    endpoint: Endpoint
    capability: str | None = None

    @property
    def pattern(self) -> re.Pattern[str]:
        """The template as a regular expression with one named group per parameter."""
        return re.compile("^" + re.sub(r":(\w+)", r"(?P<\1>[^/]+)", self.template) + "$")


class Router:
    """The routes in match order (a static segment before a parameter, as gin's tree prefers it)."""

    def __init__(self, routes: list[Route]):
        self.routes = [(r, r.pattern) for r in routes]

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route serving ``method path`` and its parameters, or None (gin: a plain 404 either way)."""
        for route, pattern in self.routes:
            m = pattern.match(path)
            if m is not None and route.method == method:
                return route, m.groupdict()
        return None


def _merged_kb_ids(body: Mapping[str, Any]) -> list[str]:
    """``knowledge_base_ids`` with ``knowledge_base_id`` appended when not already there (qa.go:673-687 @ v0.7.2)."""
    ids = list(body["knowledge_base_ids"])
    if body["knowledge_base_id"] and body["knowledge_base_id"] not in ids:
        ids.append(body["knowledge_base_id"])
    return ids


# ---------------------------------------------------------------------------------------
# the application
# ---------------------------------------------------------------------------------------
class SandboxApp:
    """One sandbox server: its state, one method per endpoint, and the Starlette ``app`` serving them.

    State: ``release`` (the WeKnora release emulated); ``catalog`` (KBs, knowledge, chunks and
    their JSON: the document KB ``kb_id``, and ``faq_kb_id`` when the version serves FAQ);
    ``conversations`` (sessions, chat, history); ``faults`` (the :class:`FaultInjector` in
    force, shared with the middleware); ``answers`` (the :class:`AnswerMemory`); ``keys`` (the
    API keys accepted: ``api_key`` is a full-access workspace key of tenant 1, ``api_keys``
    adds keys as ``{secret: {"kind", "tenant_id", "capabilities", "knowledge_base_ids"}}``, see
    :class:`~weknora_nb.sandbox.auth.ApiKey`); ``history``: gives the generated conversation history
    (:func:`~weknora_nb.sandbox.history.demo_plan`), called when a route first reads sessions (None: none);
    ``stream_manager``: ``memory`` or ``redis`` (C117; None: the version's ``server.stream_manager``).
    ``other_model_kbs``: empty document knowledge bases to serve too, ``{kb id: embedding model name}`` (C122).
    """

    def __init__(self, engine: RetrievalEngine, *, api_key: str, kb_id: str = "kb-demo", faq_kb_id: str = "kb-faq",
                 faults: FaultConfig | None = None, allow_fault_control: bool = False,
                 release: WeKnoraRelease | None = None, api_keys: Mapping[str, Mapping[str, Any]] | None = None,
                 history: Callable[[], HistoryPlan] | None = None, stream_manager: str | None = None,
                 other_model_kbs: Mapping[str, str] | None = None):
        self.engine = engine
        self.release = release or named_release(None)
        self.kb_id = kb_id
        self.catalog = Catalog(engine, kb_id=kb_id, faq_kb_id=faq_kb_id, release=self.release)
        for other, model in (other_model_kbs or {}).items():
            self.catalog.add_empty_kb(other, model)
        made = (lambda: self._history_sessions(history)) if history is not None else None
        self.conversations = Conversations(release=self.release, search=self._chat_references, history=made,
                                           stream_manager=stream_manager or engine.version.stream_manager)
        self.history = HistoryRoutes(self.conversations, self.release)
        self.faults = FaultInjector(faults or FaultConfig())
        self.answers: AnswerMemory[bytes] = AnswerMemory(SEARCH_CACHE_SIZE)
        self.keys = KeyRing(api_key, api_keys)
        self.judge = RuleGrader(self.keys, {generator.MODEL: generator.reply})  # judge, relevance grader, generator
        self.embeddings = EmbeddingsEndpoint(self.keys, engine, self.faults)
        self.reranker = RerankEndpoint(self.keys, engine, self.faults)
        self.started = time.time()
        self.router = Router(self.routes(allow_fault_control))
        methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
        self.app = Starlette(routes=[StarletteRoute("/{path:path}", self._dispatch, methods=methods)], middleware=[
            Middleware(AuthMiddleware, keys=self.keys, release=self.release),
            Middleware(FaultMiddleware, faults=self.faults)])
        self.app.state.faults = self.faults
        self.app.state.sandbox = self

    def routes(self, allow_fault_control: bool) -> list[Route]:
        """The routes of the release, each with the capability an API key needs (C7)."""
        c, h = self.conversations, self.history
        kb = "/api/v1/knowledge-bases"
        routes = [Route("GET", "/health", self.health),
                  Route("POST", "/v1/chat/completions", self.judge.chat_completions),  # the rule-based judge
                  Route("GET", "/v1/models", self.judge.models),
                  Route("POST", "/v1/embeddings", self.embeddings.embeddings),  # the version's embedding model
                  Route("POST", "/v1/rerank", self.reranker.rerank)]  # the sandbox's rerank model (C126)
        routes += [Route(m, kb + "/:id/hybrid-search", self.hybrid_search, auth.RETRIEVE)
                   for m in self.release.hybrid_search_methods]
        routes += [
            Route("POST", "/api/v1/knowledge-search", self.knowledge_search, auth.RETRIEVE),
            Route("POST", kb + "/:id/faq/search", self.faq_search, auth.RETRIEVE),
            Route("GET", kb, self.list_kbs, auth.RETRIEVE),
            Route("GET", kb + "/:id", self.get_kb, auth.RETRIEVE),
            Route("GET", kb + "/:id/knowledge", self.list_knowledge, auth.RETRIEVE),
            Route("GET", "/api/v1/knowledge/:id", self.get_knowledge, auth.RETRIEVE),
            Route("GET", "/api/v1/chunks/by-id/:id", self.get_chunk, auth.RETRIEVE),
            Route("GET", "/api/v1/chunks/:knowledge_id", self.list_chunks, auth.RETRIEVE),
            Route("GET", "/api/v1/system/info", self.system_info, auth.MANAGE_VECTOR_STORES),
            Route("GET", "/api/v1/tenants/kv/:key", self.tenant_kv, auth.MANAGE_TENANT_SETTINGS),
            Route("POST", "/api/v1/sessions", c.create_session, auth.CHAT),
            Route("GET", "/api/v1/sessions", h.list_sessions, auth.CHAT),
            Route("GET", "/api/v1/sessions/:id", h.get_session, auth.CHAT),
            Route("DELETE", "/api/v1/sessions/:id", c.delete_session, auth.CHAT),
            Route("POST", "/api/v1/knowledge-chat/:session_id", c.knowledge_chat, auth.CHAT),
            Route("POST", "/api/v1/messages/search", c.search_messages, auth.MESSAGE_HISTORY),
            Route("GET", "/api/v1/messages/:session_id/load", h.load_messages, auth.CHAT),
        ]
        if allow_fault_control:
            routes += [Route("GET", "/_sandbox/faults", self.faults_endpoint),
                       Route("PUT", "/_sandbox/faults", self.faults_endpoint),
                       Route("GET", "/_sandbox/stats", self.stats_endpoint),
                       Route("PUT", "/_sandbox/index-status", self.index_status_endpoint)]
        return routes

    async def _dispatch(self, request: Request) -> Response:
        """Route the request, gate it (API keys of the key service, C6), serve it; an exception the
        endpoint does not handle is a panic to ``Recovery`` (C13)."""
        found = self.router.match(request.method, request.url.path)
        if found is None:
            return route_not_found()
        route, params = found
        request.scope["path_params"] = params
        if route.capability is not None:
            refused = auth.gate(principal_of(request.scope), route.capability)
            if refused is not None:
                return refused
        try:
            return await route.endpoint(request)
        except Exception as exc:  # gin's Recovery: the panic's message, 500
            log.exception("sandbox: %s %s failed", request.method, request.url.path)
            return panic_body(str(exc))

    # -- shared steps --------------------------------------------------------------------
    def _kb_access(self, request: Request, kb_id: str) -> Response | None:
        """``KBAccessRead`` (C26): 403 (code 1002) outside a key's allow-list, 404 for an unknown KB."""
        refused = auth.refuse_kbs(principal_of(request.scope), [kb_id])
        if refused is not None:
            return refused
        return None if kb_id in self.catalog.kbs else app_error(NOT_FOUND, "knowledge base not found")

    def _knowledge_access(self, request: Request, kid: str) -> Response | None:
        """``KBAccessReadFromKnowledgeIDParam``: 404 "Knowledge not found", then the KB's allow-list."""
        if kid not in self.catalog.kb_of:
            return app_error(NOT_FOUND, "Knowledge not found")
        return auth.refuse_kbs(principal_of(request.scope), [self.catalog.kb_of[kid]])

    async def _remembered(self, request: Request, answer: Callable[[], Response]) -> Response:
        """``answer()``, or the body it gave before for the same release, method, path, query, tenant
        and body (only 200s are kept)."""
        key = (self.release.name, request.method, request.url.path, request.url.query,
               principal_of(request.scope).tenant_id, await request.body())
        body = self.answers.get(key)
        if body is not None:
            return Response(body, media_type="application/json")
        response = answer()
        if response.status_code == 200:
            self.answers.keep(key, bytes(response.body))
        return response

    # -- search endpoints ----------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """``GET /health``: ``{"status": "ok", "version": <system version>}`` (no envelope, no auth)."""
        return JSONResponse({"status": "ok", "version": self.engine.version.name})

    async def hybrid_search(self, request: Request) -> Response:
        """``GET|POST .../hybrid-search``: raw recall of the paths, fused (C15-C26). KB access first,
        then the body: bad JSON is 400 "Invalid request parameters" with details, an empty
        ``query_text`` 400 from v0.7.2; no hit is ``data: null``."""
        kb_id = request.path_params["id"]
        refused = self._kb_access(request, kb_id)
        if refused is not None:
            return refused
        body = await bind_request(request, "types.SearchParams", _HYBRID_FIELDS, message="Invalid request parameters")
        if isinstance(body, Response):
            return body
        vector_only = bool(body["query_embedding"]) and body["disable_keywords_match"] and \
            not body["disable_vector_match"]
        if self.release.query_text_required and not body["query_text"].strip() and not vector_only:
            return app_error(BAD_REQUEST, "query_text is required")
        kb_ids = [k for k in body["knowledge_base_ids"] or [kb_id] if k in self.catalog.kbs]
        refused = groups.mixed_models(self.catalog, kb_ids)  # C122, before the primary KB is picked
        if refused is not None:
            return refused
        if kb_id not in kb_ids:  # the KBs searched must include the path's (pickPrimary, knowledgebase_search.go:144)
            return app_error(NOT_FOUND, "knowledge base not found")
        embeds = not body["disable_vector_match"] and (self.catalog.kbs[kb_id].type == "faq"
                                                        or self.engine.version.vector_enabled)
        if embeds and self._embedding_fails(request):  # C121: the query embedding is computed first, and fails
            return groups.embedding_failed()
        return await self._remembered(request, lambda: self._hybrid(kb_ids, body))

    def _embedding_fails(self, request: Request | None) -> bool:
        """Whether the query's embedding fails for this request (the fault ``embedding_error_rate``, C121), drawn
        from the request's stream (``None``: the shared stream)."""
        rng = request.scope.get("state", {}).get("fault_rng") if request is not None else None
        return self.faults.roll(self.faults.cfg.embedding_error_rate, rng)

    def _hybrid(self, kb_ids: list[str], body: dict[str, Any]) -> Response:
        """The engine's hybrid search over ``kb_ids`` for a bound body: results, ``null``, or the panic of a
        negative ``match_count`` (C17, C13: Go's slice-bounds message). Empty knowledge bases find nothing."""
        if not self.catalog.kb_types(kb_ids):
            return ok(None)
        try:
            hits = self.engine.hybrid_search(
                body["query_text"], match_count=body["match_count"], vector_threshold=body["vector_threshold"],
                keyword_threshold=body["keyword_threshold"], disable_vector=body["disable_vector_match"],
                disable_keyword=body["disable_keywords_match"], skip_enrichment=body["skip_context_enrichment"],
                knowledge_ids=body["knowledge_ids"] or None, n_kbs=len(kb_ids),
                kb_types=self.catalog.kb_types(kb_ids))
        except NegativeMatchCount:
            return panic_body(f"runtime error: slice bounds out of range [:{body['match_count']}]")
        if hits is None:
            return ok(None)
        return ok([self.catalog.result_json(h, reranked_metadata=False) for h in hits])

    async def knowledge_search(self, request: Request) -> Response:
        """``POST /api/v1/knowledge-search`` (C27-C44): the tenant retrieval config's pipeline. 400 for the
        body or no scope, 403 for a KB-restricted key (v0.7.2+), every service error 500 code 1007."""
        body = await bind_request(request, "session.SearchKnowledgeRequest", _SEARCH_FIELDS)
        if isinstance(body, Response):
            return body
        kb_ids = _merged_kb_ids(body)
        if not kb_ids and not body["knowledge_ids"]:
            return app_error(BAD_REQUEST, _NO_SCOPE[self.release.scoped_tag_search])
        refused = auth.refuse_targets(principal_of(request.scope), kb_ids, body["knowledge_ids"])
        if refused is not None:
            return refused
        rerank_fails = self.faults.roll(self.faults.cfg.rerank_error_rate,
                                        request.scope.get("state", {}).get("fault_rng"))
        vector_fails = self._embedding_fails(request)
        if rerank_fails or vector_fails:
            return self._knowledge_search(body["query"], kb_ids, body["knowledge_ids"], rerank_fails=rerank_fails,
                                          vector_fails=vector_fails)
        return await self._remembered(
            request, lambda: self._knowledge_search(body["query"], kb_ids, body["knowledge_ids"]))

    def _search_targets(self, kb_ids: list[str], knowledge_ids: list[str]) -> tuple[list[str], list[str], list[str]]:
        """(known KB ids, knowledge ids to restrict to, unknown KB ids). A knowledge id whose KB is
        searched whole is dropped (C32); unknown knowledge ids find nothing."""
        known = [k for k in kb_ids if k in self.catalog.kbs]
        unknown = [k for k in kb_ids if k not in self.catalog.kbs]
        kids = [k for k in knowledge_ids if k in self.catalog.kb_of and self.catalog.kb_of[k] not in known]
        return known, kids, unknown

    def _knowledge_search(self, query: str, kb_ids: list[str], knowledge_ids: list[str], *,
                          rerank_fails: bool = False, vector_fails: bool = False) -> Response:
        """Run knowledge-search with the tenant's settings (C29). An unknown KB fails its search, and so does,
        when the query's embedding fails, a KB with no keyword path (C121): with nothing found that is a 500 from
        v0.7.2, and only logged before (C34)."""
        known, kids, unknown = self._search_targets(kb_ids, knowledge_ids)
        failed: list[str] = []
        if vector_fails:
            known, kids, failed = groups.keyword_fallback(self.catalog, known, kids,
                                                          self.release.embedding_failure_falls_back)
        hits = []
        if self.catalog.kb_types(known) or kids:
            hits = self.engine.knowledge_search(query, settings=self.engine.tenant_settings(),
                                                knowledge_ids=kids or None, rerank_fails=rerank_fails,
                                                kb_types=self.catalog.kb_types(known), vector_fails=vector_fails)
        if failed and not hits and self.release.search_failure_is_error:
            return groups.no_fallback_error(failed[0])
        if unknown and not hits:
            log.info("sandbox knowledge-search: knowledge base %s not found", unknown[0])
            if self.release.search_failure_is_error:
                return app_error(INTERNAL, "error code: 1003, error message: knowledge base not found")
        return ok([self.catalog.result_json(h) for h in hits])

    async def faq_search(self, request: Request) -> Response:
        """``POST .../faq/search`` (C45, C46): FAQ entries of an FAQ knowledge base; match_count <= 0 is 10,
        > 200 is 200 (the service caps at 50), vector_threshold <= 0 is 0.7."""
        kb_id = request.path_params["id"]
        refused = self._kb_access(request, kb_id)
        if refused is not None:
            return refused
        body = await bind_request(request, "types.FAQSearchRequest", _FAQ_FIELDS, message="请求参数不合法")
        if isinstance(body, Response):
            return body
        if self.catalog.kbs[kb_id].type != "faq":
            return app_error(BAD_REQUEST, "仅 FAQ 知识库支持该操作")
        if self._embedding_fails(request):  # C121: a plain 500 (recording 82)
            return internal_error()
        count = min(50, 10 if body["match_count"] <= 0 else body["match_count"])
        threshold = body["vector_threshold"] if body["vector_threshold"] > 0 else 0.7  # C45, C120
        return await self._remembered(request, lambda: ok(self.catalog.faq_entries(
            self.engine.faq_search(body["query_text"], match_count=count, vector_threshold=threshold))))

    # -- inventory endpoints -------------------------------------------------------------
    async def list_kbs(self, request: Request) -> Response:
        """``GET /api/v1/knowledge-bases``: every KB object the key may see, no paging (C48)."""
        principal = principal_of(request.scope)
        return ok([self.catalog.kb_json(k) for k in self.catalog.kbs if principal.allows_kbs([k])])

    async def get_kb(self, request: Request) -> Response:
        """``GET /api/v1/knowledge-bases/{id}``: the KB object (C49), 404 if unknown."""
        refused = self._kb_access(request, request.path_params["id"])
        return refused if refused is not None else ok(self.catalog.kb_json(request.path_params["id"]))

    async def list_knowledge(self, request: Request) -> Response:
        """``GET .../{id}/knowledge``: one page (default 1, 20 per page; > 1000 is a 400) of the KB's
        knowledge, newest first, with total (C50)."""
        kb_id = request.path_params["id"]
        refused = self._kb_access(request, kb_id)
        if refused is not None:
            return refused
        try:
            page, size = bind_pagination(request.query_params)
        except BindError as exc:
            return app_error(BAD_REQUEST, str(exc))
        page, size = page or 1, size or 20
        kids = self.catalog.knowledge_list(kb_id)
        rows = [self.catalog.knowledge_json(k) for k in kids[(page - 1) * size: page * size]]
        return ok(rows, total=len(kids), page=page, page_size=size)

    async def get_knowledge(self, request: Request) -> Response:
        """``GET /api/v1/knowledge/{id}``: the knowledge object, 404 "Knowledge not found" (C51)."""
        refused = self._knowledge_access(request, request.path_params["id"])
        return refused if refused is not None else ok(self.catalog.knowledge_json(request.path_params["id"]))

    async def list_chunks(self, request: Request) -> Response:
        """``GET /api/v1/chunks/{knowledge_id}`` (C52): page default 1; page_size default 10, over 100 is
        100 (over 1000 fails binding: 400); ``chunk_type`` default ``text``, repeated to replace it;
        disabled chunks included; the effective page size in the answer."""
        kid = request.path_params["knowledge_id"]
        refused = self._knowledge_access(request, kid)
        if refused is not None:
            return refused
        try:
            page, size = bind_pagination(request.query_params)
        except BindError as exc:
            return app_error(BAD_REQUEST, str(exc))
        page, size = max(page, 1), min(size if size >= 1 else 10, 100)
        types = request.query_params.getlist("chunk_type") or ["text"]
        rng = request.scope.get("state", {}).get("fault_rng") or self.faults.rng
        shuffled = self.faults.roll(self.faults.cfg.unstable_tie_order_rate, rng)  # C124
        idxs = self.catalog.listing(kid, types, rng if shuffled else None)
        rows = [self.catalog.chunk_json(i) for i in idxs[(page - 1) * size: page * size]]
        return ok(rows, total=len(idxs), page=page, page_size=size)

    async def get_chunk(self, request: Request) -> Response:
        """``GET /api/v1/chunks/by-id/{id}``: the chunk (escaped like the listing, C53), 404 "Chunk not found"."""
        i = self.engine.index.by_id.get(request.path_params["id"])
        kb_id = self.catalog.kb_of_chunk(i) if i is not None else None
        if i is None or kb_id is None:
            return app_error(NOT_FOUND, "Chunk not found")
        refused = auth.refuse_kbs(principal_of(request.scope), [kb_id])
        return refused if refused is not None else ok(self.catalog.chunk_json(i))

    async def system_info(self, request: Request) -> Response:
        """``GET /api/v1/system/info``: ``{"code": 0, "msg": "success", "data": ...}`` without ``success``
        (C10); ``version`` as the emulated release's build reports it (its release line: ``0.6.2`` at v0.6.3
        too, ``0.7.2`` at main) and ``commit_id`` its tag's commit; both engines ``postgres``; edition
        ``sandbox`` says what answers (C56)."""
        data = {"version": self.release.reported_version, "edition": "sandbox", "commit_id": self.release.commit_id,
                "build_time": "unknown", "go_version": "unknown", "keyword_index_engine": "postgres",
                "vector_store_engine": "postgres", "graph_database_engine": "Not Enabled",
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
                "uptime_seconds": int(time.time() - self.started)}
        return Response(go_json({"code": 0, "msg": "success", "data": data}), media_type="application/json")

    async def tenant_kv(self, request: Request) -> Response:
        """``GET /api/v1/tenants/kv/{key}``: ``retrieval-config`` is the stored config as is (zeros when
        never saved, C57); other keys the sandbox does not hold are 400 "unsupported key"."""
        if request.path_params["key"] != "retrieval-config":
            return app_error(BAD_REQUEST, "unsupported key")
        return ok(self.engine.tenant_config_raw())

    # -- chat's retrieval ----------------------------------------------------------------
    def _chat_references(self, query: str, kb_ids: list[str], knowledge_ids: list[str],
                         agent_id: str = "") -> list[dict[str, Any]]:
        """knowledge-chat's references: the pipeline with config.yaml's ``conversation.*`` settings, or the agent's
        that ``agent_id`` names over them (C113, the agent reranking with the version's rerank model), never the
        tenant retrieval config (C66); query expansion when it finds too little (C115); unknown KBs find nothing."""
        known, kids, _ = self._search_targets(kb_ids, knowledge_ids)
        vector_fails = self._embedding_fails(None)
        if vector_fails:  # C121: keyword hits only (a search with no keyword path finds nothing here)
            known, kids, _ = groups.keyword_fallback(self.catalog, known, kids,
                                                     self.release.embedding_failure_falls_back)
        if not self.catalog.kb_types(known) and not kids:
            return []
        settings, _ = chat_settings(agent_id, rerank_model=self.engine.version.rerank_enabled)
        hits = self.engine.knowledge_search(query, settings=settings, knowledge_ids=kids or None,
                                            kb_types=self.catalog.kb_types(known), vector_fails=vector_fails)
        return [self.catalog.result_json(h) for h in hits]

    # -- the generated history -----------------------------------------------------------
    def _history_sessions(self, plan: Callable[[], HistoryPlan]) -> list[Session]:
        """The history's sessions as this release and version serve them (references to served chunks only)."""
        kbs = {k: kb.type for k, kb in self.catalog.kbs.items()}
        return materialise(plan(), self.release, self._history_reference, kbs)

    def _history_reference(self, chunk_id: str, score: float) -> dict[str, Any] | None:
        """A history answer's reference to ``chunk_id``: its search result (C22), None when not served."""
        i = self.engine.index.by_id.get(chunk_id)
        if i is None or self.catalog.kb_of_chunk(i) is None:
            return None
        return self.catalog.result_json(Hit(i, score), reranked_metadata=False)

    # -- sandbox control -----------------------------------------------------------------
    async def faults_endpoint(self, request: Request) -> Response:
        """``GET|PUT /_sandbox/faults``: the faults in force; PUT replaces them (400 naming a bad setting)."""
        if request.method == "PUT":
            try:
                self.faults.set(FaultConfig.from_dict(json.loads(await request.body() or b"{}")))
            except (TypeError, ValueError) as exc:  # UsageError and JSONDecodeError are ValueErrors
                return app_error(BAD_REQUEST, str(exc))
        return ok(asdict(self.faults.cfg))

    async def index_status_endpoint(self, request: Request) -> Response:
        """``PUT /_sandbox/index-status``: ``{chunk id: "ready" | "processing" | "failed"}`` sets chunks'
        ``index_status`` (C123); answers the chunks not ready. 400 naming an unknown chunk or status."""
        try:
            wanted = json.loads(await request.body() or b"{}")
            if not isinstance(wanted, dict):
                raise ValueError("the body must be a JSON object of chunk id to index_status")
            for chunk_id, status in wanted.items():
                if chunk_id not in self.engine.index.by_id:
                    raise ValueError(f"unknown chunk {chunk_id!r}")
                self.engine.set_index_status(chunk_id, status)
        except ValueError as exc:
            return app_error(BAD_REQUEST, str(exc))
        self.answers = AnswerMemory(SEARCH_CACHE_SIZE)  # the remembered answers may hold those chunks
        chunks = self.engine.index.chunks
        return ok({chunks[i].id: status for i, status in sorted(self.engine.index_status.items())})

    async def stats_endpoint(self, request: Request) -> Response:
        """``GET /_sandbox/stats``: sessions created and deleted, title LLM calls, chat requests (a client
        can show it cost nothing)."""
        return ok({**self.conversations.stats, "sessions_open": len(self.conversations.sessions)})


def create_app(engine: RetrievalEngine, *, api_key: str, kb_id: str = "kb-demo", faq_kb_id: str = "kb-faq",
               faults: FaultConfig | None = None, allow_fault_control: bool = False,
               release: WeKnoraRelease | None = None, api_keys: Mapping[str, Mapping[str, Any]] | None = None,
               history: Callable[[], HistoryPlan] | None = None, stream_manager: str | None = None,
               other_model_kbs: Mapping[str, str] | None = None) -> Starlette:
    """The ASGI application serving ``engine`` as knowledge base ``kb_id`` in ``release`` (see :class:`SandboxApp`).

    Its ``.state.faults`` is the :class:`FaultInjector` in force, ``.state.sandbox`` the :class:`SandboxApp`.
    """
    return SandboxApp(engine, api_key=api_key, kb_id=kb_id, faq_kb_id=faq_kb_id, faults=faults,
                      allow_fault_control=allow_fault_control, release=release, api_keys=api_keys,
                      history=history, stream_manager=stream_manager, other_model_kbs=other_model_kbs).app
