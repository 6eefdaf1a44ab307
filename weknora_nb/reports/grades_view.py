"""The corrected figures and the grader's calibration, as notebooks 02 and 05 show them (docs/method.md section 16).

A run's LLM relevance grades are found beside it: ``relevance-grades.jsonl`` in the runs folder (where ``weknora-nb
testset grade`` writes them), unless a notebook names another file; people's labels of the human sample are the
test set's, plus ``relevance-labels.jsonl`` beside the grades when it exists (a labels log of notebook 07_label, or
the demo's sample). Every table starts with the grades' marker (``grades: LLM (...)``), which says when the grades
come from the sandbox's rule-based grader rather than a language model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from IPython.display import HTML

from weknora_nb.core.grades import GRADES_FILE
from weknora_nb.reports import safe

#: a labels log of people beside the grades, laid over the test set in the corrected figures
LABELS_FILE = "relevance-labels.jsonl"


def find_grades(run_dir: str | Path, grades: str | Path | None = None) -> Path | None:
    """``grades`` when given, else ``relevance-grades.jsonl`` in the run folder's parent when it exists."""
    if grades:
        return Path(grades)
    p = Path(run_dir).resolve().parent / GRADES_FILE
    return p if p.is_file() else None


def _labels(grades_path: Path, labels: Sequence[str | Path] | None, query_ids: set[str]) -> list[Any] | None:
    from weknora_nb.analysis.worksheet import read_judgements

    paths = [Path(p) for p in labels] if labels else [p for p in [grades_path.parent / LABELS_FILE] if p.is_file()]
    if not paths:
        return None
    return [j for p in paths for j in read_judgements(p) if j.query_id in query_ids]


def _none(why: str) -> HTML:
    return HTML(safe.text(why))


def corrected(run_dir: str | Path, baseline_dirs: Sequence[str | Path] = (), *, stage: str | None = None,
              metrics: Sequence[str] | None = None, grades: str | Path | None = None,
              labels: Sequence[str | Path] | None = None) -> HTML:
    """The corrected figures (:func:`weknora_nb.analysis.corrected.corrected_estimates`): without baselines each
    metric's mean for the run; with them, the run's delta against the first baseline. Human-only, LLM-filled and
    corrected side by side, the marker and the notes above."""
    from weknora_nb.analysis.corrected import corrected_estimates, human_testset
    from weknora_nb.core.grades import read_grades
    from weknora_nb.core.run import load_run

    path = find_grades(run_dir, grades)
    if path is None:
        return _none("No LLM relevance grades beside this run: its figures count every unjudged chunk as "
                     "irrelevant. `weknora-nb testset grade` grades its pool; a small human sample then corrects "
                     "them (docs/method.md section 16).")
    g = read_grades(path)
    runs = [*baseline_dirs, run_dir]
    ts = load_run(run_dir).testset
    extra = _labels(path, labels, set(ts.queries["query_id"]))
    human = human_testset(runs, ts, extra)
    out = corrected_estimates(runs, g, testset=human, stage=stage, metrics=metrics)
    if extra:
        out.notes.insert(0, f"people's labels here are the test set's and {len(extra)} more of the human sample "
                            f"({LABELS_FILE} beside the grades), so the human-only figures can differ a little from "
                            "those above, scored on the test set alone")
    name = out.runs[-1]
    table = out.deltas if baseline_dirs else out.means
    table = table[table["run"] == name]
    signed = bool(baseline_dirs)
    rows = pd.DataFrame({
        "metric": table["metric"],
        "human-only [95 % CI]": [_ci(r.human, r.human_low, r.human_high, signed) for r in table.itertuples()],
        ("Δ" if signed else "") + "judged@10": table["judged_human"].round(3),
        "LLM-filled": table["llm"].map(lambda x: f"{x:+.4f}" if signed else f"{x:.4f}"),
        ("Δ" if signed else "") + "judged@10 with grades": table["judged_graded"].round(3),
        "corrected [95 % CI]": [_ci(r.corrected, r.low, r.high, signed) if not r.reason else f"n/a: {r.reason}"
                                for r in table.itertuples()],
        "labelled queries": [f"{r.n_labelled} of {r.n}" for r in table.itertuples()]})
    what = (f"{name} minus {out.runs[0]}" if baseline_dirs else name) + f" at stage {out.stage}"
    head = safe.bullets([out.marker], bold=True) + safe.text(f"{what}; the human-labelled sample: {out.n_labelled} "
                                                             f"of {out.n_graded} graded queries.")
    return HTML(head + safe.table(rows) + safe.bullets(out.notes, bold=False))


def _ci(x: float, lo: float, hi: float, signed: bool) -> str:
    f = "{:+.4f}" if signed else "{:.4f}"
    return f"{f.format(x)} [{f.format(lo)}, {f.format(hi)}]"


def calibration(run_dir: str | Path, *, grades: str | Path | None = None,
                labels: Sequence[str | Path] | None = None) -> HTML:
    """The grader against people (:func:`weknora_nb.analysis.calibration.calibration`): kappa, bias and its
    direction, the confusion matrix, the figures per query type."""
    from weknora_nb.analysis.calibration import calibration as calibrate
    from weknora_nb.core.grades import read_grades, with_labels
    from weknora_nb.core.run import load_run

    path = find_grades(run_dir, grades)
    if path is None:
        return _none("No LLM relevance grades beside this run: nothing to calibrate.")
    g = read_grades(path)
    ts = load_run(run_dir).testset
    extra = _labels(path, labels, set(ts.queries["query_id"]))
    cal = calibrate(g, with_labels(ts, extra) if extra else ts)
    o = cal.overall
    if not o["n"]:
        return _none(f"{cal.marker}: no chunk has both a person's label and an LLM grade yet.")
    lines = [f"{o['n']} chunks graded by both; weighted kappa linear {o['kappa_linear']:.3f}, quadratic "
             f"{o['kappa_quadratic']:.3f}; same grade {o['same']:.0%}", f"bias: {o['direction']}"]
    by_type = cal.by_type[["n", "kappa_linear", "kappa_quadratic", "same", "mean_difference", "higher", "lower"]]
    confusion = cal.confusion.rename_axis(index="people's grade", columns="LLM's grade")
    return HTML(safe.bullets([cal.marker], bold=True) + safe.bullets(lines, bold=False)
                + safe.table(confusion, index=True) + safe.table(by_type.round(3), index=True))
