r"""Ranking metrics (docs/method.md section 3), named by strings and computed vectorised.

Names are ``family@K`` with an optional variant: ``recall@5``, ``ndcg@10``,
``ndcg@10:linear``. Relevant means grade >= 1. For one query with R relevant chunks
and ranked list positions :math:`i = 1..K` (after duplicate removal) with grades
:math:`rel_i`:

- ``recall@K``    :math:`|\{i \le K : rel_i \ge 1\}| / R`
- ``hit@K``       1 if any :math:`rel_i \ge 1` for :math:`i \le K`, else 0
- ``precision@K`` :math:`|\{i \le K : rel_i \ge 1\}| / K` (K, not the list length)
- ``mrr@K``       :math:`1 / \min\{i \le K : rel_i \ge 1\}`, 0 if none
- ``map@K``       :math:`\frac{1}{R}\sum_{i \le K, rel_i \ge 1} \mathrm{precision@}i` (trec_eval ``map_cut``)
- ``ndcg@K``      :math:`DCG@K / IDCG@K`, :math:`DCG@K = \sum_{i \le K} g(rel_i) / \log_2(i+1)`,
  with gain :math:`g(r) = 2^r - 1` (``exp``, default), :math:`r` (``linear``, the trec_eval
  convention) or :math:`[r \ge 1]` (``binary``). IDCG@K applies the same formula to *all*
  labelled chunks of the query sorted by grade, first K; it never comes from the run.
- ``judged@K``    :math:`|\{i \le K : \text{chunk } i \text{ has a label, grade 0 included}\}| / \min(K, n)`
  with :math:`n` the number of distinct chunks returned, 0 for an empty list (label coverage,
  docs/method.md section 10; ir_measures' ``Judged@k``). It measures the labels, not the system:
  a low value says the other figures count many unjudged chunks as irrelevant.

All kernels take a :class:`RankedLists` (rows sorted by request, then position) and
return one float per request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from weknora_nb.core.errors import MetricError

#: the metrics reported when the user names none (docs/method.md section 3)
DEFAULT_METRICS: tuple[str, ...] = ("recall@3", "recall@5", "recall@10", "hit@5", "mrr@20", "ndcg@5", "ndcg@10")

GAINS = ("exp", "linear", "binary")


@dataclass(frozen=True)
class Metric:
    """A parsed metric name: family, cutoff K and (for NDCG) the gain variant."""

    family: str
    k: int
    variant: str | None = None

    @property
    def name(self) -> str:
        """Canonical name: ``ndcg@10`` for the default gain, ``ndcg@10:linear`` otherwise."""
        base = f"{self.family}@{self.k}"
        return base if self.variant in (None, "exp") else f"{base}:{self.variant}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class RankedLists:
    """Deduplicated ranked lists of many requests, flattened (the input of every kernel).

    Rows are sorted by request, then position. ``req[j]`` is the request index
    (0..n_req-1) of row j, ``pos[j]`` its 1-based position after duplicate removal and
    ``grade[j]`` the label of its chunk. Rows of grade 0 may be left out: no metric
    counts them (their gain is 0), and positions already account for them. ``req_query[r]`` is the
    query index (0..n_q-1) of request r. Per query: ``n_rel[q]`` chunks of grade >= 1
    (> 0: only valid queries are scored) and the ideal ranking for IDCG, flattened as
    ``ideal_q`` / ``ideal_pos`` / ``ideal_grade`` (grades >= 1 sorted descending).

    Label coverage (``judged@K``) needs the cells of every labelled chunk, grade 0
    included: ``judged_req`` / ``judged_pos`` (rows sorted as above) and ``n_distinct[r]``,
    the distinct chunks request r returned. They are None unless a judged metric was asked for.
    """

    req: np.ndarray
    pos: np.ndarray
    grade: np.ndarray
    n_req: int
    req_query: np.ndarray
    n_q: int
    n_rel: np.ndarray
    ideal_q: np.ndarray
    ideal_pos: np.ndarray
    ideal_grade: np.ndarray
    judged_req: np.ndarray | None = None
    judged_pos: np.ndarray | None = None
    n_distinct: np.ndarray | None = None

    @property
    def n_rel_req(self) -> np.ndarray:
        """Number of relevant chunks of each request's query."""
        return self.n_rel[self.req_query].astype(np.float64)


def _hits(rl: RankedLists, k: int) -> np.ndarray:
    m = (rl.grade >= 1) & (rl.pos <= k)
    return np.bincount(rl.req[m], minlength=rl.n_req).astype(np.float64)


def _recall(rl: RankedLists, m: Metric) -> np.ndarray:
    return _hits(rl, m.k) / rl.n_rel_req


def _precision(rl: RankedLists, m: Metric) -> np.ndarray:
    return _hits(rl, m.k) / m.k


def _hit(rl: RankedLists, m: Metric) -> np.ndarray:
    return (_hits(rl, m.k) > 0).astype(np.float64)


def _mrr(rl: RankedLists, m: Metric) -> np.ndarray:
    sel = (rl.grade >= 1) & (rl.pos <= m.k)
    req, pos = rl.req[sel], rl.pos[sel]
    out = np.zeros(rl.n_req)
    first, idx = np.unique(req, return_index=True)  # rows are sorted: first = best rank
    out[first] = 1.0 / pos[idx]
    return out


def _map(rl: RankedLists, m: Metric) -> np.ndarray:
    sel = (rl.grade >= 1) & (rl.pos <= m.k)
    req, pos = rl.req[sel], rl.pos[sel]
    # number of relevant rows so far within the request = running count minus count at request start
    running = np.arange(1, len(req) + 1)
    starts = np.r_[0, np.flatnonzero(np.diff(req)) + 1] if len(req) else np.empty(0, dtype=np.int64)
    seg = np.repeat(starts, np.diff(np.r_[starts, len(req)])) if len(req) else starts
    hits_so_far = running - seg
    return np.bincount(req, weights=hits_so_far / pos, minlength=rl.n_req) / rl.n_rel_req


def _gain(grade: np.ndarray, variant: str | None) -> np.ndarray:
    g = grade.astype(np.float64)
    if variant == "linear":
        return g
    if variant == "binary":
        return (g >= 1).astype(np.float64)
    return np.exp2(g) - 1.0


def _dcg(req: np.ndarray, pos: np.ndarray, grade: np.ndarray, n: int, k: int, variant: str | None) -> np.ndarray:
    sel = pos <= k
    w = _gain(grade[sel], variant) / np.log2(pos[sel] + 1.0)
    return np.bincount(req[sel], weights=w, minlength=n)


def _ndcg(rl: RankedLists, m: Metric) -> np.ndarray:
    dcg = _dcg(rl.req, rl.pos, rl.grade, rl.n_req, m.k, m.variant)
    idcg = _dcg(rl.ideal_q, rl.ideal_pos, rl.ideal_grade, rl.n_q, m.k, m.variant)
    return dcg / idcg[rl.req_query]


def _judged(rl: RankedLists, m: Metric) -> np.ndarray:
    if rl.judged_req is None or rl.judged_pos is None or rl.n_distinct is None:
        raise MetricError(f"{m.name} needs the labelled cells (grade 0 included); build RankedLists with them")
    sel = rl.judged_pos <= m.k
    judged = np.bincount(rl.judged_req[sel], minlength=rl.n_req).astype(np.float64)
    denominator = np.minimum(rl.n_distinct, m.k).astype(np.float64)
    return np.divide(judged, denominator, out=np.zeros(rl.n_req), where=denominator > 0)


#: metric families that need every labelled cell (grade 0 included), not only the relevant ones
NEEDS_ALL_LABELS = frozenset({"judged"})

#: family -> (kernel, allowed variants)
FAMILIES: dict[str, tuple[Callable[[RankedLists, Metric], np.ndarray], tuple[str, ...]]] = {
    "recall": (_recall, ()),
    "hit": (_hit, ()),
    "precision": (_precision, ()),
    "mrr": (_mrr, ()),
    "map": (_map, ()),
    "ndcg": (_ndcg, GAINS),
    "judged": (_judged, ()),
}

_NAME = re.compile(r"^(?P<family>[a-z_]+)@(?P<k>\d+)(?::(?P<variant>[a-z]+))?$")


def parse_metric(name: str | Metric) -> Metric:
    """Parse ``"ndcg@10:linear"`` into a :class:`Metric`.

    Raises
    ------
    MetricError
        Unknown family, K < 1, or a variant the family does not have. The message
        lists what is supported, built from the registry.
    """
    if isinstance(name, Metric):
        return name
    if not isinstance(name, str):
        raise MetricError(f"A metric name must be a string such as 'ndcg@10'. Got {name!r} instead.")
    mt = _NAME.match(name.strip().lower())
    if not mt:
        raise MetricError(f"Metric names look like 'family@K' or 'ndcg@K:variant' with family in "
                          f"{sorted(FAMILIES)} and K >= 1 (ndcg variants: {list(GAINS)}). Got {name!r} instead.")
    family, k, variant = mt["family"], int(mt["k"]), mt["variant"]
    if family not in FAMILIES:
        raise MetricError(f"Only the metric families {sorted(FAMILIES)} are supported. Got {family!r} in "
                          f"{name!r} instead.")
    if k < 1:
        raise MetricError(f"The cutoff K must be >= 1, as in 'ndcg@10'. Got {name!r} instead.")
    allowed = FAMILIES[family][1]
    if variant is not None and variant not in allowed:
        options = f"the variants {list(allowed)}" if allowed else "no variant"
        raise MetricError(f"{family!r} has {options}. Got {variant!r} in {name!r} instead.")
    return Metric(family, k, variant if variant != "exp" else None)


def parse_metrics(names: Iterable[str | Metric] | str | None) -> list[Metric]:
    """Parse a list (or a comma-separated string) of names; duplicates removed, order kept."""
    if names is None:
        names = DEFAULT_METRICS
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    out: list[Metric] = []
    for n in names:
        m = parse_metric(n)
        if m not in out:
            out.append(m)
    if not out:
        raise MetricError("At least one metric is needed.")
    return out


def compute(rl: RankedLists, metric: Metric) -> np.ndarray:
    """One value per request of ``rl`` for ``metric``, each in [0, 1]."""
    return FAMILIES[metric.family][0](rl, metric)
