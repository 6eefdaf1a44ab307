"""Generated questions beside the others, as a report shows them (03_stratify's section "By source", and the
warnings of every page that lists the run's warnings): docs/method.md section 17.

- :func:`by_source`: who wrote the generated questions (the closing note beside the test set: a language model, or
  the sandbox's deterministic rule-based generator, said so), the figures of each source at each retrieval stage
  with their intervals and the mean lexical overlap of each source's queries with their answers, keyword minus
  vector per source (how much more the keyword path gains), and the warnings;
- :func:`source_notes`: the warnings alone (:func:`weknora_nb.analysis.synthetic.bias.source_warnings`) and the
  generator's note, for :func:`weknora_nb.reports.notebook.warnings_note`; nothing for a test set without a
  generated query.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from IPython.display import HTML

from weknora_nb.core.pipeline import HEADLINE_METRIC
from weknora_nb.core.run import Run
from weknora_nb.core.synthetic import SYNTHETIC
from weknora_nb.reports import safe

#: the stages shown by source, when the run has them
STAGES = ("vector", "keyword", "hybrid", "final")


def _has_synthetic(run: Run) -> bool:
    q = run.testset.queries
    return "source" in q and bool((q["source"] == SYNTHETIC).any())


def _texts(run: Run) -> dict[str, str] | None:
    inv = run.inventory()
    if inv is None:
        return None
    return {str(c): t for c, t in zip(inv["chunk_id"], inv["content"], strict=True) if isinstance(t, str)}


def generator_note(run: Run) -> str | None:
    """Who wrote the generated questions, from the closing note beside the test set (``<test set>.summary.json``);
    None when the test set holds none."""
    from weknora_nb.analysis.sampling import summary_path

    if not _has_synthetic(run):
        return None
    path = summary_path(Path((run.manifest.get("testset") or {}).get("path") or run.testset.source))
    try:
        note: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ("The generated questions' closing note is not beside the test set: who wrote them is not known "
                "here.")
    gen = note.get("generator") or (note.get("generated") or {}).get("generator") or {}
    if gen.get("rule_based"):
        return (f"The generated questions were written by {gen.get('model')}, the weknora-nb sandbox's deterministic "
                "rule-based generator (fixed templates over the chunks' headings), not a language model.")
    return f"The generated questions were written by the model {gen.get('model')} at {gen.get('server')}."


def source_notes(run: Run) -> list[str]:
    """The generator's note and the warnings of generated questions (module docstring); [] without any."""
    from weknora_nb.analysis.synthetic.bias import overlaps, source_warnings

    if not _has_synthetic(run):
        return []
    note = generator_note(run)
    return ([note] if note else []) + source_warnings(run.testset, overlaps(run.testset, _texts(run)))


def by_source(run: Run, *, metrics: list[str] | None = None, resamples: int = 2000) -> HTML:
    """The figures by source (module docstring), or a sentence when the test set holds no generated query."""
    from weknora_nb.analysis.synthetic.bias import (
        OVERLAP_GAP,
        lexical_advantage,
        overlaps,
        source_table,
        source_warnings,
    )

    if not _has_synthetic(run):
        return HTML(safe.text("No generated question (source: synthetic) in this test set: nothing to set apart."))
    names = run.scores.metric_names
    mets = [m for m in (metrics or [HEADLINE_METRIC, "recall@10"]) if m in names] or names[:1]
    stages = [s for s in STAGES if s in run.scores.stages]
    table = source_table(run.scores, run.testset, _texts(run), stages=stages, metrics=mets, resamples=resamples)
    shown = table[["source", "stage", "n", "overlap"]].copy()
    for m in mets:
        shown[m] = [f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in
                    zip(table[m], table[f"{m} low"], table[f"{m} high"], strict=True)]
    shown["overlap"] = shown["overlap"].round(3)
    parts = [safe.text(generator_note(run) or ""),
             safe.text(f"Each source's valid queries at each stage: {', '.join(mets)} with 95 % intervals, and the "
                       "mean share of a query's tokens found in its best answer chunk (overlap)."),
             safe.table(shown)]
    advantage = lexical_advantage(table, mets[0])
    if not advantage.empty:
        parts += [safe.text(f"Keyword minus vector ({mets[0]}) by source: generated questions reuse their chunk's "
                            "words, so the keyword path gains more on them than on other queries."),
                  safe.table(advantage.round(3))]
    parts.append(safe.text("A generated question is labelled with the chunk it was written from (and the second "
                           "chunk of a paired question) only: another chunk that answers it counts as irrelevant, "
                           "so its figures are lower bounds until its top chunks are pooled and judged."))
    over = overlaps(run.testset, _texts(run))
    warnings = source_warnings(run.testset, over)
    synthetic = table[(table["source"] == SYNTHETIC)]["overlap"]
    others = table[(table["source"] != SYNTHETIC)]["overlap"]
    said = (f" (mean overlap {synthetic.iloc[0]:.2f} against {others.mean():.2f})"
            if len(synthetic) and len(others) and pd.notna(synthetic.iloc[0]) and pd.notna(others.mean()) else "")
    parts.append(safe.bullets(warnings, bold=True) if warnings else
                 safe.text("No warning: generated questions are a minority of the valid queries, and their lexical "
                           f"overlap is within {OVERLAP_GAP:.2f} of the other queries'{said}."))
    return HTML("\n".join(parts))


def frame(run: Run, *, metrics: list[str] | None = None) -> pd.DataFrame:
    """The table of :func:`by_source` as data (for a notebook that computes on it)."""
    from weknora_nb.analysis.synthetic.bias import source_table

    names = run.scores.metric_names
    mets = [m for m in (metrics or [HEADLINE_METRIC, "recall@10"]) if m in names] or names[:1]
    return source_table(run.scores, run.testset, _texts(run), stages=[s for s in STAGES if s in run.scores.stages],
                        metrics=mets)
