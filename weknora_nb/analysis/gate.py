"""Regression gate: fail a build when retrieval quality falls below bounds, or when the evidence says so.

::

    weknora-nb gate --run outputs/runs/new --baseline outputs/runs/main \\
        --min ndcg@5=0.70 --min hit@5=0.85 --max-drop ndcg@5=0.02 \\
        --non-inferior ndcg@5=0.02 --not-worse recall@10=0.03 --detect ndcg@5=0.02

Checks (each a row of the printed table):

- every ``--min metric=value``: the run's mean at the stage is at least the value;
- every ``--max-drop metric=value``: the baseline's mean minus the run's is at most the value;
- every ``--non-inferior metric=margin``: passes only when the 95 % paired-bootstrap interval of
  the delta (run minus baseline, per query) lies above ``-margin``; ``fail`` when it lies entirely
  below, ``inconclusive`` otherwise, and inconclusive fails this bound;
- every ``--not-worse metric=margin``: fails only when the interval lies entirely below
  ``-margin`` (inconclusive passes this bound);
- completeness: a run with failed or missing requests fails unless ``allow_incomplete``.

``--max-drop``, ``--non-inferior``, ``--not-worse`` and ``--detect`` need a baseline on the same
test set. **Several bounds at once**: the gate passes only when every bound passes; each interval
is a 95 % interval of its own metric, not adjusted for the others (``adjust="none"``: for
non-inferiority this is the intersection-union test, whose error stays at 2.5 % whatever the
number of bounds); ``adjust="bonferroni"`` or ``"holm"`` keeps the false-alarm rate of several
``not-worse`` bounds near 2.5 % (see :mod:`weknora_nb.analysis.evidence`). The rule is printed under
the table.

With a baseline the gate also prints, per metric of a delta bound or ``--detect``: the delta, its
effect size d_z, the share of queries improving by more than ``improve_by`` (0: strictly better),
the minimum detectable effect at 80 % power and the interval's level, and, for ``--detect
metric=D``, the valid queries needed to detect D.

A bound's metric is a ranking metric of the registry (:func:`weknora_nb.core.metrics.parse_metric`)
or an answer metric (:func:`answer_metric_names`: ``judge.correctness``, ``citation_precision``, ...),
whose per-query values come from a provider ``answer_values(run) -> DataFrame[query_id, <metric
columns>]`` (means over repeats): :func:`weknora_nb.analysis.answers.answer_values` by default, or
the ``answer_values`` argument (index or column ``query_id``). Exit 0 when all pass, 1 when a bound
is broken, 2 on unusable input.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.evidence import (
    NON_INFERIOR,
    NOT_WORSE,
    Bound,
    effect_table,
    evidence_bounds,
    rule_text,
)
from weknora_nb.analysis.stats import DEFAULT_POWER, DEFAULT_RESAMPLES
from weknora_nb.core.errors import MetricError, NotComparableError, NothingScored, UsageError
from weknora_nb.core.metrics import parse_metric
from weknora_nb.core.pipeline import significance_warning
from weknora_nb.core.run import Run, load_run
from weknora_nb.core.scoring import Scores, score

#: a provider of answer metrics: one row per query, ``query_id`` and a column per answer metric
AnswerValues = Callable[[Run], pd.DataFrame]
JUDGE_PREFIX = "judge."


def answer_metric_names() -> tuple[str, ...]:
    """The answer metrics a bound may name (:data:`weknora_nb.analysis.answers.ANSWER_METRICS`:
    ``judge.<criterion>`` and the per-query citation metrics)."""
    from weknora_nb.analysis.answers import ANSWER_METRICS

    return tuple(ANSWER_METRICS)


def parse_metric_name(name: str) -> str:
    """The canonical name of a ranking metric (``NDCG@5`` -> ``ndcg@5``) or an answer metric as given;
    a :class:`MetricError` naming both kinds otherwise."""
    answers = answer_metric_names()
    if name.strip() in answers:
        return name.strip()
    try:
        return parse_metric(name).name
    except MetricError as exc:
        raise MetricError(f"{exc} Or an answer metric: {', '.join(answers)}.") from None


def parse_bounds(items: list[str] | None, *, what: str = "bound", minimum: float | None = None) -> dict[str, float]:
    """``["ndcg@5=0.7", ...]`` to ``{"ndcg@5": 0.7}`` (metric names checked, ranking or answer metrics).

    ``minimum``: the smallest value allowed (margins are >= 0).
    """
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"a {what} looks like METRIC=VALUE, e.g. ndcg@5=0.70. Got {item!r} instead.")
        metric = parse_metric_name(name)
        not_a_number = f"the value of a {what} must be a number, e.g. ndcg@5=0.70. Got {item!r} instead."
        try:
            bound = float(value)
        except ValueError:
            raise UsageError(not_a_number) from None
        if not math.isfinite(bound):
            raise UsageError(not_a_number)
        if minimum is not None and bound < minimum:
            raise UsageError(f"the value of a {what} must be >= {minimum:g}. Got {item!r} instead.")
        out[metric] = bound
    return out


@dataclass
class GateResult:
    """What :func:`gate` found.

    ``table``: one row per check (``check``, ``metric``, ``value``, ``bound``, ``passed``, and for
    evidence bounds ``verdict``, ``ci_low``, ``ci_high``, ``n``); ``bounds``: the evidence bounds in
    full (:func:`~weknora_nb.analysis.evidence.evidence_bounds`); ``effects``: per metric compared
    with the baseline (:func:`~weknora_nb.analysis.evidence.effect_table`); ``rule``: the rule for
    several bounds, in words.
    """

    table: pd.DataFrame
    stage: str
    passed: bool
    run: str = ""
    baseline: str | None = None
    bounds: pd.DataFrame | None = None
    effects: pd.DataFrame | None = None
    rule: str = ""
    level: float = 0.95
    power: float = DEFAULT_POWER
    improve_by: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """The gate's printed report: one line per check, the effect sizes, the rule, the verdict."""
        width = max([10, *(len(c) for c in self.table["check"])])
        mwidth = max([14, *(len(m) for m in self.table["metric"])])
        against = f" (run {self.run} against baseline {self.baseline})" if self.baseline else ""
        lines = [f"stage {self.stage}{against}:"]
        for r in self.table.itertuples():
            value = "" if pd.isna(r.value) else (f"{r.value:+.4f}" if r.check in (NON_INFERIOR, NOT_WORSE)
                                                 else f"{r.value:.4f}")
            lines.append(f"  {'PASS' if r.passed else 'FAIL'}  {r.check:<{width}} {r.metric:<{mwidth}} {value:>8}  "
                         f"{r.bound}")
        lines += self._effect_lines()
        lines += [f"warning: {w}" for w in self.warnings]
        if self.rule:
            lines.append(self.rule)
        lines.append("gate passed" if self.passed else "gate FAILED")
        return "\n".join(lines)

    def _effect_lines(self) -> list[str]:
        if self.effects is None or not len(self.effects):
            return []
        pct = f"{100 * self.level:g} %"
        lines = [f"effect sizes (run minus baseline, paired per-query differences; MDE at "
                 f"{100 * self.power:g} % power, level {pct}):",
                 f"  {'metric':<18} {'n':>5} {'delta':>8} {'d_z':>7} {f'improved>{self.improve_by:g}':>12} "
                 f"{'MDE':>8} {'detect':>8} {'needed':>7}"]
        for e in self.effects.itertuples():
            if getattr(e, "degenerate", False):
                lines.append(f"  {e.metric:<18} {e.n:>5} {_signed(e.delta):>8}  degenerate: every query's difference "
                             "is the same, so no effect size, detectable effect or query count can be given (is the "
                             "run its own baseline?)")
                continue
            needed = "" if pd.isna(e.n_needed) else f"{e.n_needed:.0f}"
            detect = "" if pd.isna(e.detect) else f"{e.detect:g}"
            lines.append(f"  {e.metric:<18} {e.n:>5} {_signed(e.delta):>8} {_signed(e.d_z, 2):>7} "
                         f"{_pct(e.share_improved):>12} {_plain(e.mde):>8} {detect:>8} {needed:>7}")
        for b in (self.bounds.itertuples() if self.bounds is not None else []):
            lines.append(f"  power of {b.kind} {b.metric} (margin {b.margin:g}): an unchanged version passes it "
                         f"with {_pct(b.pass_if_equal)}; a true loss beyond {_plain(b.loss_caught)} fails it "
                         f"with {100 * self.power:g} %")
        return lines


def _signed(x: float, digits: int = 4) -> str:
    return "n/a" if pd.isna(x) else f"{x:+.{digits}f}"


def _plain(x: float) -> str:
    return "n/a" if pd.isna(x) else f"{x:.4f}"


def _pct(x: float) -> str:
    return "n/a" if pd.isna(x) else f"{100 * x:.1f} %"


# ---------------------------------------------------------------------------------------
# per-query values: ranking metrics from the scores, answer metrics from the provider
# ---------------------------------------------------------------------------------------
def _default_answer_values() -> AnswerValues:
    """:func:`weknora_nb.analysis.answers.answer_values` (the run folder's answers and judgements)."""
    from weknora_nb.analysis.answers import answer_values

    return answer_values


def _scores_for(run: Run, metrics: list[str]) -> Scores:
    """The run's scores when they hold ``metrics``, else the run scored again with them."""
    if all(m in run.scores.metric_names for m in metrics):
        return run.scores
    return score(run.testset, run.codes, metrics=list(dict.fromkeys([*run.scores.metric_names, *metrics])))


@dataclass
class _Values:
    """One run's figures at the gate's stage: ``means`` (metric -> the run's figure) and ``per_query``
    (query id -> each metric, mean over repeats)."""

    means: dict[str, float]
    per_query: pd.DataFrame


def _values(run: Run, stage: str, ranking: list[str], answer: list[str],
            provider: AnswerValues | None) -> _Values:
    """Ranking metrics: the system figure (mean of repeat means) and per-query means over repeats; answer
    metrics: the provider's per-query values and their mean over the queries that have one."""
    frames, means = [], {}
    if ranking:
        sc = _scores_for(run, ranking)
        wide = sc.summary_wide().loc[stage]
        means.update({m: float(wide[m]) for m in ranking})
        pq = sc.per_query_mean()
        frames.append(pq[pq["stage"] == stage].set_index("query_id")[ranking])
    if answer:
        given = (provider or _default_answer_values())(run)
        if "query_id" in given.columns:
            given = given.set_index("query_id")
        lacking = [m for m in answer if m not in given.columns]
        if lacking:
            raise UsageError(f"run {run.name} holds no values of {', '.join(lacking)} (answer metrics come from its "
                             "answers.jsonl and, for judge.*, judgements.jsonl: run weknora-nb judge first)",
                             argument="answer metric", allowed=list(given.columns), got=lacking)
        values = given.groupby(level=0, sort=False)[answer].mean().astype("float64")
        means.update({m: float(values[m].mean()) for m in answer})
        frames.append(values)
    per_query = pd.concat(frames, axis=1) if frames else pd.DataFrame()
    return _Values(means, per_query)


def _deltas(run: _Values, base: _Values, metrics: list[str]) -> dict[str, np.ndarray]:
    """Per metric, the paired differences run - baseline over the queries both have a value for."""
    out = {}
    both = run.per_query.index.intersection(base.per_query.index)
    for m in metrics:
        d = (run.per_query.loc[both, m] - base.per_query.loc[both, m]).to_numpy(dtype=np.float64)
        out[m] = d[~np.isnan(d)]
    return out


def _check_scored(run: Run, stage: str) -> None:
    """:class:`NothingScored` when ``run`` has no figure at ``stage``: nothing of it was scored at all, or every
    request of that stage failed."""
    why = run.scores.counts.nothing_scored
    failed = run.scores.failed_stages().get(stage)
    if why is None and failed is not None:
        why = f"every request of stage {stage} failed ({', '.join(f'{k} {n}' for k, n in failed.items())})"
    if why is not None:
        raise NothingScored(f"{run.name}: nothing could be scored at stage {stage}: {why}")


def _baseline(baseline: str | Path | Run, r: Run, stage: str, metrics: list[str]) -> Run:
    b = baseline if isinstance(baseline, Run) else load_run(baseline, testset=r.testset, metrics=metrics or None)
    if b.testset.hash != r.testset.hash:
        raise NotComparableError("the run and the baseline were collected on different test sets")
    if stage not in b.scores.all_stages:
        raise NotComparableError(f"the baseline {b.name} has no stage {stage!r} (stages: {b.scores.all_stages})")
    _check_scored(b, stage)
    return b


# ---------------------------------------------------------------------------------------
# the gate
# ---------------------------------------------------------------------------------------
def _evidence_rows(bounds: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for b in bounds.itertuples():
        pct = f"{100 * b.level:.4g} %"
        where = {"pass": "lies above", "fail": "lies entirely below", "inconclusive": "holds"}[b.verdict]
        effect = ("" if b.verdict != "inconclusive"
                  else ": fails this bound" if b.kind == NON_INFERIOR else ": passes this bound")
        rows.append({"check": b.kind, "metric": b.metric, "value": b.delta, "passed": bool(b.passed),
                     "bound": f"{b.verdict}{effect}: {pct} CI [{_signed(b.ci_low)}, {_signed(b.ci_high)}] "
                              f"{where} -{b.margin:g} ({b.n} queries)",
                     "verdict": b.verdict, "ci_low": b.ci_low, "ci_high": b.ci_high, "n": b.n})
    return rows


def _check_options(minimums: Mapping[str, float], max_drops: Mapping[str, float], evidence: list[Bound],
                   detect: Mapping[str, float], baseline: object) -> None:
    if not (minimums or max_drops or evidence or detect):
        raise UsageError("give at least one bound (--min, --max-drop, --non-inferior, --not-worse) or --detect")
    kinds = {b.kind for b in evidence}
    for option, given in (("--max-drop", bool(max_drops)), ("--non-inferior", NON_INFERIOR in kinds),
                          ("--not-worse", NOT_WORSE in kinds), ("--detect", bool(detect))):
        if given and baseline is None:
            raise UsageError(f"{option} needs --baseline")
    for m, v in detect.items():
        if not (math.isfinite(v) and v != 0):
            raise UsageError(f"--detect needs a non-zero effect, e.g. {m}=0.02. Got {m}={v!r} instead.")


def gate(run: str | Path | Run, *, baseline: str | Path | Run | None = None, stage: str | None = None,
         minimums: Mapping[str, float] | None = None, max_drops: Mapping[str, float] | None = None,
         non_inferior: Mapping[str, float] | None = None, not_worse: Mapping[str, float] | None = None,
         detect: Mapping[str, float] | None = None, improve_by: float = 0.0, allow_incomplete: bool = False,
         level: float = 0.95, power: float = DEFAULT_POWER, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
         adjust: str = "none", answer_values: AnswerValues | None = None, corrected: Any = None) -> GateResult:
    """Evaluate the bounds on ``run`` (and against ``baseline``); see the module docstring.

    ``corrected``: the corrected figures of the baseline and the run (:func:`weknora_nb.analysis.corrected.
    corrected_estimates`, docs/method.md section 16): the ranking metrics' bounds then use the corrected means,
    deltas and 95 % intervals, and the table says so (:func:`_use_corrected`).

    ``non_inferior`` / ``not_worse``: metric -> margin (>= 0, in the metric's unit); ``detect``: metric ->
    the effect to detect; ``resamples`` and ``seed`` of the paired bootstrap; ``answer_values``: the
    provider of answer metrics (default: ``weknora_nb.analysis.answers.answer_values`` when it exists).
    """
    minimums, max_drops, detect = dict(minimums or {}), dict(max_drops or {}), dict(detect or {})
    evidence = [Bound(NON_INFERIOR, m, v) for m, v in (non_inferior or {}).items()]
    evidence += [Bound(NOT_WORSE, m, v) for m, v in (not_worse or {}).items()]
    _check_options(minimums, max_drops, evidence, detect, baseline)
    names = list(dict.fromkeys([parse_metric_name(m) for m in [*minimums, *max_drops, *(b.metric for b in evidence),
                                                               *detect]]))
    answers = set(answer_metric_names())
    ranking, answer = [m for m in names if m not in answers], [m for m in names if m in answers]
    provider = answer_values
    r = run if isinstance(run, Run) else load_run(run, metrics=ranking or None)
    st = r.focus_stage(stage)
    _check_scored(r, st)
    mine = _values(r, st, ranking, answer, provider)
    rows = [{"check": "min", "metric": m, "value": mine.means[m], "bound": f">= {bound:g}",
             "passed": bool(mine.means[m] >= bound)} for m, bound in minimums.items()]
    result = GateResult(pd.DataFrame(), st, True, run=r.name, level=level, power=power, improve_by=improve_by)
    if baseline is not None:
        b = _baseline(baseline, r, st, ranking)
        theirs = _values(b, st, ranking, answer, provider)
        result.baseline = b.name
        compared = list(dict.fromkeys([*max_drops, *(e.metric for e in evidence), *detect]))
        deltas = _deltas(mine, theirs, compared)
        empty = [m for m, d in deltas.items() if not len(d)]
        if empty:
            raise NotComparableError(f"no query has a value of {', '.join(empty)} in both {r.name} and {b.name}: "
                                     "nothing to pair")
        for m, drop in max_drops.items():   # on the basis of the intervals: the queries both runs scored
            d = -float(deltas[m].mean())
            rows.append({"check": "max-drop", "metric": m, "value": d,
                         "bound": f"<= {drop:g} (the drop over the {len(deltas[m])} queries both scored)",
                         "passed": bool(d <= drop)})
        if evidence:
            result.bounds = evidence_bounds(deltas, evidence, level=level, resamples=resamples, seed=seed,
                                            adjust=adjust)
            rows += _evidence_rows(result.bounds)
            result.rule = rule_text(len(evidence), level=level, adjust=adjust)
        result.effects = effect_table(deltas, alpha=1 - level, power=power, detect=detect, improve_by=improve_by)
        result.warnings = _size_warnings(deltas)
    rows.append({"check": "complete", "metric": "requests",
                 "value": float(r.scores.counts.n_failed + r.scores.counts.n_missing),
                 "bound": "0 failed or missing" + (" (allowed)" if allow_incomplete else ""),
                 "passed": bool(r.scores.complete or allow_incomplete)})
    result.table = pd.DataFrame(rows)
    if corrected is not None:
        margins = {(b.kind, b.metric): b.margin for b in evidence}
        _use_corrected(result, corrected, minimums, max_drops, margins, level=level, adjust=adjust)
    result.passed = bool(result.table["passed"].all())
    if not result.rule and len(result.table) > 1:
        result.rule = "rule: the gate passes only when every bound passes."
    return result


def _use_corrected(result: GateResult, corrected: Any, minimums: Mapping[str, float], max_drops: Mapping[str, float],
                   margins: Mapping[tuple[str, str], float], *, level: float, adjust: str) -> None:
    """The ranking metrics' rows of ``result`` with the corrected figures: ``min`` the corrected mean, ``max-drop``
    minus the corrected delta, the evidence bounds the corrected delta's 95 % interval; each row's bound says
    ``corrected``, and the grades' marker leads the warnings."""
    from weknora_nb.analysis.evidence import bound_passed, margin_verdict

    if adjust != "none" or abs(level - 0.95) > 1e-12:
        raise UsageError("the corrected figures (--grades) come with 95 % intervals: --adjust and another level are "
                         "not available with them")
    means = corrected.means.set_index(["run", "metric"])
    deltas = corrected.deltas.set_index(["run", "metric"]) if len(corrected.deltas) else None
    table = result.table
    for i, r in table.iterrows():
        key = (result.run, r["metric"])
        if r["check"] == "min" and key in means.index:
            m = means.loc[key]
            table.loc[i, ["value", "passed"]] = [m["corrected"], bool(m["corrected"] >= minimums[r["metric"]])]
            table.loc[i, "bound"] = f"{r['bound']} (corrected [{_plain(m['low'])}, {_plain(m['high'])}])"
        elif deltas is not None and key in deltas.index and r["check"] in ("max-drop", NON_INFERIOR, NOT_WORSE):
            d = deltas.loc[key]
            if r["check"] == "max-drop":
                drop = max_drops[r["metric"]]
                table.loc[i, ["value", "passed"]] = [-d["corrected"], bool(-d["corrected"] <= drop)]
                table.loc[i, "bound"] = f"<= {drop:g} (corrected drop)"
                continue
            margin = margins[(r["check"], r["metric"])]
            verdict = str(margin_verdict(d["low"], d["high"], margin)[()])
            table.loc[i, ["value", "verdict", "ci_low", "ci_high", "passed"]] = [
                d["corrected"], verdict, d["low"], d["high"], bool(bound_passed(r["check"], verdict))]
            table.loc[i, "bound"] = (f"{verdict}: corrected 95 % CI [{_signed(d['low'])}, {_signed(d['high'])}] vs "
                                     f"-{margin:g} ({d['n_labelled']} of {d['n']} queries labelled by people)")
    result.warnings.insert(0, f"{corrected.marker}: the bounds of ranking metrics use the corrected figures "
                              "(docs/method.md section 16)")


def _size_warnings(deltas: Mapping[str, np.ndarray]) -> list[str]:
    """The plain-words warning when fewer than 200 paired queries back a delta (once)."""
    sizes = [len(d) for d in deltas.values()]
    warning = significance_warning(min(sizes)) if sizes else None
    return [warning] if warning else []
