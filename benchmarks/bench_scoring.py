"""Scoring speed: weknora-nb vs pytrec_eval vs ranx on the same large run.

100,000 queries x 100 ranks (10 M rows), the default metrics and two linear-gain NDCGs. Two
comparisons, each printed with its goal and PASS or FAIL (issue 17):

- files to figures: ``weknora-nb score testset.jsonl results.parquet --json`` as a user runs it,
  a fresh process timed from its start to its last byte (stdout into a file; interpreter start
  and imports included), against pytrec_eval from files (its ``parse_qrel`` / ``parse_run`` on
  the same data in TREC format, then evaluate) measured two ways: in this process with the
  garbage collector off (timeit's convention; its interpreter start and import not counted),
  and as a user runs it, measured exactly as weknora-nb is (a fresh process running a script
  that prints its figures as JSON, start to last byte: both sides alike, as issue 17 compares
  them; its 14.1 s was of this kind).
  Goal: at least 10x against the script (the first pairing, which counts pytrec_eval's parsing and
  evaluation only, is printed beside it without a verdict), identical values, and the process's peak
  resident memory (``ru_maxrss`` of that process alone) under 1.5 GB;
- in process: ``weknora_nb.score(testset, "results.parquet")`` (reading its Parquet file
  included) against pytrec_eval's evaluator built and evaluated on dicts already in memory.
  Goal: at least 10x, identical values. Printed beside it, with its own ratio: ``score()`` given the
  results already read (``read_results_for_scoring``: the integer codes it reads a file into),
  inputs in memory on both sides; the verdict of the goal stays with the stricter pairing, the
  file's read included.

ranx (objects built and evaluated) is timed once for reference. Every timed measurement follows a
warm-up, then runs ``--repeat`` rounds, each round running every measurement once, in turn: on a
shared 2-core virtual machine single timings vary by up to 2x, and the machine's speed drifts
over minutes, so each ratio is taken within a round (both sides timed a few seconds apart) and
its verdict is the median of the rounds' ratios; the ratio of the two bests (timeit's convention)
and every time are printed beside it.

    python benchmarks/bench_scoring.py [--queries 100000] [--ranks 100] [--seed 0] [--repeat 5] [--no-ranx]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from machine import describe  # benchmarks/machine.py

from weknora_nb import score, write_results
from weknora_nb.core.metrics import DEFAULT_METRICS
from weknora_nb.core.results import read_results_for_scoring
from weknora_nb.core.testset import TestSet

warnings.filterwarnings("ignore", message=".*unsafe cast.*")

#: the goals of issue 17
GOAL_FILES, GOAL_IN_PROCESS, GOAL_MEMORY_GB = 10.0, 10.0, 1.5

#: the pairings (reference, weknora-nb) that carry the goals' verdicts: each side as a user runs it (a fresh process
#: from the same files, its figures as JSON on stdout), and score() against pytrec_eval's evaluate on dicts
VERDICTS = {("script", "cli"), ("dicts", "score")}

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


def timed(fn):
    """Wall time of one call of fn() and its result; the garbage collector is off during the call, as
    ``timeit`` does, for every tool (the rounds of :func:`main` repeat it)."""
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out
    finally:
        gc.enable()


def _times(times: list[float]) -> str:
    return "" if len(times) < 2 else f"  of {', '.join(f'{t:.2f}' for t in times)}"


def _cli() -> list[str]:
    """The ``weknora-nb`` command of this interpreter's environment (``python -m weknora_nb`` without one)."""
    script = Path(sys.executable).with_name("weknora-nb")
    return [str(script)] if script.exists() else [sys.executable, "-m", "weknora_nb"]


#: what runs ``weknora-nb``: a small interpreter of its own, so that the command's peak memory is its own (on
#: Linux a child's ``ru_maxrss`` starts from the size of the process that started it, and this one holds GBs)
TIMER = """
import json, os, resource, subprocess, sys, time
with open(sys.argv[1], "wb") as out:
    t = time.perf_counter()
    proc = subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - t
if proc.returncode:
    sys.exit(proc.stderr.decode()[-3000:])
print(json.dumps({"seconds": seconds, "rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


#: pytrec_eval as a user runs it from the same files: a script of its own, its figures as JSON on stdout
TREC_SCRIPT = """
import json, sys, pytrec_eval
with open(sys.argv[1]) as fq, open(sys.argv[2]) as fr:
    qrels, run = pytrec_eval.parse_qrel(fq), pytrec_eval.parse_run(fr)
json.dump(pytrec_eval.RelevanceEvaluator(qrels, set(sys.argv[3:])).evaluate(run), sys.stdout)
"""


def run_process(command: list[str], out: Path) -> tuple[float, float]:
    """Run ``command`` with stdout into ``out``: (seconds from its process's start to its exit, its peak
    resident memory in GB)."""
    proc = subprocess.run([sys.executable, "-c", TIMER, str(out), *command], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    figures = json.loads(proc.stdout)
    return figures["seconds"], figures["rss_kb"] / 2**20   # KiB on Linux


def run_cli(args: list[str], out: Path) -> tuple[float, float]:
    """:func:`run_process` of ``weknora-nb *args``."""
    return run_process([*_cli(), *args], out)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--ranks", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5,
                    help="rounds of timed runs after the warm-up, each round running every measurement once, in turn")
    ap.add_argument("--no-ranx", action="store_true", help="leave ranx out (its run takes about 20 s at full size)")
    args = ap.parse_args()
    print(describe(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"building {args.queries:,} queries x {args.ranks} ranks ...", flush=True)
        ts, path, qids, chunk_names, run_c, rel = make_data(args.queries, args.ranks, args.seed, Path(tmp))
        metrics = list(DEFAULT_METRICS) + ["ndcg@5:linear", "ndcg@10:linear"]
        testset_file = Path(tmp) / "testset.jsonl"
        ts.to_jsonl(testset_file)
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
        qrels_file, run_file = Path(tmp) / "bench.qrels", Path(tmp) / "bench.run"
        with open(qrels_file, "w") as fh:
            fh.writelines(f"{q} 0 {c} {g}\n" for q in valid for c, g in qrels[q].items())
        with open(run_file, "w") as fh:
            fh.writelines(f"{q} Q0 {c} {i + 1} {s} x\n" for q in valid for i, (c, s) in enumerate(run[q].items()))

        import pytrec_eval
        measures = {"recall.3,5,10", "ndcg_cut.5,10"}

        def trec_from_files():
            with open(qrels_file) as fq, open(run_file) as fr:
                return pytrec_eval.RelevanceEvaluator(pytrec_eval.parse_qrel(fq), measures).evaluate(
                    pytrec_eval.parse_run(fr))

        # every measurement: what it runs; the processes' peak memory is kept beside their times
        cli_args = ["score", str(testset_file), str(path), "--json", "--metrics", ",".join(metrics)]
        trec_command = [sys.executable, "-c", TREC_SCRIPT, str(qrels_file), str(run_file), *sorted(measures)]
        peaks: list[float] = []

        def cli_run() -> float:
            seconds, peak = run_cli(cli_args, Path(tmp) / "scores.json")
            peaks.append(peak)
            return seconds

        work = {
            "cli": cli_run,
            "script": lambda: run_process(trec_command, Path(tmp) / "trec.json")[0],
            "score": lambda: timed(lambda: score(ts, path, metrics))[0],
            "prebuilt": lambda: timed(lambda: score(ts, codes, metrics))[0],
            "dicts": lambda: timed(lambda: pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run))[0],
            "files": lambda: timed(trec_from_files)[0],
        }
        # warm-ups (the page cache, imports, first allocations), not counted; then the rounds, each running every
        # measurement once in turn, so that a drift of the machine's speed touches both sides of each ratio alike
        codes = read_results_for_scoring(path)   # what score() reads the file into, read once
        small_path = write_results(pd.read_parquet(path).head(1000), Path(tmp) / "small.parquet")
        score(ts, small_path, metrics)
        small = {q: qrels[q] for q in valid[:100]}
        pytrec_eval.RelevanceEvaluator(small, measures).evaluate({q: run[q] for q in small})
        run_cli(cli_args, Path(tmp) / "warm-up.json")
        times: dict[str, list[float]] = {name: [] for name in work}
        for r in range(args.repeat):
            for name, fn in work.items():
                times[name].append(fn())
            print(f"round {r + 1} of {args.repeat}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
                  flush=True)

        # the values, once: weknora-nb's (the CLI's last output, score() in process) against pytrec_eval's and ranx's
        with open(Path(tmp) / "scores.json", "rb") as fh:
            cli_pq = pd.DataFrame(json.load(fh)["per_query"]).set_index("query_id")
        pq_ = score(ts, path, metrics).per_query.set_index("query_id")
        pd.testing.assert_frame_equal(score(ts, codes, metrics).per_query.set_index("query_id"), pq_)
        trec = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
        assert trec_from_files() == trec
        with open(Path(tmp) / "trec.json") as fh:
            assert json.load(fh) == trec

        t_ranx = worst_ranx = float("nan")
        if not args.no_ranx:
            from ranx import Qrels, Run, evaluate
            evaluate(Qrels(small), Run({q: run[q] for q in small}), list(RANX.values()), return_mean=False)
            t_ranx, rx = timed(lambda: evaluate(Qrels(qrels), Run(run), list(RANX.values()), return_mean=False,
                                                make_comparable=True))
            ranx_q = sorted(valid)  # ranx orders queries by id
            worst_ranx = max(float(np.max(np.abs(pq_.loc[ranx_q, ours].to_numpy() - rx[m])))
                             for ours, m in RANX.items())

        def worst(table: pd.DataFrame) -> float:
            return max(float(np.max(np.abs(table.loc[valid, ours].to_numpy(dtype=float)
                                           - np.array([trec[q][m] for q in valid])))) for ours, m in TREC.items())
        worst_trec, worst_cli = worst(pq_), worst(cli_pq)
        same_cli = bool(np.array_equal(cli_pq.loc[valid, list(metrics)].to_numpy(dtype=float),
                                       pq_.loc[valid, list(metrics)].to_numpy(dtype=float)))

    identical = max(worst_trec, worst_cli, 0 if args.no_ranx else worst_ranx) <= 1e-9 and same_cli
    report(times, metrics, peaks, args, t_ranx)
    if not args.no_ranx:
        print(f"speed-up vs ranx    : {t_ranx / min(times['score']):8.2f} x   score() vs ranx")
    print(f"max |diff| pytrec   : {worst_trec:.2e} (score()), {worst_cli:.2e} (weknora-nb score --json)")
    if not args.no_ranx:
        print(f"max |diff| ranx     : {worst_ranx:.2e}")
    print(f"identical values    : {'yes' if identical else 'NO'}  (--json per-query values equal score()'s: "
          f"{'yes' if same_cli else 'NO'})  {verdict(identical)}")


def report(times: dict[str, list[float]], metrics: list[str], peaks: list[float], args: argparse.Namespace,
           t_ranx: float) -> None:
    """Each measurement's best and median, then each ratio of issue 17: the median of its rounds' ratios (the
    verdict: both sides of each were timed in the same round) with their range, and the ratio of the bests."""
    def line(label: str, name: str, what: str) -> None:
        t = times[name]
        print(f"{label:20s}: {min(t):8.2f} s  median {statistics.median(t):6.2f} s  ({what}){_times(t)}")

    print(f"rows scored         : {args.queries * args.ranks:,}")
    line("weknora-nb score", "cli", "a fresh process: testset.jsonl + results.parquet to --json on stdout")
    line("weknora-nb score()", "score", f"in process: read Parquet + {len(metrics)} metrics")
    line("score() (prebuilt)", "prebuilt", f"in process, on the results already read: {len(metrics)} metrics")
    line("pytrec_eval (files)", "files", f"parse_qrel + parse_run + evaluate, {len(TREC)} measures, in this "
         "process, collector off")
    line("pytrec_eval (script)", "script", "the same as a user runs it: a fresh process, start to last byte, its "
         "figures as JSON on stdout")
    line("pytrec_eval (dicts)", "dicts", "evaluator built + evaluated on in-memory dicts")
    if not args.no_ranx:
        print(f"ranx                : {t_ranx:8.2f} s  (Qrels/Run built + evaluated, {len(RANX)} metrics)")
    for ref, ours, goal, what in (("files", "cli", GOAL_FILES, "weknora-nb score vs pytrec_eval from files, in "
                                   "process: its start, imports and output not counted (the stricter pairing, not "
                                   "the verdict)"),
                                  ("script", "cli", GOAL_FILES, "weknora-nb score vs pytrec_eval's script, both "
                                   "run as a user runs them"),
                                  ("dicts", "score", GOAL_IN_PROCESS, "score() vs pytrec_eval on dicts"),
                                  ("dicts", "prebuilt", GOAL_IN_PROCESS, "score() on the results already read vs "
                                   "pytrec_eval on dicts (inputs in memory on both sides; not the verdict)")):
        paired = [a / b for a, b in zip(times[ref], times[ours], strict=True)]
        median, bests = statistics.median(paired), min(times[ref]) / min(times[ours])
        label = {"score": "in process", "prebuilt": "in process, prebuilt"}.get(ours, "files to figures")
        print(f"{label:20s}: {median:8.2f} x   {what} (median of {len(paired)} rounds, {min(paired):.2f}-"
              f"{max(paired):.2f}; bests {bests:.2f}; goal >= {goal:g}x)  "
              f"{verdict(median >= goal) if (ref, ours) in VERDICTS else ''}".rstrip())
    peak_gb = max(peaks)
    print(f"peak memory         : {peak_gb:8.2f} GB  weknora-nb score process, max RSS "
          f"(goal < {GOAL_MEMORY_GB:g} GB)  {verdict(peak_gb < GOAL_MEMORY_GB)}")


if __name__ == "__main__":
    main()
