"""Plain-text rendering of scores for terminals and logs."""

from __future__ import annotations

from weknora_nb.core.scoring import Scores

__all__ = ["format_scores"]

def format_scores(scores: Scores) -> str:
    """A table: one row per stage, one column per metric, ``mean ±std tier`` in each cell,
    then the counts and warnings."""
    names = scores.metric_names
    header = ["stage"] + names
    rows = []
    s = scores.summary.set_index(["stage", "metric"])
    for stage in scores.stages:
        cells = [stage]
        for m in names:
            r = s.loc[(stage, m)]
            cell = f"{r['mean']:.4f}"
            if r["n_repeats"] > 1:
                cell += f" ±{r['std']:.4f}"
            if isinstance(r["tier"], str):
                cell += f" {r['tier']}"
            cells.append(cell)
        rows.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    c = scores.counts
    out.append("")
    out.append(f"queries: {c['n_queries']}  valid: {c['n_valid']}  invalid: {c['n_invalid']}  "
               f"scored requests: {c['n_scored']}  failed: {c['n_failed']}  missing: {c['n_missing']}  "
               f"unknown: {c['n_unknown_query']}  duplicates removed: {c['n_duplicates_removed']}  "
               f"repeats: {c['repeats']}")
    if c["failed_by_kind"]:
        out.append("failed by kind: " + ", ".join(f"{k}={v}" for k, v in c["failed_by_kind"].items()))
    if c["invalid_ids"]:
        shown = c["invalid_ids"][:20]
        more = f" (+{len(c['invalid_ids']) - 20} more)" if len(c["invalid_ids"]) > 20 else ""
        out.append("invalid queries: " + ", ".join(shown) + more)
    out.append(f"test set: {scores.testset_hash}")
    for w in scores.warnings:
        out.append(f"WARNING: {w}")
    return "\n".join(out)
