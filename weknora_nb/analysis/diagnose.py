"""Degraded queries and their causes (docs/method.md section 6).

A query is *degraded* at a stage when Recall@K < 0.3 or NDCG@10 < 0.5 there (both
thresholds and K are parameters). Each degraded query gets one or more causes, each with
its evidence, by following every relevant chunk (grade >= 1) that is missing from the
stage's top K back through the pipeline (first repeat of each stage):

=================== ============================================================
cause               evidence
=================== ============================================================
label/KB mismatch   a labelled chunk id is not in the knowledge base's chunk listing
                    (or is disabled there)
threshold filtered  the chunk is found by a path collected with thresholds off, but
                    its score is below the configured similarity threshold
vector miss         the chunk is not among the vector path's candidates at all
lost in merge       the chunk is in the vector or keyword path's list but not in the
                    merged (hybrid) list
rerank demoted      the chunk is in the top K before rerank (hybrid) and not after
chunk split         the stage returned a neighbour (same document, adjacent chunk
                    index) of the chunk instead of it
grade inversion     a partly relevant chunk (grade 1) ranks above a fully relevant one
                    (grade 3) in the top K
=================== ============================================================

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

Causes are reported in the order they are registered (:data:`CAUSES` for the built-in ones).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import pandas as pd

from weknora_nb.core.pipeline import role_of, stage_order, upstream
from weknora_nb.core.results import expand_sub_chunks
from weknora_nb.core.scoring import Scores
from weknora_nb.core.testset import TestSet

__all__ = ["CAUSES", "Cause", "DegradedQuery", "Diagnosis", "LostChunk", "cause", "causes", "diagnose",
           "degraded_queries"]


# --------------------------------------------------------------------------- the material a cause looks at

@dataclass(frozen=True)
class KnowledgeBase:
    """What the chunk listing says: the enabled chunk ids (None: no listing) and chunk positions."""

    enabled: set[str] | None
    positions: dict[str, tuple[str, int]]  # chunk_id -> (knowledge_id, chunk_index)

    @classmethod
    def of(cls, inventory: pd.DataFrame | None, lists: Mapping[tuple[str, str], pd.DataFrame]) -> KnowledgeBase:
        """From the inventory, completed with the positions the returned lists carry for chunks it lacks."""
        enabled: set[str] | None = None
        pos: dict[str, tuple[str, int]] = {}
        if inventory is not None and len(inventory):
            inv = inventory
            enabled = set(inv.loc[inv["is_enabled"].fillna(True).astype(bool), "chunk_id"].astype(str))
            pos = {c: (kid, int(i)) for c, kid, i in inv[["chunk_id", "knowledge_id", "chunk_index"]].itertuples(
                index=False) if pd.notna(i)}
        for lst in lists.values():
            if "chunk_index" in lst.columns:
                for c, kid, i in lst[["chunk_id", "knowledge_id", "chunk_index"]].itertuples(index=False):
                    if pd.notna(i) and c not in pos:
                        pos[c] = (kid, int(i))
        return cls(enabled, pos)


@dataclass
class DegradedQuery:
    """One degraded (query, stage): what the stage returned and the lists of the paths upstream of it.

    ``paths`` maps a pipeline role (``vector``, ``keyword``, ``hybrid``, ``final``) to the list
    of the upstream stage with that role; ``relevant`` maps each chunk of grade >= 1 to its grade.
    """

    query_id: str
    stage: str
    role: str
    k: int
    relevant: dict[str, int]
    returned: pd.DataFrame  # chunk_id, rank, score, ... of this stage, best first
    paths: dict[str, pd.DataFrame]
    kb: KnowledgeBase
    vector_threshold: float
    keyword_threshold: float

    @cached_property
    def top(self) -> list[str]:
        """The chunk ids of the stage's top K, best first."""
        return list(self.returned.head(self.k)["chunk_id"])

    @cached_property
    def lost(self) -> list[str]:
        """The relevant chunks missing from the top K (in the order the labels list them)."""
        top = self.top
        return [c for c in self.relevant if c not in top]

    def path(self, role: str) -> pd.DataFrame | None:
        """The list of the upstream path with ``role``, or None when the run has no such stage."""
        return self.paths.get(role)

    def path_ids(self, role: str) -> set[str]:
        """The chunk ids of that path's list (empty when there is no such path)."""
        lst = self.paths.get(role)
        return set() if lst is None else set(lst["chunk_id"])


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
    """Every registered cause, in report order."""
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
    """A path found the chunk (thresholds off at collection) with a score below the configured threshold."""
    q, c, out = lost.query, lost.chunk_id, []
    for role, threshold, found in (("vector", q.vector_threshold, lost.in_vector),
                                   ("keyword", q.keyword_threshold, lost.in_keyword)):
        if threshold > 0 and found:
            lst = q.paths[role]
            s = float(lst.loc[lst["chunk_id"] == c, "score"].iloc[0])
            if s < threshold:
                out.append(f"{c}: {role} score {s:.3f} < {role}_threshold {threshold:g}")
    return out


@cause("vector miss")
def _vector_miss(lost: LostChunk) -> list[str]:
    """The vector path's candidates do not hold the chunk at all."""
    vec, kw = lost.query.path("vector"), lost.query.path("keyword")
    if vec is None or lost.in_vector:
        return []
    keyword = "" if kw is None else ("; the keyword path found it" if lost.in_keyword
                                     else "; nor is it in the keyword path's")
    return [f"{lost.chunk_id} (grade {lost.grade}) is not among the vector path's {len(vec)} candidates{keyword}"]


@cause("lost in merge")
def _lost_in_merge(lost: LostChunk) -> list[str]:
    """The vector or keyword path has the chunk, the merged (hybrid) list does not."""
    q = lost.query
    if q.path("hybrid") is None or not (lost.in_vector or lost.in_keyword) or lost.chunk_id in q.path_ids("hybrid"):
        return []
    return [f"{lost.chunk_id} is in the {'vector' if lost.in_vector else 'keyword'} path's list but not in "
            "the merged list"]


@cause("rerank demoted")
def _rerank_demoted(lost: LostChunk) -> list[str]:
    """At a reranked stage (final, citations): the chunk was in the hybrid top K, and is lower or absent after."""
    q, c = lost.query, lost.chunk_id
    hyb = q.path("hybrid")
    if hyb is None or q.role not in ("final", "citations"):
        return []
    hr = hyb.loc[hyb["chunk_id"] == c, "rank"]
    if not (len(hr) and int(hr.iloc[0]) <= q.k):
        return []
    fr = q.returned.loc[q.returned["chunk_id"] == c, "rank"]
    after = f"rank {int(fr.iloc[0])}" if len(fr) else "absent"
    return [f"{c} (grade {lost.grade}): rank {int(hr.iloc[0])} before rerank, {after} after"]


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


def _find_causes(q: DegradedQuery) -> tuple[list[str], list[str]]:
    """The causes found for one degraded query (report order) and their evidence (``"cause: text"``)."""
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
    return names, [f"{name}: {e}" for name in names for e in found[name]]


# --------------------------------------------------------------------------- the diagnosis

@dataclass
class Diagnosis:
    """Degraded queries with causes, and the material for a drill-down."""

    degraded: pd.DataFrame  # query_id, query, stage, recall, ndcg@10, causes (list), evidence (list)
    k: int
    lists: dict[tuple[str, str], pd.DataFrame] = field(repr=False, default_factory=dict)
    testset: TestSet | None = field(repr=False, default=None)
    inventory: pd.DataFrame | None = field(repr=False, default=None)
    stage_definitions: Mapping[str, Mapping[str, Any]] | None = field(repr=False, default=None)

    def summary(self) -> pd.DataFrame:
        """Degraded queries by cause (rows) and stage (columns); a query may have several causes."""
        names = list(causes())
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


def _lists(results: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """First successful repeat of each (query, stage), ranked, sub-chunks unfolded, duplicates removed."""
    df, _ = expand_sub_chunks(results)
    df = df[(df["status"].astype("string") == "ok") & df["chunk_id"].notna()]
    first = df.groupby(["query_id", "stage"], observed=True)["repeat"].transform("min")
    df = df[df["repeat"] == first].sort_values(["query_id", "stage", "rank"])
    keep = [c for c in ("chunk_id", "rank", "score", "knowledge_id", "chunk_index", "base_score", "model_score")
            if c in df.columns]
    out = {}
    for (q, s), g in df.groupby(["query_id", "stage"], observed=True, sort=False):
        g = g[keep].drop_duplicates("chunk_id").reset_index(drop=True)
        g["rank"] = range(1, len(g) + 1)
        out[(str(q), str(s))] = g
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
             retrieval_config: dict[str, Any] | None = None, k: int = 10, recall_below: float = 0.3,
             ndcg_below: float = 0.5, stages: list[str] | None = None,
             stage_definitions: Mapping[str, Mapping[str, Any]] | None = None) -> Diagnosis:
    """Find degraded queries and give each one or more causes with evidence (see the module docstring).

    ``inventory``: the chunk listing (``chunk_id``, ``knowledge_id``, ``chunk_index``,
    ``is_enabled``, ``content``), needed for label/KB mismatch and used for chunk positions;
    ``retrieval_config``: the server's thresholds (``vector_threshold``, ``keyword_threshold``);
    ``stage_definitions``: the manifest's ``stages`` object (:attr:`Run.stage_definitions`),
    from which a custom stage's pipeline role, upstream stages and causes follow (without
    it, only the built-in stage names have a role).
    """
    cfg = retrieval_config or {}
    vt, kt = float(cfg.get("vector_threshold") or 0.0), float(cfg.get("keyword_threshold") or 0.0)
    bad = degraded_queries(scores, k=k, recall_below=recall_below, ndcg_below=ndcg_below, stages=stages)
    lists = _lists(results[results["query_id"].astype("string").isin(bad["query_id"].unique())])
    kb = KnowledgeBase.of(inventory, lists)
    definitions: dict[str, Mapping[str, Any] | None] = {
        **dict.fromkeys(map(str, results["stage"].unique())), **(stage_definitions or {})}
    relevant = _relevant(testset)
    empty = pd.DataFrame(columns=["chunk_id", "rank", "score"])

    def degraded(qid: str, stage: str) -> DegradedQuery:
        return DegradedQuery(query_id=qid, stage=stage, role=role_of(stage, definitions.get(stage)), k=k,
                             relevant=relevant.get(qid, {}), returned=lists.get((qid, stage), empty),
                             paths=_upstream_paths(qid, stage, definitions, lists), kb=kb,
                             vector_threshold=vt, keyword_threshold=kt)
    found = [_find_causes(degraded(qid, stage)) for qid, stage in bad[["query_id", "stage"]].itertuples(index=False)]
    bad = bad.assign(causes=[c for c, _ in found], evidence=[e for _, e in found])
    bad.insert(1, "query", bad["query_id"].map(testset.queries.set_index("query_id")["query"]))
    return Diagnosis(bad, k, lists, testset, inventory, stage_definitions)
