"""Metrics by group of queries (docs/method.md section 8), each group with its size and 95 % interval.

Dimensions: the labelled ``query_type``; each tag (a query may carry several, so it counts
in several groups); single- vs multi-answer (number of relevant chunks); exact vs vague
(the ``vague`` tag); a rule-based type (factual, procedural, conceptual, technical)
from an editable rules file that works on Chinese and English text; and the query's ``source``
(``synthetic`` for generated questions, ``traffic`` for sampled ones, :data:`NO_SOURCE` when the record
names none): generated questions are reported apart (docs/method.md section 17).
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
from weknora_nb.core.errors import ConfigError, Problem, UsageError
from weknora_nb.core.scoring import Scores
from weknora_nb.core.testset import TestSet

DIMENSIONS = ("query_type", "tag", "answers", "exactness", "rule_type", "source")
#: the source group of a query whose record names no source
NO_SOURCE = "(none)"


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
    """Rules from a YAML file (default: the package's ``data/query_type_rules.yaml``).

    The file holds ``types`` (type -> list of regular expressions, matched
    case-insensitively), optionally ``order`` (the types tried first to last; default: the
    order of ``types``) and ``default`` (the type when none matches; default ``factual``).
    Raises :class:`ConfigError` naming the file and every problem (an unreadable file,
    bad YAML with its line, a wrong shape, an ``order`` naming a type without patterns,
    a pattern that does not compile).
    """
    if path is None:
        text = resources.files("weknora_nb").joinpath("data/query_type_rules.yaml").read_text(encoding="utf-8")
        where = "query_type_rules.yaml"
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(where, f"cannot be read: {exc}") from None
    data = _rules_yaml(text, where)
    problems: list[Problem] = []
    types = data.get("types") or {}
    if not isinstance(types, dict):
        raise ConfigError(where, f"'types' must map each type to a list of patterns. Got {types!r} instead.")
    order = tuple(data.get("order") or types)
    unknown = [t for t in order if t not in types]
    if unknown:
        problems.append(Problem(where, None, "order", f"'order' names types without patterns: {unknown}"))
    compiled = {}
    for t, pats in types.items():
        try:
            compiled[t] = _compile_patterns(pats)
        except re.error as exc:
            problems.append(Problem(where, None, f"types.{t}", f"type {t!r}: bad pattern: {exc}"))
        except TypeError as exc:
            problems.append(Problem(where, None, f"types.{t}", f"type {t!r}: {exc}"))
    if problems:
        raise ConfigError(where, problems)
    return QueryTypeRules(order, str(data.get("default", "factual")), compiled)


def _rules_yaml(text: str, where: str) -> dict:
    """The rules file's top-level mapping (an empty file is ``{}``); :class:`ConfigError` otherwise."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(where, [Problem(where, line, None, f"not valid YAML: {what}")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(where, f"the rules file must be a YAML mapping with 'types' (and 'order', 'default'). "
                                 f"Got a {type(data).__name__} instead.")
    return data


def _compile_patterns(patterns: object) -> tuple[re.Pattern, ...]:
    """A type's list of regular expressions, compiled case-insensitively (none: an empty tuple)."""
    if patterns is None:
        return ()
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"the patterns must be a list of regular expressions (strings). Got {patterns!r} instead.")
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


def classify(texts: Iterable[str], rules: QueryTypeRules | None = None) -> list[str]:
    """The rule-based type of each query text."""
    rules = rules or load_rules()
    return [rules.classify(t) for t in texts]


def _memberships(testset: TestSet, rules: QueryTypeRules) -> pd.DataFrame:
    q = testset.queries
    q = q if "source" in q else q.assign(source=None)   # frames given by hand may lack it
    rows = []
    for qid, text, qtype, tags, n_rel, source in q[["query_id", "query", "query_type", "tags", "n_relevant",
                                                    "source"]].itertuples(index=False):
        rows.append((qid, "query_type", qtype if isinstance(qtype, str) else "(none)"))
        for t in tags or []:
            rows.append((qid, "tag", t))
        rows.append((qid, "answers", "single-answer" if n_rel == 1 else "multi-answer"))
        rows.append((qid, "exactness", "vague" if "vague" in (tags or []) else "exact"))
        rows.append((qid, "rule_type", rules.classify(text)))
        rows.append((qid, "source", source if isinstance(source, str) else NO_SOURCE))
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
        raise UsageError(f"no scored query at stage {stage!r}: stage must be one of {', '.join(scores.stages)}",
                         argument="stage", allowed=scores.stages, got=stage)
    mem = _memberships(testset, rules)
    mem = mem[mem["dimension"].isin(list(dimensions)) & mem["query_id"].isin(pq.index)]
    rows = []
    for (dim, group), g in mem.groupby(["dimension", "group"], sort=True):
        vals = pq.loc[g["query_id"], mets].to_numpy()
        lo, hi = map(np.asarray, bootstrap_ci(vals, resamples=resamples, seed=seed))  # 2-D: one per metric
        warn = small_group_warning(len(g), min_group)
        for j, m in enumerate(mets):
            rows.append({"dimension": dim, "group": group, "metric": m, "n": len(g),
                         "mean": float(np.mean(vals[:, j])), "ci_low": float(lo[j]), "ci_high": float(hi[j]),
                         "warning": warn})
    return pd.DataFrame(rows)
