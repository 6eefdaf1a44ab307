"""Answers in the paired comparison (docs/method.md sections 7 and 11).

The answer metrics of two runs (:func:`weknora_nb.analysis.answers.answer_values`: the judge's
criteria 1-5 and the citation metrics 0-1, per valid query) are paired over the queries both
hold, as retrieval metrics are: ``delta`` = mean(B - A), its 95 % paired-bootstrap interval, the
paired randomization test and Holm's correction across the answer metrics shown.

:func:`deltas_by_type` sets the retrieval delta beside the answer delta per query type: the
second source's reading, when answers gain where retrieval barely moves, the reranker surfaced
sentences the LLM could use.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from weknora_nb.analysis.answers import ANSWER_METRICS, answer_values
from weknora_nb.analysis.stats import DEFAULT_RESAMPLES, holm, paired_bootstrap_ci, randomization_test
from weknora_nb.core.run import Run


def _paired(a: pd.DataFrame, b: pd.DataFrame, mets: list[str], resamples: int, seed: int) -> pd.DataFrame:
    rows = []
    for m in mets:
        both = pd.concat([a[m], b[m]], axis=1, keys=["a", "b"]).dropna()
        n = len(both)
        if n == 0:
            rows.append({"metric": m, "n_queries": 0})
            continue
        A, B = both[["a"]].to_numpy(), both[["b"]].to_numpy()
        lo, hi = paired_bootstrap_ci(A, B, resamples=resamples, seed=seed)
        p = randomization_test(A, B, resamples=resamples, seed=seed + 1)
        rows.append({"metric": m, "n_queries": n, "mean_a": float(A.mean()), "mean_b": float(B.mean()),
                     "delta": float((B - A).mean()), "ci_low": float(np.ravel(lo)[0]),
                     "ci_high": float(np.ravel(hi)[0]), "p_value": float(np.ravel(p)[0])})
    out = pd.DataFrame(rows, columns=["metric", "n_queries", "mean_a", "mean_b", "delta", "ci_low", "ci_high",
                                      "p_value"])
    tested = out["p_value"].notna().to_numpy()
    out["p_holm"] = np.nan
    if tested.any():
        out.loc[tested, "p_holm"] = holm(out.loc[tested, "p_value"].to_numpy())
    return out


def compare_answers(base: Run, other: Run, *, metrics: Iterable[str] | None = None, stage: str = "citations",
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """Per answer metric both runs hold: n, both means, delta (B - A) with its 95 % interval, p and
    Holm's p across the metrics compared. Empty when a run holds no answer metric."""
    a, b = answer_values(base, stage=stage), answer_values(other, stage=stage)
    wanted = list(metrics) if metrics is not None else list(ANSWER_METRICS)
    mets = [m for m in wanted if m in a.columns and m in b.columns]
    out = _paired(a, b, mets, resamples, seed)
    out.insert(0, "run", other.name)
    out.insert(1, "baseline", base.name)
    return out


def deltas_by_type(base: Run, other: Run, *, stage: str, retrieval_metric: str = "ndcg@5",
                   answer_metric: str = "judge.correctness", answer_stage: str = "citations",
                   resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """Per query type: queries paired, the retrieval delta (``retrieval_metric`` at ``stage``) and the
    answer delta (``answer_metric``), each with its 95 % paired-bootstrap interval; NaN where a run
    lacks the metric. Types come from the test set (``query_type``; untyped queries as "(none)")."""
    def stage_values(run: Run) -> pd.Series:
        pq = run.scores.per_query_mean()
        return pq[pq["stage"] == stage].set_index("query_id")[retrieval_metric]

    ra, rb = stage_values(base), stage_values(other)
    aa, ab = answer_values(base, stage=answer_stage), answer_values(other, stage=answer_stage)
    types = base.testset.queries.set_index("query_id")["query_type"].fillna("(none)")
    rows = []
    for qtype, ids in types.groupby(types).groups.items():
        row: dict[str, object] = {"query_type": qtype}
        for tag, A, B in (("retrieval", ra, rb), ("answer", aa.get(answer_metric), ab.get(answer_metric))):
            if A is None or B is None:
                row.update({f"{tag}_n": 0, f"{tag}_delta": np.nan, f"{tag}_low": np.nan, f"{tag}_high": np.nan})
                continue
            both = pd.concat([A, B], axis=1, keys=["a", "b"]).reindex(ids).dropna()
            d = (both["b"] - both["a"]).to_numpy()
            lo, hi = paired_bootstrap_ci(both[["a"]].to_numpy(), both[["b"]].to_numpy(), resamples=resamples,
                                         seed=seed) if len(d) else ([np.nan], [np.nan])
            row.update({f"{tag}_n": len(d), f"{tag}_delta": float(d.mean()) if len(d) else np.nan,
                        f"{tag}_low": float(np.ravel(lo)[0]), f"{tag}_high": float(np.ravel(hi)[0])})
        rows.append(row)
    return pd.DataFrame(rows).sort_values("retrieval_n", ascending=False).reset_index(drop=True)
