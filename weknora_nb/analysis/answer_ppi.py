"""The answer judge's scores corrected by a sample of human-rated answers (docs/method.md sections 11 and 16).

The same estimator as the corrected retrieval figures (:func:`weknora_nb.analysis.ppi.ppi_mean`), per criterion
(``correctness``, ``faithfulness``, ``relevance``, 1-5): for each valid query of a run,

- :math:`f_q` = the judge's score: the mean over the query's answers of each answer's mean over its judge repeats
  (:func:`weknora_nb.analysis.answers.answer_values`, ``judge.<criterion>``);
- :math:`y_q` = the people's rating: the mean of the ratings of the query's answers (a ratings file of
  :func:`weknora_nb.analysis.answers.read_ratings`, JSON lines or a CSV with the same columns; a rating without
  ``stage`` or ``repeat`` stands for every answer of the query), known only for the rated queries.

The **human-labelled sample** is the queries with a rating of the criterion; they must be a random sample of the
judged queries. A delta between two runs pairs the queries both runs' judge scored; its sample is the queries rated
in both (each run's ratings file rates that run's answers). Beside each corrected figure: the judge-only mean over
every query (an LLM's figure, said so) and the human-only mean over the rated queries with its classical interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from weknora_nb.analysis.answers import CRITERIA, _rating_problem, answer_values, judge_model, read_ratings
from weknora_nb.analysis.ppi import classical_mean, ppi_mean
from weknora_nb.core.errors import InputError, Problem, UsageError, reading
from weknora_nb.core.run import Run, load_run


def read_ratings_file(path: str | Path) -> pd.DataFrame:
    """Human ratings from a ``.jsonl`` file (:func:`~weknora_nb.analysis.answers.read_ratings`) or a ``.csv`` with
    the same columns (``query_id``, ``stage``, ``repeat``, ``correctness``, ``faithfulness``, ``relevance``; blank
    cells are no rating), every problem named by row and column (:class:`InputError`)."""
    import csv
    import io

    p = Path(path)
    if p.suffix.lower() != ".csv":
        return read_ratings(p)
    with reading(p):
        text = p.read_text(encoding="utf-8-sig")
    rows, problems = [], []
    for n, row in enumerate(csv.DictReader(io.StringIO(text)), start=1):
        rec: dict[str, object] = {}
        for key, value in row.items():
            value = (value or "").strip() if isinstance(value, str) else ""
            if not value:
                continue
            try:
                rec[str(key)] = int(value) if key in (*CRITERIA, "repeat") else value
            except ValueError:
                problems.append(Problem(str(p), n, str(key), f"must be an integer, got {value!r}", where="row"))
        bad = _rating_problem(rec)
        if bad:
            problems.append(Problem(str(p), n, bad[0], bad[1], where="row"))
        else:
            rows.append({"query_id": rec["query_id"], "stage": rec.get("stage"), "repeat": rec.get("repeat"),
                         **{c: rec.get(c) for c in CRITERIA}})
    if problems:
        raise InputError(p, problems)
    frame = pd.DataFrame(rows, columns=["query_id", "stage", "repeat", *CRITERIA])
    for c in CRITERIA:
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("float64")
    return frame


def rated_values(run: Run, ratings: pd.DataFrame, *, stage: str = "citations") -> pd.DataFrame:
    """Per query (index ``query_id``): ``f:<criterion>`` (the judge) and ``y:<criterion>`` (the ratings' mean, NaN
    where none rates the query)."""
    judge = answer_values(run, stage=stage)
    cols = [f"judge.{c}" for c in CRITERIA if f"judge.{c}" in judge.columns]
    if not cols:
        raise UsageError(f"run {run.name} holds no judgements (judgements.jsonl): run weknora-nb judge first")
    r = ratings[ratings["stage"].isna() | (ratings["stage"] == stage)]
    human = r.groupby("query_id")[list(CRITERIA)].mean()
    out = pd.DataFrame(index=judge.index)
    for c in CRITERIA:
        out[f"f:{c}"] = judge[f"judge.{c}"] if f"judge.{c}" in judge.columns else np.nan
        out[f"y:{c}"] = human[c].reindex(judge.index) if c in human.columns else np.nan
    return out


def _row(f: pd.Series, y: pd.Series) -> dict[str, object]:
    keep = f.notna()
    f, y = f[keep], y[keep]
    rated = y.notna()
    est = ppi_mean(y[rated].to_numpy(), f[rated].to_numpy(), f.to_numpy())
    human = classical_mean(y[rated].to_numpy())
    return {"judge": float(f.mean()), "human": human.estimate, "human_low": human.low, "human_high": human.high,
            "corrected": est.estimate, "low": est.low, "high": est.high, "n": int(len(f)), "n_rated": int(rated.sum()),
            "reason": est.reason}


def corrected_answers(runs: Sequence[str | Path | Run], ratings: Sequence[str | Path | pd.DataFrame], *,
                      stage: str = "citations") -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """``(means, deltas, notes)``: per run and criterion the judge-only, human-only and corrected means; per run
    after the first and criterion, the same for the paired delta (module docstring). ``ratings``: one ratings file
    (or table) per run, in the runs' order. The notes say what judged (an LLM, or the sandbox's rule)."""
    if len(ratings) != len(runs):
        raise UsageError(argument="--ratings", allowed=f"one ratings file per run ({len(runs)})", got=len(ratings))
    loaded = [r if isinstance(r, Run) else load_run(r) for r in runs]
    tables = [read_ratings_file(t) if not isinstance(t, pd.DataFrame) else t for t in ratings]
    values = [rated_values(run, t, stage=stage) for run, t in zip(loaded, tables, strict=True)]
    means = [{"run": run.name, "criterion": c, **_row(v[f"f:{c}"], v[f"y:{c}"])}
             for run, v in zip(loaded, values, strict=True) for c in CRITERIA]
    deltas = []
    base = values[0]
    for run, v in zip(loaded[1:], values[1:], strict=True):
        both = v.index.intersection(base.index)
        for c in CRITERIA:
            deltas.append({"run": run.name, "baseline": loaded[0].name, "criterion": c,
                           **_row(v.loc[both, f"f:{c}"] - base.loc[both, f"f:{c}"],
                                  v.loc[both, f"y:{c}"] - base.loc[both, f"y:{c}"])})
    notes = []
    for run in loaded:
        m = judge_model(run) or {}
        who = ", ".join(m.get("served_models") or []) or (m.get("judge") or {}).get("model") or "unknown"
        kind = "a rule-based judge, not a language model" if m.get("rule_based") else "an LLM judge"
        notes.append(f"scores: {kind} ({who}) for run {run.name}")
    notes.append("the corrected figure is valid when the rated queries are a random sample of the judged ones")
    return pd.DataFrame(means), pd.DataFrame(deltas), notes
