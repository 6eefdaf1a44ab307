"""The causes of a degraded query: the registry, and one rule (a registered function) per cause.

A loss is named for the step of the stage's pipeline that caused it (the steps are listed in the
package's docstring, :mod:`weknora_nb.analysis.diagnose`); each rule below finds the evidence of one cause:

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

Each cause is one function registered with :func:`cause`: a *chunk* cause gets a :class:`.query.LostChunk`
(one relevant chunk missing from the top K), a *query* cause a :class:`.query.DegradedQuery`; both return
evidence strings (none: the cause does not apply)::

    @cause("stale index", level="chunk")
    def _stale(lost: LostChunk) -> list[str]:
        ...

A *decisive* chunk cause whose evidence is found ends the search for that chunk. Causes are reported in
the order they are registered (:data:`CAUSES` for the built-in ones), then :data:`UNEXPLAINED`. A new
built-in cause is one such function in this module, placed where it falls in the report order (and a row
in the table above and in docs/method.md section 6); what it reads of a query or a chunk is a property of
:class:`.query.DegradedQuery` or :class:`.query.LostChunk`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from weknora_nb.analysis.diagnose.query import DegradedQuery, LostChunk, composite

#: the cause of a degraded query no rule explains
UNEXPLAINED = "unexplained"


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


#: every registered cause by name, in registration (report) order
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


# --------------------------------------------------------------------------- the built-in causes, in report order

@cause("label/KB mismatch", decisive=True)
def _label_kb_mismatch(lost: LostChunk) -> list[str]:
    """The label names a chunk the knowledge base does not have, has disabled, or never lets search return (a
    parent_text chunk, an index_status search drops: C100-C102)."""
    kb = lost.query.kb
    why = kb.unsearchable.get(lost.chunk_id)
    if why is not None:
        return [f"{lost.chunk_id} (grade {lost.grade}) cannot be returned by search: {why}"]
    if kb.enabled is not None and lost.chunk_id not in kb.enabled:
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
    mine, kept = composite(m, base), q.kept_composites
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
        if below or (q.kept_composites and composite(m, base) > min(q.kept_composites)):
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


# --------------------------------------------------------------------------- one query through the registry

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


def find_causes(q: DegradedQuery) -> tuple[list[str], list[str]]:
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
