"""Tables for the notebooks: figures with intervals, tier colours, and escaped HTML.

Every text that comes from the knowledge base, the test set or the run (stage names
included) is HTML-escaped before it reaches a report, by the one rule of
:mod:`weknora_nb.reports.safe`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.stats import bootstrap_ci
from weknora_nb.core.errors import UsageError
from weknora_nb.core.pipeline import focus_stage
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import Scores
from weknora_nb.core.tiers import tier
from weknora_nb.reports import safe
from weknora_nb.reports.safe import esc

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler


#: background colour of each acceptance tier in tables (and bar edges in figures)
TIER_COLOURS = {"excellent": "#1a9850", "good": "#91cf60", "pass": "#fee08b", "fail": "#f46d43"}


def metric_table(scores: Scores, *, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per (stage, metric): mean, 95 % bootstrap CI over queries, spread across repeats, tier, n.

    The tiers are the scores' (after their ``domain_adjustment``, which the table carries in
    ``attrs["domain_adjustment"]`` for :func:`style_tiers`'s caption).
    """
    pq = scores.per_query_mean()
    rows = []
    summ = scores.summary.set_index(["stage", "metric"])
    for stage in scores.stages:
        vals = pq.loc[pq["stage"] == stage, scores.metric_names].to_numpy()
        lo, hi = (np.atleast_1d(x) for x in bootstrap_ci(vals, resamples=resamples, seed=seed))
        for j, m in enumerate(scores.metric_names):
            s = summ.loc[(stage, m)]
            rows.append({"stage": stage, "metric": m, "mean": s["mean"], "ci_low": lo[j], "ci_high": hi[j],
                         "repeat_std": s["std"], "n_queries": int(s["n_queries"]), "tier": s["tier"]})
    table = pd.DataFrame(rows)
    table.attrs["domain_adjustment"] = scores.domain_adjustment
    return table


def _mean_and_interval(mean: Any, low: Any, high: Any) -> str:
    """``0.564 [0.512, 0.611]`` (:func:`weknora_nb.reports.cells.number`); blank parts for missing values."""
    from weknora_nb.reports.cells import number

    interval = f" [{number(low)}, {number(high)}]" if number(low) and number(high) else ""
    return number(mean) + interval if number(mean) else ""


def style_tiers(table: pd.DataFrame, *, domain_adjustment: float | None = None) -> Styler:
    """Stages x metrics, ``mean [low, high]`` in each cell, coloured by tier (a legend in the caption).

    The colours are the table's ``tier`` column (:func:`metric_table`: the scores' tiers, after
    their domain adjustment). Given a ``domain_adjustment``, each cell's tier is recomputed
    from its mean with it instead (:func:`weknora_nb.core.tiers.tier`), so that the colours
    and the caption never disagree.
    """
    if domain_adjustment is None:
        domain_adjustment = float(table.attrs.get("domain_adjustment", 0.0))
    else:
        table = table.assign(tier=[tier(m, v, domain_adjustment) for m, v in
                                   zip(table["metric"], table["mean"], strict=True)])
    cells = table.assign(text=[_mean_and_interval(m, lo, hi) for m, lo, hi in
                               zip(table["mean"], table["ci_low"], table["ci_high"], strict=True)])
    text = cells.pivot(index="stage", columns="metric", values="text")
    tiers = cells.pivot(index="stage", columns="metric", values="tier")
    order_s = list(dict.fromkeys(table["stage"]))
    order_m = list(dict.fromkeys(table["metric"]))
    text, tiers = text.loc[order_s, order_m], tiers.loc[order_s, order_m]

    def colour(col: pd.Series) -> list[str]:
        return [f"background-color: {TIER_COLOURS[t]}" if isinstance(t, str) else "" for t in tiers[col.name]]
    caption = "Tiers: " + ", ".join(
        f'<span style="background-color:{esc(c)};padding:0 6px">{esc(name)}</span>' for name, c in TIER_COLOURS.items())
    if domain_adjustment:
        caption += esc(f" (thresholds lowered by {domain_adjustment:.0%} for a specialised domain)")
    return safe.styled(text.style.apply(colour, axis=0)).set_caption(caption)


def html_table(df: pd.DataFrame, **kw: Any) -> str:
    """A DataFrame as escaped HTML (knowledge-base text is data, never markup): :func:`safe.table`."""
    return safe.table(df, **kw)


def counts_table(scores: Scores) -> pd.DataFrame:
    """Counts that every report carries: queries, invalid, failed, skipped, missing, duplicates."""
    c = scores.counts
    rows = [("queries in the test set", c.n_queries), ("valid queries", c.n_valid),
            ("invalid queries (excluded)", c.n_invalid), ("requests scored", c.n_scored),
            ("requests failed (excluded)", c.n_failed),
            ("chat requests that skipped retrieval (excluded, not failed)", c.n_skipped),
            ("requests missing (excluded)", c.n_missing),
            ("unknown query ids (excluded)", c.n_unknown_query),
            ("duplicate chunk ids removed", c.n_duplicates_removed),
            ("merged neighbour chunks unfolded", c.n_sub_chunks_expanded),
            ("repeats", ", ".join(map(str, c.repeats)))]
    return pd.DataFrame(rows, columns=["what", "count"])


def failed_stages(scores: Scores) -> dict[str, dict[str, int]]:
    """Each stage none of whose requests succeeded -> its requests by status (:meth:`Scores.failed_stages`)."""
    return scores.failed_stages()


def failure_lines(scores: Scores, stages: list[str] | None = None) -> list[str]:
    """One sentence per stage (of ``stages``, default all) whose every request failed, with the kinds."""
    failed = failed_stages(scores)
    return [f"Every request of stage {name} failed (kinds: "
            f"{', '.join(f'{kind} {n}' for kind, n in kinds.items())}): it has no figures."
            for name, kinds in failed.items() if stages is None or name in stages]


def all_stages(run: Run) -> list[str]:
    """The stages of the run's results: those scored (in report order), then the others (:attr:`Scores.all_stages`)."""
    return run.scores.all_stages


def report_stage(run: Run, requested: str | None = None) -> str:
    """The stage a report looks at: ``requested``, else ``final``, else the last of the pipeline
    (:func:`weknora_nb.core.pipeline.focus_stage`), among :func:`all_stages`: a stage whose every
    request failed can be the focus, and its report says so.

    Raises :class:`UsageError` naming the stages when ``requested`` is not one of them.
    """
    stages = all_stages(run)
    chosen = focus_stage(stages, requested, run.stage_definitions)
    if chosen is None:
        raise UsageError(argument="stage", allowed=stages, got=requested)
    return chosen
