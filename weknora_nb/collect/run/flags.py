"""What the collector notices about one request's answer: the ``flags`` of the results table (both heuristics).

- ``vector_path_missing`` (knowledge-search): every primary hit (match type 0 or 1, C23) is a keyword match (1)
  although a knowledge base of the run has vector retrieval. When the query's embedding fails (a provider's 429
  under load), WeKnora drops the vector path of that search and answers 200 with the keyword hits alone (C34);
  nothing in the answer says so. A query whose vectors all fell below the threshold looks the same, hence a
  heuristic: the figure of a flagged request is the keyword path's, not the pipeline's. Chats are not flagged:
  the web UI's agent runs a vector threshold of 0.5 (C103), under which keyword-only references are common
  without any failure.
- ``references_rebuilt`` (chat): every reference has match type 0, no ``sub_chunk_id`` and either no
  ``metadata`` or no ``matched_content``: the server's Redis stream manager rebuilt them from a map, losing
  those fields (C106). Their match types say nothing, so a stage's ``keep_match_types`` is not applied to them.

:data:`weknora_nb.core.results.FLAGS` says what each flag means, for readers of the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: the flag names (keys of :data:`weknora_nb.core.results.FLAGS`)
VECTOR_PATH_MISSING = "vector_path_missing"
REFERENCES_REBUILT = "references_rebuilt"
#: C23: a keyword hit's match type, and the primary (search-hit) match types
_KEYWORD = 1
_PRIMARY = (0, 1)


def request_flags(endpoint: str, items: Sequence[dict[str, Any]], *, vector_retrieval: bool) -> list[str]:
    """The flags of one successful request at ``endpoint`` that returned ``items`` (the result objects or chat
    references, as the server sent them); ``vector_retrieval``: some knowledge base of the run has it (C49)."""
    flags = []
    if endpoint == "chat" and references_rebuilt(items):
        flags.append(REFERENCES_REBUILT)
    elif endpoint == "knowledge-search" and vector_retrieval and keyword_only(items):
        flags.append(VECTOR_PATH_MISSING)
    return flags


def keyword_only(items: Sequence[dict[str, Any]]) -> bool:
    """Some primary hit, and every primary hit a keyword match."""
    primary = [mt for mt in (_match_type(it) for it in items) if mt in _PRIMARY]
    return bool(primary) and all(mt == _KEYWORD for mt in primary)


def references_rebuilt(items: Sequence[dict[str, Any]]) -> bool:
    """Some reference, and every one of them as the Redis stream manager rebuilds it (C106): match type 0 (or
    none), no ``sub_chunk_id``, and no ``metadata`` (null, up to v0.7.2) or no ``matched_content`` (main keeps
    the metadata, not the matched content)."""
    return bool(items) and all(
        _match_type(it) in (0, None) and not it.get("sub_chunk_id")
        and (it.get("metadata") is None or "matched_content" not in it)
        for it in items)


def _match_type(item: dict[str, Any]) -> int | None:
    value = item.get("match_type")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
