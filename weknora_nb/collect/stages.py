"""Pipeline stages as data: which endpoint and parameters measure which point of WeKnora's pipeline.

METHOD.md section 5: recall is measured at up to four points of one pipeline so the
loss can be located — ``vector`` and ``keyword`` (one path each), ``hybrid`` (both paths
merged, before rerank), ``final`` (after rerank and merge, what the user sees) — and
optionally ``citations`` (the references of a generated answer).

A stage file (YAML) may redefine or add stages::

    stages:
      hybrid-100:
        endpoint: hybrid-search
        params: {match_count: 100}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Stage", "DEFAULT_STAGES", "ENDPOINTS", "resolve_stages", "load_stage_file"]

ENDPOINTS = ("hybrid-search", "knowledge-search", "chat")
#: WeKnora match types that are search hits; 2-7 are context added around them
PRIMARY_MATCH_TYPES = (0, 1)


@dataclass(frozen=True)
class Stage:
    """A named measurement point: an endpoint, its parameters, and which match types count."""

    name: str
    endpoint: str
    params: dict[str, Any] = field(default_factory=dict)
    keep_match_types: tuple[int, ...] | None = PRIMARY_MATCH_TYPES

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"stage {self.name!r}: endpoint must be one of {list(ENDPOINTS)}. "
                             f"Got {self.endpoint!r} instead.")

    def request_params(self) -> dict[str, Any]:
        """Parameters sent: for hybrid-search, context enrichment is skipped unless the stage says otherwise."""
        if self.endpoint == "hybrid-search":
            return {"skip_context_enrichment": True, **self.params}
        return dict(self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "params": self.request_params(),
                "keep_match_types": list(self.keep_match_types) if self.keep_match_types is not None else None}


DEFAULT_STAGES: dict[str, Stage] = {
    "vector": Stage("vector", "hybrid-search", {"disable_keywords_match": True, "match_count": 50}),
    "keyword": Stage("keyword", "hybrid-search", {"disable_vector_match": True, "match_count": 50}),
    "hybrid": Stage("hybrid", "hybrid-search", {"match_count": 50}),
    "final": Stage("final", "knowledge-search"),
    "citations": Stage("citations", "chat"),
}


def load_stage_file(path: str | Path) -> dict[str, Stage]:
    """Stages defined in a YAML file (``stages: {name: {endpoint, params, keep_match_types}}``)."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    out = {}
    for name, spec in (data.get("stages") or {}).items():
        if not isinstance(spec, dict) or "endpoint" not in spec:
            raise ValueError(f"{path}: stage {name!r} needs an 'endpoint'")
        keep = spec.get("keep_match_types", list(PRIMARY_MATCH_TYPES))
        out[str(name)] = Stage(str(name), spec["endpoint"], dict(spec.get("params") or {}),
                               tuple(keep) if keep is not None else None)
    return out


def resolve_stages(names: str | list[str], extra: dict[str, Stage] | None = None) -> list[Stage]:
    """Stage objects for ``"hybrid,final"`` or a list of names (defaults, then ``extra``)."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    known = {**DEFAULT_STAGES, **(extra or {})}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; known: {sorted(known)}")
    if not names:
        raise ValueError("at least one stage is needed")
    return [known[n] for n in dict.fromkeys(names)]
