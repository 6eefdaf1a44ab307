"""The diagnosis of a run: its degraded queries, each with its causes and their evidence.

:func:`diagnose` finds the degraded (query, stage) pairs (:func:`degraded_queries`), reads the first
successful repeat of each of their lists once (:func:`_lists`: ranked, merged results unfolded,
duplicates removed), builds a :class:`.query.DegradedQuery` of each with the lists upstream of it and the
settings its stage ran with (:mod:`.settings`), and asks the registered causes (:mod:`.rules`).
:class:`Diagnosis` holds the outcome: the table of causes, what each stage ran and a query's drill-down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.diagnose.query import DegradedQuery, KnowledgeBase, Listing, column_lists
from weknora_nb.analysis.diagnose.rules import UNEXPLAINED, causes, find_causes
from weknora_nb.analysis.diagnose.settings import StageSettings, effective_config, rerank_column, stage_settings
from weknora_nb.core.pipeline import role_of, stage_order, upstream
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import Scores
from weknora_nb.core.testset import TestSet
from weknora_nb.core.unfold import expand_sub_chunks


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
    for q, s, a, b in zip(*column_lists(df.iloc[starts], "query_id", "stage"), starts.tolist(), ends.tolist(),
                          strict=True):
        lst = lists[(str(q), str(s))] = listed.iloc[a:b]
        lst.index = pd.RangeIndex(b - a)
    return lists, listed


def _listings(lists: Mapping[tuple[str, str], pd.DataFrame], listed: pd.DataFrame) -> dict[int, Listing]:
    """Each list read once (:class:`Listing`, by ``id`` of the frame), its columns cut from those of ``listed``
    (the lists' rows one list after another, in order, :func:`_lists`)."""
    columns = dict(zip(listed.columns, column_lists(listed, *listed.columns), strict=True))
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
    for (q, c), m, b in zip(means.index, *column_lists(means, "model_score", "base_score"), strict=True):
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
    """Find degraded queries and give each one or more causes with evidence (the causes: :mod:`.rules`).

    ``inventory``: the chunk listing (``chunk_id``, ``knowledge_id``, ``chunk_index``,
    ``is_enabled``, ``content``), needed for label/KB mismatch and dropped in merge, used for
    chunk positions; ``retrieval_config``: the manifest's (``{"raw", "effective"}``, or an older
    run's config as read: made effective, :func:`effective_config`); ``server``: the manifest's
    ``server`` (release, keyword engine); ``stage_definitions``: the manifest's ``stages`` object
    (:attr:`Run.stage_definitions`), from which a custom stage's pipeline role, upstream stages,
    settings source and causes follow (without it, only the built-in stage names have a role);
    ``vector_trace``: the chunk rows of a vector-store trace (``vector_trace.parquet``,
    :mod:`weknora_nb.collect.checks.vectortrace`), which split a vector miss into an index miss and an
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
    reranked = _reranked_queries(ok, rerank_column(server))
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
    found = [find_causes(degraded(qid, stage)) for qid, stage in bad[["query_id", "stage"]].itertuples(index=False)]
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
