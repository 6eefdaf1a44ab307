"""Citation metrics of end-to-end answers, from the labels alone (docs/method.md section 11).

For one answer with the distinct cited chunks :math:`C` (in the order the answer cites them,
first citation kept), the query's relevant chunks :math:`R` (grade >= 1) and the chat's final
references :math:`F` (the stage's results rows, in their order):

- ``citation_precision`` :math:`|\\{c \\in C : g(c) \\ge 1\\}| / |C|` (NaN when nothing is cited)
- ``citation_recall``    :math:`|C \\cap R| / |R|`
- ``citation_ndcg@10``   NDCG@10 (exp gain, section 3) of :math:`C` as a ranked list, in citation
  order: the metrics on the citation list as generated, as the first source asks
- ``cites_grade3``       1 when some cited chunk has grade 3
- ``cited_not_referenced`` :math:`|C \\setminus F|`: chunks cited that the references do not hold
- ``no_citation``        1 when :math:`C` is empty
- **order** (:math:`C` against :math:`F`): ``kendall_tau`` (tau-b over the chunks in both lists,
  NaN below two), ``rbo`` (rank-biased overlap, extrapolated, p = 0.9; Webber et al. 2010, eq. 32),
  and ``reordered`` (the chunks in both are cited in another order than :math:`F` lists them).

Only valid queries are scored (section 1); an answer whose chat request failed has no line in
``answers.jsonl`` and is counted, not scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from weknora_nb.core.results import NOT_FAILED, SKIPPED
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

#: the per-answer columns :func:`citation_scores` computes, in the order reports show them
CITATION_METRICS = ("citation_precision", "citation_recall", "citation_ndcg@10", "cites_grade3",
                    "cited_not_referenced", "no_citation", "kendall_tau", "rbo", "reordered")
RBO_P = 0.9


def rbo(s: Sequence[str], t: Sequence[str], p: float = RBO_P) -> float:
    """Extrapolated rank-biased overlap of two lists of distinct items (1 identical, 0 disjoint).

    With :math:`X_d` the overlap of the first d items, lists of lengths s <= l:
    :math:`\\frac{1-p}{p}\\left[\\sum_{d=1}^{l} \\frac{X_d}{d} p^d + \\sum_{d=s+1}^{l}
    \\frac{X_s (d-s)}{s d} p^d\\right] + \\left[\\frac{X_l - X_s}{l} + \\frac{X_s}{s}\\right] p^l`.
    Two empty lists give 1, one empty list 0.
    """
    short, long_ = (list(s), list(t)) if len(s) <= len(t) else (list(t), list(s))
    n_s, n_l = len(short), len(long_)
    if n_l == 0:
        return 1.0
    if n_s == 0:
        return 0.0
    seen_s: set[str] = set()
    seen_l: set[str] = set()
    overlap = np.zeros(n_l + 1)
    x = 0
    for d in range(1, n_l + 1):
        a = short[d - 1] if d <= n_s else None
        b = long_[d - 1]
        if a is not None:
            x += (a in seen_l) + (a == b)
            seen_s.add(a)
        x += b in seen_s and b != a
        seen_l.add(b)
        overlap[d] = x
    depth = np.arange(1, n_l + 1)
    x_s, x_l = overlap[n_s], overlap[n_l]
    tail = depth[depth > n_s]
    total = np.sum(overlap[1:] / depth * p ** depth) + np.sum(x_s * (tail - n_s) / (n_s * tail) * p ** tail)
    return float((1 - p) / p * total + ((x_l - x_s) / n_l + x_s / n_s) * p ** n_l)


def kendall_tau(cited: Sequence[str], references: Sequence[str]) -> float:
    """Kendall's tau-b between the citation order and the references' order of the chunks in both.

    With ``y`` the reference positions in citation order (the citation order has no ties):
    ``(C - D) / sqrt(n0 * (n0 - T))``, ``n0 = n(n-1)/2`` pairs, ``C - D`` the sum over pairs i < j of
    ``sign(y_j - y_i)``, ``T`` the pairs tied in ``y`` (a chunk cited twice); NaN with fewer than two shared
    chunks or every position tied (as ``scipy.stats.kendalltau``, which the tests hold it to).
    """
    pos = {c: i for i, c in enumerate(references)}
    y = np.asarray([pos[c] for c in cited if c in pos], dtype=np.int64)
    n = len(y)
    if n < 2:
        return float("nan")
    i, j = np.triu_indices(n, 1)
    signs = np.sign(y[j] - y[i])
    n0 = n * (n - 1) / 2
    denominator = np.sqrt(n0 * (n0 - np.count_nonzero(signs == 0)))
    return float(signs.sum() / denominator) if denominator > 0 else float("nan")


def _distinct(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


@dataclass
class CitationScores:
    """Per answer (``per_answer``: query_id, stage, repeat and :data:`CITATION_METRICS`) and counts."""

    per_answer: pd.DataFrame
    stage: str
    n_answers: int
    n_failed: int
    n_invalid: int

    def summary(self) -> pd.Series:
        """Each metric's mean over the scored answers (NaN-valued answers left out of that metric)."""
        return self.per_answer[list(CITATION_METRICS)].astype(float).mean()

    def reordered(self) -> pd.DataFrame:
        """The answers whose citation order differs from the references' order."""
        return self.per_answer[self.per_answer["reordered"] == 1]


def _citation_ndcg(testset: TestSet, rows: pd.DataFrame) -> np.ndarray:
    """NDCG@10 of each answer's citation list, through the package's own scoring (section 3)."""
    if rows.empty:
        return np.zeros(0)
    lists = [(q, "cited", r, i + 1, c) for q, r, cites in zip(rows["query_id"], rows["repeat"], rows["cited"],
                                                                strict=True) for i, c in enumerate(cites)]
    empty = [(q, "cited", r, None, None) for q, r, cites in zip(rows["query_id"], rows["repeat"], rows["cited"],
                                                                  strict=True) if not cites]
    frame = pd.DataFrame(lists + empty, columns=["query_id", "stage", "repeat", "rank", "chunk_id"])
    frame["status"], frame["score"] = "ok", np.nan
    pq = score(testset.subset(rows["query_id"].unique()), frame, ["ndcg@10"]).per_query
    got = pq.set_index(["query_id", "repeat"])["ndcg@10"]
    return got.reindex(pd.MultiIndex.from_arrays([rows["query_id"], rows["repeat"]])).to_numpy()


def _references(results: pd.DataFrame) -> dict[tuple[str, int], list[str]]:
    """Each (query, repeat)'s returned chunk ids in rank order: those of ``results``' rows by rank, gathered per
    request in that order (as a groupby of the rows sorted by rank gathers them, without a Python call per group)."""
    rows = results.dropna(subset=["chunk_id"]).sort_values("rank")
    refs: dict[tuple[str, int], list[str]] = {}
    for q, r, c in zip(rows["query_id"].astype(str), rows["repeat"], rows["chunk_id"].astype(str), strict=True):
        refs.setdefault((q, r), []).append(c)
    return refs


def citation_scores(run: Run, answers: pd.DataFrame, *, stage: str = "citations") -> CitationScores:
    """Score every answer of ``stage`` (``answers`` as :func:`weknora_nb.core.answers.read_answers` reads), but
    those of chats whose server skipped retrieval (status ``skipped``: neither scored nor failed)."""
    ts = run.testset
    grades = {(q, c): g for q, c, g in zip(ts.qrels["query_id"], ts.qrels["chunk_id"], ts.qrels["grade"],
                                           strict=True)}
    n_rel = ts.queries.set_index("query_id")["n_relevant"]
    res = run.results[(run.results["stage"] == stage) & (run.results["status"] == "ok")]
    refs = _references(res)
    mine = run.results[run.results["stage"] == stage]
    failed = mine[~mine["status"].isin(NOT_FAILED)]
    skipped = set(zip(*(mine.loc[mine["status"] == SKIPPED, c].tolist() for c in ("query_id", "repeat")), strict=True))
    a = answers[answers["stage"] == stage].copy()
    if skipped:   # a chat that skipped retrieval is scored by no mean (docs/method.md section 2)
        a = a[[(q, r) not in skipped for q, r in zip(a["query_id"], a["repeat"], strict=True)]]
    valid = a["query_id"].isin(ts.valid_ids)
    rows = a[valid].reset_index(drop=True)
    rows["cited"] = rows["citations"].map(_distinct)
    out = rows[["query_id", "stage", "repeat"]].copy()
    metrics: dict[str, list[float]] = {m: [] for m in CITATION_METRICS if m != "citation_ndcg@10"}
    for q, r, cited in zip(rows["query_id"], rows["repeat"], rows["cited"], strict=True):
        ref = _distinct(refs.get((q, r), []))
        g = [grades.get((q, c), 0) for c in cited]
        metrics["citation_precision"].append(sum(x >= 1 for x in g) / len(g) if g else np.nan)
        metrics["citation_recall"].append(sum(x >= 1 for x in g) / n_rel[q])
        metrics["cites_grade3"].append(float(any(x == 3 for x in g)))
        metrics["cited_not_referenced"].append(float(len(set(cited) - set(ref))))
        metrics["no_citation"].append(float(not cited))
        tau = kendall_tau(cited, ref)
        metrics["kendall_tau"].append(tau)
        metrics["rbo"].append(rbo(cited, ref))
        shared = [c for c in cited if c in set(ref)]
        metrics["reordered"].append(float(shared != [c for c in ref if c in set(shared)]))
    for m, values in metrics.items():
        out[m] = np.asarray(values, dtype=float)
    out["citation_ndcg@10"] = _citation_ndcg(ts, rows)
    out = out[["query_id", "stage", "repeat", *CITATION_METRICS]]
    return CitationScores(out, stage, n_answers=len(a), n_failed=len(failed.drop_duplicates(["query_id", "repeat"])),
                          n_invalid=int((~valid).sum()))


def citation_table(scores: CitationScores) -> pd.DataFrame:
    """One row per metric: mean, answers it is defined for, and what it means (for reports)."""
    meaning = {
        "citation_precision": "cited chunks with grade >= 1 / cited chunks",
        "citation_recall": "relevant chunks cited / relevant chunks",
        "citation_ndcg@10": "NDCG@10 of the citation list, in citation order",
        "cites_grade3": "share of answers citing a grade-3 chunk",
        "cited_not_referenced": "chunks cited but not among the returned references (per answer)",
        "no_citation": "share of answers citing nothing",
        "kendall_tau": "citation order vs references order (1 same order)",
        "rbo": "rank-biased overlap of citations and references (p = 0.9)",
        "reordered": "share of answers citing in another order than the references",
    }
    pa_ = scores.per_answer
    return pd.DataFrame({"metric": list(CITATION_METRICS),
                         "mean": [float(pa_[m].mean()) for m in CITATION_METRICS],
                         "answers": [int(pa_[m].notna().sum()) for m in CITATION_METRICS],
                         "meaning": [meaning[m] for m in CITATION_METRICS]})
