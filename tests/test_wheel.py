"""The wheel runs the demo anywhere: built from the sources, installed outside the checkout,
run in an empty folder.

The checkout's editable install stays in the venv (it provides the dependencies), so the test
first proves that ``weknora_nb`` is imported from the installed wheel, then that the demo
writes every report from what the wheel ships (demo data, notebooks, rules). The wheel and its
demo are the session's fixture ``demo_from_wheel`` (tests/conftest.py), which
tests/test_reports.py::test_the_demo_end_to_end reads too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from weknora_nb.reports.render import NOTEBOOKS, notebooks_for
from weknora_nb.sandbox import load_demo_versions

from .conftest import DEMO_LIMIT, DEMO_REPEATS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_runs_the_demo_in_an_empty_folder(demo_from_wheel):
    t0 = time.perf_counter()
    d = demo_from_wheel
    assert "weknora_nb/sandbox/demo/testset.jsonl" in d.shipped
    assert "weknora_nb/sandbox/demo/parent-child/testset.jsonl" in d.shipped   # version parent-child's test set
    assert {f"weknora_nb/reports/notebooks/{nb}.ipynb" for nb in NOTEBOOKS} <= d.shipped

    assert d.where.returncode == 0, d.where.stderr
    assert Path(d.where.stdout.strip()).resolve() == (d.site / "weknora_nb" / "__init__.py").resolve()

    assert d.demo.returncode == 0, d.demo.stdout + d.demo.stderr

    manifest = json.loads((d.out / "runs" / "baseline" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["testset"]["n_queries"] == DEMO_LIMIT  # --limit: the first queries of the demo test set
    assert manifest["repeats"] == DEMO_REPEATS

    reports = d.out / "reports"
    assert (reports / "index.html").is_file()
    runs = d.out / "runs"
    missing = [f"{v}/{nb}.html" for v in load_demo_versions() for nb in notebooks_for(runs / v)
               if not (reports / v / f"{nb}.html").is_file()]
    assert (reports / "baseline" / "06_answers.html").is_file()  # judged by the sandbox's rule-based judge
    assert not missing, f"reports not written: {missing}"
    # nothing was read from the checkout: no page, manifest or notebook names its path
    leaks = [str(p.relative_to(d.work)) for p in d.out.rglob("*")
             if p.suffix in (".html", ".json", ".ipynb", ".jsonl") and str(ROOT) in p.read_text(encoding="utf-8")]
    assert not leaks, f"outputs that name the checkout {ROOT}: {leaks}"
    print(f"wheel {d.wheel.name}: {d.wheel.stat().st_size} bytes, {len(d.shipped)} files; "
          f"test {time.perf_counter() - t0:.0f} s (the demo: the session's fixture)")
