"""The demo's wall time by phase: index (sandbox build), collect (every version, every stage,
3 repeats), render (every notebook of every report). Goal: under 3 minutes in all on a 2-core
machine once the dependencies are installed.

    python benchmarks/bench_demo.py [--out /tmp/demo-bench]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

from weknora_nb.demo import run_demo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = run_demo(args.out or tmp, progress=False)
        total = time.perf_counter() - t0
        for phase, secs in result.seconds.items():
            print(f"{phase:8s} {secs:7.1f} s")
        print(f"{'total':8s} {total:7.1f} s   (goal < 180 s)")
        for r in result.reports:
            pages = ", ".join(f"{k} {v:.1f}" for k, v in r.seconds.items())
            print(f"  report {r.run}: {pages} (s)")


if __name__ == "__main__":
    main()
