"""Tied scores: how much a figure depends on the order the system happened to give equal scores.

The method scores the order the system returned (docs/method.md section 2). When several
adjacent results of one request carry the same ``score`` (a keyword engine's equal BM25 values,
a reranker's saturated scores), that order among them is arbitrary, and another run may return
them the other way round. :func:`tie_ranges` scores each request twice more:

- **best case**: inside every tie (a run of adjacent positions with equal scores), the chunks
  ordered by grade, highest first (tied relevant chunks first);
- **worst case**: the same, lowest grade first;

and reports the range (best minus worst) of each metric per query (means over repeats) and of
the system figure. Every metric of the registry but ``judged@K`` is at least as high when a
higher grade comes earlier, so best and worst bound what any order of the ties gives. Equal
scores that are not adjacent are not ties: something else ordered them. Positions past K can
matter (a tie across the cutoff decides which chunks enter the top K). A metric is **flagged**
when its figure's range exceeds ``threshold`` (default 0.01).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from weknora_nb.core.errors import UsageError
from weknora_nb.core.metrics import parse_metrics
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

DEFAULT_TIE_THRESHOLD = 0.01
_KEYS = ["query_id", "stage", "repeat"]


@dataclass
class TieRanges:
    """What :func:`tie_ranges` found.

    ``summary``: one row per (stage, metric): ``observed``, ``best``, ``worst`` (system figures),
    ``range``, ``requests``, ``requests_with_ties`` (a tie starting inside the metric's top K),
    ``queries_wider`` (queries whose own range exceeds the threshold), ``flagged``.
    ``per_query``: one row per (query, stage, metric): ``observed``, ``best``, ``worst``, ``range``.
    """

    summary: pd.DataFrame
    per_query: pd.DataFrame
    threshold: float
    warnings: list[str] = field(default_factory=list)


def _chunk_rows(results: pd.DataFrame) -> pd.Series:
    """Which rows are chunks of a successful request (the rest: failed requests, empty lists)."""
    status = (results["status"].astype("string").fillna("ok") if "status" in results
              else pd.Series("ok", index=results.index, dtype="string"))
    return ((status == "ok") & results["chunk_id"].notna()).astype(bool)


def mark_ties(results: pd.DataFrame) -> pd.DataFrame:
    """The successful rows that carry a chunk, sorted by request and rank, with ``tie_group`` (a number
    per run of adjacent equal scores within a request, increasing down the rows), ``tie_size`` and
    ``position`` (1-based, within the request)."""
    rows = results[_chunk_rows(results).to_numpy()].sort_values([*_KEYS, "rank"], kind="stable")
    rows = rows.reset_index(drop=True)
    request = rows.groupby(_KEYS, sort=False, observed=True).ngroup().to_numpy()
    new_request = np.r_[True, request[1:] != request[:-1]] if len(rows) else np.array([], dtype=bool)
    values = rows["score"].to_numpy(dtype=np.float64)
    same = np.r_[False, values[1:] == values[:-1]] if len(rows) else np.array([], dtype=bool)
    rows["tie_group"] = np.cumsum(new_request | ~same)
    rows["tie_size"] = rows.groupby("tie_group")["tie_group"].transform("size")
    rows["position"] = rows.groupby(np.cumsum(new_request)).cumcount() + 1
    return rows


def _reordered(rows: pd.DataFrame, grades: pd.Series, best: bool) -> pd.DataFrame:
    """``rows`` (from :func:`mark_ties`) with every tie sorted by grade (best: highest first) and ranks
    renumbered: a tie keeps the positions it held, so the i-th row after sorting takes the i-th position."""
    index = pd.MultiIndex.from_arrays([rows["query_id"].astype("string"), rows["chunk_id"].astype("string")])
    g = grades.reindex(index).fillna(0).to_numpy(dtype=np.float64)
    out = rows.assign(_grade=-g if best else g).sort_values(["tie_group", "_grade", "position"], kind="stable")
    out["rank"] = pd.array(rows["position"].to_numpy(), dtype="Int64")
    return out.drop(columns=["_grade", "tie_group", "tie_size", "position"])


def tie_ranges(run: Run | None = None, *, testset: TestSet | None = None, results: pd.DataFrame | None = None,
               stages: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
               threshold: float = DEFAULT_TIE_THRESHOLD) -> TieRanges:
    """The range of each metric over the orders the ties allow (module docstring).

    Give a ``run`` (its test set and results) or ``testset`` and ``results``; ``metrics`` default to
    the run's (``judged@K`` is left out: it does not depend on grades).
    """
    ts = testset if testset is not None else run.testset if run is not None else None
    res = results if results is not None else run.results if run is not None else None
    if ts is None or res is None:
        raise UsageError("tie_ranges needs a run, or a test set and results")
    names = [m.name for m in parse_metrics(metrics if metrics is not None else
                                           (run.scores.metric_names if run is not None else None))
             if m.family != "judged"]
    keep = list(stages) if stages is not None else None
    rows = mark_ties(res)
    labels = ts.qrels.assign(query_id=ts.qrels["query_id"].astype("string"),
                             chunk_id=ts.qrels["chunk_id"].astype("string"))
    grades = labels.set_index(["query_id", "chunk_id"])["grade"]
    grades = grades[~grades.index.duplicated()]
    others = res[~_chunk_rows(res).to_numpy()]
    variants = {"observed": res}
    for name, best in (("best", True), ("worst", False)):
        variants[name] = pd.concat([_reordered(rows, grades, best), others], ignore_index=True)
    per_query = {k: _per_query(score(ts, v, metrics=names, stages=keep), names) for k, v in variants.items()}
    return _assemble(per_query, rows, names, threshold)


def _per_query(scores, names: list[str]) -> pd.DataFrame:
    """Long (query_id, stage, metric, value): each query's mean over repeats, and the system figures."""
    pq = scores.per_query_mean().melt(id_vars=["query_id", "stage"], value_vars=names, var_name="metric")
    pq.attrs["figures"] = scores.summary.set_index(["stage", "metric"])["mean"]
    pq.attrs["requests"] = scores.per_query.groupby("stage", observed=True).size()
    return pq


def _assemble(per_query: dict[str, pd.DataFrame], rows: pd.DataFrame, names: list[str],
              threshold: float) -> TieRanges:
    keys = ["query_id", "stage", "metric"]
    pq = per_query["observed"].rename(columns={"value": "observed"}).set_index(keys)
    for k in ("best", "worst"):
        pq[k] = per_query[k].set_index(keys)["value"]
    pq["range"] = pq["best"] - pq["worst"]
    pq = pq.reset_index()
    figures = {k: v.attrs["figures"] for k, v in per_query.items()}
    tied_starts = rows[(rows["tie_size"] > 1)].groupby("tie_group").agg(
        first=("position", "min"), stage=("stage", "first"), query_id=("query_id", "first"), repeat=("repeat", "first"))
    out, warnings = [], []
    for (stage, metric), fig in figures["observed"].items():
        if metric not in names:
            continue
        cutoff = parse_metrics([metric])[0].k
        inside = tied_starts[(tied_starts["stage"].astype("string") == stage) & (tied_starts["first"] <= cutoff)]
        best, worst = figures["best"].get((stage, metric), np.nan), figures["worst"].get((stage, metric), np.nan)
        sel = pq[(pq["stage"] == stage) & (pq["metric"] == metric)]
        rng = float(best - worst)
        flagged = bool(rng > threshold)
        out.append({"stage": stage, "metric": metric, "observed": float(fig), "best": float(best),
                    "worst": float(worst), "range": rng,
                    "requests": int(per_query["observed"].attrs["requests"].get(stage, 0)),
                    "requests_with_ties": int(inside[["query_id", "repeat"]].drop_duplicates().shape[0]),
                    "queries_wider": int((sel["range"] > threshold).sum()), "flagged": flagged})
        if flagged:
            warnings.append(f"{stage} {metric}: tied scores leave the figure between {worst:.4f} and {best:.4f} "
                            f"(range {rng:.4f} > {threshold:g}): the order among equal scores decides it.")
    return TieRanges(pd.DataFrame(out), pq, threshold, warnings)
