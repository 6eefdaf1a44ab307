"""Facts about WeKnora that both the client and the sandbox rely on (``docs/weknora-contract.md``).

Only what is the same on both sides of the wire lives here: the meaning of a tenant's
retrieval configuration (zeros mean defaults, C30/C57), match types (C23), chunk types
(C54) and the error codes of WeKnora's envelope (C12). Each constant names its fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: C23: ``match_type`` of a search result
MATCH_TYPES: dict[int, str] = {0: "vector", 1: "keyword", 2: "nearby", 3: "history", 4: "parent", 5: "relation",
                               6: "graph", 7: "web", 8: "direct load", 9: "data analysis"}
#: search hits proper; 2-7 are context added around them (C24)
PRIMARY_MATCH_TYPES: tuple[int, ...] = (0, 1)

#: C54: every chunk type; C24: the ones search can return (``parent_text`` never is)
CHUNK_TYPES: tuple[str, ...] = ("text", "parent_text", "image_ocr", "image_caption", "summary", "entity",
                                "relationship", "faq", "web_search", "table_summary", "table_column", "wiki_page")
SEARCHABLE_CHUNK_TYPES: tuple[str, ...] = ("text", "summary", "table_column", "table_summary", "faq", "image_ocr",
                                           "image_caption")
#: C101: what a run's inventory lists: every searchable type and the ``parent_text`` chunks (listed only when asked
#: for by name), so that a child's family is known
LISTED_CHUNK_TYPES: tuple[str, ...] = (*SEARCHABLE_CHUNK_TYPES, "parent_text")
#: C102: the ``index_status`` values (v0.7.2+) whose chunks search drops; ``ready`` (or none, before v0.7.2) is
#: searchable
UNSEARCHABLE_INDEX_STATUSES: tuple[str, ...] = ("processing", "failed")
#: C103: the agent the web UI's normal chat sends (``agent_id``, with ``agent_enabled: false``)
UI_CHAT_AGENT = "builtin-quick-answer"
#: C104: the progress step (a ``tool_call`` event) a chat announces when it retrieves
RETRIEVAL_PROGRESS_TOOL = "knowledge_search"

#: C12: envelope error code -> (name, HTTP status)
ERROR_CODES: dict[int, tuple[str, int]] = {
    1000: ("bad request", 400), 1001: ("unauthorized", 401), 1002: ("forbidden", 403), 1003: ("not found", 404),
    1004: ("method not allowed", 405), 1005: ("conflict", 409), 1006: ("too many requests", 429),
    1007: ("internal server error", 500), 1008: ("service unavailable", 503), 1009: ("timeout", 504),
    1010: ("validation", 400),
}

#: where the retrieval settings of each endpoint come from: hybrid-search and FAQ search take them in the
#: request (C16, C45); knowledge-search has no per-request settings, it runs the tenant retrieval config
#: (C27, C29); chat runs config.yaml's ``conversation.*`` (C66), or an agent's settings when the request names
#: one (:data:`AGENT_SETTINGS`, C66, C103)
SETTINGS_SOURCES: dict[str, str] = {"hybrid-search": "request", "faq-search": "request",
                                    "knowledge-search": "tenant retrieval config",
                                    "chat": "server conversation config"}
#: the settings source of a chat that names an agent (``agent <id>`` follows)
AGENT_SETTINGS = "agent configuration"
#: C45: the vector threshold FAQ search applies when the request sets none (or <= 0)
FAQ_VECTOR_THRESHOLD = 0.7

#: C30: what a value <= 0 (or absent) in the tenant retrieval config means
RETRIEVAL_DEFAULTS: dict[str, float] = {
    "embedding_top_k": 50, "vector_threshold": 0.15, "keyword_threshold": 0.3, "rerank_top_k": 10,
    "rrf_k": 60, "rrf_vector_weight": 0.7, "rrf_keyword_weight": 0.3,
}
#: C30: the rerank threshold of a tenant that never saved a retrieval config (a saved 0 stays 0)
RERANK_THRESHOLD_UNSAVED = 0.2


def effective_retrieval_config(raw: Mapping[str, Any] | None, *, saved: bool | None = None) -> dict[str, Any]:
    """The settings knowledge-search runs with, from the config ``GET .../retrieval-config`` returns (C29, C30, C57).

    Every field <= 0 (or missing) takes its default of :data:`RETRIEVAL_DEFAULTS`; when both RRF
    weights are 0 they become 0.7 / 0.3. ``rerank_threshold`` is 0.2 when the tenant never saved
    a config and the saved value otherwise; the API shows 0 in both cases, so ``saved`` says which
    (None: unknown, then 0 is read as "never saved", WeKnora's state on a fresh install, and the
    result says so in ``rerank_threshold_assumed``). An empty ``rerank_model_id`` means "the first
    rerank model of the tenant" (``rerank_model`` = ``"first registered"``).
    """
    cfg = dict(raw or {})
    out: dict[str, Any] = {}
    for key, default in RETRIEVAL_DEFAULTS.items():
        value = cfg.get(key)
        out[key] = value if isinstance(value, (int, float)) and value > 0 else default
    if not (cfg.get("rrf_vector_weight") or 0) > 0 and not (cfg.get("rrf_keyword_weight") or 0) > 0:
        out["rrf_vector_weight"], out["rrf_keyword_weight"] = 0.7, 0.3
    threshold = cfg.get("rerank_threshold")
    all_zero = not any((cfg.get(k) or 0) for k in ("embedding_top_k", "vector_threshold", "keyword_threshold",
                                                    "rerank_top_k", "rerank_threshold"))
    if saved is False or (saved is None and all_zero):
        out["rerank_threshold"] = RERANK_THRESHOLD_UNSAVED
        out["rerank_threshold_assumed"] = saved is None
    else:
        out["rerank_threshold"] = float(threshold or 0.0)
        out["rerank_threshold_assumed"] = False
    model = cfg.get("rerank_model_id") or ""
    out["rerank_model_id"] = model
    out["rerank_model"] = model or "first registered"
    return out
