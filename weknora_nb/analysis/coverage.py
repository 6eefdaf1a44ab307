"""Label coverage: how much of what a run returned carries a label (docs/method.md section 10).

Every metric counts an unlabelled chunk as grade 0. When a system changes, it returns chunks
nobody has judged, so its figures drop for want of labels, not of relevance: a comparison is
biased towards the version the labels were made on. Coverage says how far to trust it:

- ``judged@K`` per run and stage (:func:`coverage_table`): labelled chunks in the top K over
  min(K, chunks returned), mean over the valid queries scored (``core.metrics``).
- **Bounds** (:func:`coverage_bounds`): each metric as scored (unjudged = grade 0) and with
  every unjudged chunk in the runs' top ``depth`` taken as grade 1 (partly relevant; R and
  IDCG grow with those chunks too), and the delta under each: the two ends between which the
  delta moves as the unjudged chunks get judged.
- A **warning** (:func:`coverage_warning`) when the compared run's judged@K is lower than the
  baseline's by more than ``threshold`` (default 0.05, i.e. 5 points of coverage).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from weknora_nb.core.results import ResultCodes
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

#: the cutoff of the coverage figure reports show beside every metric table
COVERAGE_K = 10
#: the largest drop of judged@K between baseline and compared run before a comparison is flagged
COVERAGE_DROP = 0.05


def _judged_means(testset: TestSet, results: pd.DataFrame | ResultCodes, k: int,
                  stages: list[str] | None) -> pd.Series:
    sc = score(testset, results, [f"judged@{k}"], stages=stages)
    return sc.summary_wide()[f"judged@{k}"]


def coverage_table(runs: Iterable[Run], *, k: int = COVERAGE_K, stages: Iterable[str] | None = None) -> pd.DataFrame:
    """judged@K per run (rows) and stage (columns), in [0, 1]; a stage a run lacks is NaN."""
    wanted = list(stages) if stages is not None else None
    rows = {}
    for run in runs:
        present = [s for s in (wanted or run.stages) if s in run.stages]
        rows[run.name] = _judged_means(run.testset, run.codes, k, present) if present else pd.Series(dtype=float)
    return pd.DataFrame(rows).T


def unjudged_as_relevant(testset: TestSet, results: Iterable[pd.DataFrame], *, depth: int,
                         stage: str | None = None) -> TestSet:
    """``testset`` with grade 1 for every unlabelled chunk in the top ``depth`` of any of ``results``.

    Only ``ok`` rows of valid queries count (an invalid query stays invalid: the upper bound
    must not turn unlabelled queries into scored ones). The content hash changes: this test
    set is for the bound only.
    """
    valid = set(testset.valid_ids)
    added: dict[str, dict[str, int]] = {}
    labelled = set(zip(testset.qrels["query_id"], testset.qrels["chunk_id"], strict=True))
    for df in results:
        rows = df[(df["status"] == "ok") & df["chunk_id"].notna() & (df["rank"] <= depth)
                  & df["query_id"].isin(valid)]
        if stage is not None:
            rows = rows[rows["stage"] == stage]
        for q, c in zip(rows["query_id"], rows["chunk_id"], strict=True):
            if (q, c) not in labelled:
                added.setdefault(q, {})[c] = 1
    records = testset.records()
    for r in records:
        r["relevant"] = {**added.get(r["query_id"], {}), **r["relevant"]}
    return TestSet.from_records(records, source=f"{testset.source} (unjudged as grade 1)")


def coverage_bounds(base: Run, other: Run, stage: str, metrics: Iterable[str], *, depth: int = 20) -> pd.DataFrame:
    """Per metric, the two extreme labellings of the unjudged chunks: each run's mean with them
    irrelevant (``a_irrelevant``, ``b_irrelevant``: as scored) and relevant (grade 1:
    ``a_relevant``, ``b_relevant``), the delta B - A under each (``delta_irrelevant``,
    ``delta_relevant``), and ``delta_low`` / ``delta_high``, the smaller and the larger.

    Both runs are scored on one widened test set (the unjudged chunks in either run's top
    ``depth`` at ``stage``). Recall and NDCG are not monotone in added labels (R and IDCG grow
    too), so a run's value with unjudged as relevant can be the lower one: these are the two
    ends of a judgement, not an interval around the truth.
    """
    wide = unjudged_as_relevant(base.testset, [base.results, other.results], depth=depth, stage=stage)
    out = []
    for m in metrics:
        row: dict[str, float | str] = {"metric": m}
        for tag, run in (("a", base), ("b", other)):
            row[f"{tag}_irrelevant"] = _mean(run.testset, run, m, stage)
            row[f"{tag}_relevant"] = _mean(wide, run, m, stage)
        d_irr = float(row["b_irrelevant"]) - float(row["a_irrelevant"])
        d_rel = float(row["b_relevant"]) - float(row["a_relevant"])
        row.update(delta_irrelevant=d_irr, delta_relevant=d_rel, delta_low=min(d_irr, d_rel),
                   delta_high=max(d_irr, d_rel))
        out.append(row)
    return pd.DataFrame(out)


def _mean(testset: TestSet, run: Run, metric: str, stage: str) -> float:
    return float(score(testset, run.codes, [metric], stages=[stage]).summary_wide().loc[stage, metric])


def coverage_warning(base: Run, other: Run, stage: str, *, k: int = COVERAGE_K,
                     threshold: float = COVERAGE_DROP) -> str | None:
    """A sentence when ``other``'s judged@K at ``stage`` is below ``base``'s by more than ``threshold``."""
    a = float(_judged_means(base.testset, base.codes, k, [stage]).get(stage, float("nan")))
    b = float(_judged_means(other.testset, other.codes, k, [stage]).get(stage, float("nan")))
    if not (a - b > threshold):
        return None
    return (f"{other.name} has fewer labelled chunks in its top {k} than {base.name} at stage {stage} "
            f"(judged@{k} {b:.2f} vs {a:.2f}): unjudged chunks count as irrelevant, so its figures are biased "
            f"downwards. Label its pool (weknora-nb testset pool) or read the bounds with unjudged as relevant.")
