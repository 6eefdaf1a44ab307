"""Regression gate: fail a build when retrieval quality falls below bounds.

::

    weknora-nb gate --run outputs/runs/new --baseline outputs/runs/main \\
        --min ndcg@5=0.70 --min hit@5=0.85 --max-drop ndcg@5=0.02

Checks (each a row of the printed table): every ``--min metric=value`` (the run's mean at the
stage is at least the value), every ``--max-drop metric=value`` (the baseline's mean minus the
run's is at most the value; needs ``--baseline`` on the same test set), and completeness (a run
with failed or missing requests fails unless ``--allow-incomplete``). Exit 0 when all pass,
1 when a bound is broken, 2 on unusable input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from weknora_nb.core.errors import NotComparableError, UsageError
from weknora_nb.core.metrics import parse_metric
from weknora_nb.core.run import Run, load_run

__all__ = ["GateResult", "gate", "parse_bounds"]


@dataclass
class GateResult:
    table: pd.DataFrame  # check, metric, value, bound, passed
    stage: str
    passed: bool

    def describe(self) -> str:
        lines = [f"stage {self.stage}:"]
        for r in self.table.itertuples():
            value = "" if pd.isna(r.value) else f"{r.value:.4f}"
            lines.append(f"  {'PASS' if r.passed else 'FAIL'}  {r.check:<10} {r.metric:<14} {value:>8}  "
                         f"{r.bound}")
        lines.append("gate passed" if self.passed else "gate FAILED")
        return "\n".join(lines)


def parse_bounds(items: list[str] | None) -> dict[str, float]:
    """``["ndcg@5=0.7", ...]`` to ``{"ndcg@5": 0.7}`` (metric names checked)."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"a bound looks like METRIC=VALUE, e.g. ndcg@5=0.70. Got {item!r} instead.")
        metric = parse_metric(name).name
        not_a_number = f"the value of a bound must be a number, e.g. ndcg@5=0.70. Got {item!r} instead."
        try:
            bound = float(value)
        except ValueError:
            raise UsageError(not_a_number) from None
        if bound != bound:
            raise UsageError(not_a_number)
        out[metric] = bound
    return out


def gate(run: str | Path | Run, *, baseline: str | Path | Run | None = None, stage: str | None = None,
         minimums: dict[str, float] | None = None, max_drops: dict[str, float] | None = None,
         allow_incomplete: bool = False) -> GateResult:
    """Evaluate the bounds on ``run`` (and against ``baseline``); see the module docstring."""
    minimums, max_drops = minimums or {}, max_drops or {}
    if not minimums and not max_drops:
        raise UsageError("give at least one bound (--min or --max-drop)")
    if max_drops and baseline is None:
        raise UsageError("--max-drop needs --baseline")
    metrics = list(dict.fromkeys([*minimums, *max_drops]))
    r = run if isinstance(run, Run) else load_run(run, metrics=metrics)
    st = r.focus_stage(stage)
    rows = []
    means = r.scores.summary_wide().loc[st]
    for m, bound in minimums.items():
        rows.append({"check": "min", "metric": m, "value": means[m], "bound": f">= {bound:g}",
                     "passed": bool(means[m] >= bound)})
    if baseline is not None:
        b = baseline if isinstance(baseline, Run) else load_run(baseline, testset=r.testset, metrics=metrics)
        if b.testset.hash != r.testset.hash:
            raise NotComparableError("the run and the baseline were collected on different test sets")
        if st not in b.stages:
            raise NotComparableError(f"the baseline {b.name} has no stage {st!r} (stages: {b.stages})")
        base_means = b.scores.summary_wide().loc[st]
        for m, drop in max_drops.items():
            d = base_means[m] - means[m]
            rows.append({"check": "max-drop", "metric": m, "value": d,
                         "bound": f"<= {drop:g} (baseline {base_means[m]:.4f})", "passed": bool(d <= drop)})
    rows.append({"check": "complete", "metric": "requests", "value": float(r.scores.counts.n_failed
                                                                           + r.scores.counts.n_missing),
                 "bound": "0 failed or missing" + (" (allowed)" if allow_incomplete else ""),
                 "passed": bool(r.scores.complete or allow_incomplete)})
    table = pd.DataFrame(rows)
    return GateResult(table, st, bool(table["passed"].all()))
