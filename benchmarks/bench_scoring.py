"""Scoring speed: weknora-nb vs pytrec_eval vs ranx on the same large run.

100,000 queries x 100 ranks (10 M rows), the default metrics. Prints seconds for
weknora-nb (reading the results Parquet file included), for pytrec_eval and for ranx
(objects built and evaluated, after a warm-up call), the ratios, and whether the values
agree. Goal: weknora-nb at least 4x faster than pytrec_eval with identical values.

weknora-nb and pytrec_eval (dicts) are timed ``--repeat`` times after their warm-up and
the best is compared (timeit's convention; every time is printed): on a shared 2-core
virtual machine single timings of either tool vary by up to 2x.

pytrec_eval is timed two ways: from dicts already in memory (its evaluator built and
evaluated: the goal's comparison, although weknora-nb's time includes reading its file)
and from files (its own ``parse_qrel`` / ``parse_run`` on the same data in TREC format,
then evaluate: reading its input too).

    python benchmarks/bench_scoring.py [--queries 100000] [--ranks 100] [--seed 0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from weknora_nb import score, write_results
from weknora_nb.core.metrics import DEFAULT_METRICS
from weknora_nb.core.testset import TestSet

warnings.filterwarnings("ignore", message=".*unsafe cast.*")

#: weknora-nb metric -> pytrec_eval measure (only those it has, linear gain for ndcg)
TREC = {"recall@3": "recall_3", "recall@5": "recall_5", "recall@10": "recall_10", "ndcg@5:linear": "ndcg_cut_5",
        "ndcg@10:linear": "ndcg_cut_10"}
RANX = {"recall@3": "recall@3", "recall@5": "recall@5", "recall@10": "recall@10", "hit@5": "hit_rate@5",
        "mrr@20": "mrr@20", "ndcg@5": "ndcg_burges@5", "ndcg@10": "ndcg_burges@10"}


def make_data(n_q: int, n_rank: int, seed: int, folder: Path):
    rng = np.random.default_rng(seed)
    n_chunks = 50_000
    qids = np.array([f"q{i:06d}" for i in range(n_q)], dtype=object)
    chunk_names = np.array([f"doc{i // 20:05d}#{i % 20:04d}" for i in range(n_chunks)], dtype=object)
    # labels: 1-8 per query, grades 0-3
    n_lab = rng.integers(1, 9, size=n_q)
    lab_q = np.repeat(np.arange(n_q), n_lab)
    lab_c = rng.integers(0, n_chunks, size=len(lab_q))
    lab_g = rng.integers(0, 4, size=len(lab_q))
    labels = pd.DataFrame({"q": lab_q, "c": lab_c, "g": lab_g}).drop_duplicates(["q", "c"])
    # runs: random chunks with labelled ones planted near the top
    run_c = rng.integers(0, n_chunks, size=(n_q, n_rank))
    first_lab = labels.groupby("q")["c"].first().reindex(range(n_q)).to_numpy()
    plant = rng.integers(0, 15, size=n_q)
    run_c[np.arange(n_q), plant] = first_lab
    rows_q = np.repeat(np.arange(n_q), n_rank)
    table = pd.DataFrame({
        "query_id": pd.Categorical.from_codes(rows_q, qids),
        "stage": pd.Categorical.from_codes(np.zeros(n_q * n_rank, np.int8), ["final"]),
        "repeat": np.ones(n_q * n_rank, dtype=np.int64),
        "rank": np.tile(np.arange(1, n_rank + 1), n_q).astype(np.int64),
        "chunk_id": pd.Categorical.from_codes(run_c.ravel(), chunk_names),
        "score": np.tile(np.linspace(1, 0, n_rank), n_q),
        "status": pd.Categorical.from_codes(np.zeros(n_q * n_rank, np.int8), ["ok"]),
    })
    path = write_results(table, folder / "results.parquet")  # as the collector writes it
    rel: dict[str, dict[str, int]] = {q: {} for q in qids}
    for q, c, g in labels.itertuples(index=False):
        rel[qids[q]][chunk_names[c]] = int(g)
    records = [{"query_id": q, "query": f"query {q}", "relevant": rel[q]} for q in qids]
    return TestSet.from_records(records), path, qids, chunk_names, run_c, rel


def timed(fn, repeat: int = 1):
    """Best wall time of ``repeat`` calls of fn() (timeit's convention: the minimum is the run least
    disturbed by the machine), all the times, and the last result; the garbage collector is off
    during each call, as ``timeit`` does, for every tool."""
    times, out = [], None
    for _ in range(repeat):
        out = None  # the previous result is freed before the next call
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t)
        finally:
            gc.enable()
    return min(times), times, out


def _times(times: list[float]) -> str:
    return "" if len(times) < 2 else f"  best of {', '.join(f'{t:.2f}' for t in times)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--ranks", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="timed calls of weknora-nb and of pytrec_eval (dicts) after the warm-up; the best is shown")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"building {args.queries:,} queries x {args.ranks} ranks ...", flush=True)
        ts, path, qids, chunk_names, run_c, rel = make_data(args.queries, args.ranks, args.seed, Path(tmp))
        metrics = list(DEFAULT_METRICS) + ["ndcg@5:linear", "ndcg@10:linear"]

        # weknora-nb: read the file and score (warm-up call on a small file first)
        small_path = write_results(pd.read_parquet(path).head(1000), Path(tmp) / "small.parquet")
        score(ts, small_path, metrics)
        t_ours, all_ours, sc = timed(lambda: score(ts, path, metrics), args.repeat)
        pq_ = sc.per_query.set_index("query_id")
        valid = [q for q in qids if any(g >= 1 for g in rel[q].values())]

        # reference inputs per docs/method.md section 2: grade >= 1 labels; scores encode the returned order
        qrels = {q: {c: g for c, g in rel[q].items() if g >= 1} for q in valid}
        order_scores = np.arange(args.ranks, 0, -1, dtype=float)
        idx = {q: i for i, q in enumerate(qids)}
        run = {}
        for q in valid:
            seen: dict[str, float] = {}
            for j, c in enumerate(chunk_names[run_c[idx[q]]]):
                if c not in seen:
                    seen[c] = order_scores[j]
            run[q] = seen

        import pytrec_eval
        measures = {"recall.3,5,10", "ndcg_cut.5,10"}
        small = {q: qrels[q] for q in valid[:100]}
        pytrec_eval.RelevanceEvaluator(small, measures).evaluate({q: run[q] for q in small})
        t_trec, all_trec, trec = timed(lambda: pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run),
                                       args.repeat)
        qrels_file, run_file = Path(tmp) / "bench.qrels", Path(tmp) / "bench.run"
        with open(qrels_file, "w") as fh:
            fh.writelines(f"{q} 0 {c} {g}\n" for q in valid for c, g in qrels[q].items())
        with open(run_file, "w") as fh:
            fh.writelines(f"{q} Q0 {c} {i + 1} {s} x\n" for q in valid for i, (c, s) in enumerate(run[q].items()))

        def trec_from_files():
            with open(qrels_file) as fq, open(run_file) as fr:
                return pytrec_eval.RelevanceEvaluator(pytrec_eval.parse_qrel(fq), measures).evaluate(
                    pytrec_eval.parse_run(fr))
        t_trec_files, _, trec_f = timed(trec_from_files)
        assert trec_f == trec

        from ranx import Qrels, Run, evaluate
        evaluate(Qrels(small), Run({q: run[q] for q in small}), list(RANX.values()), return_mean=False)
        t_ranx, _, rx = timed(lambda: evaluate(Qrels(qrels), Run(run), list(RANX.values()), return_mean=False,
                                            make_comparable=True))

        worst_trec = max(float(np.max(np.abs(pq_.loc[valid, ours].to_numpy()
                                              - np.array([trec[q][m] for q in valid]))))
                         for ours, m in TREC.items())
        ranx_q = sorted(valid)  # ranx orders queries by id
        worst_ranx = max(float(np.max(np.abs(pq_.loc[ranx_q, ours].to_numpy() - rx[m]))) for ours, m in RANX.items())

    print(f"rows scored         : {args.queries * args.ranks:,} ({len(valid):,} valid queries)")
    print(f"weknora-nb          : {t_ours:8.2f} s  (read Parquet + {len(metrics)} metrics){_times(all_ours)}")
    print(f"pytrec_eval (files) : {t_trec_files:8.2f} s  (parse_qrel + parse_run + evaluate, {len(TREC)} measures)")
    print(f"pytrec_eval (dicts) : {t_trec:8.2f} s  (evaluator built + evaluated on in-memory dicts){_times(all_trec)}")
    print(f"ranx                : {t_ranx:8.2f} s  (Qrels/Run built + evaluated, {len(RANX)} metrics)")
    print(f"speed-up vs pytrec  : {t_trec / t_ours:8.2f} x   objects built + evaluated, from dicts (goal >= 4x)")
    print(f"speed-up vs pytrec  : {t_trec_files / t_ours:8.2f} x   from its files, file to values")
    print(f"speed-up vs ranx    : {t_ranx / t_ours:8.2f} x")
    print(f"max |diff| pytrec   : {worst_trec:.2e}")
    print(f"max |diff| ranx     : {worst_ranx:.2e}")
    print("identical values    : " + ("yes" if max(worst_trec, worst_ranx) <= 1e-9 else "NO"))


if __name__ == "__main__":
    main()
