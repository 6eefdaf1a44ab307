"""WeKnora's knowledge-search pipeline in the sandbox: CHUNK_SEARCH -> CHUNK_RERANK -> CHUNK_MERGE -> FILTER_TOP_K.

Each step follows WeKnora's source (docs/weknora-contract.md; paths relative to the WeKnora
repository, chat_pipeline = internal/application/service/chat_pipeline):

1. CHUNK_SEARCH (C29, C32, C33): one hybrid search over the whole knowledge bases with
   ``match_count = embedding_top_k``, the effective vector/keyword thresholds and no context
   enrichment; documents named by ``knowledge_ids`` get their own restricted search (thresholds
   0/0 from v0.7.2; a direct load of <= 50 chunks, score 1.0, match type 8, at v0.6.x); a chat
   with query expansion on that found fewer than ``embedding_top_k`` searches the query's variants
   too (C115). Nothing found -> ``[]`` (C31).
2. CHUNK_RERANK, only when a rerank model runs (C35): the model scores every candidate's
   cleaned passage; keep scores ``>= rerank_threshold``; if none pass and the threshold is
   above 0.3, once more at ``max(0.7 t, 0.3)``; a call that keeps nothing keeps the model's
   first result if it scores >= 0.15 (0 for an explicit document scope from v0.7.2), else the
   stage finds nothing -> ``[]`` (C36). Final score ``clamp01(0.6 model + 0.3 base + 0.1)``
   (times the +-5 % position factor at v0.6.x, C38), then MMR with ``k = min(n, max(1,
   rerank_top_k))``, lambda 0.7, redundancy = max Jaccard of the passages' simple tokens (C40).
   A failing reranker leaves the candidates as they were: no model score, no MMR (C37).
3. CHUNK_MERGE (C41, C42, C112): the reranked list (or, without one, the candidates by score),
   deduplicated by id and normalised content; a child of a parent-child document shows its parent
   (its own id into ``sub_chunk_ids``); per document and chunk type, results of
   consecutive ``chunk_index`` (or whose text contains the other's) become one, keeping the
   first chunk's id, the best score and the merged ids in ``sub_chunk_ids``; FAQ results take
   their answer as content; ``text`` results shorter than 350 characters are widened with
   neighbour chunks up to 850 (their ids into ``sub_chunk_ids``); merged once more;
   deduplicated; a result contained in another, or sharing >= 85 % of its tokens with a longer
   one, is dropped unless it scores strictly higher.
4. FILTER_TOP_K (C43): sorted by score, knowledge id, chunk type, chunk index and id (v0.7.2+;
   v0.6.x keeps the merge's per-document groups in order of first appearance), cut to
   ``rerank_top_k``.

The sandbox's chunks tile their documents with no overlap, so WeKnora's position rule of
v0.6.x (``start_at <= last end_at``) and the chunk-index rule of v0.7.2+ merge the same
neighbours; the sandbox applies the chunk-index rule at every release.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from weknora_nb.sandbox.chunking import Chunk, faq_answer_content
from weknora_nb.sandbox.expansion import expand_queries
from weknora_nb.sandbox.textutil import (
    Text,
    contains_chunk_content,
    content_signature,
    jaccard,
    join_texts,
    normalize_content,
    truncate_text,
)

if TYPE_CHECKING:
    import numpy as np

    from weknora_nb.sandbox.emulation import WeKnoraRelease
    from weknora_nb.sandbox.index import SandboxIndex

#: C33: direct load (v0.6.x) only while the named documents total at most this many chunks
DIRECT_LOAD_MAX_CHUNKS = 50
#: C40: MMR's weight of relevance against redundancy
MMR_LAMBDA = 0.7
#: C36: a rerank threshold above this is retried once at max(0.7 t, this); the fallback keeps a first result >= 0.15
RERANK_RETRY_ABOVE = 0.3
RERANK_FALLBACK_MIN = 0.15
#: C42: share of the shorter result's tokens found in the longer one that makes it redundant
OVERLAP_DROP = 0.85
#: C41: text results shorter than WIDEN_MIN characters are widened with neighbours up to WIDEN_MAX
WIDEN_MIN, WIDEN_MAX = 350, 850
#: C23: match type of a directly loaded chunk
MATCH_DIRECT_LOAD = 8


@dataclass
class Hit:
    """One result: the chunk's position in the index, its score and how it was found.

    ``base_score`` (the retrieval score) and ``model_score`` are set when a reranker scored the
    result (C39), else None; ``sub_chunk_ids`` lists merged or widened-in chunks (C41);
    ``content`` is the result's text when the pipeline rewrote it (merged, widened, an FAQ
    answer), else None (the chunk's own content); ``faq_original_score``: an FAQ result's score before an
    agent's FAQ boost (C119), None when not boosted.
    """

    idx: int
    score: float
    match_type: int = 0
    base_score: float | None = None
    model_score: float | None = None
    sub_chunk_ids: list[str] = field(default_factory=list)
    content: str | None = None
    faq_original_score: float | None = None


@dataclass(frozen=True)
class PipelineSettings:
    """The retrieval settings one knowledge-search (or chat) runs with.

    ``embedding_top_k`` is the hybrid-search ``match_count``; thresholds per path (the keyword
    one is ignored on Postgres, C19); ``rerank_top_k`` results are kept; ``rerank_threshold`` is
    the model-score floor; RRF ``k`` and weights fuse the two paths (C21); ``rerank``: a rerank
    model runs (C29, C35).
    """

    embedding_top_k: int
    vector_threshold: float
    keyword_threshold: float
    rerank_top_k: int
    rerank_threshold: float
    rrf_k: int
    rrf_vector_weight: float
    rrf_keyword_weight: float
    rerank: bool
    #: C115: a chat whose search found fewer than ``embedding_top_k`` results searches variants of the query too
    query_expansion: bool = False
    #: C119: an agent's FAQ priority multiplies reranked FAQ results' scores by this (capped at 1); 1: none
    faq_score_boost: float = 1.0

    @classmethod
    def from_effective(cls, cfg: Mapping[str, Any], *, rerank: bool) -> PipelineSettings:
        """From :func:`weknora_nb.core.weknora.effective_retrieval_config`'s output (defaults already applied)."""
        return cls(embedding_top_k=int(cfg["embedding_top_k"]), vector_threshold=float(cfg["vector_threshold"]),
                   keyword_threshold=float(cfg["keyword_threshold"]), rerank_top_k=int(cfg["rerank_top_k"]),
                   rerank_threshold=float(cfg["rerank_threshold"]), rrf_k=int(cfg["rrf_k"]),
                   rrf_vector_weight=float(cfg["rrf_vector_weight"]),
                   rrf_keyword_weight=float(cfg["rrf_keyword_weight"]), rerank=rerank)

    @property
    def rrf(self) -> tuple[int, float, float]:
        """``(k, vector weight, keyword weight)`` of the fusion."""
        return self.rrf_k, self.rrf_vector_weight, self.rrf_keyword_weight


#: C66: knowledge-chat's settings (config.yaml ``conversation.*``; no rerank model without an agent; query expansion
#: on, C115)
CONVERSATION_SETTINGS = PipelineSettings(embedding_top_k=30, vector_threshold=0.2, keyword_threshold=0.3,
                                         rerank_top_k=30, rerank_threshold=0.3, rrf_k=60, rrf_vector_weight=0.7,
                                         rrf_keyword_weight=0.3, rerank=False, query_expansion=True)


class SearchEngine(Protocol):
    """What the pipeline runs on (:class:`weknora_nb.sandbox.engine.RetrievalEngine`): an index, the release it
    behaves as, its hybrid search and its rerank model."""

    index: SandboxIndex
    release: WeKnoraRelease

    def primary_search(self, query: str, *, match_count: int, vector_threshold: float, keyword_threshold: float,
                       kb_types: Sequence[str], n_kbs: int, rrf: tuple[int, float, float],
                       knowledge_ids: Sequence[str] | None = None) -> list[Hit]: ...

    def rerank_scores(self, query: str, idxs: Sequence[int]) -> np.ndarray: ...


@dataclass
class _Result:
    """A result inside the pipeline (WeKnora's ``SearchResult``, mutated step by step as WeKnora does)."""

    idx: int
    chunk: Chunk
    score: float
    match_type: int
    text: Text
    base_score: float | None = None
    model_score: float | None = None
    sub_chunk_ids: list[str] = field(default_factory=list)
    rewritten: bool = False
    faq_original_score: float | None = None

    def hit(self) -> Hit:
        return Hit(self.idx, self.score, self.match_type, self.base_score, self.model_score,
                   list(self.sub_chunk_ids), self.text.s if self.rewritten else None, self.faq_original_score)


def _results(engine: SearchEngine, hits: Sequence[Hit]) -> list[_Result]:
    chunks = engine.index.chunks
    return [_Result(h.idx, chunks[h.idx], h.score, h.match_type, Text.of(chunks[h.idx].content)) for h in hits]


# ---------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------
def knowledge_search(engine: SearchEngine, query: str, *, settings: PipelineSettings,
                     knowledge_ids: Sequence[str] | None = None, rerank_fails: bool = False,
                     kb_types: Sequence[str] | None = None) -> list[Hit]:
    """The four stages on ``query`` (see the module docstring); ``[]`` when a stage finds nothing (C31).

    ``kb_types``: the knowledge bases searched whole (default: the document one when no
    ``knowledge_ids`` are given); ``knowledge_ids``: documents searched on their own (those
    of a knowledge base also searched whole are ignored, C32); ``rerank_fails``: the rerank
    call fails (C37).
    """
    found, scoped = _chunk_search(engine, query, settings, knowledge_ids, kb_types)
    if not found:
        return []
    reranked: list[_Result] = []
    if settings.rerank:
        floor = 0.0 if scoped and not engine.release.direct_load_knowledge else RERANK_FALLBACK_MIN
        outcome = _chunk_rerank(engine, query, found, settings, floor, rerank_fails)
        if outcome is None:
            return []
        reranked, found = outcome
    merged = _chunk_merge(engine, reranked or sorted(found, key=lambda r: -r.score))
    return [r.hit() for r in _filter_top_k(merged, settings.rerank_top_k, engine.release.sort_before_top_k)]


def _chunk_search(engine: SearchEngine, query: str, settings: PipelineSettings,
                  knowledge_ids: Sequence[str] | None, kb_types: Sequence[str] | None) -> tuple[list[_Result], bool]:
    """CHUNK_SEARCH: the candidates, and whether documents were searched on their own (C32, C33)."""
    whole = tuple(kb_types) if kb_types is not None else (() if knowledge_ids else ("document",))
    out: list[_Result] = []
    if whole:
        out += _results(engine, engine.primary_search(
            query, match_count=settings.embedding_top_k, vector_threshold=settings.vector_threshold,
            keyword_threshold=settings.keyword_threshold, kb_types=whole, n_kbs=len(whole), rrf=settings.rrf))
    by_kb: dict[str, list[str]] = {}
    for kid in knowledge_ids or ():
        kb = engine.index.kb_type_of_knowledge(kid)
        if kb is not None and kb not in whole and kid not in by_kb.get(kb, []):
            by_kb.setdefault(kb, []).append(kid)
    for kb, kids in by_kb.items():
        out += _knowledge_target(engine, query, settings, kb, kids)
    if settings.query_expansion and len(out) < max(1, settings.embedding_top_k):
        out += _expanded(engine, query, settings, whole, by_kb)
    return out, bool(by_kb)


def expansion_variants(engine: SearchEngine, query: str, settings: PipelineSettings,
                       kb_types: Sequence[str] = ("document",)) -> list[str]:
    """The query variants a chat with ``settings`` over the knowledge bases ``kb_types`` searches too (C115): none
    when query expansion is off or the search found enough (what the demo's seed embeds ahead of time)."""
    if not settings.query_expansion:
        return []
    found, _ = _chunk_search(engine, query, replace(settings, query_expansion=False), None, tuple(kb_types))
    return expand_queries(query) if len(found) < max(1, settings.embedding_top_k) else []


def _expanded(engine: SearchEngine, query: str, settings: PipelineSettings, whole: tuple[str, ...],
              by_kb: dict[str, list[str]]) -> list[_Result]:
    """C115: one more search per query variant (:func:`~weknora_nb.sandbox.expansion.expand_queries`) and knowledge
    base, ``max(2 embedding_top_k, 2 rerank_top_k)`` results each, the keyword threshold times 0.8 (ignored, C19),
    named documents without thresholds from v0.7.2 (C33), appended in that order (query_expansion.go:14-124)."""
    top_k = max(2 * settings.embedding_top_k, 2 * settings.rerank_top_k)
    found: list[Hit] = []
    for variant in expand_queries(query):
        for kb in whole:
            found += engine.primary_search(variant, match_count=top_k, vector_threshold=settings.vector_threshold,
                                           keyword_threshold=0.8 * settings.keyword_threshold, kb_types=(kb,),
                                           n_kbs=1, rrf=settings.rrf)
        for kb, kids in by_kb.items():
            keep = engine.release.direct_load_knowledge  # thresholds of named documents (C33)
            found += engine.primary_search(variant, match_count=top_k,
                                           vector_threshold=settings.vector_threshold if keep else 0.0,
                                           keyword_threshold=0.8 * settings.keyword_threshold if keep else 0.0,
                                           kb_types=(kb,), n_kbs=1, rrf=settings.rrf, knowledge_ids=kids)
    return _results(engine, found)


def _knowledge_target(engine: SearchEngine, query: str, settings: PipelineSettings, kb: str,
                      kids: list[str]) -> list[_Result]:
    """One knowledge base's named documents: v0.7.2+ a restricted search with thresholds 0/0; v0.6.x a
    direct load of whole documents while they total <= 50 chunks, the rest searched (C33)."""
    vector_t, keyword_t = 0.0, 0.0
    loaded: list[_Result] = []
    if engine.release.direct_load_knowledge:
        vector_t, keyword_t = settings.vector_threshold, settings.keyword_threshold
        skipped: list[str] = []
        for kid in kids:
            positions = engine.index.positions_of_knowledge(kid)
            if len(loaded) + len(positions) > DIRECT_LOAD_MAX_CHUNKS:
                skipped.append(kid)
                continue
            loaded += _results(engine, [Hit(i, 1.0, MATCH_DIRECT_LOAD) for i in positions])
        kids = skipped
    if not kids:
        return loaded
    return loaded + _results(engine, engine.primary_search(
        query, match_count=settings.embedding_top_k, vector_threshold=vector_t, keyword_threshold=keyword_t,
        kb_types=(kb,), n_kbs=1, rrf=settings.rrf, knowledge_ids=kids))


def _chunk_rerank(engine: SearchEngine, query: str, found: list[_Result], settings: PipelineSettings,
                  floor: float, fails: bool) -> tuple[list[_Result], list[_Result]] | None:
    """CHUNK_RERANK: (reranked, candidates), or None when the stage finds nothing (C35-C40).

    A failed call returns no reranked list and the candidates as retrieved (C37).
    """
    direct = [r for r in found if r.match_type == MATCH_DIRECT_LOAD]
    candidates = [r for r in found if r.match_type != MATCH_DIRECT_LOAD and engine.index.rerank_passage(r.idx).strip()]
    kept: list[tuple[int, float]] = []
    if candidates:
        if fails:
            return [], direct + candidates
        scores = engine.rerank_scores(query, [r.idx for r in candidates])
        ranked = sorted(enumerate(float(s) for s in scores), key=lambda p: -p[1])  # the model's order
        kept = _above_threshold(ranked, settings.rerank_threshold, floor)
        if not kept and settings.rerank_threshold > RERANK_RETRY_ABOVE:
            kept = _above_threshold(ranked, max(0.7 * settings.rerank_threshold, RERANK_RETRY_ABOVE), floor)
    reranked = [_boosted(_rescored(engine, candidates[i], s), settings.faq_score_boost) for i, s in kept]
    reranked += [_rescored(engine, r, 1.0) for r in direct]
    final = _mmr(engine, reranked, min(len(reranked), max(1, settings.rerank_top_k)))
    return (final, found) if final else None


def _above_threshold(ranked: list[tuple[int, float]], threshold: float, floor: float) -> list[tuple[int, float]]:
    """The model results scoring >= ``threshold``; if none, the first one when it scores >= ``floor`` (C36)."""
    kept = [(i, s) for i, s in ranked if s >= threshold]
    if not kept and ranked and ranked[0][1] >= floor:
        kept = ranked[:1]
    return kept


def _rescored(engine: SearchEngine, r: _Result, model: float) -> _Result:
    """``r`` with base = its retrieval score, the model score, and the C38 composite as its score.

    ``clamp01((0.6 model + 0.3 base + 0.1 w) p)`` with source weight w = 1 (no web search) and,
    at v0.6.x, position factor ``p = 1 + clamp(1 - start_at / (end_at + 1), -0.05, 0.05)``.
    """
    r.base_score, r.model_score = r.score, model
    value = 0.6 * model + 0.3 * r.score + 0.1 * 1.0
    if engine.release.position_factor and r.chunk.start_at >= 0:
        value *= 1.0 + min(0.05, max(-0.05, 1.0 - r.chunk.start_at / (r.chunk.end_at + 1)))
    r.score = min(1.0, max(0.0, value))
    return r


def _boosted(r: _Result, boost: float) -> _Result:
    """C119: an FAQ result reranked for an agent with FAQ priority: score ``min(score x boost, 1)``, the score before
    kept (rerank.go:205-218 @ v0.7.2)."""
    if boost > 1.0 and r.chunk.chunk_type == "faq":
        r.faq_original_score, r.score = r.score, min(r.score * boost, 1.0)
    return r


def _mmr(engine: SearchEngine, results: list[_Result], k: int) -> list[_Result]:
    """Maximal marginal relevance (C40): repeatedly the result maximising ``0.7 score - 0.3 max Jaccard``
    to those already chosen (first one on ties), ``k`` of them, in selection order."""
    if k <= 0 or not results:
        return []
    tokens = [engine.index.passage_tokens(r.idx) for r in results]
    redundancy = [0.0] * len(results)
    chosen: list[int] = []
    free = set(range(len(results)))
    while len(chosen) < k and free:
        best = max(free, key=lambda i: (MMR_LAMBDA * results[i].score - (1 - MMR_LAMBDA) * redundancy[i], -i))
        chosen.append(best)
        free.discard(best)
        for i in free:
            redundancy[i] = max(redundancy[i], jaccard(tokens[i], tokens[best]))
    return [results[i] for i in chosen]


# ---------------------------------------------------------------------------------------
# CHUNK_MERGE
# ---------------------------------------------------------------------------------------
def _chunk_merge(engine: SearchEngine, results: list[_Result]) -> list[_Result]:
    """CHUNK_MERGE (chat_pipeline/merge.go:44-97): dedupe, merge neighbours, FAQ answers, widen short
    results, merge again, dedupe, drop partial overlaps (C41, C42)."""
    sort_after = engine.release.sort_before_top_k  # v0.7.2+ sort after grouping (merge.go:206)
    merged = _group_merge(_with_parents(engine, _dedup(results)), sort_after)
    for r in merged:
        if r.chunk.chunk_type == "faq":
            r.text, r.rewritten = Text.of(faq_answer_content(r.chunk)), True
    merged = _group_merge(_widen(engine, merged), sort_after)
    return _drop_partial_overlaps(_dedup(merged))


def _dedup(results: list[_Result]) -> list[_Result]:
    """``removeDuplicateResults`` (chat_pipeline/search.go:183-207 @ v0.7.2): the first of each id and content."""
    seen: set[str] = set()
    signatures: set[str] = set()
    out: list[_Result] = []
    for r in results:
        if r.chunk.id in seen:
            continue
        sig = _signature(r.text.s)
        if sig and sig in signatures:
            continue
        if sig:
            signatures.add(sig)
        seen.add(r.chunk.id)
        out.append(r)
    return out


def _with_parents(engine: SearchEngine, results: list[_Result]) -> list[_Result]:
    """``resolveParentChunks`` (chat_pipeline/merge.go:218-345 @ v0.7.2, C112): a ``text`` child whose parent is a
    ``parent_text`` chunk shows the parent joined with itself (``JoinChunkContent``: the parent alone when it holds
    the child) and lists its own id in ``sub_chunk_ids``; its id, score and chunk index stay the child's."""
    index = engine.index
    for r in results:
        parent = index.by_id.get(r.chunk.parent_chunk_id) if r.chunk.parent_chunk_id else None
        if r.chunk.chunk_type != "text" or parent is None or index.chunks[parent].chunk_type != "parent_text":
            continue
        r.text, r.rewritten = join_texts(Text.of(index.chunks[parent].content), r.text), True
        if r.chunk.id not in r.sub_chunk_ids:
            r.sub_chunk_ids.append(r.chunk.id)
    return results


def _sort_key(r: _Result) -> tuple[float, str, str, int, str]:
    """``sortSearchResultsDeterministically`` (chat_pipeline/filter_top_k.go:76-95 @ v0.7.2)."""
    return -r.score, r.chunk.knowledge_id, r.chunk.chunk_type, r.chunk.chunk_index, r.chunk.id


def _group_merge(results: list[_Result], sort_after: bool) -> list[_Result]:
    """Per (knowledge id, chunk type) group in order of first appearance: merge sequential results
    (chunk-index order), each group's results by score; all sorted at the end when ``sort_after``."""
    groups: dict[tuple[str, str], list[_Result]] = {}
    for r in results:
        groups.setdefault((r.chunk.knowledge_id, r.chunk.chunk_type), []).append(r)
    out: list[_Result] = []
    for members in groups.values():
        members.sort(key=lambda r: (r.chunk.chunk_index, r.chunk.id))
        out += sorted(_merge_sequential(members), key=lambda r: -r.score)
    return sorted(out, key=_sort_key) if sort_after else out


def _merge_sequential(members: list[_Result]) -> list[_Result]:
    """``mergeSequentialChunks`` (chat_pipeline/merge_overlap.go:17-150 @ v0.7.2), untrusted branch:
    a result whose text contains (or is contained in) the group's, or whose chunk index follows the
    group's last, joins it: texts joined, its id recorded, the higher score kept."""
    groups = [members[0]]
    last_index = members[0].chunk.chunk_index
    for cur in members[1:]:
        last = groups[-1]
        contained = contains_chunk_content(last.text.s, cur.text.s) or contains_chunk_content(cur.text.s, last.text.s)
        if not contained and cur.chunk.chunk_index != last_index + 1:
            groups.append(cur)
            last_index = cur.chunk.chunk_index
            continue
        last.text, last.rewritten = join_texts(last.text, cur.text), True
        if cur.chunk.id not in last.sub_chunk_ids:
            last.sub_chunk_ids.append(cur.chunk.id)
        last_index = max(last_index, cur.chunk.chunk_index)
        last.score = max(last.score, cur.score)
    return groups


def _widen(engine: SearchEngine, results: list[_Result]) -> list[_Result]:
    """``expandShortContextWithNeighbors`` (chat_pipeline/merge_expand.go:11-246 @ v0.7.2): a ``text``
    result shorter than 350 characters becomes its chunk with the previous and next chunks of its
    document, one more on each side (previous first) while shorter than 350, cut at 850."""
    index = engine.index
    for r in results:
        if r.chunk.chunk_type != "text" or not r.text.s or len(r.text.s) >= WIDEN_MIN:
            continue
        base = Text.of(r.chunk.content)
        prev_i, next_i = index.neighbour(r.idx, -1), index.neighbour(r.idx, 1)
        prev = Text.of(index.chunks[prev_i].content) if prev_i is not None else Text("", ())
        nxt = Text.of(index.chunks[next_i].content) if next_i is not None else Text("", ())
        ids = ([index.chunks[prev_i].id] if prev_i is not None else []) + \
              ([index.chunks[next_i].id] if next_i is not None else [])
        prev_c = index.neighbour(prev_i, -1) if prev_i is not None else None
        next_c = index.neighbour(next_i, 1) if next_i is not None else None
        merged = _ordered(prev, base, nxt)
        while merged.s and len(merged.s) < WIDEN_MIN and (prev_c is not None or next_c is not None):
            if prev_c is not None:
                prev = join_texts(Text.of(index.chunks[prev_c].content), prev)
                ids.insert(0, index.chunks[prev_c].id)
                prev_c = index.neighbour(prev_c, -1)
                merged = _ordered(prev, base, nxt)
                if len(merged.s) >= WIDEN_MIN:
                    break
            if next_c is not None:
                nxt = join_texts(nxt, Text.of(index.chunks[next_c].content))
                ids.append(index.chunks[next_c].id)
                next_c = index.neighbour(next_c, 1)
            merged = _ordered(prev, base, nxt)
        if merged.s:
            r.text, r.rewritten = merged, True
            r.sub_chunk_ids += [i for i in ids if i not in r.sub_chunk_ids]
    return results


def _ordered(prev: Text, base: Text, nxt: Text) -> Text:
    """``mergeOrderedContent``: previous, base and next joined, cut to 850 characters."""
    t = join_texts(prev, base) if prev.s else base
    return truncate_text(join_texts(t, nxt) if nxt.s else t, WIDEN_MAX)


def _drop_partial_overlaps(results: list[_Result]) -> list[_Result]:
    """``removePartialOverlaps`` (chat_pipeline/search.go:226-303 @ v0.7.2, C42): for each pair the shorter
    (by normalised bytes) goes when contained in the longer or >= 85 % of its tokens are, unless it
    scores strictly higher (then the longer goes); pairs are visited as WeKnora visits them.

    A pair's share is :func:`~weknora_nb.sandbox.textutil.overlap_ratio`, its intersection counted as the bits two
    :func:`_token_bits` have in common (a demo version compares 250,000 pairs: building each intersection was
    more than half of this step); each text's facts are kept (:func:`_overlap_facts`)."""
    n = len(results)
    if n <= 1:
        return results
    norms, sizes, counts, bits = zip(*(_overlap_facts(r.text) for r in results), strict=True)
    removed = [False] * n
    for i in range(n):
        if removed[i]:
            continue
        for j in range(i + 1, n):
            if removed[j]:
                continue
            short, long_ = (j, i) if sizes[i] > sizes[j] else (i, j)
            if not (norms[short] and norms[long_] and norms[short] in norms[long_]):   # not contained
                a, b = counts[short], counts[long_]
                if not a or not b or (bits[short] & bits[long_]).bit_count() / min(a, b) < OVERLAP_DROP:
                    continue
            removed[long_ if results[short].score > results[long_].score else short] = True
    return [r for r, gone in zip(results, removed, strict=True) if not gone]


@lru_cache(maxsize=4096)
def _overlap_facts(text: Text) -> tuple[str, int, int, int]:
    """What C42's drop compares of a result's text: its :func:`~weknora_nb.sandbox.textutil.normalize_content`,
    that in UTF-8 bytes, its number of tokens and their :func:`_token_bits`. Kept for the texts seen last: the same
    chunks come back search after search."""
    norm, tokens = normalize_content(text.s), text.tokens()
    return norm, len(norm.encode("utf-8")), len(tokens), _token_bits(tokens)


@lru_cache(maxsize=4096)
def _signature(text: str) -> str:
    """:func:`~weknora_nb.sandbox.textutil.content_signature` of ``text``, kept for the texts seen last."""
    return content_signature(text)


#: every token :func:`_token_bits` has met, numbered in the order met (its bit); written under the lock
_TOKEN_NUMBER: dict[str, int] = {}
_NUMBERING = threading.Lock()


def _token_bits(tokens: frozenset[str]) -> int:
    """The set ``tokens`` as an int, one bit per token: ``(bits(a) & bits(b)).bit_count() == len(a & b)``. The ints
    are as long as the number of distinct tokens met (a demo version's results: 5,256 tokens, 660 bytes)."""
    with _NUMBERING:
        numbers = [_TOKEN_NUMBER.setdefault(t, len(_TOKEN_NUMBER)) for t in tokens]
    if not numbers:
        return 0
    buf = bytearray((max(numbers) >> 3) + 1)
    for k in numbers:
        buf[k >> 3] |= 1 << (k & 7)
    return int.from_bytes(buf, "little")


def _filter_top_k(results: list[_Result], top_k: int, sort_first: bool) -> list[_Result]:
    """FILTER_TOP_K (C43): sorted deterministically first from v0.7.2, then the first ``top_k``."""
    out = sorted(results, key=_sort_key) if sort_first else list(results)
    return out[:top_k] if top_k > 0 else out

