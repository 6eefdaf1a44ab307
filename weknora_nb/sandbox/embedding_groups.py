"""What WeKnora's search does with the embedding models of the knowledge bases it searches, for the sandbox's server:

- hybrid-search over knowledge bases indexed with different embedding models is refused with a 400 (C122:
  ``validateSameEmbeddingModel``, knowledgebase_search_storegroup.go:247-279, called at knowledgebase_search.go:137
  @ v0.7.2; a model's identity is its name and base URL, knowledgebase_search.go:69; the sandbox's models share
  one base URL, so their names tell them apart);
- when the query's embedding fails (the model answers 429), knowledge-search and chat keep, per knowledge base,
  the keyword path alone where the knowledge base has one and record an error for the others (C121:
  ``targetReportsEmbedFailure`` and ``searchByTargets``, chat_pipeline/search.go:330-341, :411-440 @ v0.7.2); at
  v0.6.x the whole search fails (``group_embed_error``, then the search embeds again and fails,
  chat_pipeline/search.go:369-382 @ v0.6.2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import Response

from weknora_nb.sandbox.embeddings_api import EMBEDDING_FAILURE
from weknora_nb.sandbox.wire import BAD_REQUEST, INTERNAL, app_error

if TYPE_CHECKING:
    from weknora_nb.sandbox.catalog import Catalog

#: C122: the 400's message (knowledgebase_search_storegroup.go:273-275 @ v0.7.2, :247-249 @ v0.6.2)
MIXED_MODELS = ("selected knowledge bases use different embedding models; multi-KB search requires every knowledge "
                "base to share a single embedding model")


def mixed_models(catalog: Catalog, kb_ids: list[str]) -> Response | None:
    """The 400 (code 1000) of a multi-KB hybrid-search whose knowledge bases use different embedding models, or None
    (C122; with ``disable_vector_match`` too: the check comes before the paths)."""
    models = {catalog.embedding_model(k) for k in kb_ids if k in catalog.kbs}
    return app_error(BAD_REQUEST, MIXED_MODELS) if len(models) > 1 else None


def has_keyword_fallback(catalog: Catalog, kb_id: str) -> bool:
    """Whether a knowledge base's search survives a failed query embedding: a document knowledge base with its
    keyword path (``!targetReportsEmbedFailure``, C121)."""
    return catalog.kbs[kb_id].type == "document" and catalog.engine.version.keyword_enabled


def keyword_fallback(catalog: Catalog, known: list[str], kids: list[str],
                     falls_back: bool) -> tuple[list[str], list[str], list[str]]:
    """The targets of a knowledge-search whose query embedding failed: (knowledge bases searched whole, knowledge
    ids searched, knowledge bases whose search failed), from the ones it had. ``falls_back``: the release keeps the
    keyword path (v0.7.2+); else every target fails."""
    if not falls_back:
        failed = list(dict.fromkeys([*known, *(catalog.kb_of[k] for k in kids)]))
        return [], [], failed
    failed = [k for k in known if not has_keyword_fallback(catalog, k)]
    failed += [catalog.kb_of[k] for k in kids if not has_keyword_fallback(catalog, catalog.kb_of[k])]
    kept_kids = [k for k in kids if has_keyword_fallback(catalog, catalog.kb_of[k])]
    return [k for k in known if k not in failed], kept_kids, list(dict.fromkeys(failed))


def no_fallback_error(kb_id: str) -> Response:
    """knowledge-search's 500 when nothing was found and a knowledge base's search failed for the embedding
    (v0.7.2+: ``knowledge base <id> has no keyword fallback: <the embedding error>``, recording 81b)."""
    return app_error(INTERNAL, f"knowledge base {kb_id} has no keyword fallback: {EMBEDDING_FAILURE}")


def embedding_failed() -> Response:
    """hybrid-search's 500 when the query's embedding fails (C121; knowledgebase_search.go:164-170, the handler's
    InternalServerError with the error's text, knowledgebase.go:327-328 @ v0.7.2; recording 80)."""
    return app_error(INTERNAL, EMBEDDING_FAILURE)
