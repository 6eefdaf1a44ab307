"""Degraded queries and their causes (docs/method.md section 6).

A query is *degraded* at a stage when Recall@K < 0.3 or NDCG@10 < 0.5 there (both
thresholds and K are parameters). Each degraded query gets one or more causes, each with
its evidence, by following every relevant chunk (grade >= 1) that is missing from the
stage's top K back through the pipeline the stage ran (first repeat of each stage).

A knowledge-search stage (``final``) runs WeKnora's pipeline with the tenant retrieval
config (``docs/weknora-contract.md`` C29-C44): CHUNK_SEARCH (hybrid-search at
``match_count = embedding_top_k`` with the effective thresholds) -> CHUNK_RERANK, only when
a rerank model resolves (model score threshold, composite score, MMR) -> CHUNK_MERGE
(ranges merged, short results widened with neighbours, overlapping results dropped) ->
FILTER_TOP_K (``rerank_top_k``). The run's ``hybrid`` stage stands for CHUNK_SEARCH's
candidates. A loss is named for the step that caused it:

====================== ===============================================================
cause                  evidence
====================== ===============================================================
label/KB mismatch      a labelled chunk id is not in the knowledge base's chunk listing
                       (or is disabled there)
threshold filtered     a path collected with thresholds off found the chunk with a score
                       below the threshold the stage ran with: knowledge-search's
                       *effective* vector threshold (a tenant config's 0 is the default
                       0.15, C30), a hybrid-search stage's own; a keyword threshold only
                       when the server's keyword engine is not Postgres (C19)
vector miss            the chunk is not among the vector path's candidates at all (and no
                       trace of the vector store says why)
index miss             (with a vector-store trace) the vector path missed the chunk, exact
                       nearest-neighbour search in the store finds it within the path's
                       TopK, WeKnora's search does not: ef_search or m too low
embedding miss         (with a vector-store trace) not within the TopK even of exact search
                       (the embedding does not put it near the query), or no vector at all
lost in fusion         the vector or keyword path has the chunk, the hybrid list (both
                       paths fused by RRF and cut at match_count, C21) does not
below rerank threshold a reranker ran: the chunk's model score is below the effective
                       rerank threshold, or (its score unknown) the chunk, a search
                       candidate, is absent while fewer than rerank_top_k chunks passed
                       the threshold (C36)
not selected by MMR    a reranker ran: the chunk's model score (from another list of the
                       run) would rank it above a kept result, yet MMR chose others (C40)
rerank demoted         a reranker ran and scored the chunk lower than what it kept: absent
                       from a full list of rerank_top_k, or ranked below the first K
rerank failed          (query) a reranker runs (the tenant config names one, or other
                       queries' lists carry model scores), but this query's list is empty
                       or carries no model scores while hybrid found a relevant chunk
                       (C36, C37; WeKnora issues #2391, #2143, #713)
dropped in merge       knowledge-search: the chunk, a search candidate, is absent and a
                       kept result covers its text (contained, or >= 85 % of the shorter's
                       tokens shared: the overlap drop, C42)
pushed down by merge   the result holding the chunk is among the first K results, but the
                       neighbours merged into the results above it (C41) put it below K
                       once unfolded
cut by top-k           knowledge-search, no reranking: the chunk, a search candidate, is
                       absent from a full list of rerank_top_k results (FILTER_TOP_K, C43);
                       or it ranks below embedding_top_k in the hybrid list (the search
                       depth, C29)
chunk split            the stage returned a neighbour (same document, adjacent chunk
                       index) of the chunk instead of it
grade inversion        a partly relevant chunk (grade 1) ranks above a fully relevant one
                       (grade 3) in the top K
unexplained            (query) none of the above applies: the evidence says where each
                       lost chunk was
====================== ===============================================================

*A reranker ran* for a query when its list carries model scores (``model_score``; at v0.6.2,
which writes none, ``base_score``: both are written only by the rerank step, C39). The rerank,
merge-drop and top-k causes apply only at stages whose settings are the tenant retrieval config
(knowledge-search); the ``citations`` stage runs the server's conversation settings instead (C66),
so its diagnosis never blames knowledge-search's rerank or top-k. Where a stage's settings came
from is the manifest's ``stages.<name>.settings_source``, else follows from its role.

The stages upstream of a degraded stage, and so the paths a cause can look at, follow
from the stage's pipeline role (:func:`weknora_nb.core.pipeline.role_of`): a custom stage
such as ``hybrid-100`` (hybrid-search) is diagnosed like ``hybrid``, ``final-b``
(knowledge-search) like ``final``. Of several upstream stages with one role, the one named
as the role (the built-in stage) is looked at, else the first collected.

Each cause is one function registered with :func:`cause`: a *chunk* cause gets a
:class:`LostChunk` (one relevant chunk missing from the top K), a *query* cause a
:class:`DegradedQuery`; both return evidence strings (none: the cause does not apply)::

    @cause("stale index", level="chunk")
    def _stale(lost: LostChunk) -> list[str]:
        ...

Causes are reported in the order they are registered (:data:`CAUSES` for the built-in ones),
then :data:`UNEXPLAINED`.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Literal

import numpy as np
import pandas as pd

from weknora_nb.core.pipeline import role_of, stage_order, upstream
from weknora_nb.core.results import expand_sub_chunks
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import Scores
from weknora_nb.core.segmenter import jieba_ready
from weknora_nb.core.testset import TestSet
from weknora_nb.core.weknora import RETRIEVAL_DEFAULTS, effective_retrieval_config

__all__ = ["CAUSES", "UNEXPLAINED", "Cause", "DegradedQuery", "Diagnosis", "LostChunk", "StageSettings", "cause",
           "causes", "diagnose", "diagnose_run", "degraded_queries", "effective_config", "stage_settings"]

log = logging.getLogger(__name__)

#: the cause of a degraded query no rule explains
UNEXPLAINED = "unexplained"

#: where a stage's settings come from (the manifest's ``stages.<name>.settings_source``)
KNOWLEDGE_SEARCH = "tenant retrieval config"
REQUEST = "request"
CONVERSATION = "server conversation config"

#: C42: the share of the shorter result's tokens found in the longer that drops the shorter
OVERLAP_DROP = 0.85


# --------------------------------------------------------------------------- what each stage ran

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


def _keyword_engine_note(server: Mapping[str, Any] | None) -> str | None:
    """None when a keyword threshold applies: the server's keyword engine is not Postgres (C19: the
    Postgres keyword path ignores its threshold); otherwise why it does not apply."""
    engines = server.get("keyword_index_engine") if isinstance(server, Mapping) else None
    if not isinstance(engines, str) or not engines.strip():
        return "keyword engine not recorded"
    names = {e.strip().lower() for e in engines.split(",") if e.strip()}
    if any(n.startswith("postgres") for n in names):
        return "ignored by the Postgres keyword path (C19)"
    return None if names and "未配置" not in names else "no keyword engine configured"


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


def _rerank_column(server: Mapping[str, Any] | None) -> str:
    """The results column that shows a reranked list: ``model_score``, or ``base_score`` before v0.6.3 (C39)."""
    release = _release(server)
    return "model_score" if release is None or release >= (0, 6, 3) else "base_score"


def stage_settings(stage: str, definition: Mapping[str, Any] | None, config: Mapping[str, Any] | None,
                   server: Mapping[str, Any] | None, reranked_queries: int = 0) -> StageSettings:
    """The settings ``stage`` ran with: ``config`` is :func:`effective_config` (None: not recorded),
    ``server`` the manifest's ``server``; ``reranked_queries``: how many queries' lists at the stage
    carry rerank scores (over the whole run)."""
    source = _settings_source(stage, definition)
    common: dict[str, Any] = {"rerank_column": _rerank_column(server), "release": _release(server)}
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


# --------------------------------------------------------------------------- the material a cause looks at

@dataclass(frozen=True)
class KnowledgeBase:
    """What the chunk listing says: the enabled chunk ids (None: no listing), chunk positions and texts."""

    enabled: set[str] | None
    positions: dict[str, tuple[str, int]]  # chunk_id -> (knowledge_id, chunk_index)
    content: dict[str, str] = field(default_factory=dict)  # chunk_id -> text

    @classmethod
    def of(cls, inventory: pd.DataFrame | None, listed: pd.DataFrame) -> KnowledgeBase:
        """From the inventory, completed with the positions the returned lists carry for chunks it lacks
        (``listed``: every list's rows, one list after another, :func:`_lists`; a chunk's first row with a
        position counts)."""
        enabled: set[str] | None = None
        pos: dict[str, tuple[str, int]] = {}
        content: dict[str, str] = {}
        if inventory is not None and len(inventory):
            inv = inventory
            enabled = set(inv.loc[inv["is_enabled"].fillna(True).astype(bool), "chunk_id"].astype(str))
            pos = {c: (kid, int(i)) for c, kid, i in zip(*_columns(inv, "chunk_id", "knowledge_id", "chunk_index"),
                                                         strict=True) if pd.notna(i)}
            if "content" in inv.columns:
                content = {str(c): str(t) for c, t in zip(*_columns(inv, "chunk_id", "content"), strict=True)
                           if isinstance(t, str) and t}
        if "chunk_index" in listed.columns:
            placed = listed[listed["chunk_index"].notna()]
            for c, kid, i in zip(*_columns(placed, "chunk_id", "knowledge_id", "chunk_index"), strict=True):
                if c not in pos:
                    pos[c] = (kid, int(i))
        return cls(enabled, pos, content)


def _columns(frame: pd.DataFrame, *names: str) -> list[list[Any]]:
    """The columns ``names`` of ``frame`` as Python lists (the values iterating the frame gives)."""
    return [frame[n].tolist() for n in names]


class Listing:
    """One list (a results frame) read once: its chunk ids in order, where each chunk id first appears, and
    its columns as Python lists (read on first use). It holds the frame, so ``id(frame)`` names it while
    it lives."""

    def __init__(self, frame: pd.DataFrame, columns: dict[str, list[Any]] | None = None) -> None:
        """``columns``: the frame's columns as lists when already read (else read on first use)."""
        self.frame = frame
        self._columns: dict[str, list[Any]] = columns or {}
        self.ids: list[str] = self.column("chunk_id")
        self.first: dict[str, int] = {}
        for i, c in enumerate(self.ids):
            self.first.setdefault(c, i)

    def column(self, name: str) -> list[Any]:
        """Column ``name`` as a list (row order)."""
        values = self._columns.get(name)
        if values is None:
            values = self._columns[name] = self.frame[name].tolist()
        return values

    @cached_property
    def names(self) -> list[str]:
        """The frame's column names."""
        return self.frame.columns.tolist()

    def row(self, chunk_id: str) -> dict[str, Any] | None:
        """The chunk's first row (column -> value), or None when the list lacks it."""
        at = self.first.get(chunk_id)
        return None if at is None else {c: self.column(c)[at] for c in self.names}

    def value(self, chunk_id: str, column: str) -> Any:
        """``column`` of the chunk's first row (the chunk is in the list)."""
        return self.column(column)[self.first[chunk_id]]


@dataclass
class DegradedQuery:
    """One degraded (query, stage): what the stage returned, the lists of the paths upstream of it
    and the settings it ran with.

    ``returned`` is the stage's list unfolded (merged neighbours after their result): ``rank`` is
    the unfolded rank, ``result`` the position of the result holding the chunk, ``holder`` that
    result's chunk id. ``paths`` maps a pipeline role (``vector``, ``keyword``, ``hybrid``,
    ``final``) to the list of the upstream stage with that role; ``relevant`` maps each chunk of
    grade >= 1 to its grade; ``rerank_scores``: (model score, base score) of chunks of this query
    that any knowledge-search list of the run reranked. ``listings``: each list read once
    (:class:`Listing`, by ``id`` of the frame), shared by the queries of one diagnosis.
    """

    query_id: str
    stage: str
    role: str
    k: int
    relevant: dict[str, int]
    returned: pd.DataFrame
    paths: dict[str, pd.DataFrame]
    kb: KnowledgeBase
    settings: StageSettings = field(default_factory=lambda: StageSettings(REQUEST))
    rerank_scores: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    #: the vector-store trace of this query (collect.vectortrace): chunk id -> its row at the largest K
    trace: dict[str, dict[str, Any]] = field(default_factory=dict)
    listings: dict[int, Listing] = field(default_factory=dict, repr=False)

    @property
    def vector_threshold(self) -> float:
        """The vector threshold the stage ran with (0: none)."""
        return self.settings.vector_threshold or 0.0

    @property
    def keyword_threshold(self) -> float:
        """The keyword threshold the stage applied (0: none, or ignored by the engine)."""
        return self.settings.keyword_threshold or 0.0

    def listing(self, lst: pd.DataFrame) -> Listing:
        """``lst`` (one of this query's lists) read once."""
        held = self.listings.get(id(lst))
        if held is None:
            held = self.listings[id(lst)] = Listing(lst)
        return held

    @cached_property
    def top(self) -> list[str]:
        """The chunk ids of the stage's top K, best first."""
        return self.listing(self.returned).ids[:self.k]

    @cached_property
    def lost(self) -> list[str]:
        """The relevant chunks missing from the top K (in the order the labels list them)."""
        top = self.top
        return [c for c in self.relevant if c not in top]

    def path(self, role: str) -> pd.DataFrame | None:
        """The list of the upstream path with ``role``, or None when the run has no such stage."""
        return self.paths.get(role)

    def path_ids(self, role: str) -> AbstractSet[str]:
        """The chunk ids of that path's list (empty when there is no such path)."""
        lst = self.paths.get(role)
        return frozenset() if lst is None else self.listing(lst).first.keys()

    @cached_property
    def result_rows(self) -> list[int]:
        """The positions in ``returned`` of the stage's results proper, one per result as returned (not the
        neighbours merged into them)."""
        listing = self.listing(self.returned)
        if "holder" not in self.returned.columns:
            return list(range(len(listing.ids)))
        return [i for i, (c, h) in enumerate(zip(listing.ids, listing.column("holder"), strict=True)) if c == h]

    @cached_property
    def results(self) -> pd.DataFrame:
        """The stage's results proper, one row per result as returned (the rows :attr:`result_rows`)."""
        return self.returned.iloc[self.result_rows]

    def result_values(self, column: str) -> list[Any]:
        """``column`` of the stage's results proper (:attr:`result_rows`), in order."""
        values = self.listing(self.returned).column(column)
        return [values[i] for i in self.result_rows]

    @cached_property
    def reranked(self) -> bool:
        """A reranker ran for this query: its list carries rerank scores (:attr:`StageSettings.rerank_column`)."""
        col = self.settings.rerank_column
        return col in self.returned.columns and any(pd.notna(v) for v in self.listing(self.returned).column(col))

    @cached_property
    def kept_texts(self) -> dict[str, str]:
        """Each result's text as the chunk listing has it: its chunk then the chunks merged into it."""
        if not self.kb.content or "holder" not in self.returned.columns:
            return {}
        listing = self.listing(self.returned)
        out: dict[str, list[str]] = {}
        for c, h in zip(listing.ids, listing.column("holder"), strict=True):
            out.setdefault(str(h), []).append(self.kb.content.get(str(c), ""))
        return {h: "\n".join(t for t in texts if t) for h, texts in out.items()}

    @cached_property
    def accounted(self) -> int:
        """How many chunks the stage's list accounts for: the unfolded list, plus the search candidates
        absent from it whose text a kept result covers (the overlap drop, C42)."""
        hyb = self.path("hybrid")
        if hyb is None or not self.kept_texts:
            return len(self.returned)
        shown, listing = self.listing(self.returned).first, self.listing(hyb)
        depth = [c for c, r in zip(listing.ids, listing.column("rank"), strict=True)
                 if r <= self.settings.embedding_top_k]
        return len(self.returned) + sum(1 for c in depth if c not in shown and LostChunk(self, c).covered_by)

    @cached_property
    def kept_composites(self) -> list[float]:
        """C38's score of each reranked result: clamp01(0.6 x model + 0.3 x base + 0.1)."""
        if "model_score" not in self.returned.columns:
            return []
        models = self.result_values("model_score")
        base = self.result_values("base_score") if "base_score" in self.returned.columns else [0.0] * len(models)
        return [_composite(m, b) for m, b in zip(models, base, strict=True) if pd.notna(m)]


def _composite(model: float, base: float | None) -> float:
    """C38: clamp01(0.6 x model + 0.3 x base + 0.1 x source weight), source weight 1 (knowledge, not web)."""
    b = float(base) if base is not None and pd.notna(base) else 0.0
    return min(1.0, max(0.0, 0.6 * float(model) + 0.3 * b + 0.1))


@dataclass
class LostChunk:
    """One relevant chunk of a degraded query that the stage's top K misses."""

    query: DegradedQuery
    chunk_id: str

    @property
    def grade(self) -> int:
        return self.query.relevant[self.chunk_id]

    @property
    def in_vector(self) -> bool:
        return self.chunk_id in self.query.path_ids("vector")

    @property
    def in_keyword(self) -> bool:
        return self.chunk_id in self.query.path_ids("keyword")

    def _holding(self, role: str) -> Listing | None:
        """The upstream path with ``role`` read once, when it holds the chunk (else None)."""
        lst = self.query.path(role)
        listing = None if lst is None else self.query.listing(lst)
        return listing if listing is not None and self.chunk_id in listing.first else None

    def path_score(self, role: str) -> float | None:
        """The chunk's score in the upstream path with ``role`` (None: not in it)."""
        listing = self._holding(role)
        if listing is None:
            return None
        score = listing.value(self.chunk_id, "score")
        return None if pd.isna(score) else float(score)

    @cached_property
    def returned_row(self) -> dict[str, Any] | None:
        """The chunk's row in the stage's list (it is there, below the top K; column -> value), or None."""
        return self.query.listing(self.query.returned).row(self.chunk_id)

    @cached_property
    def hybrid_rank(self) -> int | None:
        """The chunk's rank in the hybrid list (None: not in it, or no hybrid stage)."""
        listing = self._holding("hybrid")
        return None if listing is None else int(listing.value(self.chunk_id, "rank"))

    @cached_property
    def threshold_removed(self) -> bool:
        """The stage's thresholds remove the chunk from every path that found it (both paths collected:
        an uncollected path might have found it)."""
        s, below = self.query.settings, []
        for role, threshold in (("vector", s.vector_threshold), ("keyword", s.keyword_threshold)):
            if self.query.path(role) is None:
                return False
            score = self.path_score(role)
            if score is not None:
                below.append(threshold is not None and score < threshold)
        return bool(below) and all(below)

    @cached_property
    def searched(self) -> bool:
        """The stage's search step had the chunk: in the hybrid list within the search depth
        (embedding_top_k) and not removed by the thresholds; without a hybrid stage, in a path."""
        if self.threshold_removed:
            return False
        if self.query.path("hybrid") is None:
            return self.in_vector or self.in_keyword
        h = self.hybrid_rank
        return h is not None and h <= self.query.settings.embedding_top_k

    @cached_property
    def covered_by(self) -> str | None:
        """How a kept result of the stage covers the chunk's text (C42), or None (or no text to compare)."""
        text = self.query.kb.content.get(self.chunk_id)
        if not text:
            return None
        for holder, kept in self.query.kept_texts.items():
            how = _overlap(text, kept)
            if how:
                return f"{how} kept result {holder}"
        return None

    @cached_property
    def rerank_score(self) -> tuple[float, float | None] | None:
        """(model score, base score) of the chunk for this query, when a list of the run reranked it."""
        row = self.returned_row
        if row is not None and "model_score" in row and pd.notna(row["model_score"]):
            base = row.get("base_score")
            return float(row["model_score"]), None if base is None or pd.isna(base) else float(base)
        return self.query.rerank_scores.get(self.chunk_id)

    @cached_property
    def rerank_candidate(self) -> bool:
        """Knowledge-search reranked this query and the chunk, a search candidate, is absent and not covered."""
        q = self.query
        return (q.settings.knowledge_search and q.reranked and self.returned_row is None and self.searched
                and self.covered_by is None)

    def where(self) -> str:
        """``hybrid rank N``, ``not in the hybrid list`` or ``no hybrid stage`` (for evidence)."""
        if self.query.path("hybrid") is None:
            return "no hybrid stage"
        return f"hybrid rank {self.hybrid_rank}" if self.hybrid_rank is not None else "not in the hybrid list"


# --------------------------------------------------------------------------- text overlap (C42)

_CJK = re.compile(r"[\u4e00-\u9fff]")


def _punctuation_only(word: str) -> bool:
    return all(unicodedata.category(ch)[0] in "PSZ" or ch.isspace() for ch in word)


@lru_cache(maxsize=65536)
def _tokens(text: str) -> frozenset[str]:
    """WeKnora's ``TokenizeSimple``: lower case; jieba search-mode words when the text holds Chinese, else
    whitespace-separated words; one-character and punctuation-only tokens dropped.

    jieba cuts each run of the characters it segments (``jieba.re_han_default``: Chinese, ASCII letters
    and digits, ``+#&._%-``) on its own, and yields what lies between runs as single characters and
    whitespace, all dropped here: a text's tokens are those of its runs, each run cut once
    (:func:`_run_tokens`) whichever texts hold it (a kept result's text holds its chunks' texts).
    """
    t = text.lower().strip()
    if not _CJK.search(t):
        return _kept_tokens(t.split())
    return frozenset().union(*map(_run_tokens, jieba_ready().re_han_default.findall(t)))


@lru_cache(maxsize=65536)
def _run_tokens(run: str) -> frozenset[str]:
    """The tokens jieba's search mode gives one run of segmented characters (see :func:`_tokens`)."""
    return _kept_tokens(jieba_ready().cut_for_search(run, HMM=True))


def _kept_tokens(words: Iterable[str]) -> frozenset[str]:
    """``words`` stripped, without one-character and punctuation-only ones."""
    return frozenset(w for w in (x.strip() for x in words) if len(w) > 1 and not _punctuation_only(w))


@lru_cache(maxsize=65536)
def _normalised(text: str) -> str:
    """``text`` in lower case, runs of whitespace made one space, stripped."""
    return " ".join(text.lower().split())


def _overlap(text: str, kept: str) -> str | None:
    """How ``kept`` covers ``text`` as C42's overlap drop sees it: one normalised text contained in the
    other, or >= 85 % of the smaller token set found in the other (``|A & B| / min(|A|, |B|)``)."""
    a, b = _normalised(text), _normalised(kept)
    if not a or not b:
        return None
    if a in b:
        return "its text is contained in"
    if b in a:
        return "its text contains"
    ta, tb = _tokens(text), _tokens(kept)
    if not ta or not tb:
        return None
    ratio = len(ta & tb) / min(len(ta), len(tb))
    return f"{ratio:.0%} of the shorter text's tokens shared with" if ratio >= OVERLAP_DROP else None


# --------------------------------------------------------------------------- the registry of causes

@dataclass(frozen=True)
class Cause:
    """A registered cause: its name, what it looks at and the function that finds its evidence.

    ``decisive``: a chunk cause whose evidence ends the search for that chunk (the causes
    registered after it are not asked about it).
    """

    name: str
    level: Literal["chunk", "query"]
    find: Callable[[Any], list[str]]
    decisive: bool = False


_REGISTRY: dict[str, Cause] = {}


def cause(name: str, *, level: Literal["chunk", "query"] = "chunk",
          decisive: bool = False) -> Callable[[Callable[[Any], list[str]]], Callable[[Any], list[str]]]:
    """Register the decorated function as the finder of cause ``name`` (see the module docstring)."""
    def register(find: Callable[[Any], list[str]]) -> Callable[[Any], list[str]]:
        _REGISTRY[name] = Cause(name, level, find, decisive)
        return find
    return register


def causes() -> tuple[str, ...]:
    """Every registered cause, in report order (:data:`UNEXPLAINED` is not one: it is their absence)."""
    return tuple(_REGISTRY)


@cause("label/KB mismatch", decisive=True)
def _label_kb_mismatch(lost: LostChunk) -> list[str]:
    """The label names a chunk the knowledge base does not have (or has disabled)."""
    enabled = lost.query.kb.enabled
    if enabled is not None and lost.chunk_id not in enabled:
        return [f"{lost.chunk_id} (grade {lost.grade}) is not an enabled chunk of the knowledge base"]
    return []


@cause("threshold filtered")
def _threshold_filtered(lost: LostChunk) -> list[str]:
    """A path found the chunk (thresholds off at collection) with a score below the threshold the stage ran with."""
    q, out = lost.query, []
    for role, threshold in (("vector", q.settings.vector_threshold), ("keyword", q.settings.keyword_threshold)):
        s = lost.path_score(role)
        if threshold is not None and s is not None and s < threshold:
            out.append(f"{lost.chunk_id}: {role} score {s:.3f} < {role}_threshold {threshold:g} "
                       f"({q.settings.source}{', effective' if q.settings.knowledge_search else ''})")
    return out


def _missed_by_vector(lost: LostChunk) -> tuple[str, dict[str, Any] | None] | None:
    """(evidence prefix, the chunk's trace row or None) when the vector path's candidates lack the chunk."""
    vec, kw = lost.query.path("vector"), lost.query.path("keyword")
    if vec is None or lost.in_vector:
        return None
    keyword = "" if kw is None else ("; the keyword path found it" if lost.in_keyword
                                     else "; nor is it in the keyword path's")
    text = f"{lost.chunk_id} (grade {lost.grade}) is not among the vector path's {len(vec)} candidates{keyword}"
    return text, lost.query.trace.get(lost.chunk_id)


@cause("vector miss")
def _vector_miss(lost: LostChunk) -> list[str]:
    """The vector path's candidates do not hold the chunk at all (and no trace of the vector store says why)."""
    missed = _missed_by_vector(lost)
    if missed is None:
        return []
    text, trace = missed
    if trace is None:
        return [text]
    if trace["status"] == "hit":  # the store's own search finds it: the run's vector path asked otherwise
        return [f"{text}; yet the vector-store trace finds it at rank {_n(trace['planned_rank'])} of {_n(trace['k'])}"]
    return []


def _traced(lost: LostChunk, status: str) -> tuple[str, dict[str, Any]] | None:
    """(evidence prefix, trace row) when the vector path lacks the chunk and the trace gives it ``status``."""
    missed = _missed_by_vector(lost)
    if missed is None or missed[1] is None or missed[1]["status"] != status:
        return None
    return missed[0], missed[1]


@cause("index miss")
def _index_miss(lost: LostChunk) -> list[str]:
    """Exact search in the vector store finds the chunk within the path's TopK, WeKnora's search does not."""
    traced = _traced(lost, "index_miss")
    if traced is None:
        return []
    text, t = traced
    return [f"{text}; exact search in the vector store ranks it {_n(t['exact_rank'])} of {_n(t['k'])}, WeKnora's "
            "search does not return it (ef_search or m too low)"]


@cause("embedding miss")
def _embedding_miss(lost: LostChunk) -> list[str]:
    """Not within the TopK even of exact search in the vector store, or no vector at all."""
    traced = _traced(lost, "embedding_miss")
    if traced is None:
        return []
    text, t = traced
    if not t.get("has_vector", True):
        return [f"{text}; it has no vector in the store (see the integrity check)"]
    where = f"ranks it {_n(t['exact_rank'])}" if _present(t.get("exact_rank")) else "does not rank it"
    return [f"{text}; exact search in the vector store {where}, beyond the top {_n(t['k'])}: the embedding does not "
            "put it near the query"]


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and value != value)


def _n(value: Any) -> str:
    """A rank or K as an integer (a trace column with a missing rank holds floats)."""
    return str(int(value)) if _present(value) else "?"


@cause("lost in fusion")
def _lost_in_fusion(lost: LostChunk) -> list[str]:
    """The vector or keyword path has the chunk, the fused (hybrid) list does not."""
    q = lost.query
    hyb = q.path("hybrid")
    if hyb is None or not (lost.in_vector or lost.in_keyword) or lost.chunk_id in q.path_ids("hybrid"):
        return []
    path = "vector" if lost.in_vector else "keyword"
    rank = int(q.listing(q.paths[path]).value(lost.chunk_id, "rank"))
    return [f"{lost.chunk_id} is rank {rank} in the {path} path's list but not in the hybrid list of {len(hyb)} "
            "(fused below match_count)"]


@cause("below rerank threshold")
def _below_rerank_threshold(lost: LostChunk) -> list[str]:
    """A reranker ran: the chunk's model score is below the rerank threshold, or, its score unknown, the
    chunk is absent while fewer than rerank_top_k chunks passed the threshold."""
    if not lost.rerank_candidate:
        return []
    q, s = lost.query, lost.query.settings
    t = "" if s.rerank_threshold is None else f" {s.rerank_threshold:g}"
    if lost.rerank_score is not None:
        m = lost.rerank_score[0]
        if s.rerank_threshold is None or m >= s.rerank_threshold:
            return []
        return [f"{lost.chunk_id} ({lost.where()}): model score {m:.4f} < rerank_threshold{t}"]
    if q.accounted >= s.rerank_top_k:
        return []
    return [f"{lost.chunk_id} ({lost.where()}) is absent and no kept result covers it, while the list accounts "
            f"for only {q.accounted} chunks < rerank_top_k {s.rerank_top_k}: fewer passed the rerank "
            f"threshold{t}, so its model score was below it"]


@cause("not selected by MMR")
def _not_selected_by_mmr(lost: LostChunk) -> list[str]:
    """A reranker ran and scored the chunk (in another list of the run) above a result it kept, yet MMR
    chose others."""
    if not lost.rerank_candidate or lost.rerank_score is None:
        return []
    q, (m, base) = lost.query, lost.rerank_score
    if q.settings.rerank_threshold is not None and m < q.settings.rerank_threshold:
        return []
    if base is None:
        base = lost.path_score("hybrid")
    mine, kept = _composite(m, base), q.kept_composites
    if not kept or mine <= min(kept):
        return []
    return [f"{lost.chunk_id} ({lost.where()}): model score {m:.4f}, composite {mine:.4f} above the lowest kept "
            f"result's {min(kept):.4f}, yet MMR (lambda 0.7) chose others"]


@cause("rerank demoted")
def _rerank_demoted(lost: LostChunk) -> list[str]:
    """A reranker ran and scored the chunk lower than what it kept: below the first K, or absent from a full list."""
    q, s = lost.query, lost.query.settings
    if not (s.knowledge_search and q.reranked):
        return []
    row = lost.returned_row
    if row is not None:
        result = int(row.get("result", row["rank"]))
        if result <= q.k:
            return []
        score = f" (model score {lost.rerank_score[0]:.4f})" if lost.rerank_score else ""
        return [f"{lost.chunk_id} ({lost.where()}): result {result} after rerank{score}, below the first {q.k}"]
    if not lost.rerank_candidate:
        return []
    if lost.rerank_score is not None:
        m, base = lost.rerank_score
        below = s.rerank_threshold is not None and m < s.rerank_threshold
        if below or (q.kept_composites and _composite(m, base) > min(q.kept_composites)):
            return []
    elif q.accounted < s.rerank_top_k:
        return []
    kept = [m for m in q.result_values("model_score") if pd.notna(m)] if "model_score" in q.returned.columns else []
    lowest = f", lowest model score {min(kept):.4f}" if kept else ""
    return [f"{lost.chunk_id} ({lost.where()}) is not among what the reranker kept ({len(q.result_rows)} results once "
            f"merged{lowest})"]


@cause("rerank failed", level="query")
def _rerank_failed(q: DegradedQuery) -> list[str]:
    """A reranker runs here, yet this query's list is empty or carries no rerank scores while hybrid found a
    relevant chunk."""
    s = q.settings
    if not (s.knowledge_search and s.reranker) or q.reranked:
        return []
    found = [lost for lost in (LostChunk(q, c) for c in q.lost) if lost.searched]
    if not found:
        return []
    where = ", ".join(f"{lost.chunk_id} ({lost.where()})" for lost in found[:3])
    if q.returned.empty:
        t = "" if s.rerank_threshold is None else f" {s.rerank_threshold:g}"
        return [f"the list is empty though {s.reranker}, and hybrid found {where}: the reranker scored every "
                f"candidate below rerank_threshold{t} and the best below 0.15 (C36; WeKnora issues #2391, #2143, "
                "#713)"]
    return [f"the list carries no {s.rerank_column} though {s.reranker}: the rerank call failed and the retrieval "
            f"candidates came back unreranked (C37); hybrid found {where}"]


@cause("dropped in merge")
def _dropped_in_merge(lost: LostChunk) -> list[str]:
    """Knowledge-search: the chunk, a search candidate, is absent and a kept result covers its text (C42)."""
    q = lost.query
    if not q.settings.knowledge_search or lost.returned_row is not None or not lost.searched:
        return []
    how = lost.covered_by
    return [f"{lost.chunk_id} ({lost.where()}): {how} (overlap drop)"] if how else []


@cause("pushed down by merge")
def _pushed_down_by_merge(lost: LostChunk) -> list[str]:
    """The result holding the chunk is among the first K, but neighbours merged into the results above it
    put it below K once unfolded."""
    q, row = lost.query, lost.returned_row
    if row is None or "result" not in row:
        return []
    result, rank = int(row["result"]), int(row["rank"])
    if result > q.k or rank <= q.k:
        return []
    ranks = q.listing(q.returned).column("rank")
    merged = sum(1 for r in ranks if r < rank) - sum(1 for i in q.result_rows if ranks[i] < rank)
    return [f"{lost.chunk_id} is in result {result} (of the first {q.k}); {merged} neighbours merged into the "
            f"results above it put it at rank {rank} once unfolded"]


@cause("cut by top-k")
def _cut_by_top_k(lost: LostChunk) -> list[str]:
    """Knowledge-search without reranking: the chunk, a search candidate, is absent from a full list
    (rerank_top_k); or it ranks below embedding_top_k in the hybrid list."""
    q, s = lost.query, lost.query.settings
    if not s.knowledge_search or lost.returned_row is not None or lost.threshold_removed:
        return []
    h = lost.hybrid_rank
    if h is not None and h > s.embedding_top_k:
        return [f"{lost.chunk_id}: hybrid rank {h} > embedding_top_k {s.embedding_top_k} (the search depth)"]
    if q.reranked or not lost.searched or lost.covered_by is not None or len(q.result_rows) < s.rerank_top_k:
        return []
    order = " (v0.6.x keeps merged groups in document order, not by score)" if s.release and s.release < (
        0, 7, 2) else ""
    return [f"{lost.chunk_id} ({lost.where()}) is not among the rerank_top_k {s.rerank_top_k} results kept{order}"]


@cause("chunk split")
def _chunk_split(lost: LostChunk) -> list[str]:
    """The top K holds a neighbour of the chunk (same document, chunk index +- 1): the first such one."""
    pos, c = lost.query.kb.positions, lost.chunk_id
    if c not in pos:
        return []
    kid, idx = pos[c]
    for n in lost.query.top:
        if n in pos and pos[n][0] == kid and abs(pos[n][1] - idx) == 1:
            return [f"returned neighbour {n} instead of {c} (grade {lost.grade})"]
    return []


@cause("grade inversion", level="query")
def _grade_inversion(q: DegradedQuery) -> list[str]:
    """The first grade-1 chunk of the top K that ranks above a grade-3 one, and the first such grade-3 chunk."""
    top = q.top
    grades = [q.relevant.get(c, 0) for c in top]
    for i, g in enumerate(grades):
        if g == 1 and 3 in grades[i + 1:]:
            j = grades.index(3, i + 1)
            return [f"{top[i]} (grade 1) at rank {i + 1} above {top[j]} (grade 3) at rank {j + 1}"]
    return []


#: the built-in causes, in report order
CAUSES: tuple[str, ...] = causes()


def _whereabouts(q: DegradedQuery) -> list[str]:
    """Where each lost chunk was, for a query no cause explains: its rank in the stage's list and upstream."""
    if not q.lost:
        ranks = ", ".join(f"{c} at rank {q.top.index(c) + 1}" for c in q.relevant if c in q.top)
        return [f"every relevant chunk is in the top {q.k} ({ranks}), ranked too low for NDCG@10"]
    out = []
    listings = [(name, q.listing(lst)) for name, lst in [(q.stage, q.returned), *q.paths.items()]]
    for c in q.lost:
        spots = [f"{name} rank {int(listing.value(c, 'rank'))}" for name, listing in listings if c in listing.first]
        out.append(f"{c} (grade {q.relevant[c]}): " + (", ".join(spots) if spots else "in none of the lists"))
    return out


def _find_causes(q: DegradedQuery) -> tuple[list[str], list[str]]:
    """The causes found for one degraded query (report order) and their evidence (``"cause: text"``);
    :data:`UNEXPLAINED` with where the lost chunks were when no cause applies."""
    found: dict[str, list[str]] = {}
    chunk_causes = [c for c in _REGISTRY.values() if c.level == "chunk"]
    for chunk in q.lost:
        lost = LostChunk(q, chunk)
        for c in chunk_causes:
            evidence = c.find(lost)
            found.setdefault(c.name, []).extend(evidence)
            if evidence and c.decisive:
                break
    for c in _REGISTRY.values():
        if c.level == "query":
            found.setdefault(c.name, []).extend(c.find(q))
    names = [name for name in _REGISTRY if found.get(name)]
    if not names:
        return [UNEXPLAINED], [f"{UNEXPLAINED}: {e}" for e in _whereabouts(q)]
    return names, [f"{name}: {e}" for name in names for e in found[name]]


# --------------------------------------------------------------------------- the diagnosis

@dataclass
class Diagnosis:
    """Degraded queries with causes, what each stage ran, and the material for a drill-down."""

    degraded: pd.DataFrame  # query_id, query, stage, recall, ndcg@10, causes (list), evidence (list)
    k: int
    lists: dict[tuple[str, str], pd.DataFrame] = field(repr=False, default_factory=dict)
    testset: TestSet | None = field(repr=False, default=None)
    inventory: pd.DataFrame | None = field(repr=False, default=None)
    stage_definitions: Mapping[str, Mapping[str, Any]] | None = field(repr=False, default=None)
    settings: dict[str, StageSettings] = field(repr=False, default_factory=dict)
    reranked_queries: dict[str, int] = field(repr=False, default_factory=dict)

    def summary(self) -> pd.DataFrame:
        """Degraded queries by cause (rows, :data:`UNEXPLAINED` last) and stage (columns); a query may have
        several causes. The last row counts the degraded queries."""
        names = [*causes(), UNEXPLAINED]
        if self.degraded.empty:
            return pd.DataFrame(index=pd.Index(names, name="cause"))
        ex = self.degraded.explode("causes")
        ex = ex[ex["causes"].notna()]
        table = pd.crosstab(ex["causes"], ex["stage"]).reindex(names, fill_value=0)
        stages = stage_order(self.degraded["stage"].unique(), self.stage_definitions)
        table = table.reindex(columns=stages, fill_value=0)
        table.index.name = "cause"
        n = self.degraded.groupby("stage").size()
        table.loc["degraded queries"] = n.reindex(table.columns, fill_value=0)
        return table

    def what_ran(self) -> pd.DataFrame:
        """Per stage: where its settings came from, the thresholds and top-k it ran with, and the reranker
        (how many queries' lists carry rerank scores): what the causes were judged against."""
        rows = []
        for stage in stage_order(self.settings, self.stage_definitions):
            s = self.settings[stage]
            ks = s.knowledge_search
            rows.append({"stage": stage, "settings": s.source, "vector_threshold": _shown(s.vector_threshold),
                         "keyword_threshold": s.keyword_note or _shown(s.keyword_threshold),
                         "embedding_top_k": s.embedding_top_k if ks else "", "rerank_top_k": s.rerank_top_k if ks
                         else "", "rerank_threshold": _threshold_shown(s) if ks else "",
                         "reranker": _reranker_shown(s, self.reranked_queries.get(stage, 0)) if ks else "none"})
        return pd.DataFrame(rows)

    def drilldown(self, query_id: str, stages: list[str] | None = None) -> dict[str, Any]:
        """The query, its labelled chunks (grade, content) and what each stage returned (top K)."""
        assert self.testset is not None
        q = self.testset.queries.set_index("query_id").loc[query_id]
        labels = self.testset.qrels[self.testset.qrels["query_id"] == query_id]
        grade = dict(zip(labels["chunk_id"], labels["grade"], strict=True))
        content = {}
        if self.inventory is not None and len(self.inventory):
            content = dict(zip(self.inventory["chunk_id"], self.inventory["content"], strict=True))
        lab = labels.sort_values("grade", ascending=False).assign(
            content=lambda d: d["chunk_id"].map(content), in_kb=lambda d: d["chunk_id"].isin(content.keys())
            if content else None)
        returned = {}
        for (qid, st), lst in self.lists.items():
            if qid != query_id or (stages and st not in stages):
                continue
            top = lst.head(self.k).copy()
            top["grade"] = top["chunk_id"].map(grade).fillna(0).astype(int)
            top["content"] = top["chunk_id"].map(content)
            returned[st] = top
        rows = self.degraded[self.degraded["query_id"] == query_id]
        return {"query_id": query_id, "query": q["query"], "answer": q.get("answer"), "labels": lab,
                "returned": returned, "causes": rows[["stage", "causes", "evidence"]].to_dict("records")}


def _shown(value: float | None, none: str = "none") -> str:
    return none if value is None else f"{value:g}"


def _threshold_shown(s: StageSettings) -> str:
    """The rerank threshold column of :meth:`Diagnosis.what_ran` (C30: 0.2 when the tenant never saved a config,
    which the API cannot tell from a saved 0)."""
    if s.rerank_threshold is None:
        return "not recorded"
    return f"{s.rerank_threshold:g}" + (" (assumed: config never saved)" if s.rerank_threshold_assumed else "")


def _reranker_shown(s: StageSettings, reranked: int) -> str:
    """The reranker column of :meth:`Diagnosis.what_ran`."""
    if reranked:
        return f"ran: {reranked} queries' lists carry {s.rerank_column}"
    return f"expected ({s.reranker}), never ran" if s.reranker else f"none (no {s.rerank_column} in the results)"


def degraded_queries(scores: Scores, *, k: int = 10, recall_below: float = 0.3, ndcg_below: float = 0.5,
                     stages: list[str] | None = None) -> pd.DataFrame:
    """Per (query, stage), averaged over repeats: degraded when recall@k < recall_below or ndcg@10 < ndcg_below."""
    rk, nd = f"recall@{k}", "ndcg@10"
    missing = [m for m in (rk, nd) if m not in scores.metric_names]
    if missing:
        raise ValueError(f"the scores lack {missing}; score with those metrics")
    pq = scores.per_query_mean()
    if stages:
        pq = pq[pq["stage"].isin(stages)]
    bad = pq[(pq[rk] < recall_below) | (pq[nd] < ndcg_below)]
    return bad[["query_id", "stage", rk, nd]].rename(columns={rk: "recall", nd: "ndcg@10"}).reset_index(drop=True)


def _lists(results: pd.DataFrame) -> tuple[dict[tuple[str, str], pd.DataFrame], pd.DataFrame]:
    """First successful repeat of each (query, stage), ranked, sub-chunks unfolded, duplicates removed
    (a chunk's first row kept), ``rank`` renumbered 1..n; ``result`` / ``holder``: the position and chunk
    id of the result each chunk came in. Also every list's rows in one frame, one list after another.

    One sort by (query, stage, rank) lays each list out in one block, split at the blocks' starts.
    """
    df, _ = expand_sub_chunks(results.assign(result=results["rank"], holder=results["chunk_id"]))
    df = df[(df["status"].astype("string") == "ok") & df["chunk_id"].notna()]
    first = df.groupby(["query_id", "stage"], observed=True)["repeat"].transform("min")
    df = df[df["repeat"] == first].sort_values(["query_id", "stage", "rank"])
    df = df[~df.duplicated(["query_id", "stage", "chunk_id"])]
    block = df.groupby(["query_id", "stage"], observed=True, sort=False).ngroup().to_numpy()
    bounds = np.append(np.flatnonzero(np.diff(block, prepend=-1)), len(df))
    starts, ends = bounds[:-1], bounds[1:]
    keep = [c for c in ("chunk_id", "rank", "score", "knowledge_id", "chunk_index", "base_score", "model_score",
                        "result", "holder") if c in df.columns]
    listed = df[keep].reset_index(drop=True)
    listed["rank"] = np.arange(1, len(df) + 1, dtype=np.int64) - np.repeat(starts, ends - starts)
    listed["holder"] = listed["holder"].astype(str)
    lists: dict[tuple[str, str], pd.DataFrame] = {}
    for q, s, a, b in zip(*_columns(df.iloc[starts], "query_id", "stage"), starts.tolist(), ends.tolist(),
                          strict=True):
        lst = lists[(str(q), str(s))] = listed.iloc[a:b]
        lst.index = pd.RangeIndex(b - a)
    return lists, listed


def _listings(lists: Mapping[tuple[str, str], pd.DataFrame], listed: pd.DataFrame) -> dict[int, Listing]:
    """Each list read once (:class:`Listing`, by ``id`` of the frame), its columns cut from those of ``listed``
    (the lists' rows one list after another, in order, :func:`_lists`)."""
    columns = dict(zip(listed.columns, _columns(listed, *listed.columns), strict=True))
    out: dict[int, Listing] = {}
    start = 0
    for lst in lists.values():
        end = start + len(lst)
        out[id(lst)] = Listing(lst, {c: values[start:end] for c, values in columns.items()})
        start = end
    return out


def _reranked_queries(results: pd.DataFrame, column: str) -> dict[str, int]:
    """Per stage, the number of queries whose successful lists carry ``column`` (a rerank score)."""
    if column not in results.columns:
        return {}
    scored = results[results[column].notna()]
    return {str(s): int(n) for s, n in scored.groupby("stage", observed=True)["query_id"].nunique().items() if n}


def _rerank_scores(results: pd.DataFrame, stages: list[str]) -> dict[str, dict[str, tuple[float, float | None]]]:
    """Query id -> {chunk id: (model score, base score)}, means over every repeat of the knowledge-search
    ``stages`` that reranked the chunk."""
    if "model_score" not in results.columns:
        return {}
    df = results[results["stage"].astype("string").isin(stages) & results["model_score"].notna()]
    if "base_score" not in df.columns:
        df = df.assign(base_score=float("nan"))
    out: dict[str, dict[str, tuple[float, float | None]]] = {}
    means = df.groupby(["query_id", "chunk_id"], observed=True)[["model_score", "base_score"]].mean()
    for (q, c), m, b in zip(means.index, *_columns(means, "model_score", "base_score"), strict=True):
        out.setdefault(str(q), {})[str(c)] = (float(m), None if pd.isna(b) else float(b))
    return out


def _upstream_paths(query_id: str, stage: str, definitions: Mapping[str, Mapping[str, Any] | None],
                    lists: Mapping[tuple[str, str], pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Role -> list of the stage upstream of ``stage`` with that role that has a list for the query
    (the stage named as the role first, then in collection order)."""
    paths: dict[str, pd.DataFrame] = {}
    ups = upstream(stage, definitions)
    for s in sorted(ups, key=lambda s: s != role_of(s, definitions.get(s))):
        role = role_of(s, definitions.get(s))
        if role not in paths and (query_id, s) in lists:
            paths[role] = lists[(query_id, s)]
    return paths


def _relevant(testset: TestSet) -> dict[str, dict[str, int]]:
    """Query id -> {chunk id: grade} of its chunks of grade >= 1."""
    qrels = testset.qrels[testset.qrels["grade"] >= 1]
    return {q: dict(zip(g["chunk_id"], g["grade"], strict=True)) for q, g in qrels.groupby("query_id")}


def diagnose(scores: Scores, testset: TestSet, results: pd.DataFrame, *, inventory: pd.DataFrame | None = None,
             retrieval_config: Mapping[str, Any] | None = None, server: Mapping[str, Any] | None = None,
             k: int = 10, recall_below: float = 0.3, ndcg_below: float = 0.5, stages: list[str] | None = None,
             stage_definitions: Mapping[str, Mapping[str, Any]] | None = None,
             vector_trace: pd.DataFrame | None = None) -> Diagnosis:
    """Find degraded queries and give each one or more causes with evidence (see the module docstring).

    ``inventory``: the chunk listing (``chunk_id``, ``knowledge_id``, ``chunk_index``,
    ``is_enabled``, ``content``), needed for label/KB mismatch and dropped in merge, used for
    chunk positions; ``retrieval_config``: the manifest's (``{"raw", "effective"}``, or an older
    run's config as read: made effective, :func:`effective_config`); ``server``: the manifest's
    ``server`` (release, keyword engine); ``stage_definitions``: the manifest's ``stages`` object
    (:attr:`Run.stage_definitions`), from which a custom stage's pipeline role, upstream stages,
    settings source and causes follow (without it, only the built-in stage names have a role);
    ``vector_trace``: the chunk rows of a vector-store trace (``vector_trace.parquet``,
    :mod:`weknora_nb.collect.vectortrace`), which split a vector miss into an index miss and an
    embedding miss.
    """
    bad = degraded_queries(scores, k=k, recall_below=recall_below, ndcg_below=ndcg_below, stages=stages)
    wanted = results[results["query_id"].astype("string").isin(bad["query_id"].unique())]
    lists, listed = _lists(wanted)
    kb = KnowledgeBase.of(inventory, listed)
    definitions: dict[str, Mapping[str, Any] | None] = {
        **dict.fromkeys(map(str, results["stage"].unique())), **(stage_definitions or {})}
    config = effective_config(retrieval_config)
    ok = results[results["status"].astype("string") == "ok"] if "status" in results.columns else results
    reranked = _reranked_queries(ok, _rerank_column(server))
    settings = {s: stage_settings(s, d, config, server, reranked.get(s, 0)) for s, d in definitions.items()}
    rerank_scores = _rerank_scores(wanted, [s for s, st in settings.items() if st.knowledge_search])
    relevant = _relevant(testset)
    traces = _traces(vector_trace)
    empty = pd.DataFrame(columns=["chunk_id", "rank", "score", "result", "holder"])
    listings = _listings(lists, listed)

    def degraded(qid: str, stage: str) -> DegradedQuery:
        return DegradedQuery(query_id=qid, stage=stage, role=role_of(stage, definitions.get(stage)), k=k,
                             relevant=relevant.get(qid, {}), returned=lists.get((qid, stage), empty),
                             paths=_upstream_paths(qid, stage, definitions, lists), kb=kb,
                             settings=settings[stage], rerank_scores=rerank_scores.get(qid, {}),
                             trace=traces.get(qid, {}), listings=listings)
    found = [_find_causes(degraded(qid, stage)) for qid, stage in bad[["query_id", "stage"]].itertuples(index=False)]
    bad = bad.assign(causes=[c for c, _ in found], evidence=[e for _, e in found])
    bad.insert(1, "query", bad["query_id"].map(testset.queries.set_index("query_id")["query"]))
    return Diagnosis(bad, k, lists, testset, inventory, stage_definitions,
                     {s: settings[s] for s in map(str, results["stage"].unique())}, reranked)


def diagnose_run(run: Run, **options: Any) -> Diagnosis:
    """:func:`diagnose` of a loaded run folder with everything its manifest records (chunk listing,
    retrieval config, server, stage definitions) and its vector-store trace when the folder holds one
    (``vector_trace.parquet``, written by ``weknora-nb check --out``); ``options``: k, recall_below,
    ndcg_below, stages."""
    return diagnose(run.scores, run.testset, run.results, inventory=run.inventory(),
                    retrieval_config=run.manifest.get("retrieval_config"), server=run.manifest.get("server"),
                    stage_definitions=run.stage_definitions, vector_trace=run.vector_trace(), **options)


def _traces(frame: pd.DataFrame | None) -> dict[str, dict[str, dict[str, Any]]]:
    """query id -> chunk id -> the trace row at the largest K (the vector path's TopK)."""
    if frame is None or not len(frame):
        return {}
    top = frame[frame["k"] == frame["k"].max()]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in top.to_dict("records"):
        out.setdefault(str(row["query_id"]), {})[str(row["chunk_id"])] = row
    return out
