"""What the comparison notebook (05) shows beyond the deltas, one call a cell (docs/method.md sections
7, 10, 11 and 13): effect sizes and what the test set can detect, margins, the two sources of noise,
the query types that gain, every version side by side, label coverage and the answers.

Each function returns something Jupyter displays (escaped HTML from :mod:`.safe`, or a figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import HTML

from weknora_nb.analysis import evidence, groups
from weknora_nb.analysis.answer_compare import compare_answers, deltas_by_type
from weknora_nb.analysis.answers import judge_model
from weknora_nb.analysis.compare import Comparison, rank_versions
from weknora_nb.analysis.coverage import COVERAGE_K, coverage_bounds, coverage_table
from weknora_nb.core.answers import read_answers
from weknora_nb.core.pipeline import HEADLINE_METRIC
from weknora_nb.core.run import ANSWERS
from weknora_nb.reports import evidence_figures, safe


def headline_metric(cmp: Comparison) -> str:
    """The metric these views use: the headline metric when it was compared, else the first compared."""
    return HEADLINE_METRIC if f"{HEADLINE_METRIC}_a" in cmp.per_query else str(cmp.metrics["metric"].iloc[0])


def _deltas(cmp: Comparison, metric: str) -> dict[str, np.ndarray]:
    return {run: (g[f"{metric}_b"] - g[f"{metric}_a"]).to_numpy()
            for run, g in cmp.per_query.groupby("run", sort=False)}


def _html(df: pd.DataFrame, note: str = "") -> HTML:
    return HTML(safe.table(df.round(4)) + (safe.text(note) if note else ""))


def effect_sizes(cmp: Comparison, *, detect: Sequence[float] = (0.01, 0.02)) -> HTML:
    """Per compared run: delta, d_z, the minimum detectable effect at 80 % power, and for each effect
    of ``detect`` the valid queries needed and the power the test set has now."""
    metric = headline_metric(cmp)
    rows = [evidence.effect_table({metric: d}, detect={metric: D}).assign(run=run)
            for run, d in _deltas(cmp, metric).items() for D in detect]
    cols = ["run", "metric", "n", "delta", "sd", "d_z", "mde", "detect", "n_needed", "power_now"]
    table = pd.concat(rows, ignore_index=True)
    flat = sorted(set(table.loc[table["degenerate"], "run"]))
    note = (f"Degenerate comparison ({', '.join(flat)}): every query's difference is the same, so no effect size, "
            "detectable effect or number of queries can be given (is a run compared with itself?)." if flat else "")
    return _html(table[[c for c in cols if c in table.columns]], note)


def margins(cmp: Comparison, *, margin: float = 0.02, resamples: int = 2000) -> HTML:
    """The non-inferiority and "not worse" verdicts of the headline delta at ``margin`` (section 13), with the rule."""
    metric = headline_metric(cmp)
    bounds = [evidence.Bound("non-inferior", metric, margin), evidence.Bound("not-worse", metric, margin)]
    table = pd.concat([evidence.evidence_bounds({metric: d}, bounds, resamples=resamples).assign(run=run)
                       for run, d in _deltas(cmp, metric).items()], ignore_index=True)
    cols = ["run", "kind", "metric", "margin", "delta", "ci_low", "ci_high", "verdict", "passed"]
    return _html(table[cols], evidence.rule_text(len(bounds)))


def noise(cmp: Comparison, *, resamples: int = 2000) -> HTML:
    """How much of each interval comes from the sample of queries and how much from run-to-run variation."""
    metric = headline_metric(cmp)
    at_stage = {r.name: r.scores.per_query[r.scores.per_query["stage"] == cmp.stage] for r in cmp.runs}
    base = cmp.runs[0].name
    rows = [evidence.noise_split(v, [metric], resamples=resamples, baseline=None if name == base else at_stage[base])
            .assign(run=name, figure_of="mean" if name == base else f"delta vs {base}")
            for name, v in at_stage.items()]
    cols = ["run", "figure_of", "metric", "figure", "ci_low", "ci_high", "share_queries", "share_repeats"]
    return _html(pd.concat(rows, ignore_index=True)[cols])


def group_gains(cmp: Comparison, run: str, *, resamples: int = 2000) -> Any:
    """The forest plot of the headline delta per query type and tag for ``run``."""
    return evidence_figures.group_gain_chart(groups.group_gains(cmp, run=run, metric=headline_metric(cmp),
                                                                 resamples=resamples))


def recommend_groups(cmp: Comparison, run: str, *, resamples: int = 2000) -> HTML:
    """Where the change pays and where it does not, with the latency it costs each group."""
    gains = groups.group_gains(cmp, run=run, metric=headline_metric(cmp), resamples=resamples)
    return HTML(safe.text(gains.recommendation))


def versions(cmp: Comparison, *, resamples: int = 2000) -> Any:
    """Every version's NDCG, MRR, hit rate and latency side by side."""
    return evidence_figures.versions_chart(cmp, resamples=resamples)


def ranking(cmp: Comparison, *, resamples: int = 2000) -> HTML:
    """The versions ranked, with which differences are resolved (Holm across every pair)."""
    return HTML(safe.text(rank_versions(cmp, metric=headline_metric(cmp), resamples=resamples).describe()))


def coverage(cmp: Comparison) -> HTML:
    """judged@K of every run at the compared stage, and the headline delta with the unjudged chunks
    taken as irrelevant (as scored) and as relevant: the two ends of what judging them could give."""
    judged = coverage_table(cmp.runs, stages=[cmp.stage]).rename(columns={cmp.stage: f"judged@{COVERAGE_K}"})
    metric = headline_metric(cmp)
    bounds = pd.concat([coverage_bounds(cmp.runs[0], other, cmp.stage, [metric]).assign(run=other.name)
                        for other in cmp.runs[1:]], ignore_index=True)
    cols = ["run", "metric", "delta_irrelevant", "delta_relevant"]
    return HTML(safe.table(judged.round(3), index=True) + safe.table(bounds[cols].round(4)))


def answers(cmp: Comparison, *, resamples: int = 2000) -> HTML:
    """The answer metrics' deltas (judge 1-5, citations 0-1) beside the headline retrieval delta."""
    metric = headline_metric(cmp)
    retrieval = cmp.metrics[cmp.metrics["metric"] == metric][["run", "baseline", "metric", "n_queries", "mean_a",
                                                             "mean_b", "delta", "ci_low", "ci_high", "p_holm"]]
    parts = [retrieval.assign(kind=f"retrieval ({cmp.stage})")]
    for other in cmp.runs[1:]:
        t = compare_answers(cmp.runs[0], other, resamples=resamples)
        if len(t):
            parts.append(t.drop(columns=["p_value"]).assign(kind="answer (citations)"))
    table = pd.concat(parts, ignore_index=True)
    if len(parts) == 1:
        return _html(table, "No run holds answers (a citations stage) or judgements: only retrieval is compared.")
    same = [o.name for o in cmp.runs[1:] if _same_answers(cmp.runs[0], o)]
    note = (f"{', '.join(same)} gave the very same answers as {cmp.runs[0].name}: the change did not reach the "
            "chat, which runs the server's conversation settings (docs/weknora-contract.md C66), so every answer "
            "delta is 0 whatever the retrieval delta." if same else "")
    return _html(table[["kind", *[c for c in table.columns if c != "kind"]]], note)


def _same_answers(a: Any, b: Any) -> bool:
    """True when both runs' answers files hold the same answers (and citations) for the same requests."""
    pa, pb = a.path / ANSWERS, b.path / ANSWERS
    if not (pa.is_file() and pb.is_file()):
        return False
    key = ["query_id", "stage", "repeat"]
    ta, tb = read_answers(pa).sort_values(key), read_answers(pb).sort_values(key)
    return len(ta) == len(tb) and ta[key + ["answer"]].reset_index(drop=True).equals(
        tb[key + ["answer"]].reset_index(drop=True))


def answers_by_type(cmp: Comparison, run: str, *, answer_metric: str = "judge.correctness",
                    resamples: int = 2000) -> HTML:
    """Per query type, the retrieval delta beside the answer delta for ``run``."""
    other = next(r for r in cmp.runs if r.name == run)
    t = deltas_by_type(cmp.runs[0], other, stage=cmp.stage, retrieval_metric=headline_metric(cmp),
                       answer_metric=answer_metric, resamples=resamples)
    return _html(t)


def judge_note(runs: Sequence[Any]) -> HTML | None:
    """Which judge scored the runs' answers; a rule-based one is named as such (never as an LLM)."""
    lines = []
    for run in runs:
        m = judge_model(run)
        if not m:
            continue
        served = ", ".join(m.get("served_models") or [str((m.get("judge") or {}).get("model", "?"))])
        kind = "a deterministic rule-based judge, not a language model" if m.get("rule_based") else "an LLM judge"
        lines.append(f"{run.name}: judged by {served} ({kind}).")
    return HTML(safe.bullets(lines)) if lines else None
