"""The test suite's wall time as a developer meets it, against the goals of issue 17: ``make test-fast``
(``pytest -m "not slow"``) in 60 s, ``make test`` (ruff, mypy, the whole pytest suite) in 240 s.

pytest runs as a subprocess with the options of the Makefile (``PYTEST_OPTS``: every core, a test file
per worker; for test-fast, ``FAST_EXAMPLES``: the share of each property test's examples), as ``make`` would
run it; ``make test``'s lint steps are timed too and added to its total.
Printed per step: wall seconds, CPU seconds of the step's processes (less sensitive to other work on
the machine than the wall time), pytest's counts, and the ratio wall / goal (<= 1: goal met). The load
average before and after is printed with them: other work on the cores shows in every wall time.
A benchmark, not a test: it asserts nothing about time; it exits 1 when a step fails.

    python benchmarks/bench_suite.py             both (test-fast, then test)
    python benchmarks/bench_suite.py --fast      only pytest -m "not slow"
    python benchmarks/bench_suite.py --full      only make test's steps
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from machine import describe  # benchmarks/machine.py

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"test-fast": 60.0, "test": 240.0}


@dataclass
class Step:
    """One command's outcome: wall and CPU seconds, exit code, its last line (pytest's counts)."""

    name: str
    wall: float
    cpu: float
    code: int
    summary: str


def makefile_variable(name: str, makefile: Path = ROOT / "Makefile") -> str:
    """The value of the Makefile's variable ``name``: ``PYTEST_OPTS`` (what `make test` and `make test-fast`
    pass to pytest), ``FAST_EXAMPLES`` (the share of each property test's examples `make test-fast` draws)."""
    m = re.search(rf"^{name}\s*:?=\s*(.*)$", makefile.read_text(encoding="utf-8"), flags=re.M)
    if m is None:
        raise SystemExit(f"no {name} line in {makefile}")
    return m.group(1).strip()


def children_cpu() -> float:
    """CPU seconds (user + system) of the child processes that have ended."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(name: str, args: list[str], env: dict[str, str] | None = None) -> Step:
    """Run ``args`` in the checkout (with ``env`` added to the environment), its output kept (the last line
    shown), and time it."""
    t0, c0 = time.perf_counter(), children_cpu()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    step = Step(name, wall, cpu, proc.returncode, lines[-1].strip("= ") if lines else "")
    print(f"  {name:<28} {wall:7.1f} s wall {cpu:7.1f} s CPU  exit {proc.returncode}  {step.summary}", flush=True)
    if proc.returncode != 0:
        failed = [x for x in lines if x.startswith(("FAILED", "ERROR", "E "))][:20]
        print("    " + "\n    ".join(failed or lines[-20:]), flush=True)
    return step


def report(target: str, steps: list[Step]) -> None:
    """The target's total against its goal."""
    wall, cpu = sum(s.wall for s in steps), sum(s.cpu for s in steps)
    goal = GOALS[target]
    print(f"make {target}: {wall:.1f} s wall ({cpu:.1f} s CPU on {os.cpu_count()} cores); goal {goal:.0f} s; "
          f"ratio {wall / goal:.2f} ({'met' if wall <= goal else 'not met'}); "
          f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--fast", action="store_true", help='only pytest -m "not slow" (make test-fast)')
    which.add_argument("--full", action="store_true", help="only make test's steps (ruff, mypy, pytest)")
    args = ap.parse_args()
    print(describe(), flush=True)
    py = sys.executable
    opts = shlex.split(makefile_variable("PYTEST_OPTS"))
    print(f"pytest options from the Makefile: {' '.join(opts)}; {os.cpu_count()} cores; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    steps: dict[str, list[Step]] = {}
    if not args.full:
        share = os.environ.get("WEKNORA_NB_EXAMPLES", makefile_variable("FAST_EXAMPLES"))
        print(f"make test-fast draws {share} of each property test's examples (WEKNORA_NB_EXAMPLES)", flush=True)
        steps["test-fast"] = [run('pytest -m "not slow"', [py, "-m", "pytest", *opts, "-m", "not slow"],
                                  {"WEKNORA_NB_EXAMPLES": share})]
        report("test-fast", steps["test-fast"])
    if not args.fast:
        bin_dir = Path(py).parent
        lint = [str(bin_dir / "ruff"), "check", "weknora_nb", "tests", "benchmarks", "tools"]
        steps["test"] = [run("ruff check", lint),
                         run("mypy", [str(bin_dir / "mypy")]),
                         run("pytest (everything)", [py, "-m", "pytest", *opts], {"WEKNORA_NB_EXAMPLES": "1"})]
        report("test", steps["test"])
    return 1 if any(s.code != 0 for group in steps.values() for s in group) else 0


if __name__ == "__main__":
    sys.exit(main())
