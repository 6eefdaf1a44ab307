"""Compare runs of different system versions on the same test set (docs/method.md section 7).

::

    cmp = compare_runs(["outputs/runs/baseline", "outputs/runs/rerank"])
    cmp.metrics        # per metric: both means, delta, 95 % paired-bootstrap CI, p (Holm), wins/ties/losses
    cmp.config_diff    # which configuration keys differ
    cmp.latency        # p50 / p95 / p99 per run and deltas
    cmp.recommendation # the decision rules in words
    rank_versions(cmp) # every version ranked, with which differences the data resolve

Runs are comparable only on the same test set (same content hash); anything else is
refused. The first run is the baseline; each other run is compared with it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.coverage import coverage_warning
from weknora_nb.analysis.diagnose.settings import CONVERSATION, effective_config
from weknora_nb.analysis.evidence import effect_columns
from weknora_nb.analysis.stats import DEFAULT_RESAMPLES, holm, paired_bootstrap_ci, randomization_test
from weknora_nb.core.errors import NotComparableError, UsageError, WeknoraNbError
from weknora_nb.core.lineage import rescore_plan
from weknora_nb.core.metrics import DEFAULT_METRICS, parse_metrics
from weknora_nb.core.pipeline import FOCUS_STAGE, HEADLINE_METRIC, focus_stage, role_of, significance_warning
from weknora_nb.core.run import Run, flatten, iter_runs, load_run
from weknora_nb.core.testset import load_testset

#: configuration keys that name or describe a version rather than configure it
_IGNORED_KEYS = ("description", "version", "name", "faults")
#: what a stage's record says about how it was collected or what came back, not what it ran
#: (``stages.<name>.<key>...``)
_STAGE_RECORDS = ("settings_source", "method", "inline_citations")
#: what the server reports that changes what runs (``GET /api/v1/system/info``, C56)
_SERVER_KEYS = ("version", "keyword_index_engine", "vector_store_engine")
#: keys of the effective retrieval config derived from others (``rerank_model`` from ``rerank_model_id``)
_DERIVED_CONFIG_KEYS = ("rerank_model", "rerank_threshold_assumed")


def _retrieval_settings(manifest: dict[str, Any]) -> dict[str, Any]:
    """The retrieval config knowledge-search ran with (the effective one, C30: a raw 0 and the default it
    means are one setting), or what was recorded when it is unusable (an error)."""
    effective = effective_config(manifest.get("retrieval_config"))
    if effective is None:
        return manifest.get("retrieval_config") or {}
    return {k: v for k, v in effective.items() if k not in _DERIVED_CONFIG_KEYS}


def _counts(key: str) -> bool:
    """Whether a differing key is a configuration variable (not a name, a description or a record)."""
    parts = key.split(".")
    if parts[-1] in _IGNORED_KEYS and parts[0] != "server":
        return False
    return parts[1:2] != ["faults"] and not (parts[0] == "stages" and parts[2:3] and parts[2] in _STAGE_RECORDS)


def config_diff(manifests: list[dict[str, Any]], names: list[str]) -> pd.DataFrame:
    """Configuration keys (system description, effective retrieval config, stages, the server's release and
    engines) that differ between runs.

    Columns: ``key``, one per run, ``counts`` (False for keys that only name or describe a version,
    or record how a stage was collected).
    """
    flats = []
    for m in manifests:
        recorded = m.get("server")
        server: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        flats.append(flatten({"system": m.get("system") or {}, "retrieval_config": _retrieval_settings(m),
                              "stages": m.get("stages") or {},
                              "server": {k: server[k] for k in _SERVER_KEYS if k in server}}))
    keys = sorted(set().union(*flats))
    rows = []
    for k in keys:
        vals = [f.get(k) for f in flats]
        if any(json.dumps(v, sort_keys=True, default=str) != json.dumps(vals[0], sort_keys=True, default=str)
               for v in vals[1:]):
            rows.append({"key": k, **dict(zip(names, vals, strict=True)), "counts": _counts(k)})
    return pd.DataFrame(rows, columns=["key", *names, "counts"])


def _variables(diff: pd.DataFrame) -> list[str]:
    """The changed configuration variables.

    The user's system description is the record of the configuration; the retrieval config
    read from the server is a partial view of the same settings, so it is only used when
    no system description differs. Stage definitions and the server's release and engines always count.
    """
    keys = diff.loc[diff["counts"], "key"].tolist() if len(diff) else []
    system = [k for k in keys if k.startswith("system.")]
    always = [k for k in keys if k.startswith(("stages.", "server."))]
    config = [k for k in keys if k.startswith("retrieval_config.")]
    return sorted(set((system or config) + always))


def latency_table(runs: list[Run], stage: str) -> pd.DataFrame:
    """Latency p50 / p95 / p99 (ms) of successful requests at ``stage``, per run, and deltas to the first."""
    rows = []
    for r in runs:
        req = r.scores.requests
        lat = req.loc[(req["stage"] == stage) & (req["status"] == "ok"), "latency_ms"].dropna().to_numpy()
        q = np.percentile(lat, [50, 95, 99]) if len(lat) else [np.nan] * 3
        rows.append({"run": r.name, "n": len(lat), "p50_ms": q[0], "p95_ms": q[1], "p99_ms": q[2]})
    df = pd.DataFrame(rows)
    for c in ("p50_ms", "p95_ms", "p99_ms"):
        df[f"delta_{c}"] = df[c] - df[c].iloc[0]
    return df


@dataclass
class Comparison:
    """What :func:`compare_runs` found."""

    runs: list[Run]
    stage: str
    metrics: pd.DataFrame
    config_diff: pd.DataFrame
    latency: pd.DataFrame
    per_query: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    recommendation: str = ""

    @property
    def single_variable(self) -> dict[str, bool]:
        """Per compared run: True when exactly one configuration variable differs from the baseline."""
        out = {}
        base = self.runs[0]
        for r in self.runs[1:]:
            d = config_diff([base.manifest, r.manifest], [base.name, r.name])
            out[r.name] = len(_variables(d)) == 1
        return out


def _distinct_names(runs: list[Run]) -> list[Run]:
    """``runs``, each known by a name of its own in the comparison: a name already taken by an earlier run (the
    same folder twice, a copy of a run, runs of one name in two folders) becomes ``name#2``, ``name#3``..., as the
    pool names them. The runs' folders and manifests on disk are left as they are."""
    seen: dict[str, int] = {}
    out = []
    for r in runs:
        seen[r.name] = seen.get(r.name, 0) + 1
        n = seen[r.name]
        out.append(r if n == 1 else replace(r, manifest={**r.manifest, "run_name": f"{r.name}#{n}"}))
    return out


def _comparable_runs(paths: Sequence[str | Path] | Sequence[Run], metrics: Iterable[str] | None
                     ) -> tuple[list[Run], list[str]]:
    """The runs, loaded, all on one test set, and what was done to get there.

    Runs scored on different versions of a test set (docs/method.md section 10) are all
    re-scored on the newest when one version descends from the others by its lineage
    (:func:`weknora_nb.core.lineage.rescore_plan`); otherwise they cannot be compared and the
    error says why.
    """
    runs = _distinct_names([p if isinstance(p, Run) else load_run(p, metrics=metrics) for p in paths])
    if len(runs) < 2:
        raise NotComparableError("a comparison needs at least two runs")
    if len({r.testset.hash for r in runs}) == 1:
        return runs, []
    listing = ", ".join(f"{r.name}: {r.testset.hash[:19]}" for r in runs)
    plans = [rescore_plan(a.manifest, b.manifest) for a, b in itertools.combinations(runs, 2)
             if a.testset.hash != b.testset.hash]
    targets = {path for path, _ in plans}
    if None in targets or len(targets) != 1:
        reasons = "; ".join(reason for path, reason in plans if path is None) or "no one version is the newest"
        raise NotComparableError(f"runs on different test sets cannot be compared ({listing}): {reasons}")
    newest = str(targets.pop())
    target = load_testset(newest)
    runs = _distinct_names([load_run(r.path, testset=target, metrics=metrics, other_version=True) for r in runs])
    note = (f"The runs were scored on different versions of the test set ({listing}); all are re-scored on the "
            f"newest, {newest} ({target.hash[:19]}...): {plans[0][1]}.")
    return runs, [note]


def _common_stage(runs: list[Run], stage: str | None) -> str:
    """``stage`` when every run has it, else the focus stage of the stages all runs share."""
    common = [s for s in runs[0].stages if all(s in r.stages for r in runs[1:])]
    chosen = focus_stage(common, stage, runs[0].stage_definitions)
    if chosen is None:
        if stage is not None:
            raise NotComparableError(f"stage {stage!r} is not in every run (common stages: {common})")
        raise NotComparableError(f"the runs share no stage (stages: {[r.stages for r in runs]})")
    return chosen


def _stage_values(run: Run, stage: str) -> pd.DataFrame:
    """Per-query means over repeats at ``stage``, indexed by query id."""
    pq = run.scores.per_query_mean()
    return pq[pq["stage"] == stage].set_index("query_id")


def _paired_rows(base: Run, other: Run, stage: str, mets: list[str], resamples: int,
                 seed: int) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """One compared run against the baseline: a row per metric and the paired per-query values.

    Over the queries valid and scored in both (n): ``delta`` = mean(B - A), its 95 %
    paired-bootstrap interval, the randomization-test p-value (seed + 1) with Holm's
    correction across ``mets``, and wins / ties / losses (|B - A| <= 1e-12 is a tie).
    """
    a, b = _stage_values(base, stage), _stage_values(other, stage)
    qids = a.index.intersection(b.index)
    n = len(qids)
    A, B = a.loc[qids, mets].to_numpy(), b.loc[qids, mets].to_numpy()
    nan = np.full(len(mets), np.nan)
    lo, hi = (np.asarray(x) for x in paired_bootstrap_ci(A, B, resamples=resamples, seed=seed)) if n else (nan, nan)
    p = np.asarray(randomization_test(A, B, resamples=resamples, seed=seed + 1)) if n else nan
    p_holm = holm(p)
    d = B - A
    rows = [{"run": other.name, "metric": m, "baseline": base.name, "n_queries": n,
             "mean_a": A[:, j].mean() if n else np.nan, "mean_b": B[:, j].mean() if n else np.nan,
             "delta": d[:, j].mean() if n else np.nan, "ci_low": lo[j], "ci_high": hi[j],
             "p_value": p[j], "p_holm": p_holm[j],
             "wins": int((d[:, j] > 1e-12).sum()), "ties": int((np.abs(d[:, j]) <= 1e-12).sum()),
             "losses": int((d[:, j] < -1e-12).sum())} for j, m in enumerate(mets)]
    frame = pd.DataFrame({"query_id": qids, "run": other.name})
    for j, m in enumerate(mets):
        frame[f"{m}_a"], frame[f"{m}_b"] = A[:, j], B[:, j]
    return rows, frame


def _settings_warning(runs: list[Run], stage: str, diff: pd.DataFrame) -> str | None:
    """When the compared stage runs the server's conversation settings (the chat, C66: config.yaml
    ``conversation.*``, recorded as the stage's ``settings_source``) and the tenant retrieval config
    changed: that change did not reach the stage. None for older manifests (no settings source)."""
    sources = {(r.stage_definitions.get(stage) or {}).get("settings_source") for r in runs}
    role = role_of(stage, runs[0].stage_definitions.get(stage))
    keys = [k for k in diff.loc[diff["counts"], "key"] if k.startswith("retrieval_config.")] if len(diff) else []
    if CONVERSATION not in sources or not keys:
        return None
    return (f"Stage {stage} ({role}) ran the server's conversation settings, not the tenant retrieval config: "
            f"{', '.join(keys)} did not reach it.")


def _pair_warnings(base: Run, other: Run, stage: str) -> list[str]:
    """What limits one pair's comparison besides its size: several changed variables, a changed retrieval
    config the compared stage does not run, an incomplete run, fewer labelled chunks in the compared
    run's top 10 than in the baseline's (``analysis.coverage``)."""
    out = []
    diff = config_diff([base.manifest, other.manifest], [base.name, other.name])
    changed = _variables(diff)
    if len(changed) > 1:
        out.append(f"{other.name} differs from {base.name} in {len(changed)} variables "
                   f"({', '.join(changed)}): a difference cannot be attributed to one of them.")
    settings = _settings_warning([base, other], stage, diff)
    if settings:
        out.append(settings)
    if not base.scores.complete or not other.scores.complete:
        out.append(f"{base.name if not base.scores.complete else other.name} is incomplete: failed or "
                   "missing requests are left out of the comparison.")
    coverage = coverage_warning(base, other, stage)
    if coverage:
        out.append(coverage)
    return out


def compare_runs(paths: Sequence[str | Path] | Sequence[Run], *, stage: str | None = None,
                 metrics: Iterable[str] | None = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                 latency_budget_ms: float | None = None, effects: bool = False,
                 detect: Mapping[str, float] | None = None, improve_by: float = 0.0) -> Comparison:
    """Compare two or more runs; the first is the baseline (docs/method.md section 7).

    Per metric and compared run: both means, ``delta`` (B - A) with a 95 % paired-bootstrap
    interval over the queries valid and scored in both, the paired randomization-test
    p-value with Holm's correction across the metrics shown, and wins / ties / losses
    per query. ``stage`` defaults to ``final`` when every run has it, else the only
    common stage. ``p_holm_all``: Holm's correction across every compared run and metric (the family of
    a comparison of several versions). With ``effects`` (or ``detect``: metric -> the effect to detect),
    the columns ``d_z``, ``share_improved`` (d > ``improve_by``), ``mde`` (80 % power, level 5 %) and
    ``n_needed`` (:func:`weknora_nb.analysis.evidence.effect_columns`).
    """
    runs, rescored = _comparable_runs(paths, metrics)
    stage = _common_stage(runs, stage)
    mets = [m.name for m in parse_metrics(metrics)]
    base = runs[0]
    rows: list[dict[str, Any]] = []
    per_query: list[pd.DataFrame] = []
    warnings: list[str] = list(rescored)
    for other in runs[1:]:
        pair_rows, frame = _paired_rows(base, other, stage, mets, resamples, seed)
        rows += pair_rows
        per_query.append(frame)
        too_few = significance_warning(len(frame))
        if too_few and too_few not in warnings:
            warnings.append(too_few)
        warnings += _pair_warnings(base, other, stage)
    diff_all = config_diff([r.manifest for r in runs], [r.name for r in runs])
    cmp = Comparison(runs, stage, pd.DataFrame(rows), diff_all, latency_table(runs, stage),
                     pd.concat(per_query, ignore_index=True), warnings)
    cmp.metrics["p_holm_all"] = holm(cmp.metrics["p_value"].to_numpy())
    if effects or detect:
        cmp.metrics = effect_columns(cmp.metrics, cmp.per_query, detect=detect, improve_by=improve_by)
    cmp.recommendation = recommend(cmp, latency_budget_ms=latency_budget_ms)
    return cmp


def latency_line(p95_ms: float, delta_p95_ms: float) -> str:
    """The recommendation's latency line, its words following the sign of the p95 change (compared minus
    baseline): slower is a cost to weigh against the gain, faster is not; a change under 0.5 ms is none."""
    head = f"- Latency p95 {p95_ms:.0f} ms"
    if np.isnan(delta_p95_ms):
        return head + "."
    if round(delta_p95_ms) == 0:
        return head + ": as fast as the baseline."
    if delta_p95_ms > 0:
        return f"{head}, {delta_p95_ms:.0f} ms slower than the baseline: weigh the gain against this cost."
    return f"{head}, {-delta_p95_ms:.0f} ms faster than the baseline."


def recommend(cmp: Comparison, *, latency_budget_ms: float | None = None, alpha: float = 0.05) -> str:
    """The decision rules of docs/method.md section 7 (from the rerank-impact study), in words."""
    out = []
    t = cmp.metrics
    for run in t["run"].unique() if len(t) else []:
        r = t[t["run"] == run].set_index("metric")
        lines = [f"{run} vs {r['baseline'].iloc[0]} (stage {cmp.stage}, {int(r['n_queries'].iloc[0])} queries):"]
        key = HEADLINE_METRIC if HEADLINE_METRIC in r.index else r.index[0]
        row = r.loc[key]
        sig = bool(row["p_holm"] < alpha and not (row["ci_low"] <= 0 <= row["ci_high"]))
        ci = f"95 % CI [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], p = {row['p_holm']:.3g} after Holm"
        if not sig:
            lines.append(f"- {key} changes by {row['delta']:+.3f} ({ci}): not statistically significant. "
                         "Treat the versions as equivalent on this test set; keep the simpler one, or collect "
                         "more queries if the difference matters.")
        else:
            d = row["delta"]
            verdict = "better" if d > 0 else "worse"
            lines.append(f"- {key} is {verdict} by {d:+.3f} ({ci}); wins / ties / losses per query: "
                         f"{int(row['wins'])} / {int(row['ties'])} / {int(row['losses'])}.")
            if 0 < d < 0.02:
                lines.append("- A gain below 0.02 rarely pays for the added complexity.")
            elif 0 < d < 0.03:
                lines.append("- A gain below 0.03: skip the reranker and improve the first stage instead.")
            elif 0.05 <= d <= 0.15:
                lines.append("- A gain in the +0.05 to +0.15 range that a good cross-encoder reranker typically "
                             "brings.")
            elif d > 0.15:
                lines.append("- A gain above what rerankers typically bring (+0.05 to +0.15): check that the "
                             "versions differ only as intended.")
        if "hit@5" in r.index and r.loc["hit@5", "mean_b"] < 0.85:
            lines.append(f"- Hit@5 is only {r.loc['hit@5', 'mean_b']:.2f}: the first stage misses documents; "
                         "raise the candidate count or switch to hybrid retrieval before tuning the ranking.")
        lat = cmp.latency.set_index("run")
        if run in lat.index and not np.isnan(lat.loc[run, "p95_ms"]):
            lines.append(latency_line(lat.loc[run, "p95_ms"], lat.loc[run, "delta_p95_ms"]))
            if latency_budget_ms is not None and lat.loc[run, "p95_ms"] > latency_budget_ms:
                lines.append(f"- p95 exceeds the latency budget of {latency_budget_ms:.0f} ms.")
        out.append("\n".join(lines))
    if cmp.warnings:
        out.append("Warnings:\n" + "\n".join(f"- {w}" for w in cmp.warnings))
    return "\n\n".join(out)


def history(root: str | Path = "outputs/runs", *, metrics: Iterable[str] = ("recall@5", "ndcg@5", "hit@5"),
            stage: str | None = FOCUS_STAGE) -> pd.DataFrame:
    """Every run under ``root`` over time with the tracked metrics of ``stage`` (or every stage).

    The runs are scored with the default metrics plus the tracked ones: when the defaults hold the tracked
    ones, that is the default list, which a report's other notebooks load its runs with, so a rendering
    finds each run in its cache (its key reads the default list and None as one)."""
    tracked = [m.name for m in parse_metrics(metrics)]
    scored = list(dict.fromkeys([*DEFAULT_METRICS, *tracked]))
    rows: list[dict[str, Any]] = []
    for p in iter_runs(root):
        try:
            run = load_run(p, metrics=scored)
        except (WeknoraNbError, OSError) as exc:
            rows.append({"run": p.name, "problem": str(exc)})
            continue
        wide = run.scores.summary_wide()
        for st in wide.index:
            if stage is not None and st != stage:
                continue
            rows.append({"run": run.name, "started_at": run.manifest.get("started_at"),
                         "testset": run.testset.hash[7:19], "stage": st, "complete": run.scores.complete,
                         **{m: wide.loc[st, m] for m in tracked}})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------
# several versions: a ranking with the differences the data resolve
# ---------------------------------------------------------------------------------------
@dataclass
class Ranking:
    """What :func:`rank_versions` found: ``table`` (one row per version, best first: ``rank``, ``run``,
    ``mean``, ``tier``, ``resolved_from_next``) and ``pairs`` (every pair of versions: ``better``,
    ``worse``, ``n``, ``delta``, ``ci_low``, ``ci_high``, ``p_value``, ``p_holm``, ``resolved``)."""

    metric: str
    table: pd.DataFrame
    pairs: pd.DataFrame

    def describe(self) -> str:
        """The ranking in words: tiers of versions the data cannot tell apart."""
        lines = [f"ranking by {self.metric} (a tier: versions whose difference from the tier's best is not "
                 "resolved, Holm across every pair):"]
        for r in self.table.itertuples():
            lines.append(f"  {r.rank}. {r.run:<20} {r.mean:.4f}  tier {r.tier}")
        return "\n".join(lines)


def _version_values(cmp: Comparison, metric: str) -> pd.DataFrame:
    """Queries x versions: each version's per-query value of ``metric`` (the baseline's from its pairs)."""
    pq = cmp.per_query
    if f"{metric}_a" not in pq.columns:
        raise UsageError(argument="metric", allowed=[c[:-2] for c in pq.columns if c.endswith("_a")], got=metric)
    wide = pq.pivot_table(index="query_id", columns="run", values=f"{metric}_b", aggfunc="first", observed=True)
    base = pq.groupby("query_id", sort=False)[f"{metric}_a"].first()
    out = pd.concat([base.rename(cmp.runs[0].name), wide], axis=1)
    return out[[r.name for r in cmp.runs]]


def rank_versions(cmp: Comparison, *, metric: str = HEADLINE_METRIC, alpha: float = 0.05,
                  resamples: int = 2000, seed: int = 0) -> Ranking:
    """Every version of ``cmp`` (baseline included) ranked by its mean ``metric`` over the queries all
    versions share, with a paired comparison of every pair (95 % paired-bootstrap interval,
    randomization-test p, Holm across all pairs). A difference is *resolved* when its Holm p < ``alpha``
    and its interval excludes 0. Tiers, best first: a version joins the current tier unless its difference
    from the tier's first version is resolved, in which case it starts the next tier."""
    values = _version_values(cmp, metric).dropna()
    means = values.mean().sort_values(ascending=False, kind="stable")
    order = list(means.index)
    pairs = []
    for i, hi in enumerate(order):
        for lo in order[i + 1:]:
            a, b = values[lo].to_numpy(), values[hi].to_numpy()
            ci = paired_bootstrap_ci(a, b, resamples=resamples, seed=seed)
            pairs.append({"better": hi, "worse": lo, "n": len(values), "delta": float((b - a).mean()),
                          "ci_low": float(ci[0]), "ci_high": float(ci[1]),
                          "p_value": float(randomization_test(a, b, resamples=resamples, seed=seed + 1))})
    pt = pd.DataFrame(pairs, columns=["better", "worse", "n", "delta", "ci_low", "ci_high", "p_value"])
    pt["p_holm"] = holm(pt["p_value"].to_numpy()) if len(pt) else []
    pt["resolved"] = (pt["p_holm"] < alpha) & ((pt["ci_low"] > 0) | (pt["ci_high"] < 0))
    resolved = {(r.better, r.worse): bool(r.resolved) for r in pt.itertuples()}
    tiers, tier, leader = [], 1, order[0] if order else None
    for v in order:
        if v != leader and resolved.get((leader, v), False):
            tier, leader = tier + 1, v
        tiers.append(tier)
    nxt = [resolved.get((v, w), False) for v, w in zip(order, order[1:], strict=False)] + [None]
    table = pd.DataFrame({"rank": range(1, len(order) + 1), "run": order, "mean": means.to_numpy(), "tier": tiers,
                          "resolved_from_next": nxt})
    return Ranking(metric, table, pt)
