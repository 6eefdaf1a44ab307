"""The demo's wall time by phase, against issue 17's goal: ``weknora-nb demo`` (index; collection, judging and
integrity checks of every version; every notebook of every report) in 60 s on 2 cores once installed.

Phases: index (the sandbox's build), collect (every version measured: collected at every stage with 3
repeats, judged, checked; ``jobs`` versions at a time, each in a worker process), render (every notebook of
every report, ``jobs`` at a time). Printed: each phase's seconds, the total and its ratio to the goal
(<= 1: met), the CPU seconds of this process and its children, and the load average before and after
(other work on the cores shows in every wall time). With ``--reference`` the demo is run a second time
with ``--jobs 1`` (everything one after another in one process, as before issue 17) and the speed-up of
the parallel run over it is printed: a reference measured in the same run. A benchmark, not a test.

    python benchmarks/bench_demo.py [--out /tmp/demo-bench] [--jobs N] [--reference]
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import tempfile
import time
from pathlib import Path

from machine import describe  # benchmarks/machine.py

from weknora_nb.demo import DemoResult, run_demo

GOAL_S = 60.0


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its children that have ended."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(out: Path, jobs: int | None) -> tuple[DemoResult, float, float]:
    """The demo into ``out`` with ``jobs``: its result, wall seconds and CPU seconds."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    result = run_demo(out, progress=False, jobs=jobs)
    return result, time.perf_counter() - t0, cpu_seconds() - c0


def show(label: str, result: DemoResult, wall: float, cpu: float) -> None:
    print(f"{label}: total {wall:6.1f} s  (goal {GOAL_S:.0f} s: ratio {wall / GOAL_S:.2f}, "
          f"{'met' if wall <= GOAL_S else 'not met'})  CPU {cpu:6.1f} s")
    for phase, secs in result.seconds.items():
        print(f"  {phase:8s} {secs:7.1f} s")
    for r in result.reports:
        slowest = sorted(r.seconds.items(), key=lambda kv: -kv[1])[:3]
        print(f"  report {r.run}: slowest pages " + ", ".join(f"{k} {v:.1f} s" for k, v in slowest))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    ap.add_argument("--jobs", type=int, default=None, help="versions / notebooks at a time (default one per core)")
    ap.add_argument("--reference", action="store_true", help="also run with --jobs 1 and print the speed-up")
    args = ap.parse_args()
    print(describe(), flush=True)
    logging.basicConfig(level=logging.WARNING)
    print(f"{os.cpu_count()} CPU(s), load average before {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        result, wall, cpu = timed(root / "parallel", args.jobs)
        show(f"demo (jobs {args.jobs or os.cpu_count()})", result, wall, cpu)
        if args.reference:
            ref, ref_wall, ref_cpu = timed(root / "one-by-one", 1)
            show("demo (jobs 1, the reference)", ref, ref_wall, ref_cpu)
            print(f"speed-up over the reference: {ref_wall / wall:.2f}x")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
