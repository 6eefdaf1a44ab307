"""What each stage ran with: where its settings came from, its thresholds, top-k and reranker (C19, C29-C44, C66).

A degraded query's causes are judged against these settings. Where a stage's settings came from is the
manifest's ``stages.<name>.settings_source``, else follows from its role: a knowledge-search stage
(``final``) runs the tenant retrieval config (:data:`KNOWLEDGE_SEARCH`), the ``citations`` stage the
server's conversation settings (:data:`CONVERSATION`, C66), any other stage what its request asked
(:data:`REQUEST`). Knowledge-search's thresholds and top-k are those of the *effective* retrieval config
(:func:`effective_config`: a tenant config's zeros are the defaults, C30); a keyword threshold applies
only when the server's keyword engine is OpenSearch (C109: Weaviate, Elasticsearch v7/v8, Postgres and
SQLite ignore it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from weknora_nb.core.pipeline import role_of
from weknora_nb.core.weknora import RETRIEVAL_DEFAULTS, effective_retrieval_config

#: where a stage's settings come from (the manifest's ``stages.<name>.settings_source``)
KNOWLEDGE_SEARCH = "tenant retrieval config"
REQUEST = "request"
CONVERSATION = "server conversation config"


def effective_config(recorded: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The settings knowledge-search ran with, from the manifest's ``retrieval_config``.

    Manifests record ``{"raw": ..., "effective": ...}``: the effective one is used; older ones
    hold the config as read, made effective here (:func:`weknora_nb.core.weknora.
    effective_retrieval_config`: zeros mean the defaults, C30). None when nothing usable was
    recorded (no config, or the server answered with an error).
    """
    if not isinstance(recorded, Mapping) or not recorded:
        return None
    if isinstance(recorded.get("effective"), Mapping):
        return dict(recorded["effective"])
    raw = recorded.get("raw", recorded)
    if not isinstance(raw, Mapping) or "error" in raw:
        return None
    return effective_retrieval_config(raw)


def _release(server: Mapping[str, Any] | None) -> tuple[int, ...] | None:
    """The WeKnora release the server reports (``v0.7.2`` -> (0, 7, 2)); None when unknown or not a release."""
    version = server.get("version") if isinstance(server, Mapping) else None
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", str(version or "").strip())
    return tuple(int(x) for x in m.groups()) if m else None


#: C109: the keyword engines (``RETRIEVE_DRIVER`` names) that apply a keyword threshold, and those that ignore it
KEYWORD_THRESHOLD_APPLIED = ("opensearch",)
KEYWORD_THRESHOLD_IGNORED = {"postgres": ("Postgres", "C19"), "sqlite": ("SQLite", "C109"),
                             "weaviate": ("Weaviate", "C109"), "elasticsearch": ("Elasticsearch", "C109")}


def _keyword_engine_note(server: Mapping[str, Any] | None) -> str | None:
    """None when a keyword threshold applies: every keyword engine of the server is OpenSearch (C109); otherwise
    why it does not apply: an engine that ignores it (Postgres C19, SQLite, Weaviate, Elasticsearch v7/v8:
    C109), one whose rule was not read, none configured, none recorded."""
    engines = server.get("keyword_index_engine") if isinstance(server, Mapping) else None
    if not isinstance(engines, str) or not engines.strip():
        return "keyword engine not recorded"
    names = [e.strip().lower() for e in engines.split(",") if e.strip()]
    if not names or "未配置" in names:
        return "no keyword engine configured"
    ignoring = [found for n in names for key, found in KEYWORD_THRESHOLD_IGNORED.items() if n.startswith(key)]
    if ignoring:
        labels = "/".join(dict.fromkeys(label for label, _ in ignoring))
        return f"ignored by the {labels} keyword path ({', '.join(dict.fromkeys(fact for _, fact in ignoring))})"
    unknown = [n for n in names if n not in KEYWORD_THRESHOLD_APPLIED]
    if unknown:
        return f"not known whether the {'/'.join(unknown)} keyword path applies it (C109: only OpenSearch does)"
    return None


def _positive(value: Any) -> float | None:
    """``value`` as a threshold: None when absent or <= 0 (no filter)."""
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


@dataclass(frozen=True)
class StageSettings:
    """What a stage ran with, as far as the run records it.

    ``source``: where WeKnora took the settings from (:data:`KNOWLEDGE_SEARCH`, :data:`REQUEST`,
    :data:`CONVERSATION`). Thresholds are None when none was applied (or it is not known);
    ``keyword_note`` says why a configured keyword threshold is not applied. ``reranker``: what
    says a reranker runs at the stage (None: nothing does). ``rerank_column``: the results column
    that shows a reranked list (``model_score``; ``base_score`` at v0.6.2, which writes no
    model score, C39). Top-k and the rerank threshold are the effective config's (defaults when
    the run recorded none; ``rerank_threshold`` None then).
    """

    source: str
    vector_threshold: float | None = None
    keyword_threshold: float | None = None
    keyword_note: str | None = None
    embedding_top_k: int = int(RETRIEVAL_DEFAULTS["embedding_top_k"])
    rerank_top_k: int = int(RETRIEVAL_DEFAULTS["rerank_top_k"])
    rerank_threshold: float | None = None
    rerank_threshold_assumed: bool = False
    reranker: str | None = None
    rerank_column: str = "model_score"
    release: tuple[int, ...] | None = None

    @property
    def knowledge_search(self) -> bool:
        """The stage runs knowledge-search's pipeline with the tenant retrieval config."""
        return self.source == KNOWLEDGE_SEARCH


def _settings_source(stage: str, definition: Mapping[str, Any] | None) -> str:
    """The manifest's ``settings_source`` of the stage, else its role's (final: the tenant config, citations:
    the server's conversation config, C66; any other: the request)."""
    recorded = (definition or {}).get("settings_source")
    if recorded:
        return str(recorded)
    return {"final": KNOWLEDGE_SEARCH, "citations": CONVERSATION}.get(role_of(stage, definition), REQUEST)


def rerank_column(server: Mapping[str, Any] | None) -> str:
    """The results column that shows a reranked list: ``model_score``, or ``base_score`` before v0.6.3 (C39)."""
    release = _release(server)
    return "model_score" if release is None or release >= (0, 6, 3) else "base_score"


def stage_settings(stage: str, definition: Mapping[str, Any] | None, config: Mapping[str, Any] | None,
                   server: Mapping[str, Any] | None, reranked_queries: int = 0) -> StageSettings:
    """The settings ``stage`` ran with: ``config`` is :func:`effective_config` (None: not recorded),
    ``server`` the manifest's ``server``; ``reranked_queries``: how many queries' lists at the stage
    carry rerank scores (over the whole run)."""
    source = _settings_source(stage, definition)
    common: dict[str, Any] = {"rerank_column": rerank_column(server), "release": _release(server)}
    if source == REQUEST:
        params = (definition or {}).get("params") or {}
        return StageSettings(source, vector_threshold=_positive(params.get("vector_threshold")),
                             **_keyword_threshold(params, server), **common)
    if source != KNOWLEDGE_SEARCH:
        return StageSettings(source, **common)
    cfg = config or {}
    model = cfg.get("rerank_model_id")
    reranker = (f"the tenant retrieval config names rerank model {model!r}" if model else
                f"{reranked_queries} queries' lists at {stage} carry {common['rerank_column']}" if reranked_queries
                else None)
    threshold = cfg.get("rerank_threshold")
    return StageSettings(
        source, vector_threshold=_positive(cfg.get("vector_threshold")), **_keyword_threshold(cfg, server),
        embedding_top_k=int(cfg.get("embedding_top_k") or RETRIEVAL_DEFAULTS["embedding_top_k"]),
        rerank_top_k=int(cfg.get("rerank_top_k") or RETRIEVAL_DEFAULTS["rerank_top_k"]),
        rerank_threshold=None if config is None or threshold is None else float(threshold),
        rerank_threshold_assumed=bool(cfg.get("rerank_threshold_assumed")), reranker=reranker,
        **common)


def _keyword_threshold(settings: Mapping[str, Any], server: Mapping[str, Any] | None) -> dict[str, Any]:
    """``keyword_threshold`` (applied, or None) and ``keyword_note`` (why a configured one is not) of a stage
    whose thresholds are ``settings`` (C19)."""
    kt, note = _positive(settings.get("keyword_threshold")), _keyword_engine_note(server)
    return {"keyword_threshold": None if note else kt, "keyword_note": f"{kt:g}, {note}" if kt and note else None}
