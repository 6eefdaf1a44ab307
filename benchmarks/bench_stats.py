"""Paired bootstrap speed: 10,000 resamples over 10,000 queries and 7 metrics.

Prints the seconds of ``weknora_nb.stats.paired_bootstrap_ci`` (all 7 metrics share one
resampling, batched count-matrix products) and, as a reference measured in the same run,
a straightforward loop that resamples with ``numpy`` fancy indexing per replicate, on a
subset of the replicates scaled up. Goal: under 2 seconds on a 2-core machine.

    python benchmarks/bench_stats.py [--queries 10000] [--resamples 10000] [--metrics 7]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from weknora_nb.analysis.stats import paired_bootstrap_ci, randomization_test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--metrics", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    a = rng.random((args.queries, args.metrics))
    b = np.clip(a + rng.normal(0.01, 0.1, a.shape), 0, 1)

    paired_bootstrap_ci(a[:100], b[:100], resamples=100)  # warm-up
    t0 = time.perf_counter()
    lo, hi = paired_bootstrap_ci(a, b, resamples=args.resamples, seed=1)
    t_boot = time.perf_counter() - t0

    t0 = time.perf_counter()
    randomization_test(a, b, resamples=args.resamples, seed=2)
    t_perm = time.perf_counter() - t0

    # reference: the plain loop, on 200 replicates, scaled to the same count
    d = b - a
    sub = 200
    t0 = time.perf_counter()
    r2 = np.random.default_rng(1)
    for _ in range(sub):
        d[r2.integers(0, args.queries, args.queries)].mean(axis=0)
    t_loop = (time.perf_counter() - t0) * args.resamples / sub

    print(f"{args.resamples:,} resamples x {args.queries:,} queries x {args.metrics} metrics")
    print(f"paired bootstrap (weknora-nb) : {t_boot:6.2f} s   (goal < 2 s)")
    print(f"randomization test            : {t_perm:6.2f} s")
    print(f"plain per-replicate loop      : {t_loop:6.2f} s   (estimated from {sub} replicates)")
    print(f"speed-up vs the loop          : {t_loop / t_boot:6.1f} x")
    print(f"delta of metric 0: {d[:, 0].mean():+.4f}, 95 % CI [{lo[0]:+.4f}, {hi[0]:+.4f}]")


if __name__ == "__main__":
    main()
