"""The figures as the user sees the results beside the figures of the results' own ids (docs/method.md section 14).

WeKnora's merge step shows a child hit with its parent's content (parent-child knowledge bases, the web UI's
default) and folds neighbouring chunks into one result. A run is scored as the user sees it: each result is
followed by the chunks whose content it shows (``sub_chunks="expand"``, :mod:`weknora_nb.core.unfold`). The
same results scored on their own ids only (``sub_chunks="ignore"``) is the child-id-only figure. The two differ
in two directions:

- **credit**: a relevant chunk the result shows (the parent, a sibling) counts as found, so recall at a K that
  covers the results rises;
- **rank**: a result that shows a parent of n children takes n + 1 positions, so a relevant chunk the *next*
  result shows moves down by n; rank-sensitive figures at a small K (hit@5, ndcg@5) can fall.

Both are computed on the same valid queries and requests (one basis: a stage's figure is the mean of per-query
means over repeats), so their difference is the unfolding alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pandas as pd

from weknora_nb.core.scoring import score

if TYPE_CHECKING:
    from weknora_nb.core.run import Run

#: the columns of :func:`shown_vs_own_ids`
COLUMNS = ["stage", "metric", "as_shown", "own_ids", "difference", "results_showing_more", "results"]


def result_counts(run: Run) -> pd.DataFrame:
    """Per stage (the index), the successful result rows (``results``) and those that show chunks besides their
    own (``showing_more``: a non-empty ``shown_chunk_ids``, else, for runs collected before that column, a
    ``sub_chunk_ids`` that names another chunk than the row's own)."""
    res = run.results
    if "chunk_id" not in res.columns or not len(res):
        return pd.DataFrame({"results": pd.Series(dtype="int64"), "showing_more": pd.Series(dtype="int64")})
    rows = res[res["chunk_id"].notna()]
    shown = rows["shown_chunk_ids"] if "shown_chunk_ids" in rows.columns else pd.Series(None, index=rows.index)
    subs = rows["sub_chunk_ids"] if "sub_chunk_ids" in rows.columns else pd.Series(None, index=rows.index)
    more = [_names_others(s if _given(s) else b, own) for s, b, own in zip(shown, subs, rows["chunk_id"], strict=True)]
    by_stage = pd.Series(more, index=rows.index, dtype="int64").groupby(rows["stage"].astype(str), sort=False)
    return pd.DataFrame({"results": by_stage.size(), "showing_more": by_stage.sum()}).astype("int64")


def showing_more(run: Run) -> pd.Series:
    """Per stage, how many successful result rows show chunks besides their own (:func:`result_counts`)."""
    return result_counts(run)["showing_more"]


def shown_vs_own_ids(run: Run, metrics: Iterable[str] | None = None, stages: Iterable[str] | None = None, *,
                     counts: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each metric at each stage scored as shown (the run's scores) and on the results' own ids only.

    Columns :data:`COLUMNS`: ``as_shown`` and ``own_ids`` are the stage's means (the mean over valid queries of
    each query's mean over its scored repeats), ``difference`` = as_shown - own_ids, ``results_showing_more``
    the result rows of the stage that show other chunks out of ``results`` (``counts``: :func:`result_counts`
    when the caller has it already). A stage with no scored request has no row.
    """
    names = list(metrics) if metrics is not None else run.scores.metric_names
    wanted = [s for s in (list(stages) if stages is not None else run.scores.stages) if s in run.scores.stages]
    if not wanted:
        return pd.DataFrame(columns=COLUMNS)
    shown = run.scores if set(names) <= set(run.scores.metric_names) else \
        score(run.testset, run.results, names, stages=wanted)
    own = score(run.testset, run.results, names, stages=wanted, sub_chunks="ignore")
    a, b = shown.summary_wide(), own.summary_wide()
    counts = result_counts(run) if counts is None else counts
    more, total = counts["showing_more"], counts["results"]
    rows = [{"stage": st, "metric": m, "as_shown": float(a.loc[st, m]), "own_ids": float(b.loc[st, m]),
             "difference": float(a.loc[st, m] - b.loc[st, m]), "results_showing_more": int(more.get(st, 0)),
             "results": int(total.get(st, 0))}
            for st in wanted if st in a.index and st in b.index for m in names]
    return pd.DataFrame(rows, columns=COLUMNS)


def degraded_either_way(run: Run, stage: str, *, k: int = 10, recall_below: float = 0.3,
                        ndcg_below: float = 0.5) -> pd.DataFrame:
    """The queries of ``stage`` degraded under one scoring and not under the other (the rule of
    :func:`weknora_nb.analysis.diagnose.degraded_queries`: recall@k < recall_below or ndcg@10 < ndcg_below, per
    query averaged over repeats).

    Columns: query_id, ``recall@k`` and ``ndcg@10`` as shown and on own ids (suffixes ``(shown)``, ``(own ids)``),
    ``degraded`` (``as shown only`` or ``own ids only``).
    """
    names = [f"recall@{k}", "ndcg@10"]
    out = ["query_id", *(f"{m} ({w})" for w in ("shown", "own ids") for m in names), "degraded"]
    if stage not in run.scores.stages:
        return pd.DataFrame(columns=out)
    both = [score(run.testset, run.results, names, stages=[stage], sub_chunks=how).per_query_mean()
            .set_index("query_id")[names] for how in ("expand", "ignore")]
    shown, own = both[0], both[1].reindex(both[0].index)
    bad = [(pq[names[0]] < recall_below) | (pq[names[1]] < ndcg_below) for pq in (shown, own)]
    differs = bad[0] != bad[1]
    table = pd.concat([shown[differs].add_suffix(" (shown)"), own[differs].add_suffix(" (own ids)")], axis=1)
    table["degraded"] = ["as shown only" if b else "own ids only" for b in bad[0][differs]]
    return table.reset_index()[out]


def _given(value: object) -> bool:
    """A list value a results column gives (``[]`` included), as :mod:`weknora_nb.core.unfold` reads it."""
    return value is not None and not (isinstance(value, float) and value != value)


def _names_others(value: object, own: object) -> bool:
    """Whether a ``shown_chunk_ids`` / ``sub_chunk_ids`` value (a JSON list of ids, or a list) names a chunk
    other than ``own``."""
    if not _given(value):
        return False
    ids = json.loads(value) if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    return any(i is not None and i != own for i in ids)
