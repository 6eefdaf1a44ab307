"""Parent-child and merged results as the reports show them (docs/method.md section 14), one call a cell.

WeKnora's merge shows a child hit with its parent's content, and the run is scored on what the user sees
(:mod:`weknora_nb.analysis.shown`). :func:`shown_figures` (notebook 02) sets the figures as shown beside the
results' own ids, with a sentence that says why they differ; :func:`degraded_by_scoring` (notebook 04) lists the
queries that one scoring calls degraded and the other does not. A run whose results show nothing besides their
own ids gets one sentence saying both figures are the same.
"""

from __future__ import annotations

import pandas as pd
from IPython.display import HTML

from weknora_nb.analysis.shown import degraded_either_way, result_counts, showing_more, shown_vs_own_ids
from weknora_nb.core.run import Run
from weknora_nb.reports import safe

#: the metric added when the run has none that covers the results returned (method section 14: read the as-shown
#: figure at a K that covers them)
COVERING = "recall@50"

_SAME = ("No result of this run shows chunks besides its own id (no parent-child knowledge base, nothing merged): "
         "its figures as the user sees the results and on the results' own ids are the same.")


def shown_figures(run: Run, *, metrics: list[str] | None = None) -> HTML:
    """The metrics of every stage whose results show other chunks, as shown and on own ids only, and what the
    difference means at the stage where it is largest."""
    counts = result_counts(run)
    stages = [s for s in run.scores.stages if counts["showing_more"].get(s, 0) > 0]
    if not stages:
        return HTML(safe.text(_SAME))
    names = list(metrics or run.scores.metric_names)
    if COVERING not in names:
        names.append(COVERING)
    table = shown_vs_own_ids(run, names, stages, counts=counts)
    parts = [safe.text(_explain(table)), safe.table(_readable(table))]
    return HTML("\n".join(parts))


def degraded_by_scoring(run: Run, stage: str, *, k: int = 10, recall_below: float = 0.3,
                        ndcg_below: float = 0.5) -> HTML:
    """The queries of ``stage`` degraded as the user sees the results but not on their own ids, and the other way
    round; a sentence when the stage's results show nothing besides their own ids."""
    if showing_more(run).get(stage, 0) == 0:
        return HTML(safe.text(f"No result of stage {stage} shows chunks besides its own id: the degraded queries are "
                              "the same as shown and on own ids."))
    table = degraded_either_way(run, stage, k=k, recall_below=recall_below, ndcg_below=ndcg_below)
    shown_only = int((table["degraded"] == "as shown only").sum())
    own_only = len(table) - shown_only
    said = (f"At stage {stage}, {len(table)} queries change sides when the results are scored on their own ids "
            f"instead of as shown: {own_only} are degraded only on own ids (the parent or merged chunks a result "
            f"shows hold their relevant chunks: the user saw them), {shown_only} only as shown (a result before "
            f"theirs shows a whole parent and pushes their relevant chunks down, past rank {k} or lower in NDCG@10). "
            "The causes above are those of the as-shown figures.")
    return HTML(safe.text(said) + (safe.table(table.round(3)) if len(table) else ""))


def _explain(table: pd.DataFrame) -> str:
    """The sentence under the table: where the unfolding changes most, in which direction, and why."""
    at = table.loc[table["difference"].abs().idxmax()]
    first = table[table["stage"] == at["stage"]].iloc[0]
    text = (f"{int(first['results_showing_more'])} of {int(first['results'])} results of stage {at['stage']} show "
            f"chunks besides their own id (a child shown with its parent's content, or merged neighbours). Scored "
            f"as the user sees them, {at['metric']} is {at['as_shown']:.3f}; on the results' own ids it is "
            f"{at['own_ids']:.3f}.")
    falls = table[table["difference"] < 0]
    if len(falls):
        where = "; ".join(f"at {stage}: {', '.join(dict.fromkeys(group['metric']))}"
                          for stage, group in falls.groupby("stage", sort=False))
        text += (f" Lower as shown {where}. A result that shows a parent of n children takes n + 1 positions, so a "
                 "relevant chunk the next result shows moves down: at a small K the as-shown figure can fall below "
                 f"the own-id one. Read it at a K that covers the results ({COVERING}) and beside the own-id figure.")
    return text


def _readable(table: pd.DataFrame) -> pd.DataFrame:
    """The table with the column names a reader reads."""
    return (table[["stage", "metric", "as_shown", "own_ids", "difference"]].round(3)
            .rename(columns={"as_shown": "as the user sees it", "own_ids": "own ids only"}))
