"""What machine a benchmark ran on, and how fast one of its cores is, printed first by the benchmarks.

Wall-time goals (the demo in 60 s, the suite in 4 minutes) are absolute, but machines of one kind differ:
one session's 2-core VM ran a pure-Python loop 2.5x slower than another's. Two fixed workloads timed here,
best of three, let a reader scale a figure from one machine to another:

- ``python``: ``sum(i * i % 7 for i in range(3_000_000))``, the interpreter's speed (parsing, HTTP, tests);
- ``numpy``: sorting the rows of a 100,000 x 100 int32 array, numpy's (scoring).

    python benchmarks/machine.py        # the line alone
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np

__all__ = ["describe", "reference_seconds"]


def _cpu() -> tuple[str, bool | None]:
    """The CPU's model name and whether it has AVX-512 F (None where /proc/cpuinfo cannot tell)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags")
    return fields.get("model name") or platform.machine(), ("avx512f" in flags.split()) if flags else None


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def reference_seconds() -> dict[str, float]:
    """Seconds of the two reference workloads (best of 3 each)."""
    grid = np.random.default_rng(0).integers(0, 200_000, size=(100_000, 100), dtype=np.int32)
    return {"python": _best(lambda: sum(i * i % 7 for i in range(3_000_000))),
            "numpy": _best(lambda: np.sort(grid, axis=1))}


def describe() -> str:
    """One line: CPU, cores, AVX-512, and the reference workloads' seconds."""
    model, avx512 = _cpu()
    ref = reference_seconds()
    simd = {True: "AVX-512", False: "no AVX-512", None: "AVX-512 unknown"}[avx512]
    return (f"machine: {model}, {os.cpu_count()} cores, {simd}; one core: Python reference {ref['python']:.2f} s, "
            f"numpy row sort {ref['numpy']:.2f} s (benchmarks/machine.py, best of 3)")


if __name__ == "__main__":
    print(describe())
