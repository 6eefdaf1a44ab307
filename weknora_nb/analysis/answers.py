r"""Judged answers summarised: means with intervals, the judge's stability, pairwise wins, calibration.

Works on the records of a judgement log (``judgements.jsonl``, ``pairwise/<baseline>.jsonl``:
plain dicts, as :func:`weknora_nb.collect.judge.store.read_judgements` returns them); only records
with ``status`` ``judged`` carry scores, failed ones are counted, never scored.

- **Means** (:func:`criterion_summary`): an answer's score is the mean of its judge repeats; a
  query's, the mean of its answers (the collector's repeats); a criterion's figure, the mean over
  queries, with its 95 % percentile bootstrap interval resampling queries
  (:func:`~weknora_nb.analysis.stats.bootstrap_ci`): a query's answers are not independent of
  one another, so the query is the unit resampled, as in every other figure.
- **Stability** (:func:`stability`): over answers judged at least twice, the share whose
  repeats agree within 1 point (max - min <= 1), the share that agree exactly, and the mean
  within-answer standard deviation (sample SD, ddof 1).
- **Pairwise** (:func:`pairwise_summary`): wins, ties and losses of the run against the baseline
  (the rule is :func:`weknora_nb.collect.judge.pairwise.judge_pairwise`'s), net = (wins - losses) / n, and
  its 95 % interval by a bootstrap over queries of the ratio (the sums of each resample divided).
- **Calibration** (:func:`calibration`): the judge against human ratings (:func:`read_ratings`,
  a JSON-lines file ``{"query_id", "stage"?, "repeat"?, "correctness"?, "faithfulness"?,
  "relevance"?}`` with integer ratings 1-5; a rating without ``stage`` or ``repeat`` stands for
  every answer of that query). Per criterion: Spearman's rho (scipy) between the ratings and the
  judge's mean score of the answers they stand for, and the quadratic-weighted kappa

  .. math:: \kappa_w = 1 - \frac{\sum_{ij} w_{ij} O_{ij}}{\sum_{ij} w_{ij} E_{ij}}, \quad
            w_{ij} = \frac{(i - j)^2}{(k - 1)^2}

  where :math:`O` counts (rating, judge score) pairs over the k = 5 categories, :math:`E` is the
  outer product of the two marginals over n, and the judge's mean is rounded half up.
"""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.stats import DEFAULT_RESAMPLES, bootstrap_ci
from weknora_nb.core.answers import JUDGE_MANIFEST, JUDGEMENTS, read_answers, read_judgement_records
from weknora_nb.core.errors import InputError, Problem, reading
from weknora_nb.core.run import ANSWERS, Run

CRITERIA = ("correctness", "faithfulness", "relevance")
_KEYS = ["query_id", "stage", "repeat"]


def judgement_frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per judged record: ``query_id``, ``stage``, ``repeat``, ``judge_repeat`` and a float
    column per criterion (NaN where the judge gave none: correctness without a reference answer)."""
    rows = [{"query_id": r["query_id"], "stage": r["stage"], "repeat": r["repeat"], "judge_repeat": r["judge_repeat"],
             **{c: (r.get("scores") or {}).get(c) for c in CRITERIA}}
            for r in records if r.get("status") == "judged" and isinstance(r.get("scores"), dict)]
    frame = pd.DataFrame(rows, columns=[*_KEYS, "judge_repeat", *CRITERIA])
    for c in CRITERIA:
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("float64")
    return frame


def _answer_means(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.groupby(_KEYS, sort=True)[list(CRITERIA)].mean().reset_index()


def criterion_summary(frame: pd.DataFrame, *, resamples: int = DEFAULT_RESAMPLES,
                      seed: int | None = 0) -> dict[str, dict[str, dict[str, Any]]]:
    """``{stage: {criterion: {"mean", "low", "high", "n_queries", "n_answers", "n_judgements"}}}``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    answers = _answer_means(frame)
    for stage, group in answers.groupby("stage", sort=True):
        per_query = group.groupby("query_id")[list(CRITERIA)].mean()
        judged = frame[frame["stage"] == stage]
        out[str(stage)] = {}
        for c in CRITERIA:
            values = per_query[c].dropna().to_numpy()
            low, high = bootstrap_ci(values, resamples=resamples, seed=seed) if len(values) else (math.nan, math.nan)
            out[str(stage)][c] = {"mean": _num(values.mean()) if len(values) else None, "low": _num(low),
                                  "high": _num(high), "n_queries": int(len(values)),
                                  "n_answers": int(group[c].notna().sum()),
                                  "n_judgements": int(judged[c].notna().sum())}
    return out


def stability(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per criterion, over answers with >= 2 judged repeats: ``answers``, ``within_1`` (share whose
    repeats span at most 1 point), ``exact`` (share that agree), ``mean_sd`` (mean sample SD)."""
    out: dict[str, dict[str, Any]] = {}
    for c in CRITERIA:
        g = frame.dropna(subset=[c]).groupby(_KEYS)[c]
        stats = pd.DataFrame({"n": g.count(), "span": g.max() - g.min(), "sd": g.std(ddof=1)})
        stats = stats[stats["n"] >= 2]
        n = len(stats)
        out[c] = {"answers": n, "within_1": _num((stats["span"] <= 1).mean()) if n else None,
                  "exact": _num((stats["span"] == 0).mean()) if n else None,
                  "mean_sd": _num(stats["sd"].mean()) if n else None}
    return out


def pairwise_summary(records: Iterable[dict[str, Any]], *, resamples: int = DEFAULT_RESAMPLES,
                     seed: int | None = 0) -> dict[str, Any]:
    """Wins, ties, losses of the run, ``net`` = (wins - losses) / n with its 95 % interval, the share of
    pairs whose two orders disagreed (``position_disagreement``: the judge followed the position)."""
    judged = [r for r in records if r.get("status") == "judged" and r.get("outcome") in ("win", "tie", "loss")]
    n = len(judged)
    counts = {k: sum(1 for r in judged if r["outcome"] == k) for k in ("win", "tie", "loss")}
    disagree = sum(1 for r in judged if len(set((r.get("verdicts") or {}).values())) > 1)
    by_query: dict[str, list[int]] = {}
    for r in judged:
        by_query.setdefault(r["query_id"], []).append({"win": 1, "tie": 0, "loss": -1}[r["outcome"]])
    low, high = _ratio_interval([sum(v) for v in by_query.values()], [len(v) for v in by_query.values()],
                                resamples, seed)
    return {"wins": counts["win"], "ties": counts["tie"], "losses": counts["loss"], "n": n, "n_queries": len(by_query),
            "net": _num((counts["win"] - counts["loss"]) / n) if n else None, "low": low, "high": high,
            "position_disagreement": _num(disagree / n) if n else None}


def _ratio_interval(num: Sequence[float], den: Sequence[float], resamples: int,
                    seed: int | None) -> tuple[float | None, float | None]:
    """95 % percentile bootstrap interval of sum(num) / sum(den), resampling the units (queries)."""
    if not num:
        return None, None
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    ratios = a[idx].sum(axis=1) / b[idx].sum(axis=1)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return _num(low), _num(high)


# ---------------------------------------------------------------------------------------
# calibration against human ratings
# ---------------------------------------------------------------------------------------
def read_ratings(path: str | Path) -> pd.DataFrame:
    """Human ratings, one JSON object a line: ``query_id`` (str), optional ``stage`` (str) and
    ``repeat`` (int), and at least one of the criteria as an integer 1-5. Every problem at once
    (:class:`InputError` naming line and field)."""
    p = Path(path)
    with reading(p):
        lines = p.read_text(encoding="utf-8").splitlines()
    rows, problems = [], []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            problems.append(Problem(str(p), n, None, f"not JSON ({exc})"))
            continue
        bad = _rating_problem(rec)
        if bad:
            problems.append(Problem(str(p), n, bad[0], bad[1]))
            continue
        rows.append({"query_id": rec["query_id"], "stage": rec.get("stage"), "repeat": rec.get("repeat"),
                     **{c: rec.get(c) for c in CRITERIA}})
    if problems:
        raise InputError(p, problems)
    frame = pd.DataFrame(rows, columns=[*_KEYS, *CRITERIA])
    for c in CRITERIA:
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("float64")
    return frame


def _rating_problem(rec: Any) -> tuple[str | None, str] | None:
    if not isinstance(rec, dict):
        return None, "not a JSON object"
    if not isinstance(rec.get("query_id"), str):
        return "query_id", "missing or not a string"
    if rec.get("stage") is not None and not isinstance(rec["stage"], str):
        return "stage", "not a string"
    if rec.get("repeat") is not None and (isinstance(rec["repeat"], bool) or not isinstance(rec["repeat"], int)):
        return "repeat", "not an integer"
    unknown = sorted(set(rec) - {"query_id", "stage", "repeat", *CRITERIA})
    if unknown:
        return unknown[0], f"not a field of a rating (fields: query_id, stage, repeat, {', '.join(CRITERIA)})"
    given = [c for c in CRITERIA if rec.get(c) is not None]
    if not given:
        return None, f"no rating: give at least one of {', '.join(CRITERIA)}"
    for c in given:
        v = rec[c]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 5:
            return c, f"must be an integer from 1 to 5, got {v!r}"
    return None


def quadratic_weighted_kappa(a: Sequence[int], b: Sequence[int], categories: Sequence[int] = (1, 2, 3, 4, 5)) -> float:
    """Cohen's kappa with quadratic weights between two raters' integer ratings (module docstring);
    NaN when it is undefined (no pair, or both raters always give one and the same category)."""
    k = len(categories)
    pos = {c: i for i, c in enumerate(categories)}
    if not len(a) or k < 2:
        return math.nan
    observed = np.zeros((k, k))
    for x, y in zip(a, b, strict=True):
        observed[pos[int(x)], pos[int(y)]] += 1
    n = observed.sum()
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / n
    i, j = np.indices((k, k))
    w = (i - j) ** 2 / (k - 1) ** 2
    denom = (w * expected).sum()
    return float(1 - (w * observed).sum() / denom) if denom > 0 else math.nan


def calibration(frame: pd.DataFrame, ratings: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per criterion: ``n`` (ratings matched to judged answers), ``spearman`` and its ``spearman_p``,
    ``kappa_quadratic`` (module docstring)."""
    from scipy.stats import spearmanr

    answers = _answer_means(frame)
    out: dict[str, dict[str, Any]] = {}
    for c in CRITERIA:
        human, judge = [], []
        for rating in ratings.dropna(subset=[c]).itertuples(index=False):
            match = answers[answers["query_id"] == rating.query_id]
            if isinstance(rating.stage, str):
                match = match[match["stage"] == rating.stage]
            if rating.repeat is not None and not (isinstance(rating.repeat, float) and math.isnan(rating.repeat)):
                match = match[match["repeat"] == int(rating.repeat)]
            value = match[c].mean()
            if not math.isnan(value):
                human.append(int(getattr(rating, c)))
                judge.append(float(value))
        n = len(human)
        rho, p = spearmanr(human, judge) if n >= 2 else (math.nan, math.nan)
        rounded = [int(math.floor(v + 0.5)) for v in judge]
        out[c] = {"n": n, "spearman": _num(rho), "spearman_p": _num(p),
                  "kappa_quadratic": _num(quadratic_weighted_kappa(human, rounded))}
    return out


def judge_summary(records: Sequence[dict[str, Any]], *, ratings: pd.DataFrame | None = None,
                  resamples: int = DEFAULT_RESAMPLES) -> dict[str, Any]:
    """The figures of a pointwise judgement log: ``stages`` (:func:`criterion_summary`), ``criteria`` (the
    one stage's, when there is one), ``stability`` and, with ``ratings``, ``calibration``."""
    frame = judgement_frame(records)
    stages = criterion_summary(frame, resamples=resamples)
    out: dict[str, Any] = {"criteria": next(iter(stages.values())) if len(stages) == 1 else None, "stages": stages,
                           "stability": stability(frame)}
    if ratings is not None:
        out["calibration"] = calibration(frame, ratings)
    return out


def format_judge_summary(summary: dict[str, Any]) -> str:
    """The command line's text for a judge summary (the ``--json`` object): what was judged, the figures."""
    judge = summary.get("judge") or {}
    lines = [f"judge {judge.get('model')} ({', '.join(judge.get('served_models') or []) or 'no reply yet'}) on "
             f"{summary['run']}: {summary['judged']} of {summary['judgements_expected']} judgements made "
             f"({summary['answers']} answers), {summary['failed']} failed {summary['failed_by_kind'] or ''}, "
             f"{summary['not_judged']} not made"]
    lines += [f"  note: {n}" for n in judge.get("notes") or []]
    tokens = summary["tokens"]
    lines.append(f"  this run: {summary['calls_made']} calls, {summary['cache_hits']} from the cache, "
                 f"{summary['already_judged']} judged before; {tokens['prompt']} + {tokens['completion']} tokens, "
                 f"cost {summary['cost']:.4f}" + (" (stopped by --max-cost)" if summary["stopped_by_max_cost"] else ""))
    if summary.get("estimate"):
        e = summary["estimate"]
        lines.append(f"  dry run: {e['judgements']} judgements to make, {e['calls']} calls ({e['cached']} cached), "
                     f"~{e['prompt_tokens']} prompt tokens, at most {e['completion_tokens_at_most']} completion "
                     f"tokens, cost at most {e['cost_at_most']:.4f}")
    for stage, figures in (summary.get("stages") or {}).items():
        shown = ", ".join(f"{c} {_fmt(f['mean'])} [{_fmt(f['low'])}, {_fmt(f['high'])}]" for c, f in figures.items())
        lines.append(f"  {stage}: {shown} (95 % intervals over queries)")
    for c, s in (summary.get("stability") or {}).items():
        if s["answers"]:
            lines.append(f"  stability of {c}: {_fmt(s['within_1'])} of {s['answers']} answers within 1 point, "
                         f"mean SD {_fmt(s['mean_sd'])}")
    pair = summary.get("pairwise")
    if pair:
        lines.append(f"  against {summary.get('baseline')}: {pair['wins']} wins, {pair['ties']} ties, {pair['losses']} "
                     f"losses; net {_fmt(pair['net'])} [{_fmt(pair['low'])}, {_fmt(pair['high'])}]")
    for c, k in (summary.get("calibration") or {}).items():
        lines.append(f"  calibration of {c}: n {k['n']}, Spearman {_fmt(k['spearman'])}, "
                     f"quadratic kappa {_fmt(k['kappa_quadratic'])}")
    return "\n".join(lines)


def _fmt(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _num(x: Any) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# ---------------------------------------------------------------------------------------
# per-query answer values: what the comparison and the gate pair up
# ---------------------------------------------------------------------------------------
#: the answer metrics named in comparisons and gate bounds (``judge.<criterion>`` 1-5; citations 0-1)
ANSWER_METRICS = (*(f"judge.{c}" for c in CRITERIA), "citation_precision", "citation_recall", "citation_ndcg@10",
                  "cites_grade3")


def answer_values(run: Run, *, stage: str = "citations") -> pd.DataFrame:
    """Per valid query (index ``query_id``): the mean over its answers (the collector's repeats) of
    every answer metric the run folder holds: ``judge.<criterion>`` from ``judgements.jsonl`` (an
    answer's score is the mean of its judge repeats; failed judgements left out) and the citation
    metrics of :mod:`weknora_nb.analysis.citations` from ``answers.jsonl``. Empty when it holds neither.

    Computed once per run object, stage and state of those two files (inode, size and modification
    time): a comparison page asks for the same run's values from several tables. While reports render,
    once per rendering (:data:`values_cache`): each report's comparison shows the baseline's values again."""
    files = tuple(_file_state(run.path / name) for name in (ANSWERS, JUDGEMENTS))
    kept = _values_kept.get(id(run))
    if kept is not None and kept[0]() is run and kept[1] == (stage, files):
        return kept[2].copy()
    if values_cache is None:
        values = _answer_values(run, stage)
    else:
        values = values_cache(run, stage, lambda: _answer_values(run, stage))
    if kept is None or kept[0]() is not run:
        weakref.finalize(run, _values_kept.pop, id(run), None)
    _values_kept[id(run)] = (weakref.ref(run), (stage, files), values)
    return values.copy()


#: set while reports render (in their kernels: :func:`weknora_nb.reports.cache.use_in_this_kernel`): ``values_cache(run,
#: stage, compute)`` is ``compute()``, the values of ``run`` at ``stage``, computed once per rendering for the bytes of
#: its folder's files (:func:`weknora_nb.reports.cache.cached_answer_values`); None: computed in this process
values_cache: Callable[[Run, str, Callable[[], pd.DataFrame]], pd.DataFrame] | None = None

#: the last :func:`answer_values` of each run object: (a reference to check it is that run, (stage, files), values)
_values_kept: dict[int, tuple[weakref.ref, tuple[str, tuple], pd.DataFrame]] = {}


def _file_state(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, modification time in ns) of ``path``, None when there is no such file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _answer_values(run: Run, stage: str) -> pd.DataFrame:
    """:func:`answer_values`, computed."""
    from weknora_nb.analysis.citations import citation_scores

    parts = []
    if (run.path / ANSWERS).is_file():
        cs = citation_scores(run, read_answers(run.path / ANSWERS), stage=stage)
        cols = [m for m in ANSWER_METRICS if m in cs.per_answer.columns]
        parts.append(cs.per_answer.groupby("query_id")[cols].mean())
    if (run.path / JUDGEMENTS).is_file():
        frame = judgement_frame(read_judgement_records(run.path / JUDGEMENTS))
        frame = frame[(frame["stage"] == stage) & frame["query_id"].isin(run.testset.valid_ids)]
        per_query = _answer_means(frame).groupby("query_id")[list(CRITERIA)].mean()
        parts.append(per_query.rename(columns={c: f"judge.{c}" for c in CRITERIA}))
    if not parts:
        return pd.DataFrame(index=pd.Index([], name="query_id"))
    return pd.concat(parts, axis=1).rename_axis("query_id")


def judge_model(run: Run) -> dict[str, Any] | None:
    """What judged the run (``judge.json``: model, served models, whether it is rule-based), or None."""
    p = run.path / JUDGE_MANIFEST
    if not p.is_file():
        return None
    with reading(p):
        manifest = json.loads(p.read_text(encoding="utf-8"))
    return manifest if isinstance(manifest, dict) else None
