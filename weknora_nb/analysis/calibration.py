"""How far an LLM's relevance grades agree with people's (docs/method.md section 16).

On the (query, chunk) items that carry both a grade from the grades file (:mod:`weknora_nb.core.grades`, either
purpose: chunks graded to calibrate, and fill-graded chunks a person has labelled since) and a person's label:

- the **confusion matrix**: people's grade (rows 0-3) against the LLM's (columns 0-3), counts;
- **weighted kappa**, linear and quadratic (Cohen's, on the fixed scale 0-3:
  :func:`weknora_nb.analysis.agreement.weighted_kappa`), and the share of equal grades;
- the **bias**: the mean of LLM grade minus people's grade, the share of items the LLM grades higher and lower,
  and its direction in words (``lenient``: higher more often than lower, ``strict``: the reverse);
- as **relevant or not** (grade >= 1, what the binary metrics see): of the chunks people call relevant, the share
  the LLM calls relevant too, and of those the LLM calls relevant, the share people call relevant;
- all of it **per query type** (the test set's ``query_type``, ``(none)`` when absent) and per ``purpose``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.agreement import weighted_kappa
from weknora_nb.core.grades import Grades
from weknora_nb.core.labels import GRADES
from weknora_nb.core.testset import TestSet

#: mean LLM - human grade differences within this band are "no clear bias"
NO_BIAS = 0.05


@dataclass
class Calibration:
    """The calibration of a grades file against people's labels (module docstring). ``items``: one row per item
    with both (``query_id``, ``chunk_id``, ``human``, ``llm``, ``purpose``, ``query_type``); ``overall`` and
    ``by_type`` / ``by_purpose``: the figures (:func:`figures`); ``confusion``: the matrix of all items."""

    marker: str
    items: pd.DataFrame
    overall: dict[str, Any]
    by_type: pd.DataFrame
    by_purpose: pd.DataFrame
    confusion: pd.DataFrame

    def describe(self) -> str:
        o = self.overall
        if not o["n"]:
            return (f"{self.marker}\nno chunk has both a person's label and an LLM grade: grade a calibration sample "
                    "(weknora-nb testset grade --calibration N) or label fill-graded chunks")
        lines = [self.marker, f"{o['n']} chunks with both a person's label and an LLM grade",
                 f"weighted kappa: linear {_f(o['kappa_linear'])}, quadratic {_f(o['kappa_quadratic'])}; same grade "
                 f"{_pct(o['same'])}", f"bias: {o['direction']}",
                 f"as relevant or not (grade >= 1): the LLM finds {_pct(o['relevant_recall'])} of what people call "
                 f"relevant; {_pct(o['relevant_precision'])} of what it calls relevant people call relevant too",
                 "confusion (rows: people's grade, columns: the LLM's):", self.confusion.to_string()]
        lines += ["by query type:", _table(self.by_type), "by purpose:", _table(self.by_purpose)]
        return "\n".join(lines)


def _f(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _table(frame: pd.DataFrame) -> str:
    cols = ["n", "kappa_linear", "kappa_quadratic", "same", "mean_difference", "higher", "lower", "direction"]
    return frame[cols].to_string(float_format=lambda x: f"{x:.3f}") if len(frame) else "(none)"


def figures(human: np.ndarray, llm: np.ndarray) -> dict[str, Any]:
    """The figures of one set of items (module docstring): ``n``, ``kappa_linear``, ``kappa_quadratic``,
    ``same``, ``mean_difference`` (LLM - human), ``higher``, ``lower``, ``direction``, ``relevant_recall``,
    ``relevant_precision``; NaN where undefined (with no item, or one grade everywhere)."""
    h, g = np.asarray(human, dtype=int), np.asarray(llm, dtype=int)
    n = len(h)
    if not n:
        nan = math.nan
        return {"n": 0, "kappa_linear": nan, "kappa_quadratic": nan, "same": nan, "mean_difference": nan,
                "higher": nan, "lower": nan, "direction": "no item", "relevant_recall": nan, "relevant_precision": nan}
    diff = g - h
    mean = float(diff.mean())
    higher, lower = float((diff > 0).mean()), float((diff < 0).mean())
    if abs(mean) <= NO_BIAS and abs(higher - lower) <= NO_BIAS:
        direction = f"no clear bias (mean difference {mean:+.2f} grade; higher {_pct(higher)}, lower {_pct(lower)})"
    else:
        word = "lenient: it grades higher than people" if mean > 0 else "strict: it grades lower than people"
        direction = (f"{word} (mean difference {mean:+.2f} grade; higher on {_pct(higher)} of chunks, lower on "
                     f"{_pct(lower)})")
    rel_h, rel_g = h >= 1, g >= 1
    return {"n": n, "kappa_linear": weighted_kappa(list(h), list(g), "linear")[0],
            "kappa_quadratic": weighted_kappa(list(h), list(g), "quadratic")[0], "same": float((diff == 0).mean()),
            "mean_difference": mean, "higher": higher, "lower": lower, "direction": direction,
            "relevant_recall": float(rel_g[rel_h].mean()) if rel_h.any() else math.nan,
            "relevant_precision": float(rel_h[rel_g].mean()) if rel_g.any() else math.nan}


def calibration(grades: Grades, human: TestSet) -> Calibration:
    """The grader against people's labels on every item that has both (module docstring)."""
    labels = human.qrels[["query_id", "chunk_id", "grade"]].rename(columns={"grade": "human"})
    both = grades.frame.rename(columns={"grade": "llm"}).merge(labels, on=["query_id", "chunk_id"], how="inner")
    types = human.queries.set_index("query_id")["query_type"] if "query_type" in human.queries else None
    both["query_type"] = (both["query_id"].map(types) if types is not None else None)
    both["query_type"] = both["query_type"].where(both["query_type"].notna() & (both["query_type"] != ""), "(none)")
    items = both[["query_id", "chunk_id", "human", "llm", "purpose", "query_type"]].astype(
        {"human": int, "llm": int}).reset_index(drop=True)
    confusion = pd.crosstab(pd.Categorical(items["human"], categories=GRADES),
                            pd.Categorical(items["llm"], categories=GRADES), dropna=False)
    confusion.index.name, confusion.columns.name = "human", "llm"
    return Calibration(grades.marker(), items, figures(items["human"], items["llm"]),
                       _grouped(items, "query_type"), _grouped(items, "purpose"), confusion)


def _grouped(items: pd.DataFrame, by: str) -> pd.DataFrame:
    rows = {key: figures(g["human"], g["llm"]) for key, g in items.groupby(by, sort=True)}
    return pd.DataFrame.from_dict(rows, orient="index") if rows else pd.DataFrame(
        columns=list(figures(np.empty(0), np.empty(0))))
