"""The evidence a cause looks at: one degraded (query, stage) and each relevant chunk it lost.

:class:`DegradedQuery` holds what the stage returned (unfolded: merged neighbours after their result),
the lists of the paths upstream of it (by pipeline role), the labels, the knowledge base's chunk listing
(:class:`KnowledgeBase`) and the settings the stage ran with; :class:`LostChunk` is one relevant chunk
(grade >= 1) missing from its top K, with where it was upstream. A chunk cause gets a :class:`LostChunk`,
a query cause a :class:`DegradedQuery` (:mod:`.rules`).

Each list is read once (:class:`Listing`: chunk ids in order, where each first appears, columns as Python
lists), shared by the queries of one diagnosis: the causes look chunks up in plain lists and dicts, not
in frames.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from weknora_nb.analysis.diagnose.overlap import overlap
from weknora_nb.analysis.diagnose.settings import REQUEST, StageSettings
from weknora_nb.core.integrity_api import unsearchable_chunks


@dataclass(frozen=True)
class KnowledgeBase:
    """What the chunk listing says: the enabled chunk ids search can return (None: no listing), chunk positions
    and texts, and the listed chunks search never returns with why (a parent, an index not ready: C100-C102)."""

    enabled: set[str] | None
    positions: dict[str, tuple[str, int]]  # chunk_id -> (knowledge_id, chunk_index)
    content: dict[str, str] = field(default_factory=dict)  # chunk_id -> text
    unsearchable: dict[str, str] = field(default_factory=dict)  # chunk_id -> why search never returns it

    @classmethod
    def of(cls, inventory: pd.DataFrame | None, listed: pd.DataFrame) -> KnowledgeBase:
        """From the inventory, completed with the positions the returned lists carry for chunks it lacks
        (``listed``: every list's rows, one list after another, :func:`.diagnosis._lists`; a chunk's first
        row with a position counts)."""
        enabled: set[str] | None = None
        pos: dict[str, tuple[str, int]] = {}
        content: dict[str, str] = {}
        unsearchable: dict[str, str] = {}
        if inventory is not None and len(inventory):
            inv = inventory
            unsearchable = unsearchable_chunks(inv)
            enabled = set(inv.loc[inv["is_enabled"].fillna(True).astype(bool), "chunk_id"].astype(str))
            enabled -= set(unsearchable)
            pos = {c: (kid, int(i)) for c, kid, i in zip(*column_lists(inv, "chunk_id", "knowledge_id",
                                                                       "chunk_index"), strict=True) if pd.notna(i)}
            if "content" in inv.columns:
                content = {str(c): str(t) for c, t in zip(*column_lists(inv, "chunk_id", "content"), strict=True)
                           if isinstance(t, str) and t}
        if "chunk_index" in listed.columns:
            placed = listed[listed["chunk_index"].notna()]
            for c, kid, i in zip(*column_lists(placed, "chunk_id", "knowledge_id", "chunk_index"), strict=True):
                if c not in pos:
                    pos[c] = (kid, int(i))
        return cls(enabled, pos, content, unsearchable)


def column_lists(frame: pd.DataFrame, *names: str) -> list[list[Any]]:
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
        return [composite(m, b) for m, b in zip(models, base, strict=True) if pd.notna(m)]


def composite(model: float, base: float | None) -> float:
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
            how = overlap(text, kept)
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
