"""The pipeline WeKnora runs, as data: stage order, upstream stages, the focus stage, the headline metric.

``docs/method.md`` section 5: recall is measured at up to five points of one pipeline so
that a loss can be located::

    vector ─┐
            ├─> hybrid ─> final ─> citations        faq (an FAQ knowledge base's own
    keyword ┘   (fusion)  (rerank,  (the references   search, faq/search)
                           merge)    of an answer)

Every stage a run holds has a *role*, one of :data:`PIPELINE`: the built-in stages are
their own role; a custom stage's role follows from its definition (endpoint and
parameters, see :func:`role_of`), so that its upstream stages, and the causes a
degraded query can have there, come from what it measures, not from its name.

This module also holds the rules every report applies the same way: the default focus
stage (:func:`focus_stage`), the headline metric (:data:`HEADLINE_METRIC`) and the
number of valid queries below which figures are not statistically significant
(:data:`MIN_VALID_QUERIES`, ``docs/method.md`` section 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: stage roles in pipeline order; stages of other roles follow in the order first seen
PIPELINE: tuple[str, ...] = ("vector", "keyword", "hybrid", "final", "citations", "faq")

#: the stage MRR and NDCG default to (``docs/method.md`` section 5): what the user sees
FOCUS_STAGE = "final"

#: the figure a comparison, a recommendation and a report headline lead with (section 7)
HEADLINE_METRIC = "ndcg@5"

#: fewer valid queries than this and every output says the figures are not significant
MIN_VALID_QUERIES = 200

#: for each role, the roles whose lists are looked at when a query is degraded there
_UPSTREAM: dict[str, tuple[str, ...]] = {
    "vector": (), "keyword": (), "hybrid": ("vector", "keyword"),
    "final": ("hybrid", "vector", "keyword"), "citations": ("final", "hybrid", "vector", "keyword"),
    "faq": (),  # an FAQ knowledge base's own search (faq/search): one vector path, nothing upstream
}


def role_of(name: str, definition: Mapping[str, Any] | None = None) -> str:
    """The pipeline role of a stage: its name when built in, else what its definition measures.

    ``definition`` is a stage as the manifest records it (``{"endpoint": ..., "params": ...}``):
    hybrid-search with ``disable_keywords_match`` is ``vector``, with ``disable_vector_match``
    ``keyword``, with both paths ``hybrid``; knowledge-search is ``final``; chat ``citations``.
    A stage with neither a known name nor a definition keeps its name as its role.
    """
    if name in PIPELINE:
        return name
    if not definition:
        return name
    endpoint = definition.get("endpoint")
    params = definition.get("params") or {}
    if endpoint == "hybrid-search":
        if params.get("disable_keywords_match") and not params.get("disable_vector_match"):
            return "vector"
        if params.get("disable_vector_match") and not params.get("disable_keywords_match"):
            return "keyword"
        return "hybrid"
    return {"knowledge-search": "final", "chat": "citations", "faq-search": "faq"}.get(str(endpoint), name)


def upstream(stage: str, stages: Mapping[str, Mapping[str, Any] | None] | Iterable[str]) -> list[str]:
    """The stages of a run upstream of ``stage``, nearest role first.

    ``stages`` is every stage of the run, with its definition when known (the manifest's
    ``stages`` object) or as plain names.
    """
    defs: Mapping[str, Mapping[str, Any] | None] = (
        stages if isinstance(stages, Mapping) else dict.fromkeys(stages))
    own = role_of(stage, defs.get(stage))
    roles = {s: role_of(s, d) for s, d in defs.items() if s != stage}
    out: list[str] = []
    for role in _UPSTREAM.get(own, ()):
        out += [s for s, r in roles.items() if r == role]
    return out


def stage_order(stages: Iterable[str], definitions: Mapping[str, Mapping[str, Any] | None] | None = None) -> list[str]:
    """``stages`` (distinct, first seen first) sorted by pipeline role; stages of no known role last."""
    seen = list(dict.fromkeys(stages))
    defs = definitions or {}

    def key(s: str) -> tuple[int, int]:
        role = role_of(s, defs.get(s))
        return (PIPELINE.index(role) if role in PIPELINE else len(PIPELINE), seen.index(s))
    return sorted(seen, key=key)


def focus_stage(stages: Iterable[str], requested: str | None = None,
                definitions: Mapping[str, Mapping[str, Any] | None] | None = None) -> str | None:
    """The stage a report, a comparison or a gate looks at.

    ``requested`` when given; else ``final`` when present (what the user sees); else the stage
    furthest down the pipeline (by role, :func:`stage_order`). None when ``requested`` is not
    one of ``stages`` (the caller turns that into its own error naming the stages) or when
    there is no stage at all.
    """
    seen = list(dict.fromkeys(stages))
    if requested is not None:
        return requested if requested in seen else None
    if FOCUS_STAGE in seen:
        return FOCUS_STAGE
    return stage_order(seen, definitions)[-1] if seen else None


def significance_warning(n_valid: int, minimum: int = MIN_VALID_QUERIES) -> str | None:
    """The plain-words warning every output shows when fewer than ``minimum`` valid queries back a figure."""
    if n_valid < minimum:
        return (f"Only {n_valid} valid queries back these figures (fewer than {minimum}): they are not "
                "statistically significant.")
    return None
