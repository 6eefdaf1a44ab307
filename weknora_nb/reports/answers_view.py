"""What the answers notebook (06) shows, one call a cell (docs/method.md section 11).

:func:`open_answers` reads a run's answers (``answers.jsonl``), their citation metrics and the
judge's records (``judgements.jsonl``, ``judge.json``); the other functions turn them into
escaped tables and figures. Failed judgements are counted and listed, never scored. The judge
is named on the page: a rule-based one (the sandbox's) as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
from IPython.display import HTML

from weknora_nb.analysis.answers import CRITERIA, criterion_summary, judge_model, judgement_frame, stability
from weknora_nb.analysis.citations import CitationScores, citation_scores, citation_table
from weknora_nb.core.answers import JUDGEMENTS, read_answers, read_judgement_records
from weknora_nb.core.run import ANSWERS, Run
from weknora_nb.reports import safe
from weknora_nb.reports.figures import _done, figure_style


@dataclass
class AnswersView:
    """A run's answers of one stage, their citation metrics and the judge's records (possibly none)."""

    run: Run
    stage: str
    answers: pd.DataFrame
    citations: CitationScores | None
    records: list[dict[str, Any]]
    judge: dict[str, Any] | None

    @property
    def frame(self) -> pd.DataFrame:
        """One row per judged record (criteria as float columns)."""
        f = judgement_frame(self.records)
        return f[f["stage"] == self.stage]


def open_answers(run: Run, stage: str = "citations") -> AnswersView:
    """Read what the run folder holds about the answers of ``stage``."""
    answers = read_answers(run.path / ANSWERS) if (run.path / ANSWERS).is_file() else pd.DataFrame(
        columns=["query_id", "stage", "repeat", "answer", "citations"])
    cs = citation_scores(run, answers, stage=stage) if len(answers) else None
    records = read_judgement_records(run.path / JUDGEMENTS) if (run.path / JUDGEMENTS).is_file() else []
    return AnswersView(run, stage, answers[answers["stage"] == stage], cs, records, judge_model(run))


def judge_line(view: AnswersView) -> HTML:
    """One sentence: how many answers, who judged them (a rule-based judge named as such), how many failed."""
    n_failed = sum(1 for r in view.records if r.get("status") == "failed" and r.get("stage") == view.stage)
    if not view.records:
        return HTML(safe.text(f"{len(view.answers)} answers; none judged "
                              f"(run weknora-nb judge --run {view.run.path})."))
    j = view.judge or {}
    model = ", ".join(j.get("served_models") or [str((j.get("judge") or {}).get("model", "?"))])
    kind = ("a deterministic rule-based judge, not a language model: its scores follow documented rules"
            if j.get("rule_based") else "an LLM judge")
    return HTML(safe.text(f"{len(view.answers)} answers at stage {view.stage}, judged by {model} ({kind}); "
                          f"{len(view.frame)} judgements scored, {n_failed} failed (listed below, never scored)."))


def scores_table(view: AnswersView, *, resamples: int = 2000) -> HTML:
    """Per criterion: the mean over queries (1-5) with its 95 % interval and the counts."""
    summary = criterion_summary(view.frame, resamples=resamples).get(view.stage, {})
    rows = [{"criterion": c, **summary[c]} for c in CRITERIA if c in summary]
    return HTML(safe.table(pd.DataFrame(rows).round(3)) if rows else safe.text("No judged answer."))


def score_distributions(view: AnswersView) -> Any:
    """How the answers' scores (mean of the judge repeats) spread over 1-5, one panel per criterion."""
    import matplotlib.pyplot as plt

    per_answer = view.frame.groupby(["query_id", "repeat"])[list(CRITERIA)].mean()
    figure_style()
    fig, axs = plt.subplots(1, len(CRITERIA), sharey=True, figsize=(10, 3), layout="constrained")
    for ax, c in zip(axs, CRITERIA, strict=True):
        ax.hist(per_answer[c].dropna(), bins=[0.75 + 0.5 * i for i in range(10)], color="#4c72b0")
        ax.set_title(c)
        ax.set_xticks([1, 2, 3, 4, 5])
    axs[0].set_ylabel("answers")
    return _done(fig)


def by_type(view: AnswersView) -> HTML:
    """Mean of each criterion per query type (over queries), with the number of queries."""
    per_query = view.frame.groupby("query_id")[list(CRITERIA)].mean()
    types = view.run.testset.queries.set_index("query_id")["query_type"].fillna("(none)")
    t = per_query.join(types).groupby("query_type").agg(["mean"]).droplevel(1, axis=1)
    t.insert(0, "queries", per_query.join(types).groupby("query_type").size())
    return HTML(safe.table(t.round(3).reset_index()))


def citations(view: AnswersView) -> HTML:
    """The citation metrics (mean, answers defined for, meaning) and the counts of answers left out."""
    cs = view.citations
    if cs is None:
        return HTML(safe.text("No answers: the run has no citations stage."))
    note = (f"{cs.n_answers} answers; {cs.n_invalid} of invalid queries left out; {cs.n_failed} chat requests "
            "failed (no answer to score).")
    return HTML(safe.table(citation_table(cs).round(3)) + safe.text(note))


def reordered(view: AnswersView, limit: int = 20) -> HTML:
    """The answers that cite in another order than the references list them (Kendall's tau, RBO)."""
    cs = view.citations
    if cs is None or cs.reordered().empty:
        return HTML(safe.text("No answer cites its chunks in another order than the references list them."))
    r = cs.reordered()
    return HTML(safe.text(f"{len(r)} answers reorder their citations; the first {min(limit, len(r))}:")
                + safe.table(r[["query_id", "repeat", "kendall_tau", "rbo"]].head(limit).round(3)))


def worst(view: AnswersView, n: int = 10, criterion: str = "correctness") -> HTML:
    """The ``n`` queries whose answer scored lowest on ``criterion`` (one row a query, its lowest-scored
    answer): question, answer, citations, the judge's reason."""
    judged = [r for r in view.records if r.get("status") == "judged" and r.get("stage") == view.stage
              and (r.get("scores") or {}).get(criterion) is not None]
    if not judged:
        return HTML(safe.text("No judged answer."))
    judged.sort(key=lambda r: (r["scores"][criterion], r["query_id"], r["repeat"]))
    seen: set[str] = set()
    answers = view.answers.set_index(["query_id", "repeat"])
    questions = view.run.testset.queries.set_index("query_id")["query"]
    rows = []
    for r in judged:  # one row per query: its lowest-scored answer
        key = (r["query_id"], r["repeat"])
        if r["query_id"] in seen:
            continue
        seen.add(r["query_id"])
        a = answers.loc[key] if key in answers.index else None
        rows.append({"query_id": r["query_id"], "question": questions.get(r["query_id"], ""),
                     criterion: r["scores"][criterion], "reason": (r.get("reasons") or {}).get(criterion, ""),
                     "answer": "" if a is None else str(a["answer"])[:400],
                     "citations": "" if a is None else ", ".join(a["citations"])})
        if len(rows) == n:
            break
    return HTML(safe.table(pd.DataFrame(rows)))


def stability_table(view: AnswersView) -> HTML:
    """Over answers judged at least twice: the share whose repeats agree within 1 point, exactly, and the mean SD."""
    st = stability(view.frame)
    return HTML(safe.table(pd.DataFrame([{"criterion": c, **v} for c, v in st.items()]).round(3)))


def failures(view: AnswersView, limit: int = 20) -> HTML:
    """The failed judgements by kind, with the first ``limit`` (their raw text, escaped)."""
    failed = [r for r in view.records if r.get("status") == "failed" and r.get("stage") == view.stage]
    if not failed:
        return HTML(safe.text("No judgement failed."))
    t = pd.DataFrame([{"query_id": r["query_id"], "repeat": r["repeat"], "judge_repeat": r.get("judge_repeat"),
                       "kind": r.get("kind"), "raw": str(r.get("raw") or r.get("error") or "")[:200]} for r in failed])
    counts = ", ".join(f"{k} {v}" for k, v in t["kind"].value_counts().items())
    return HTML(safe.text(f"{len(t)} judgements failed ({counts}); the first {min(limit, len(t))}:")
                + safe.table(t.head(limit)))


def cost(view: AnswersView) -> HTML:
    """The judge's ledger: calls, tokens, cost (prices as the judge run was given them)."""
    ledger = (view.judge or {}).get("ledger")
    if not ledger:
        return HTML(safe.text("No judge ledger (the run was not judged)."))
    return HTML(safe.table(pd.DataFrame([ledger])))
