"""Does the corrected interval cover the truth? A simulation with known truth (docs/method.md section 16).

Each world is a test set of ``--queries`` queries with a pool of ``--pool`` chunks each, drawn afresh:

- **true grades** 0-3 of every pooled chunk (a query's chunks share its difficulty);
- **two systems**, A and B, rank the pool by the true grade plus noise, B with less noise: their top 10 at the stage;
- **people's labels at the start** cover a chunk with a probability that grows with its grade (the pools of earlier
  systems found the relevant chunks first), so unjudged chunks are mostly, not only, irrelevant;
- a **biased grader** grades every unlabelled chunk: lenient, it moves a grade up far more often than down
  (``LENIENT``), as LLM assessors did against NIST's at TREC 2024 RAG;
- a **human sample**: a random ``--share`` of the graded queries (5-20 %) get all their graded chunks labelled.

From these, per query: ``f`` = NDCG@5 with the labels and the grader's grades, ``y`` = NDCG@5 with the true grades
(known for the sampled queries and for queries labelled in full from the start). The corrected mean (of B) and delta
(B - A) are computed by the package's own estimator (:func:`weknora_nb.analysis.corrected.estimate`: the stratified
prediction-powered mean) and compared with the truth, the mean over the world generator's population (a Monte Carlo
of ``--truth-queries`` queries: its error is far below the intervals'). Printed beside the corrected interval's
coverage: the LLM-only estimate's bias (mean of ``f`` minus the truth), the as-scored human-only figure's bias
(unjudged chunks as grade 0), and the width of the human-only interval (the classical 95 % interval of the human
sample alone) against the corrected interval's width.

    python benchmarks/ppi_coverage.py                    # 1,000 worlds at each of 5, 10 and 20 %
    python benchmarks/ppi_coverage.py --worlds 200 --share 0.1
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from weknora_nb.analysis.corrected import estimate  # noqa: E402
from weknora_nb.analysis.ppi import classical_mean  # noqa: E402

#: P(true grade) of a chunk of an average query: 0, 1, 2, 3
GRADE_P = np.array([0.62, 0.2, 0.1, 0.08])
#: the grader's move from the true grade: P(-1), P(0), P(+1), P(+2) (clipped to 0-3)
LENIENT = np.array([0.08, 0.52, 0.3, 0.1])
#: P(labelled at the start | true grade 0..3)
LABELLED_P = np.array([0.35, 0.55, 0.7, 0.85])
K = 5


@dataclass
class World:
    """One world's per-query values: f and y of A and B, which queries are graded and labelled."""

    f_a: np.ndarray
    f_b: np.ndarray
    y_a: np.ndarray
    y_b: np.ndarray
    scored_b: np.ndarray
    graded: np.ndarray
    labelled: np.ndarray


def ndcg(ranked: np.ndarray, pool: np.ndarray, k: int = K) -> np.ndarray:
    """NDCG@k (exponential gain) of each row: ``ranked`` the grades in rank order, ``pool`` every grade of the query
    (the ideal list); NaN for a query without a relevant chunk."""
    disc = 1 / np.log2(np.arange(2, k + 2))
    dcg = ((2.0 ** ranked[:, :k] - 1) * disc).sum(axis=1)
    ideal = -np.sort(-pool, axis=1)[:, :k]
    idcg = ((2.0 ** ideal - 1) * disc).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg / idcg, np.nan)


def draw(rng: np.random.Generator, n: int, pool: int) -> tuple[np.ndarray, ...]:
    """True grades, the systems' rankings, the labels at the start and the grader's grades of ``n`` queries."""
    shift = rng.normal(0, 0.6, size=(n, 1))   # a query's difficulty moves its whole pool
    u = rng.random((n, pool))
    cdf = np.cumsum(GRADE_P)
    truth = (u[..., None] > cdf[None, None, :]).sum(axis=2)
    truth = np.clip(np.rint(truth + shift * (truth > 0)), 0, 3).astype(int)
    rank_a = np.argsort(-(truth + rng.normal(0, 1.6, truth.shape)), axis=1)
    rank_b = np.argsort(-(truth + rng.normal(0, 0.9, truth.shape)), axis=1)
    labelled = rng.random(truth.shape) < LABELLED_P[truth]
    move = rng.choice(np.arange(-1, 3), size=truth.shape, p=LENIENT)
    grader = np.clip(truth + move, 0, 3)
    return truth, rank_a, rank_b, labelled, grader


def world(rng: np.random.Generator, n: int, pool: int, share: float) -> World:
    truth, rank_a, rank_b, labelled, grader = draw(rng, n, pool)
    filled = np.where(labelled, truth, grader)           # people's labels, the grader's grades elsewhere
    graded = ~labelled.all(axis=1)
    sampled = np.zeros(n, bool)
    idx = np.flatnonzero(graded)
    sampled[rng.choice(idx, size=max(2, round(share * len(idx))), replace=False)] = True
    rows = np.arange(n)[:, None]
    out = {}
    for tag, rank in (("a", rank_a), ("b", rank_b)):
        out[f"f_{tag}"] = ndcg(filled[rows, rank], filled)
        out[f"y_{tag}"] = ndcg(truth[rows, rank], truth)
    return World(out["f_a"], out["f_b"], out["y_a"], out["y_b"], ~np.isnan(out["y_b"]), graded,
                 sampled | ~graded)


def population_truth(rng: np.random.Generator, n: int, pool: int) -> tuple[float, float]:
    """The population means of B's NDCG@5 and of B - A over the queries with a relevant chunk."""
    truth, rank_a, rank_b, _, _ = draw(rng, n, pool)
    rows = np.arange(n)[:, None]
    a, b = ndcg(truth[rows, rank_a], truth), ndcg(truth[rows, rank_b], truth)
    ok = ~np.isnan(b)
    return float(b[ok].mean()), float((b - a)[ok].mean())


def run(worlds: int, queries: int, pool: int, share: float, seed: int, truth_queries: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    true_b, true_d = population_truth(np.random.default_rng(seed + 10_000), truth_queries, pool)
    rows = []
    for _ in range(worlds):
        w = world(rng, queries, pool, share)
        ok = w.scored_b
        ids = pd.Index([f"q{i}" for i in np.flatnonzero(ok)], name="query_id")
        strata = pd.DataFrame({"graded": w.graded[ok], "labelled": w.labelled[ok] & w.graded[ok]}, index=ids)
        f_b, y_b = pd.Series(np.nan_to_num(w.f_b[ok]), ids), pd.Series(w.y_b[ok], ids)
        f_d = pd.Series(np.nan_to_num(w.f_b[ok]) - np.nan_to_num(w.f_a[ok]), ids)
        y_d = pd.Series(w.y_b[ok] - w.y_a[ok], ids)
        known = w.labelled[ok]
        mean, delta = estimate(f_b, y_b, strata), estimate(f_d, y_d, strata)
        human = classical_mean(w.y_b[ok][known])
        human_d = classical_mean((w.y_b - w.y_a)[ok][known])
        rows.append({"cover_mean": mean.low <= true_b <= mean.high, "cover_delta": delta.low <= true_d <= delta.high,
                     "width_mean": mean.high - mean.low, "width_delta": delta.high - delta.low,
                     "llm_bias_mean": f_b.mean() - true_b, "llm_bias_delta": f_d.mean() - true_d,
                     "human_width_mean": human.high - human.low, "human_width_delta": human_d.high - human_d.low,
                     "n_labelled": int((strata["labelled"]).sum())})
    t = pd.DataFrame(rows)
    return {"share": share, "worlds": worlds, "truth_mean": true_b, "truth_delta": true_d,
            "n_labelled": float(t["n_labelled"].mean()), **{c: float(t[c].mean()) for c in t.columns
                                                             if c != "n_labelled"}}


def describe(r: dict[str, float]) -> str:
    se = math.sqrt(0.95 * 0.05 / r["worlds"])
    return (f"human sample {r['share']:.0%} of the graded queries (~{r['n_labelled']:.0f} queries), {r['worlds']} "
            f"worlds:\n"
            f"  mean of B  (truth {r['truth_mean']:.4f}): corrected 95 % interval covers it in "
            f"{r['cover_mean']:.1%} of worlds (Monte-Carlo sd {se:.1%}), width {r['width_mean']:.4f}; "
            f"LLM-only bias {r['llm_bias_mean']:+.4f}; human-only interval width {r['human_width_mean']:.4f}\n"
            f"  delta B-A  (truth {r['truth_delta']:+.4f}): corrected 95 % interval covers it in "
            f"{r['cover_delta']:.1%} of worlds, width {r['width_delta']:.4f}; LLM-only bias "
            f"{r['llm_bias_delta']:+.4f}; human-only interval width {r['human_width_delta']:.4f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, default=1000)
    p.add_argument("--queries", type=int, default=400)
    p.add_argument("--pool", type=int, default=12)
    p.add_argument("--share", type=float, action="append", default=None, help="human sample share (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--truth-queries", type=int, default=400_000)
    args = p.parse_args(argv)
    for share in args.share or [0.05, 0.10, 0.20]:
        print(describe(run(args.worlds, args.queries, args.pool, share, args.seed, args.truth_queries)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
