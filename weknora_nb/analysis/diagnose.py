"""Degraded queries and their causes (METHOD.md section 6).

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from weknora_nb.core.pipeline import stage_order
from weknora_nb.core.results import expand_sub_chunks
from weknora_nb.core.scoring import Scores
from weknora_nb.core.testset import TestSet

__all__ = ["CAUSES", "Diagnosis", "diagnose", "degraded_queries"]

CAUSES = ("label/KB mismatch", "threshold filtered", "vector miss", "lost in merge", "rerank demoted",
          "chunk split", "grade inversion")
#: stages whose lists are looked at when diagnosing a stage (the pipeline upstream of it)
UPSTREAM = {"vector": (), "keyword": (), "hybrid": ("vector", "keyword"),
            "final": ("hybrid", "vector", "keyword"), "citations": ("final", "hybrid", "vector", "keyword")}


@dataclass
class Diagnosis:
    """Degraded queries with causes, and the material for a drill-down."""

    degraded: pd.DataFrame  # query_id, stage, recall, ndcg, causes (list), evidence (list)
    k: int
    lists: dict[tuple[str, str], pd.DataFrame] = field(repr=False, default_factory=dict)
    testset: TestSet | None = field(repr=False, default=None)
    inventory: pd.DataFrame | None = field(repr=False, default=None)

    def summary(self) -> pd.DataFrame:
        """Degraded queries by cause (rows) and stage (columns); a query may have several causes."""
        if self.degraded.empty:
            return pd.DataFrame(index=pd.Index(list(CAUSES), name="cause"))
        ex = self.degraded.explode("causes")
        ex = ex[ex["causes"].notna()]
        table = pd.crosstab(ex["causes"], ex["stage"]).reindex(list(CAUSES), fill_value=0)
        stages = stage_order(self.degraded["stage"].unique())
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
        grade = dict(zip(labels["chunk_id"], labels["grade"]))
        content = {}
        if self.inventory is not None and len(self.inventory):
            content = dict(zip(self.inventory["chunk_id"], self.inventory["content"]))
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


def diagnose(scores: Scores, testset: TestSet, results: pd.DataFrame, *, inventory: pd.DataFrame | None = None,
             retrieval_config: dict[str, Any] | None = None, k: int = 10, recall_below: float = 0.3,
             ndcg_below: float = 0.5, stages: list[str] | None = None) -> Diagnosis:
    """Find degraded queries and give each one or more causes with evidence (see the module docstring).

    ``inventory``: the chunk listing (``chunk_id``, ``knowledge_id``, ``chunk_index``,
    ``is_enabled``, ``content``), needed for label/KB mismatch and used for chunk positions;
    ``retrieval_config``: the server's thresholds (``vector_threshold``, ``keyword_threshold``).
    """
    cfg = retrieval_config or {}
    vt, kt = float(cfg.get("vector_threshold") or 0.0), float(cfg.get("keyword_threshold") or 0.0)
    bad = degraded_queries(scores, k=k, recall_below=recall_below, ndcg_below=ndcg_below, stages=stages)
    lists = _lists(results[results["query_id"].astype("string").isin(bad["query_id"].unique())])
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
    qrels = testset.qrels[testset.qrels["grade"] >= 1]
    labels = {q: dict(zip(g["chunk_id"], g["grade"])) for q, g in qrels.groupby("query_id")}

    causes_col, evidence_col = [], []
    for qid, stage in bad[["query_id", "stage"]].itertuples(index=False):
        rel = labels.get(qid, {})
        here = lists.get((qid, stage), pd.DataFrame(columns=["chunk_id", "rank", "score"]))
        top = here.head(k)
        top_ids = list(top["chunk_id"])
        lost = [c for c in rel if c not in top_ids]
        found: dict[str, list[str]] = {}

        def add(cause: str, text: str) -> None:
            found.setdefault(cause, []).append(text)

        up = {s: lists.get((qid, s)) for s in UPSTREAM.get(stage, ()) if (qid, s) in lists}
        for c in lost:
            if enabled is not None and c not in enabled:
                add("label/KB mismatch", f"{c} (grade {rel[c]}) is not an enabled chunk of the knowledge base")
                continue
            vec, kw, hyb = up.get("vector"), up.get("keyword"), up.get("hybrid")
            in_vec = vec is not None and c in set(vec["chunk_id"])
            in_kw = kw is not None and c in set(kw["chunk_id"])
            if vt > 0 and in_vec:
                s = float(vec.loc[vec["chunk_id"] == c, "score"].iloc[0])
                if s < vt:
                    add("threshold filtered", f"{c}: vector score {s:.3f} < vector_threshold {vt:g}")
            if kt > 0 and in_kw:
                s = float(kw.loc[kw["chunk_id"] == c, "score"].iloc[0])
                if s < kt:
                    add("threshold filtered", f"{c}: keyword score {s:.3f} < keyword_threshold {kt:g}")
            if vec is not None and not in_vec:
                add("vector miss", f"{c} (grade {rel[c]}) is not among the vector path's {len(vec)} candidates"
                    + ("" if kw is None else ("; the keyword path found it" if in_kw else "; nor is it in the keyword path's")))
            if hyb is not None and (in_vec or in_kw) and c not in set(hyb["chunk_id"]):
                add("lost in merge", f"{c} is in the {'vector' if in_vec else 'keyword'} path's list but not in "
                    "the merged list")
            if hyb is not None and stage in ("final", "citations"):
                hr = hyb.loc[hyb["chunk_id"] == c, "rank"]
                if len(hr) and int(hr.iloc[0]) <= k:
                    fr = here.loc[here["chunk_id"] == c, "rank"]
                    after = f"rank {int(fr.iloc[0])}" if len(fr) else "absent"
                    add("rerank demoted", f"{c} (grade {rel[c]}): rank {int(hr.iloc[0])} before rerank, {after} after")
            if c in pos:
                kid, idx = pos[c]
                for n in top_ids:
                    if n in pos and pos[n][0] == kid and abs(pos[n][1] - idx) == 1:
                        add("chunk split", f"returned neighbour {n} instead of {c} (grade {rel[c]})")
                        break
        grades = [rel.get(c, 0) for c in top_ids]
        for i, g in enumerate(grades):
            if g == 1 and 3 in grades[i + 1:]:
                j = grades.index(3, i + 1)
                add("grade inversion", f"{top_ids[i]} (grade 1) at rank {i + 1} above {top_ids[j]} (grade 3) "
                    f"at rank {j + 1}")
                break
        causes_col.append([c for c in CAUSES if c in found])
        evidence_col.append([f"{c}: {e}" for c in CAUSES for e in found.get(c, [])])
    bad = bad.assign(causes=causes_col, evidence=evidence_col)
    qtext = testset.queries.set_index("query_id")["query"]
    bad.insert(1, "query", bad["query_id"].map(qtext))
    return Diagnosis(bad, k, lists, testset, inventory)
