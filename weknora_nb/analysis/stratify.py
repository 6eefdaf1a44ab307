"""Metrics by group of queries (METHOD.md section 8), each group with its size and 95 % interval.

Dimensions: the labelled ``query_type``; each tag (a query may carry several, so it counts
in several groups); single- vs multi-answer (number of relevant chunks); exact vs vague
(the ``vague`` tag); and a rule-based type (factual, procedural, conceptual, technical)
from an editable rules file that works on Chinese and English text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from weknora_nb.analysis.stats import MIN_GROUP_SIZE, bootstrap_ci, small_group_warning
from weknora_nb.core.scoring import Scores
from weknora_nb.core.testset import TestSet

__all__ = ["QueryTypeRules", "load_rules", "classify", "stratify", "DIMENSIONS"]

DIMENSIONS = ("query_type", "tag", "answers", "exactness", "rule_type")


@dataclass(frozen=True)
class QueryTypeRules:
    order: tuple[str, ...]
    default: str
    patterns: dict[str, tuple[re.Pattern, ...]]

    def classify(self, text: str) -> str:
        for t in self.order:
            if any(p.search(text) for p in self.patterns.get(t, ())):
                return t
        return self.default


def load_rules(path: str | Path | None = None) -> QueryTypeRules:
    """Rules from a YAML file (default: the package's ``data/query_type_rules.yaml``)."""
    import yaml

    if path is None:
        text = resources.files("weknora_nb").joinpath("data/query_type_rules.yaml").read_text(encoding="utf-8")
        where = "query_type_rules.yaml"
    else:
        text, where = Path(path).read_text(encoding="utf-8"), str(path)
    data = yaml.safe_load(text) or {}
    types = data.get("types") or {}
    order = tuple(data.get("order") or types)
    unknown = [t for t in order if t not in types]
    if unknown:
        raise ValueError(f"{where}: 'order' names types without patterns: {unknown}")
    compiled = {}
    for t, pats in types.items():
        try:
            compiled[t] = tuple(re.compile(p, re.IGNORECASE) for p in pats or [])
        except re.error as exc:
            raise ValueError(f"{where}: type {t!r}: bad pattern: {exc}") from exc
    return QueryTypeRules(order, str(data.get("default", "factual")), compiled)


def classify(texts: Iterable[str], rules: QueryTypeRules | None = None) -> list[str]:
    """The rule-based type of each query text."""
    rules = rules or load_rules()
    return [rules.classify(t) for t in texts]


def _memberships(testset: TestSet, rules: QueryTypeRules) -> pd.DataFrame:
    q = testset.queries
    rows = []
    for qid, text, qtype, tags, n_rel in q[["query_id", "query", "query_type", "tags", "n_relevant"]].itertuples(
            index=False):
        rows.append((qid, "query_type", qtype or "(none)"))
        for t in tags or []:
            rows.append((qid, "tag", t))
        rows.append((qid, "answers", "single-answer" if n_rel == 1 else "multi-answer"))
        rows.append((qid, "exactness", "vague" if "vague" in (tags or []) else "exact"))
        rows.append((qid, "rule_type", rules.classify(text)))
    return pd.DataFrame(rows, columns=["query_id", "dimension", "group"])


def stratify(scores: Scores, testset: TestSet, *, stage: str, metrics: Iterable[str] | None = None,
             dimensions: Iterable[str] = DIMENSIONS, rules: QueryTypeRules | str | Path | None = None,
             min_group: int = MIN_GROUP_SIZE, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per (dimension, group, metric): ``n``, ``mean``, ``ci_low``, ``ci_high``, ``warning``.

    Values are each query's metric averaged over its repeats at ``stage``; groups hold the
    valid, scored queries only.
    """
    rules = rules if isinstance(rules, QueryTypeRules) else load_rules(rules)
    mets = list(metrics) if metrics is not None else scores.metric_names
    pq = scores.per_query_mean()
    pq = pq[pq["stage"] == stage].set_index("query_id")
    if pq.empty:
        raise ValueError(f"no scored query at stage {stage!r} (stages: {scores.stages})")
    mem = _memberships(testset, rules)
    mem = mem[mem["dimension"].isin(list(dimensions)) & mem["query_id"].isin(pq.index)]
    rows = []
    for (dim, group), g in mem.groupby(["dimension", "group"], sort=True):
        vals = pq.loc[g["query_id"], mets].to_numpy()
        lo, hi = bootstrap_ci(vals, resamples=resamples, seed=seed)
        warn = small_group_warning(len(g), min_group)
        for j, m in enumerate(mets):
            rows.append({"dimension": dim, "group": group, "metric": m, "n": len(g),
                         "mean": float(np.mean(vals[:, j])), "ci_low": float(lo[j]), "ci_high": float(hi[j]),
                         "warning": warn})
    return pd.DataFrame(rows)
