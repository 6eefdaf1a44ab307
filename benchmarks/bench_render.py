"""Rendering a demo run's report one notebook at a time (jobs=1) and one per core (jobs=N).

Each rendering goes to an empty reports folder, so the render cache starts cold; then the
jobs=N one is rendered again over its folder (the cache warm: every run loaded and scored,
groups and label coverage found, not computed). ``--all`` renders every report of the demo
at once, as ``weknora-nb demo`` does (the baseline alone, the others against it). The
machine's load is printed with the figures (other work on the cores shows in every wall time),
and the CPU seconds of this process and its kernels, which depend less on it.

    python benchmarks/bench_render.py --demo OUT [--run rerank] [--all]
    (OUT: a folder made by ``weknora-nb demo --out OUT``; without --demo, a demo of --limit
    queries is collected first into a temporary folder)
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

from weknora_nb.demo import run_demo
from weknora_nb.reports.render import ReportRequest, render_reports
from weknora_nb.sandbox import load_demo_versions


def requests(runs: Path, out: Path, run: str, every: bool) -> list[ReportRequest]:
    """The report of ``run`` against the baseline, or (``every``) each version's as the demo renders them."""
    versions = load_demo_versions()
    names = [v for v in versions if (runs / v).is_dir()]
    base = runs / names[0]
    alone = {v for v in names if versions[v].faq_enabled} | {names[0]}
    chosen = names if every else [run]
    return [ReportRequest(runs / v, () if v in alone else (base,), out) for v in chosen]


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that ended (the kernels)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(reqs: list[ReportRequest], jobs: int) -> tuple[float, float, int]:
    """Wall seconds and CPU seconds to render ``reqs`` with ``jobs`` notebooks at once, and the pages written."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    reports = render_reports(reqs, jobs=jobs)
    return time.perf_counter() - t0, cpu_seconds() - c0, sum(len(r.pages) for r in reports)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", default=None, help="a demo output folder (holding runs/); default: collect one")
    ap.add_argument("--limit", type=int, default=60, help="queries of the demo collected without --demo (default 60)")
    ap.add_argument("--run", default="rerank", help="the demo run whose report is rendered (default rerank)")
    ap.add_argument("--all", action="store_true", help="render every report of the demo, as the demo does")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="jobs of the parallel rendering "
                    "(default os.cpu_count())")
    args = ap.parse_args()
    print(describe(), flush=True)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        demo = Path(args.demo) if args.demo else Path(tmp) / "demo"
        if not args.demo:
            run_demo(demo, progress=False, limit=args.limit)
        runs = demo / "runs"
        what = "every report of the demo" if args.all else f"the report of {args.run}"
        print(f"rendering {what} from {runs}; {os.cpu_count()} cores, load average "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        one, cpu, pages = timed(requests(runs, Path(tmp) / "jobs-1", args.run, args.all), 1)
        print(f"jobs=1          {one:7.1f} s   CPU {cpu:6.1f} s   ({pages} pages)")
        many, cpu, _ = timed(requests(runs, Path(tmp) / "jobs-n", args.run, args.all), args.jobs)
        print(f"jobs={args.jobs:<10d} {many:7.1f} s   CPU {cpu:6.1f} s   ratio {one / many:.2f}x")
        warm, cpu, _ = timed(requests(runs, Path(tmp) / "jobs-n", args.run, args.all), args.jobs)
        print(f"jobs={args.jobs:<10d} {warm:7.1f} s   CPU {cpu:6.1f} s   ratio {one / warm:.2f}x "
              "(again, the render cache warm)")
        print(f"load average now {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
