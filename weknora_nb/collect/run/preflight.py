"""What the server says before a collection starts: its knowledge bases, version, retrieval config.

:func:`read_server` checks every knowledge base first (``GET /api/v1/knowledge-bases/{id}``,
docs/weknora-contract.md C49): a missing one (404 code 1003, C26) or an auth failure (a key
the server rejects, a platform key without tenant, a wrong tenant, a key without the
``retrieve`` capability, C4-C7) stops the collection before anything is written. What
follows is recorded, never fatal: ``GET /api/v1/system/info`` (C56; needs the
``manage_vector_stores`` capability, C7) and the tenant retrieval config (C57; needs
``manage_tenant_settings``), read raw and as WeKnora applies it (C30,
:func:`weknora_nb.core.weknora.effective_retrieval_config`).

:func:`system_description` merges the user's system YAML over what the server says (the
user's keys override and add) and records where each key came from; :func:`adapt_stages`
fits the stages to FAQ knowledge bases (no keyword path, C20/C47; a ``faq`` stage, C45).

:func:`check_embedding_models` refuses, before any request is recorded, a run whose hybrid-search stages
would search knowledge bases of different embedding models together (every such request fails with a 400,
C107). :func:`reranker_notes` names what the server's version and settings do to rerank scores (C108).
The knowledge bases' ``chunk_count`` and ``knowledge_count`` are not recorded from the KB object: each is
filled for one type of knowledge base only (C101); the collector takes them from its inventory.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

from weknora_nb.collect.http.client import WeKnoraClient
from weknora_nb.collect.http.envelope import route_missing
from weknora_nb.collect.run.stages import FAQ_STAGE, Stage
from weknora_nb.core.errors import AuthFailed, NotFound, RequestFailed, UsageError
from weknora_nb.core.pipeline import role_of
from weknora_nb.core.run import flatten
from weknora_nb.core.weknora import effective_retrieval_config

log = logging.getLogger(__name__)

#: C49: the knowledge base fields the manifest records
KB_FIELDS = ("id", "name", "type", "chunking_config", "embedding_model_id", "summary_model_id", "indexing_strategy",
             "faq_config", "vector_store_id", "capabilities")
#: C56: the system/info fields that describe the deployment (the rest is uptime and build details)
_SERVER_SYSTEM = {"weknora": ("version", "edition", "commit_id"),
                  "index": ("vector_store_engine", "keyword_index_engine", "graph_database_engine")}


@dataclass
class ServerFacts:
    """What the server said: ``server`` (system/info's data, or ``{"error"}``), ``knowledge_bases``
    (id -> the KB's configuration, or ``{"error"}``), ``retrieval_config`` (``raw`` and
    ``effective``, or ``error``)."""

    server: dict[str, Any]
    knowledge_bases: dict[str, dict[str, Any]]
    retrieval_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def kb_types(self) -> dict[str, str | None]:
        """Each knowledge base's ``type`` (``document``, ``faq``, ``wiki``; None when unknown)."""
        return {kb: e.get("type") for kb, e in self.knowledge_bases.items()}

    @property
    def vector_retrieval(self) -> bool:
        """Whether some knowledge base searches by vector (C49 ``indexing_strategy.vector_enabled``; a knowledge
        base that could not be read, or says nothing, is taken to)."""
        return any(not isinstance(e.get("indexing_strategy"), Mapping)
                   or e["indexing_strategy"].get("vector_enabled", True) is not False
                   for e in self.knowledge_bases.values()) if self.knowledge_bases else True

    @property
    def version(self) -> str | None:
        """The server's ``version`` (C56), None when system/info could not be read."""
        v = self.server.get("version")
        return str(v) if v else None


async def read_server(client: WeKnoraClient, kb_ids: list[str]) -> ServerFacts:
    """Check the knowledge bases, then read system/info and the retrieval config (see the module docstring).

    Raises :class:`NotFound` for a knowledge base the server does not have and
    :class:`AuthFailed` when the key, tenant or capability do not let it be read.
    """
    kbs = {kb: await _knowledge_base(client, kb) for kb in kb_ids}
    server = await _recorded(client.system_info(), "system/info")
    raw = await _recorded(client.retrieval_config(), "retrieval-config")
    if "error" in raw:
        retrieval: dict[str, Any] = {"raw": None, "effective": None, "error": raw["error"]}
    else:
        retrieval = {"raw": raw, "effective": effective_retrieval_config(raw)}
    return ServerFacts(server, kbs, retrieval)


async def _knowledge_base(client: WeKnoraClient, kb_id: str) -> dict[str, Any]:
    """The manifest's entry for one knowledge base (:data:`KB_FIELDS`), or ``{"error"}`` when it could
    not be read for a reason that is not the knowledge base's or the key's (those raise)."""
    try:
        kb = await client.knowledge_base(kb_id)
    except AuthFailed:
        raise
    except NotFound as exc:
        if not route_missing(exc):
            raise NotFound(f"knowledge base {kb_id!r} not found on this server (check --kb-id and --tenant-id): "
                           f"{exc}", status=exc.status, code=exc.code) from None
        return {"error": f"{exc.kind}: {exc}"}
    except RequestFailed as exc:
        log.warning("knowledge base %s: cannot be read (%s); collecting without its configuration", kb_id, exc)
        return {"error": f"{exc.kind}: {exc}"}
    return {k: kb[k] for k in KB_FIELDS if k in kb}


async def _recorded(call: Awaitable[dict[str, Any]], what: str) -> dict[str, Any]:
    """The object ``call`` returns, or ``{"error": "<kind>: <message>"}`` when it fails (logged, not raised)."""
    try:
        return dict(await call)
    except RequestFailed as exc:
        log.info("%s not read (%s): recorded in the manifest", what, exc)
        return {"error": f"{exc.kind}: {exc}"}


def server_release(version: str | None) -> tuple[int, ...] | None:
    """``"0.7.2"`` or ``"v0.6.3"`` as ``(0, 7, 2)``; None for ``"unknown"`` or no version.

    C56: the number is the VERSION file of the build, which is ``0.6.2`` at v0.6.3 too and
    ``0.7.2`` at main, so it tells release lines apart, not every release.
    """
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", (version or "").strip())
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


# -- the system description -----------------------------------------------------------------
def system_description(user: Mapping[str, Any] | None, facts: ServerFacts) -> tuple[dict[str, Any], dict[str, str]]:
    """The user's system description merged over the server's (mappings merged key by key, any other
    value of the user replacing the server's), and where each flattened key came from:
    ``"user"``, ``"server"`` or ``"user over server"`` (the user's value replaced the server's)."""
    server = _server_system(facts)
    merged = _merge(user or {}, server)
    flat_user, flat_server = flatten(dict(user or {})), flatten(server)

    def overlaps(key: str) -> bool:
        return any(s == key or s.startswith(key + ".") or key.startswith(s + ".") for s in flat_server)
    sources = {k: ("server" if k not in flat_user else "user over server" if overlaps(k) else "user")
               for k in flatten(merged)}
    return merged, sources


def _server_system(facts: ServerFacts) -> dict[str, Any]:
    """The system as the server describes it: ``weknora`` (version), ``index`` (engines, C56), and
    each knowledge base's ``knowledge_base.type``, ``chunking``, ``embedding.model_id``, ``indexing``
    (C49); a value that differs between the knowledge bases is a mapping by knowledge base id."""
    out: dict[str, Any] = {}
    if "error" not in facts.server:
        for key, names in _SERVER_SYSTEM.items():
            part = {n: facts.server[n] for n in names if facts.server.get(n) not in (None, "")}
            if part:
                out[key] = part
    kbs = {kb: e for kb, e in facts.knowledge_bases.items() if "error" not in e}
    views = {kb: {"knowledge_base": {"type": e.get("type")}, "chunking": e.get("chunking_config"),
                  "embedding": {"model_id": e.get("embedding_model_id")}, "indexing": e.get("indexing_strategy")}
             for kb, e in kbs.items()}
    for key in ("knowledge_base", "chunking", "embedding", "indexing"):
        values = {kb: v[key] for kb, v in views.items() if v[key] is not None}
        if not values:
            continue
        distinct = {repr(v) for v in values.values()}
        out[key] = next(iter(values.values())) if len(distinct) == 1 else values
    return out


def _merge(user: Any, server: Any) -> Any:
    """``user`` over ``server``: two mappings merge key by key; otherwise the user's value wins."""
    if isinstance(user, Mapping) and isinstance(server, Mapping):
        out = dict(server)
        for k, v in user.items():
            out[k] = _merge(v, server[k]) if k in server else v
        return out
    return user


# -- stages for FAQ knowledge bases ----------------------------------------------------------
def adapt_stages(stages: list[Stage], *, defaults: bool, kb_types: Mapping[str, str | None]) -> tuple[
        list[Stage], list[str]]:
    """The stages fitted to the knowledge bases' types, and the notes saying what changed.

    With only FAQ knowledge bases there is no keyword path (C20/C47): a default keyword stage
    is dropped, an explicit one is a :class:`UsageError`. With any FAQ knowledge base the
    default stages gain ``faq`` (C45).
    """
    faq = [kb for kb, t in kb_types.items() if t == "faq"]
    if not faq:
        return stages, []
    notes: list[str] = []
    keyword = [s for s in stages if role_of(s.name, s.to_dict()) == "keyword"]
    if keyword and len(faq) == len(kb_types):
        names = ", ".join(s.name for s in keyword)
        if not defaults:
            raise UsageError(f"--stages: {names} measures the keyword path, which FAQ knowledge bases do not have "
                             f"(WeKnora searches FAQ entries by vector only, docs/weknora-contract.md C20/C47; every "
                             f"knowledge base of this run is of type faq: {', '.join(faq)}). Leave it out; the faq "
                             "stage measures FAQ search")
        stages = [s for s in stages if s not in keyword]
        notes.append(f"stage {names} dropped: the knowledge bases are of type faq, which have no keyword path "
                     "(C20/C47)")
    elif keyword:
        notes.append(f"stage {', '.join(s.name for s in keyword)} measures the document knowledge bases only: "
                     f"{', '.join(faq)} (type faq) have no keyword path (C20/C47)")
    if defaults and not any(s.endpoint == FAQ_STAGE.endpoint for s in stages):
        stages = [*stages, FAQ_STAGE]
        notes.append(f"stage faq added: POST /api/v1/knowledge-bases/{{id}}/faq/search on {', '.join(faq)} (C45)")
    for note in notes:
        log.info(note)
    return stages, notes


# -- knowledge bases searched together (C107) ------------------------------------------------------
async def check_embedding_models(client: WeKnoraClient, facts: ServerFacts, kb_ids: list[str],
                                 stages: list[Stage]) -> list[str]:
    """Refuse (UsageError, exit 2) a run whose hybrid-search stages search knowledge bases of different
    embedding models together: WeKnora answers every such request 400 from v0.7.2, and before embeds the
    query with the first knowledge base's model for all (C107). Identity is the model's name
    and base URL (``GET /api/v1/models/{id}``), not its id; a knowledge base without an embedding model is left
    out, as WeKnora leaves it out. Returns notes: what could not be compared."""
    together = [s for s in stages if s.endpoint == "hybrid-search" and "knowledge_base_ids" not in s.params]
    if len(kb_ids) < 2 or not together:
        return []
    entries = {kb: facts.knowledge_bases.get(kb) or {"error": "not read"} for kb in kb_ids}
    unknown = [f"{kb} (not read: {e['error']})" for kb, e in entries.items() if "error" in e]
    # a knowledge base without an embedding model (wiki or graph only) is left out, as WeKnora leaves it out
    model_ids = {kb: e["embedding_model_id"] for kb, e in entries.items() if e.get("embedding_model_id")}
    if not unknown and len(set(model_ids.values())) <= 1:
        return []
    identity: dict[str, str] = {}
    models: dict[str, dict[str, Any] | None] = {}
    for kb, mid in model_ids.items():
        if mid not in models:
            models[mid] = await _model(client, str(mid))
        model = models[mid]
        if model is None:
            unknown.append(f"{kb} (model {mid} could not be read)")
            continue
        params = model.get("parameters")
        params = params if isinstance(params, Mapping) else {}
        identity[kb] = f"{model.get('name')!s} at {params.get('base_url') or '(no base URL)'} (model id {mid})"
    distinct = {v.rsplit(" (model id", 1)[0] for v in identity.values()}
    if len(distinct) > 1:
        names = "; ".join(f"{kb}: {v}" for kb, v in identity.items())
        raise UsageError(f"--kb-id: these knowledge bases use different embedding models, so no hybrid-search over "
                         f"them can be measured (WeKnora answers each with a 400 from v0.7.2, and embeds the query "
                         f"with one model for all before, docs/weknora-contract.md C107): {names}. Collect each in a "
                         f"run of its own, or leave out the hybrid-search stages "
                         f"({', '.join(s.name for s in together)})")
    if unknown:
        note = ("the embedding models of the knowledge bases searched together could not all be compared (C107): "
                + ", ".join(unknown))
        log.warning(note)
        return [note]
    return []


async def _model(client: WeKnoraClient, model_id: str) -> dict[str, Any] | None:
    try:
        return await client.model(model_id)
    except RequestFailed as exc:
        log.info("model %s not read (%s)", model_id, exc)
        return None


# -- what the server's reranking does to scores (C108) ---------------------------------------------
async def reranker_notes(client: WeKnoraClient, facts: ServerFacts) -> tuple[dict[str, Any], list[str]]:
    """The manifest's ``reranker`` entry and the notes it calls for: at v0.6.x the remote reranker sends
    ``truncate_prompt_tokens: 511`` with every request (C108: providers that reject or mishandle it score near
    zero); on main, with the tenant's memory on, MemoryAffinity multiplies the rerank scores of documents a
    user's earlier answers drew on by up to 1.15 (C108; memory-config exists on main only)."""
    entry: dict[str, Any] = {}
    notes: list[str] = []
    release = server_release(facts.version)
    if release is not None and release < (0, 7):
        entry["truncate_prompt_tokens"] = 511
        notes.append(f"WeKnora {facts.version} (v0.6.x): its remote reranker sends truncate_prompt_tokens 511 with "
                     "every rerank request (C108); on providers that reject or mishandle the field the rerank "
                     "scores collapse and final comes back near empty")
        return entry, notes
    memory = await _recorded(client.memory_config(), "memory-config")
    entry["memory_config"] = memory
    if memory.get("enabled") is True and memory.get("retrieval_conditioning") is not False:
        entry["memory_affinity"] = True
        notes.append("the tenant's memory is on with retrieval conditioning (WeKnora main): MemoryAffinity "
                     "multiplies the rerank scores of documents the caller's earlier answers drew on by up to 1.15 "
                     "(C108); this run's own chats feed it, so later runs of the same key are biased")
    return entry, notes
