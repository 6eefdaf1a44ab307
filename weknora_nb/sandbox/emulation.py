"""Which WeKnora release the sandbox behaves as (``--weknora-version``), as data.

Each field is one behaviour that differs between releases, with the fact of
``docs/weknora-contract.md`` that holds it. The default is the latest release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weknora_nb.core.errors import UsageError


@dataclass(frozen=True)
class WeKnoraRelease:
    """The behaviours of one WeKnora release the sandbox emulates."""

    name: str
    #: C15: methods routed for hybrid-search (v0.6.2: GET only, with a JSON body)
    hybrid_search_methods: tuple[str, ...] = ("GET", "POST")
    #: C17: what ``match_count <= 0`` does: "empty" (0 -> data null, negative -> panic 500) or "default" (50)
    match_count_nonpositive: str = "empty"
    #: C39: ``metadata.model_score`` present on reranked knowledge-search results
    model_score_metadata: bool = True
    #: C38: the final score also carries the +-5 % position factor
    position_factor: bool = False
    #: C43: FILTER_TOP_K sorts the merged results by score first
    sort_before_top_k: bool = True
    #: C53: chunk listings return HTML-escaped content
    escape_chunk_listing: bool = False
    #: C3-C7: API keys from a key service (platform keys, X-Tenant-ID, capabilities)
    key_service: bool = True
    #: C65: the server writes inline ``<kb ... />`` citations into answers
    inline_citations: bool = True
    #: C64: the references event comes before the answer
    references_first: bool = True
    #: C16: hybrid-search refuses an empty ``query_text`` (400 "query_text is required")
    query_text_required: bool = True
    #: C27: knowledge-search takes ``tag_ids`` / ``mentioned_items``; its missing-scope 400 names "scoped tag"
    scoped_tag_search: bool = True
    #: C55: chunks carry ``content_revision``, ``index_status``, ``last_editor_id``
    chunk_revision_fields: bool = True
    #: C2: a rejected bearer token without X-API-Key is "invalid or expired token" (else "missing authentication")
    bearer_rejection_message: bool = True
    #: C34: a knowledge base search that fails with nothing found is a 500 (v0.6.x: only logged, ``data: []``)
    search_failure_is_error: bool = True
    #: C121: when the query's embedding fails, knowledge-search and chat keep the keyword path of the knowledge
    #: bases that have one (v0.6.x: the search fails)
    embedding_failure_falls_back: bool = True
    #: C33, C36: knowledge-search's ``knowledge_ids`` of other knowledge bases are loaded directly (<= 50 chunks,
    #: score 1.0, match type 8; rerank floor 0.15) instead of searched without thresholds (rerank floor 0)
    direct_load_knowledge: bool = False
    #: C56: what ``/system/info`` reports as ``version`` (the build's VERSION file: it names the release line,
    #: ``0.6.2`` at v0.6.3 too, ``0.7.2`` at main) and ``commit_id`` (the tag's commit, as get_version.sh takes it)
    reported_version: str = "0.7.2"
    commit_id: str = ""
    #: C82-C84: sessions belong to the API key that created them and the channel sources (``api``, embed, IM)
    #: need the Admin role; at v0.6.x a key acts as the tenant's first user and ``source`` knows web and IM only
    per_key_sessions: bool = True
    #: C88: ``POST /messages/search`` finds the caller's own (and legacy) sessions only; before main, tenant-wide
    owner_scoped_message_search: bool = False
    #: C116: a knowledge-chat shows its query understanding and its retrieval as ``tool_call`` / ``tool_result``
    #: events (chat_pipeline/progress.go, from v0.6.3)
    progress_events: bool = True
    #: C117: references rebuilt by the Redis stream manager keep their ``metadata`` (main's searchResultFromMap)
    redis_keeps_metadata: bool = False


#: the details v0.6.x share (C2, C16, C27, C33, C34, C55, C82-C84, C121)
_BEFORE_V072: dict[str, Any] = {
    "query_text_required": False, "scoped_tag_search": False, "chunk_revision_fields": False,
    "bearer_rejection_message": False, "search_failure_is_error": False, "direct_load_knowledge": True,
    "per_key_sessions": False, "embedding_failure_falls_back": False}

RELEASES: dict[str, WeKnoraRelease] = {
    "v0.6.2": WeKnoraRelease("v0.6.2", hybrid_search_methods=("GET",), model_score_metadata=False,
                             position_factor=True, sort_before_top_k=False, escape_chunk_listing=True,
                             key_service=False, inline_citations=False, references_first=False,
                             reported_version="0.6.2", commit_id="fc98f00", progress_events=False, **_BEFORE_V072),
    "v0.6.3": WeKnoraRelease("v0.6.3", position_factor=True, sort_before_top_k=False, escape_chunk_listing=True,
                             key_service=False, inline_citations=False, reported_version="0.6.2",
                             commit_id="974ca35", **_BEFORE_V072),
    "v0.7.2": WeKnoraRelease("v0.7.2", commit_id="3d5d8bf"),
    "main": WeKnoraRelease("main", match_count_nonpositive="default", commit_id="412dcc4",
                           owner_scoped_message_search=True, redis_keeps_metadata=True),
}
#: the latest release
DEFAULT_RELEASE = "v0.7.2"


def release(name: str | None) -> WeKnoraRelease:
    """The release called ``name`` (None: the default); a UsageError lists the ones emulated."""
    key = DEFAULT_RELEASE if name is None else name
    if key not in RELEASES:
        raise UsageError(argument="--weknora-version", allowed=list(RELEASES), got=name)
    return RELEASES[key]
