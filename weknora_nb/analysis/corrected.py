r"""Corrected figures of runs: LLM-graded pools corrected by a human sample (docs/method.md section 16).

For a metric at a stage, each query :math:`q` of the population (the queries the human-only figure averages:
valid under people's labels and scored) has

- :math:`f_q`, the metric with the LLM's **fill** grades in place of the missing labels (the test set filled by
  :meth:`weknora_nb.core.grades.Grades.filled`: people's labels elsewhere; a fill grade keeps standing after a
  person labels the chunk, so :math:`f` is the same function of the query whether or not it was labelled; a query
  that the fill grades make invalid counts 0);
- :math:`y_q`, the metric with people's labels only, **known** for a query only when every chunk of its graded
  pool carries a person's label (the chunks graded to fill, :meth:`~weknora_nb.core.grades.Grades.fill_keys`,
  have all been labelled since).

The **human-labelled sample** :math:`L` of a retrieval metric is therefore a set of queries: the graded queries
(at least one fill grade) whose every fill-graded chunk now has a person's grade. Queries with no fill grade at
all (their pool was labelled before grading: :math:`f_q = y_q`) form a stratum of their own; the estimate mixes
both (:func:`weknora_nb.analysis.ppi.stratified`). The graded pool defines the truth: chunks outside it
count as grade 0 in both :math:`f` and :math:`y` (the pooling assumption, with the pool that was graded).

The sample must be **random** among the graded queries (``weknora-nb testset label-next`` draws it so): a
sample chosen by looking at the LLM's errors would bias the correction.

Beside each corrected figure: the human-only figure as scored (unjudged = grade 0) with its 95 % percentile
bootstrap interval (2,000 resamples, seed 0) and its judged@K, and the LLM-filled figure (mean of :math:`f`) with
its judged@K; deltas are paired per query (B - A over the queries both runs scored), each estimated the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.ppi import Estimate, Stratum, projected_half_width, stratified
from weknora_nb.analysis.stats import bootstrap_ci
from weknora_nb.core.errors import NotComparableError, UsageError
from weknora_nb.core.grades import Grades, read_grades, with_labels
from weknora_nb.core.labels import Judgement
from weknora_nb.core.metrics import DEFAULT_METRICS, parse_metric
from weknora_nb.core.run import Run, load_run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet, load_testset

#: the cutoff of the judged@K shown beside every corrected figure
JUDGED_K = 10
#: the intervals' level
LEVEL = 0.95


@dataclass
class QueryValues:
    """One run's per-query values at a stage: ``f`` and ``y`` (query id -> metric columns), the judged@K of each."""

    run: str
    f: pd.DataFrame
    y: pd.DataFrame
    judged_human: float
    judged_graded: float


@dataclass
class Corrected:
    """The corrected figures of runs at a stage (module docstring).

    ``means``: one row per (run, metric): ``human`` [``human_low``, ``human_high``], ``judged_human``, ``llm``,
    ``judged_graded``, ``corrected`` [``low``, ``high``], ``n`` (queries), ``n_labelled``, ``n_graded`` (queries
    with a fill grade), ``reason`` (why ``corrected`` is NaN). ``deltas``: one row per (run against the first run,
    metric): the same columns for the paired delta. ``strata``: per query, ``graded`` and ``labelled``.
    """

    stage: str
    marker: str
    runs: list[str]
    means: pd.DataFrame
    deltas: pd.DataFrame
    strata: pd.DataFrame
    values: dict[str, QueryValues] = field(repr=False, default_factory=dict)
    loaded: list[Run] = field(repr=False, default_factory=list)
    notes: list[str] = field(default_factory=list)

    def paired(self, run: str, metric: str) -> tuple[pd.Series, pd.Series]:
        """(f, y) per query of ``run``'s delta against the first run, over the queries both scored (of ``run``'s
        own values when it is the first)."""
        v, base = self.values[run], self.values[self.runs[0]]
        if run == self.runs[0]:
            return v.f[metric], v.y[metric]
        both = v.y.index.intersection(base.y.index)
        return v.f.loc[both, metric] - base.f.loc[both, metric], v.y.loc[both, metric] - base.y.loc[both, metric]

    @property
    def n_labelled(self) -> int:
        return int(self.strata["labelled"].sum())

    @property
    def n_graded(self) -> int:
        return int(self.strata["graded"].sum())

    def describe(self, metrics: Iterable[str] | None = None) -> str:
        """The tables as the command line prints them, the marker first."""
        wanted = set(metrics) if metrics is not None else None
        lines = [self.marker, f"stage {self.stage}; human-labelled sample: {self.n_labelled} of the {self.n_graded} "
                              f"graded queries (every fill-graded chunk labelled by a person); "
                              f"{LEVEL:.0%} intervals"]
        for title, table in (("means", self.means), (f"deltas (run minus {self.runs[0]})", self.deltas)):
            if table.empty:
                continue
            signed = title != "means"
            judged = ("Δ" if signed else "") + f"judged@{JUDGED_K}"
            lines += [title + ":", f"  {'run':<14} {'metric':<10} {'human-only [95 % CI]':<26} {judged:>11} "
                                   f"{'LLM-filled':>10} {'w/ grades':>9}  {'corrected [95 % CI]':<26} labelled"]
            for r in table.itertuples():
                if wanted is not None and r.metric not in wanted:
                    continue
                corrected = _ci(r.corrected, r.low, r.high, signed) if not r.reason else f"n/a: {r.reason}"
                lines.append(f"  {r.run:<14} {r.metric:<10} {_ci(r.human, r.human_low, r.human_high, signed):<26} "
                             f"{_num(r.judged_human, signed):>11} {_num(r.llm, signed):>10} "
                             f"{_num(r.judged_graded, signed):>9}  {corrected:<26} {r.n_labelled}/{r.n}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _num(x: float, signed: bool = False) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else (f"{x:+.4f}" if signed else f"{x:.4f}")


def _ci(x: float, lo: float, hi: float, signed: bool) -> str:
    return f"{_num(x, signed)} [{_num(lo, signed)}, {_num(hi, signed)}]"


# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------
def human_testset(runs: Sequence[str | Path | Run], testset: TestSet | str | Path | None = None,
                  labels: Iterable[Judgement] | None = None) -> TestSet:
    """People's labels: ``testset`` (default the first run's), with ``labels`` laid over it."""
    if testset is None:
        first = runs[0]
        ts = first.testset if isinstance(first, Run) else load_run(first).testset
    else:
        ts = testset if isinstance(testset, TestSet) else load_testset(testset)
    return with_labels(ts, labels) if labels is not None else ts


def _load(runs: Sequence[str | Path | Run], human: TestSet, metrics: list[str]) -> list[Run]:
    out = []
    hashes = set()
    for r in runs:
        run = r if isinstance(r, Run) else load_run(r)
        hashes.add(run.manifest.get("testset", {}).get("hash") or run.testset.hash)
        if run.testset.hash != human.hash or not all(m in run.scores.metric_names for m in metrics):
            run = load_run(run.path, testset=human, metrics=metrics, other_version=True)
        out.append(run)
    if len(hashes) > 1:
        raise NotComparableError("the runs were collected on different test sets: corrected figures compare runs of "
                                 "one test set")
    return out


def _values(run: Run, filled: TestSet, stage: str, metrics: list[str]) -> QueryValues:
    judged = f"judged@{JUDGED_K}"
    if stage not in run.scores.stages:
        raise NotComparableError(f"run {run.name} has no scored stage {stage!r} (stages: {run.scores.stages})")
    human = score(run.testset, run.codes, [*metrics, judged], stages=[stage])
    fill = score(filled, run.codes, [*metrics, judged], stages=[stage])
    y = human.per_query_mean().set_index("query_id")[[*metrics, judged]]
    f = fill.per_query_mean().set_index("query_id")[[*metrics, judged]].reindex(y.index)
    return QueryValues(run.name, f[metrics].fillna(0.0), y[metrics], float(y[judged].mean()), float(f[judged].mean()))


def query_strata(grades: Grades, human: TestSet) -> pd.DataFrame:
    """Per query of the test set: ``graded`` (it has a fill-graded chunk) and ``labelled`` (graded, and every
    fill-graded chunk now has a person's label), ``to_label`` (those still without one)."""
    labelled = set(zip(human.qrels["query_id"], human.qrels["chunk_id"], strict=True))
    missing: dict[str, int] = {}
    graded: set[str] = set()
    for q, c in grades.fill_keys():
        graded.add(q)
        if (q, c) not in labelled:
            missing[q] = missing.get(q, 0) + 1
    ids = list(human.queries["query_id"])
    return pd.DataFrame({"query_id": ids, "graded": [q in graded for q in ids],
                         "labelled": [q in graded and q not in missing for q in ids],
                         "to_label": [missing.get(q, 0) for q in ids]}).set_index("query_id")


# ---------------------------------------------------------------------------------------
# the estimates
# ---------------------------------------------------------------------------------------
def strata_of(f: pd.Series, y: pd.Series, strata: pd.DataFrame) -> list[Stratum]:
    """The two strata of one metric's per-query values (module docstring): queries without a fill grade (exact),
    and the graded queries (their labelled sample's ``y`` and ``f``, and ``f`` of all of them)."""
    s = strata.reindex(f.index)
    graded, labelled = s["graded"].fillna(False).to_numpy(bool), s["labelled"].fillna(False).to_numpy(bool)
    labelled = labelled & graded
    fv, yv = f.to_numpy(np.float64), y.to_numpy(np.float64)
    return [Stratum(yv[~graded], fv[~graded], np.empty(0), exact=True),
            Stratum(yv[labelled], fv[labelled], fv[graded])]


def estimate(f: pd.Series, y: pd.Series, strata: pd.DataFrame, *, alpha: float = 1 - LEVEL) -> Estimate:
    """The corrected mean of one metric's per-query values (``f`` and ``y`` indexed by query id)."""
    return stratified(strata_of(f, y, strata), alpha=alpha)


def _row(f: pd.Series, y: pd.Series, strata: pd.DataFrame, resamples: int) -> dict[str, Any]:
    est = estimate(f, y, strata)
    lo, hi = bootstrap_ci(y.to_numpy(np.float64), resamples=resamples)
    s = strata.reindex(f.index)
    return {"human": float(y.mean()), "human_low": lo, "human_high": hi, "llm": float(f.mean()),
            "corrected": est.estimate, "low": est.low, "high": est.high, "se": est.se, "n": len(f),
            "n_labelled": int(s["labelled"].fillna(False).sum()), "n_graded": int(s["graded"].fillna(False).sum()),
            "reason": est.reason}


def corrected_estimates(runs: Sequence[str | Path | Run], grades: Grades | str | Path, *,
                        testset: TestSet | str | Path | None = None, labels: Iterable[Judgement] | None = None,
                        stage: str | None = None, metrics: Iterable[str] | None = None,
                        resamples: int = 2000) -> Corrected:
    """The corrected mean of every metric of every run, and the corrected delta of every run against the first,
    at ``stage`` (default: final when the runs have it), beside the human-only and LLM-filled figures (module
    docstring). ``testset``/``labels``: people's labels (default the runs' test set)."""
    g = grades if isinstance(grades, Grades) else read_grades(grades)
    if not len(runs):
        raise UsageError(argument="--runs", allowed="one or more run folders", got=[])
    names = [parse_metric(m).name for m in (metrics or DEFAULT_METRICS)]
    human = human_testset(runs, testset, labels)
    loaded = _load(runs, human, names)
    st = loaded[0].focus_stage(stage)
    filled = g.filled(human)
    strata = query_strata(g, human)
    values = {r.name: _values(r, filled, st, names) for r in loaded}
    means, deltas = [], []
    for run in loaded:
        v = values[run.name]
        for m in names:
            means.append({"run": run.name, "metric": m, "judged_human": v.judged_human,
                          "judged_graded": v.judged_graded, **_row(v.f[m], v.y[m], strata, resamples)})
    base = values[loaded[0].name]
    for run in loaded[1:]:
        v = values[run.name]
        both = v.y.index.intersection(base.y.index)
        for m in names:
            df, dy = v.f.loc[both, m] - base.f.loc[both, m], v.y.loc[both, m] - base.y.loc[both, m]
            deltas.append({"run": run.name, "baseline": base.run, "metric": m,
                           "judged_human": v.judged_human - base.judged_human,
                           "judged_graded": v.judged_graded - base.judged_graded, **_row(df, dy, strata, resamples)})
    out = Corrected(st, g.marker(), [r.name for r in loaded], pd.DataFrame(means), pd.DataFrame(deltas), strata,
                    values, loaded)
    out.notes = _notes(g, human, loaded, out)
    return out


def _notes(g: Grades, human: TestSet, runs: list[Run], out: Corrected) -> list[str]:
    notes = []
    pooled = set((g.pool.get("runs") or {}).values()) if isinstance(g.pool.get("runs"), dict) else set()
    for r in runs:
        if pooled and str(r.path.resolve()) not in pooled:
            notes.append(f"run {r.name} was not among the runs whose pools were graded: chunks only it returned count "
                         "as grade 0 in every figure; grade its pool too (weknora-nb testset grade)")
    if len(g.failed):
        notes.append(f"{len(g.failed)} graded chunks have no grade (the grading failed: "
                     f"{', '.join(f'{k} {n}' for k, n in g.failed['kind'].value_counts().items())}); they count as "
                     "grade "
                     "0 in the LLM-filled figures, and a person's label is needed for their queries to join the sample")
    if out.n_labelled < 2:
        notes.append(f"{out.n_labelled} graded queries are fully labelled by people: the correction needs at least 2, "
                     "drawn at random (weknora-nb testset label-next)")
    notes.append("the corrected interval is valid when the labelled queries are a random sample of the graded ones "
                 "(docs/method.md section 16); it is a normal interval, the human-only one a bootstrap interval")
    return notes


def projection(out: Corrected, run: str, metric: str, steps: Sequence[int] = (5, 10, 20, 40)) -> pd.DataFrame:
    """For ``run``'s delta against the first run (its mean when it is the first), the half-width of the corrected
    interval now and once k more graded queries drawn at random are labelled (the spreads as estimated now)."""
    f, y = out.paired(run, metric)
    sampled = strata_of(f, y, out.strata)[1]
    share = sampled.size / len(f) if len(f) else math.nan
    rows = [{"more_queries": k, "half_width": projected_half_width(sampled.y, sampled.f_labelled, sampled.f_all,
                                                                     k, share=share)} for k in (0, *steps)]
    return pd.DataFrame(rows)


def judged_table(runs: Sequence[str | Path | Run], grades: Grades, testset: TestSet | str | Path | None = None, *,
                 k: int = JUDGED_K) -> pd.DataFrame:
    """judged@K of every run and stage with people's labels (``human``) and with the LLM's grades too
    (``with_grades``: a chunk counts as judged when a person labelled it or the LLM graded it), both over the queries
    valid under people's labels."""
    human = human_testset(runs, testset)
    filled = grades.filled(human)
    rows = []
    name = f"judged@{k}"
    for r in _load(runs, human, []):
        a = score(r.testset, r.codes, [name]).per_query_mean().set_index(["stage", "query_id"])[name]
        b = score(filled, r.codes, [name]).per_query_mean().set_index(["stage", "query_id"])[name].reindex(a.index)
        a_mean, b_mean = a.groupby(level=0, sort=False).mean(), b.groupby(level=0, sort=False).mean()
        rows += [{"run": r.name, "stage": st, "human": float(a_mean[st]), "with_grades": float(b_mean[st])}
                 for st in a_mean.index]
    return pd.DataFrame(rows, columns=["run", "stage", "human", "with_grades"])
