"""Plain-text rendering of scores for terminals and logs."""

from __future__ import annotations

import pandas as pd

from weknora_nb.core.scoring import Counts, Scores

#: invalid query ids listed before "(+N more)"
MAX_IDS_SHOWN = 20


def format_scores(scores: Scores) -> str:
    """A table: one row per stage, one column per metric, ``mean ±std tier`` in each cell
    (the spread only with several repeats), then the counts, the test-set hash and the
    warnings."""
    names = scores.metric_names
    header = ["stage", *names]
    s = scores.summary.set_index(["stage", "metric"])
    rows = [[stage, *(_cell(s.loc[(stage, m)]) for m in names)] for stage in scores.stages]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True))

    out = [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out += ["", *_count_lines(scores.counts), f"test set: {scores.testset_hash}"]
    out += [f"WARNING: {w}" for w in scores.warnings]
    return "\n".join(out)


def _cell(r: pd.Series) -> str:
    """``mean`` to 4 places, `` ±std`` when there are several repeats, then the tier if any."""
    cell = f"{r['mean']:.4f}"
    if r["n_repeats"] > 1:
        cell += f" ±{r['std']:.4f}"
    if isinstance(r["tier"], str):
        cell += f" {r['tier']}"
    return cell


def _count_lines(c: Counts) -> list[str]:
    """The counts line, then failures by kind, the skipped and the invalid query ids when there are any."""
    out = [f"queries: {c.n_queries}  valid: {c.n_valid}  invalid: {c.n_invalid}  "
           f"scored requests: {c.n_scored}  failed: {c.n_failed}  skipped: {c.n_skipped}  missing: {c.n_missing}  "
           f"unknown: {c.n_unknown_query}  duplicates removed: {c.n_duplicates_removed}  "
           f"repeats: {c.repeats}"]
    if c.failed_by_kind:
        out.append("failed by kind: " + ", ".join(f"{k}={v}" for k, v in c.failed_by_kind.items()))
    if c.skipped_ids:
        shown = c.skipped_ids[:MAX_IDS_SHOWN]
        more = f" (+{len(c.skipped_ids) - MAX_IDS_SHOWN} more)" if len(c.skipped_ids) > MAX_IDS_SHOWN else ""
        out.append("skipped retrieval (not failed, not scored): " + ", ".join(shown) + more)
    if c.invalid_ids:
        shown = c.invalid_ids[:MAX_IDS_SHOWN]
        more = f" (+{len(c.invalid_ids) - MAX_IDS_SHOWN} more)" if len(c.invalid_ids) > MAX_IDS_SHOWN else ""
        out.append("invalid queries: " + ", ".join(shown) + more)
    return out
