"""Agreement between assessors who graded the same (query, chunk) pairs (docs/method.md §10).

From the latest graded judgement of each assessor per (query, chunk) (skips left out):

- for every pair of assessors, on the items both graded: Cohen's kappa with linear and with
  quadratic weights (grades 0-3 are ordered: 0 against 3 is a worse disagreement than 2 against
  3), and unweighted, with the raw share of equal grades. Weights are the distances between the
  grades on the fixed scale 0-3 (scikit-learn's ``cohen_kappa_score(labels=[0, 1, 2, 3])``);
- with more than two assessors, Fleiss' kappa (nominal) on the items every one of them graded;
- the number of items each assessor covers, and a table of disagreements (query, chunk, each
  assessor's grade, spread = highest - lowest) sorted by spread, to adjudicate.

A kappa is undefined when the grades leave nothing to agree on by chance (every grade the same,
for both assessors: the agreement expected by chance is 1) or when no item is shared: it is
then NaN with the reason, never an error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.core.labels import GRADES, Judgement, latest

WEIGHTS = ("linear", "quadratic", None)


@dataclass(frozen=True)
class PairAgreement:
    """Two assessors on the items both graded."""

    a: str
    b: str
    n_items: int
    linear: float
    quadratic: float
    unweighted: float
    #: share of shared items with the same grade (NaN without shared items)
    observed: float
    #: why the kappas are NaN (None when they are defined)
    reason: str | None = None


@dataclass(frozen=True)
class FleissAgreement:
    """Fleiss' kappa of three or more assessors on the items every one of them graded."""

    assessors: tuple[str, ...]
    n_items: int
    kappa: float
    reason: str | None = None


@dataclass
class Agreement:
    """Agreement of the assessors of a set of judgements (see the module docstring)."""

    assessors: list[str]
    items_per_assessor: dict[str, int]
    n_items: int
    n_shared: int
    pairs: list[PairAgreement]
    fleiss: FleissAgreement | None
    disagreements: pd.DataFrame

    def describe(self, max_rows: int = 20) -> str:
        """A few lines for the terminal."""
        covers = ", ".join(f"{a} {n}" for a, n in self.items_per_assessor.items())
        lines = [f"{len(self.assessors)} assessors, {self.n_items} items, {self.n_shared} graded by two or more; "
                 f"items per assessor: {covers}"]
        for p in self.pairs:
            if p.reason:
                lines.append(f"{p.a} vs {p.b}: {p.n_items} shared items, kappa undefined: {p.reason}")
            else:
                lines.append(f"{p.a} vs {p.b}: {p.n_items} shared items, weighted kappa linear {p.linear:.3f}, "
                             f"quadratic {p.quadratic:.3f} (unweighted {p.unweighted:.3f}, "
                             f"same grade {p.observed:.0%})")
        if self.fleiss is not None:
            f = self.fleiss
            value = f"undefined: {f.reason}" if f.reason else f"{f.kappa:.3f}"
            lines.append(f"Fleiss' kappa ({len(f.assessors)} assessors, {f.n_items} items graded by all): {value}")
        d = self.disagreements
        if d.empty:
            lines.append("no disagreement")
        else:
            spread = ", ".join(f"spread {s}: {n}" for s, n in d["spread"].value_counts().sort_index(ascending=False)
                               .items())
            lines.append(f"{len(d)} disagreements to adjudicate ({spread}); the largest first:")
            lines.append(d.head(max_rows).to_string(index=False))
        return "\n".join(lines)

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON types; NaN kappas become null beside their reason."""
        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(float(x), 6)

        return {
            "assessors": self.assessors, "items_per_assessor": self.items_per_assessor, "n_items": self.n_items,
            "n_shared": self.n_shared,
            "pairs": [{"a": p.a, "b": p.b, "n_items": p.n_items, "kappa_linear": num(p.linear),
                       "kappa_quadratic": num(p.quadratic), "kappa_unweighted": num(p.unweighted),
                       "observed_agreement": num(p.observed), "reason": p.reason} for p in self.pairs],
            "fleiss": None if self.fleiss is None else {
                "assessors": list(self.fleiss.assessors), "n_items": self.fleiss.n_items,
                "kappa": num(self.fleiss.kappa), "reason": self.fleiss.reason},
            "disagreements": [{k: (None if pd.isna(v) else int(v) if k not in ("query_id", "chunk_id") else v)
                               for k, v in rec.items()} for rec in self.disagreements.to_dict("records")],
        }


# ---------------------------------------------------------------------------------------
# the coefficients
# ---------------------------------------------------------------------------------------
def weighted_kappa(x: Sequence[int], y: Sequence[int], weights: str | None = "linear",
                   categories: Sequence[int] = GRADES) -> tuple[float, str | None]:
    """Cohen's kappa of two assessors' grades of the same items: ``(kappa, None)``, or ``(nan, reason)``.

    ``weights``: ``"linear"`` (|i - j|), ``"quadratic"`` ((i - j)²) or None (unweighted), distances
    taken on ``categories`` (the grades 0-3).
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    if len(x) != len(y):
        raise ValueError(f"the two assessors' grades differ in length ({len(x)} and {len(y)})")
    if not x:
        return math.nan, "no item graded by both"
    cats = list(categories)
    k = len(cats)
    index = {c: i for i, c in enumerate(cats)}
    observed = np.zeros((k, k))
    np.add.at(observed, ([index[v] for v in x], [index[v] for v in y]), 1.0)
    observed /= observed.sum()
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    dist = np.subtract.outer(np.arange(k), np.arange(k))
    w = np.abs(dist) if weights == "linear" else dist ** 2 if weights == "quadratic" else (dist != 0) * 1.0
    chance = float((w * expected).sum())
    if chance <= 1e-12:
        return math.nan, f"every grade is {x[0]} for both assessors: agreement by chance is 1, kappa is undefined"
    return 1.0 - float((w * observed).sum()) / chance, None


def fleiss_kappa(counts: np.ndarray) -> tuple[float, str | None]:
    """Fleiss' kappa of an items x categories table of counts (each row sums to the number of raters).

    ``(kappa, None)``, or ``(nan, reason)`` with no item or when every rating falls in one category.
    """
    table = np.asarray(counts, dtype=float)
    if table.ndim != 2 or table.shape[0] == 0:
        return math.nan, "no item graded by every assessor"
    raters = table.sum(axis=1)
    if not np.allclose(raters, raters[0]) or raters[0] < 2:
        raise ValueError("every item needs the same number (>= 2) of ratings")
    m = raters[0]
    p_item = ((table ** 2).sum(axis=1) - m) / (m * (m - 1))
    p_cat = table.sum(axis=0) / table.sum()
    p_bar, p_exp = float(p_item.mean()), float((p_cat ** 2).sum())
    if p_exp >= 1 - 1e-12:
        return math.nan, "every rating is the same grade: agreement by chance is 1, kappa is undefined"
    return (p_bar - p_exp) / (1 - p_exp), None


# ---------------------------------------------------------------------------------------
# from judgements
# ---------------------------------------------------------------------------------------
def agreement(judgements: Iterable[Judgement]) -> Agreement:
    """Pairwise weighted Cohen's kappas, Fleiss' kappa (three or more assessors), coverage and the
    disagreements of ``judgements`` (every assessor's latest graded judgement per item)."""
    items: dict[tuple[str, str], dict[str, int]] = {}
    for j in latest(j for j in judgements if j.grade is not None):
        assert j.grade is not None
        items.setdefault((j.query_id, j.chunk_id), {})[j.assessor] = j.grade
    assessors = sorted({a for grades in items.values() for a in grades})
    covers = {a: sum(a in g for g in items.values()) for a in assessors}
    pairs = [_pair(a, b, items) for a, b in itertools.combinations(assessors, 2)]
    fleiss = _fleiss(assessors, items) if len(assessors) > 2 else None
    return Agreement(assessors, covers, len(items), sum(len(g) >= 2 for g in items.values()), pairs, fleiss,
                     _disagreements(assessors, items))


def _pair(a: str, b: str, items: dict[tuple[str, str], dict[str, int]]) -> PairAgreement:
    both = [(g[a], g[b]) for g in items.values() if a in g and b in g]
    x, y = [p[0] for p in both], [p[1] for p in both]
    values = {w: weighted_kappa(x, y, w) for w in WEIGHTS}
    reason = next((r for _, r in values.values() if r), None)
    observed = sum(p == q for p, q in both) / len(both) if both else math.nan
    return PairAgreement(a, b, len(both), values["linear"][0], values["quadratic"][0], values[None][0], observed,
                         reason)


def _fleiss(assessors: list[str], items: dict[tuple[str, str], dict[str, int]]) -> FleissAgreement:
    full = [g for g in items.values() if len(g) == len(assessors)]
    table = np.array([[sum(v == c for v in g.values()) for c in GRADES] for g in full]).reshape(len(full), len(GRADES))
    kappa, reason = fleiss_kappa(table)
    return FleissAgreement(tuple(assessors), len(full), kappa, reason)


def _disagreements(assessors: list[str], items: dict[tuple[str, str], dict[str, int]]) -> pd.DataFrame:
    """Items graded differently: query, chunk, one column per assessor, spread; largest spread first."""
    reserved = {"query_id", "chunk_id", "spread", "n_assessors"}
    names = {a: f"grade:{a}" if a in reserved else a for a in assessors}
    rows = []
    for (q, c), grades in items.items():
        if len(grades) < 2 or len(set(grades.values())) == 1:
            continue
        rows.append({"query_id": q, "chunk_id": c, **{names[a]: grades.get(a) for a in assessors},
                     "spread": max(grades.values()) - min(grades.values()), "n_assessors": len(grades)})
    columns = ["query_id", "chunk_id", *names.values(), "spread", "n_assessors"]
    frame = pd.DataFrame(rows, columns=columns)
    frame = frame.astype({n: "Int64" for n in names.values()} | {"spread": int, "n_assessors": int})
    return frame.sort_values(["spread", "query_id", "chunk_id"], ascending=[False, True, True],
                             kind="stable").reset_index(drop=True)
