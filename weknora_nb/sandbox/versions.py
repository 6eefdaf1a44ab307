"""System versions of the sandbox: what defines one (:class:`VersionConfig`) and how ``versions.yaml`` is read
(:func:`load_versions`).

A system version is data, not code: the knowledge base's indexing strategy and engine parameters (C49), the
vector index's HNSW settings, whether a rerank model is registered (C29/C35), the tenant's saved retrieval
config (C57, C30), whether an FAQ knowledge base is served (C45-C47) and the seeded integrity faults (C89).
The retrieval engine (:mod:`.engine`) serves one over an index (:mod:`.index`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import ConfigError, Problem
from weknora_nb.sandbox.chunking import FAQ_INDEX_MODES, FAQ_QUESTION_INDEX_MODES
from weknora_nb.sandbox.parentchild import CHILD_CHUNK_SIZE, PARENT_CHUNK_SIZE, ParentChild

#: C57: the keys of a tenant's retrieval config, and the ones returned only when non-zero
TENANT_KEYS = ("embedding_top_k", "vector_threshold", "keyword_threshold", "rerank_top_k", "rerank_threshold",
               "rerank_model_id", "rrf_k", "rrf_vector_weight", "rrf_keyword_weight")
TENANT_OMITEMPTY = ("rrf_k", "rrf_vector_weight", "rrf_keyword_weight")
#: C117: WeKnora's stream managers (``STREAM_MANAGER_TYPE``): Lite's ``memory``, or ``redis``
STREAM_MANAGERS = ("memory", "redis")


@dataclass(frozen=True)
class VersionConfig:
    """Everything that defines one "system version" of the sandbox, in WeKnora's terms (data, not code).

    Sections of ``versions.yaml``: ``vector`` and ``keyword`` (the knowledge base's indexing
    strategy, C49, and the engines' parameters), ``hnsw`` (the vector index), ``rerank``
    (``enabled``: a rerank model is registered, so knowledge-search reranks, C29/C35), ``tenant``
    (the tenant's saved retrieval config, C57; absent: never saved, so zeros and WeKnora's
    defaults, C30) and ``faq`` (``enabled``: an FAQ knowledge base is served, C45-C47; its
    ``faq_config`` ``index_mode`` / ``question_index_mode``, C49, default WeKnora's for a knowledge
    base created through the API: question_answer / combined).
    """

    name: str
    description: str = ""
    vector_enabled: bool = True
    keyword_enabled: bool = True
    embedding_model: str = "use-multilingual-v3"
    hnsw_m: int = 16
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 64
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    rerank_enabled: bool = False
    rerank_model: str = "e5-bm25-features"
    rerank_bm25_weight: float = 1.0
    tenant_saved: bool = False
    tenant_embedding_top_k: int = 0
    tenant_vector_threshold: float = 0.0
    tenant_keyword_threshold: float = 0.0
    tenant_rerank_top_k: int = 0
    tenant_rerank_threshold: float = 0.0
    tenant_rerank_model_id: str = ""
    tenant_rrf_k: int = 0
    tenant_rrf_vector_weight: float = 0.0
    tenant_rrf_keyword_weight: float = 0.0
    faq_enabled: bool = False
    faq_index_mode: str = "question_answer"
    faq_question_index_mode: str = "combined"
    integrity_without_vectors: tuple[str, ...] = ()
    integrity_duplicated_vectors: tuple[tuple[str, str], ...] = ()
    integrity_deleted_chunks: tuple[str, ...] = ()
    chunking_parent_child: bool = False
    chunking_parent_chunk_size: int = PARENT_CHUNK_SIZE
    chunking_child_chunk_size: int = CHILD_CHUNK_SIZE
    stream_manager: str = "memory"

    _SECTIONS = {
        "vector": {"enabled": "vector_enabled", "model": "embedding_model"},
        "hnsw": {"m": "hnsw_m", "ef_construction": "hnsw_ef_construction", "ef_search": "hnsw_ef_search"},
        "keyword": {"enabled": "keyword_enabled", "k1": "bm25_k1", "b": "bm25_b"},
        "rerank": {"enabled": "rerank_enabled", "model": "rerank_model", "bm25_weight": "rerank_bm25_weight"},
        "tenant": {key: f"tenant_{key}" for key in TENANT_KEYS},
        "faq": {"enabled": "faq_enabled", "index_mode": "faq_index_mode",
                "question_index_mode": "faq_question_index_mode"},
        "integrity": {"without_vectors": "integrity_without_vectors",
                      "duplicated_vectors": "integrity_duplicated_vectors",
                      "deleted_chunks": "integrity_deleted_chunks"},
        "chunking": {"enable_parent_child": "chunking_parent_child", "parent_chunk_size": "chunking_parent_chunk_size",
                     "child_chunk_size": "chunking_child_chunk_size"},
        "server": {"stream_manager": "stream_manager"},
    }

    def __post_init__(self) -> None:
        # YAML gives lists; the config stays hashable and comparable
        object.__setattr__(self, "integrity_without_vectors", tuple(map(str, self.integrity_without_vectors)))
        object.__setattr__(self, "integrity_duplicated_vectors",
                           tuple((str(b), str(a)) for b, a in self.integrity_duplicated_vectors))
        object.__setattr__(self, "integrity_deleted_chunks", tuple(map(str, self.integrity_deleted_chunks)))

    def integrity_faults(self) -> dict[str, list[Any]]:
        """The seeded integrity faults (section ``integrity``): ``without_vectors`` (chunk ids whose embeddings
        rows are missing), ``duplicated_vectors`` ([chunk, chunk whose vector it carries] pairs) and
        ``deleted_chunks`` (soft-deleted, their rows left behind, C89); empty lists when none."""
        return {"without_vectors": list(self.integrity_without_vectors),
                "duplicated_vectors": [list(p) for p in self.integrity_duplicated_vectors],
                "deleted_chunks": list(self.integrity_deleted_chunks)}

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any], where: str = "versions") -> VersionConfig:
        """Build from the nested YAML form (sections vector, hnsw, keyword, rerank, tenant, faq).

        A non-empty ``tenant`` section means the tenant saved a retrieval config. Raises
        :class:`ConfigError` for ``where`` naming the version and each unknown section or key,
        and a saved ``rerank_model_id`` that is not the registered rerank model (all at once).
        """
        kwargs: dict[str, Any] = {"name": name, "description": str(data.get("description", ""))}
        problems: list[Problem] = []
        for section, value in data.items():
            if section == "description":
                continue
            if section not in cls._SECTIONS:
                problems.append(Problem(where, None, f"versions.{name}.{section}",
                                        f"version {name!r}: unknown section {section!r}; "
                                        f"expected one of {sorted(cls._SECTIONS)}"))
                continue
            if not isinstance(value, dict):
                problems.append(Problem(where, None, f"versions.{name}.{section}",
                                        f"version {name!r}: section {section!r} must be a mapping of key to value"))
                continue
            for key, v in value.items():
                if key not in cls._SECTIONS[section]:
                    problems.append(Problem(where, None, f"versions.{name}.{section}.{key}",
                                            f"version {name!r}: unknown key {section}.{key}; "
                                            f"expected one of {sorted(cls._SECTIONS[section])}"))
                else:
                    kwargs[cls._SECTIONS[section][key]] = v
        kwargs["tenant_saved"] = bool(data.get("tenant"))
        problems += cls._rerank_id_problems(name, kwargs, where) + cls._faq_mode_problems(name, kwargs, where)
        problems += cls._integrity_problems(name, kwargs, where) + cls._chunking_problems(name, kwargs, where)
        if problems:
            raise ConfigError(where, problems)
        return cls(**kwargs)

    @classmethod
    def _rerank_id_problems(cls, name: str, kwargs: Mapping[str, Any], where: str) -> list[Problem]:
        """A saved ``rerank_model_id`` must name the registered model (else WeKnora's rerank fails, C35)."""
        saved = kwargs.get("tenant_rerank_model_id") or ""
        model = kwargs.get("rerank_model", cls.rerank_model) if kwargs.get("rerank_enabled") else None
        if not saved or saved == model:
            return []
        why = f"registered: {model!r}" if model else "none is registered: rerank.enabled is false"
        return [Problem(where, None, f"versions.{name}.tenant.rerank_model_id",
                        f"version {name!r}: tenant.rerank_model_id {saved!r} names no registered rerank model ({why})")]

    @classmethod
    def _faq_mode_problems(cls, name: str, kwargs: Mapping[str, Any], where: str) -> list[Problem]:
        """``faq.index_mode`` / ``faq.question_index_mode`` must be one of WeKnora's (C49)."""
        out = []
        for key, allowed in (("index_mode", FAQ_INDEX_MODES), ("question_index_mode", FAQ_QUESTION_INDEX_MODES)):
            value = kwargs.get(f"faq_{key}", allowed[0])
            if value not in allowed:
                out.append(Problem(where, None, f"versions.{name}.faq.{key}",
                                   f"version {name!r}: faq.{key} {value!r} is not one of {', '.join(allowed)}"))
        return out

    @classmethod
    def _integrity_problems(cls, name: str, kwargs: Mapping[str, Any], where: str) -> list[Problem]:
        """``integrity.without_vectors`` / ``deleted_chunks``: lists of chunk ids; ``duplicated_vectors``: a list of
        [chunk, chunk whose vector it carries] pairs."""
        out = []
        for key in ("without_vectors", "deleted_chunks", "duplicated_vectors"):
            value = kwargs.get(f"integrity_{key}", ())
            pairs = key == "duplicated_vectors"
            ok = isinstance(value, (list, tuple)) and all(
                (isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(y, str) for y in x)) if pairs
                else isinstance(x, str) for x in value)
            if not ok:
                what = "a list of [chunk id, chunk id] pairs" if pairs else "a list of chunk ids"
                out.append(Problem(where, None, f"versions.{name}.integrity.{key}",
                                   f"version {name!r}: integrity.{key} must be {what}"))
        return out

    @classmethod
    def _chunking_problems(cls, name: str, kwargs: Mapping[str, Any], where: str) -> list[Problem]:
        """``chunking``: a boolean ``enable_parent_child`` and positive integer sizes, the child smaller than the
        parent (C110); ``server.stream_manager`` one of WeKnora's (C117)."""
        out = []
        if not isinstance(kwargs.get("chunking_parent_child", False), bool):
            out.append(Problem(where, None, f"versions.{name}.chunking.enable_parent_child",
                               f"version {name!r}: chunking.enable_parent_child must be true or false"))
        sizes = {key: kwargs.get(f"chunking_{key}", getattr(cls, f"chunking_{key}"))
                 for key in ("parent_chunk_size", "child_chunk_size")}
        for key, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                out.append(Problem(where, None, f"versions.{name}.chunking.{key}",
                                   f"version {name!r}: chunking.{key} must be a positive integer, got {value!r}"))
        if not out and sizes["child_chunk_size"] >= sizes["parent_chunk_size"]:
            out.append(Problem(where, None, f"versions.{name}.chunking.child_chunk_size",
                               f"version {name!r}: chunking.child_chunk_size must be smaller than parent_chunk_size"))
        manager = kwargs.get("stream_manager", "memory")
        if manager not in STREAM_MANAGERS:
            out.append(Problem(where, None, f"versions.{name}.server.stream_manager",
                               f"version {name!r}: server.stream_manager {manager!r} is not one of "
                               f"{', '.join(STREAM_MANAGERS)}"))
        return out

    @property
    def parent_child(self) -> ParentChild | None:
        """The knowledge base's parent-child chunking (C110), None when it is chunked flat."""
        if not self.chunking_parent_child:
            return None
        return ParentChild(self.chunking_parent_chunk_size, self.chunking_child_chunk_size)

    @property
    def faq_role(self) -> str:
        """The FAQ knowledge base's index entries for this version's modes (see :meth:`SandboxIndex.rows`)."""
        return f"faq:{self.faq_index_mode}:{self.faq_question_index_mode}"

    def to_nested(self) -> dict[str, Any]:
        """The nested form (what a manifest's system description records); ``tenant`` is empty when never saved."""
        out: dict[str, Any] = {"description": self.description}
        for section, keys in self._SECTIONS.items():
            if section == "tenant" and not self.tenant_saved:
                out[section] = {}
                continue
            out[section] = {k: getattr(self, attr) for k, attr in keys.items()}
        out["integrity"] = self.integrity_faults()
        return out

    def retrieval_config(self) -> dict[str, Any]:
        """What ``GET /api/v1/tenants/kv/retrieval-config`` returns (C57): the saved values (zeros when never
        saved), ``rrf_*`` only when non-zero."""
        out = {key: getattr(self, f"tenant_{key}") for key in TENANT_KEYS}
        for key in TENANT_OMITEMPTY:
            if not out[key]:
                del out[key]
        return out


def load_versions(path: str | Path) -> dict[str, VersionConfig]:
    """Read ``versions.yaml``: ``defaults`` (nested sections) and ``versions`` (name -> overrides).

    Raises :class:`ConfigError` naming every problem at once: no versions defined, an
    unknown section or key (with the version it is in).
    """
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(p, f"not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        data = {}
    defaults = data.get("defaults") or {}
    versions = data.get("versions") or {}
    if not versions or not isinstance(versions, dict):
        raise ConfigError(p, "no 'versions' defined (a mapping of version name to its settings)")
    out: dict[str, VersionConfig] = {}
    problems: list[Problem] = []
    for name, over in versions.items():
        if over is not None and not isinstance(over, dict):
            problems.append(Problem(str(p), None, f"versions.{name}",
                                    f"version {name!r} must be a mapping of section to settings"))
            continue
        merged: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in defaults.items()}
        for section, value in (over or {}).items():
            if isinstance(value, dict):
                merged[section] = {**merged.get(section, {}), **value}
            else:
                merged[section] = value
        try:
            out[str(name)] = VersionConfig.from_dict(str(name), merged, where=str(p))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(p, problems)
    return out
