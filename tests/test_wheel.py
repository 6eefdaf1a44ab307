"""The wheel runs the demo anywhere: built from the sources, installed outside the checkout,
run in an empty folder.

The checkout's editable install stays in the venv (it provides the dependencies), so the test
first proves that ``weknora_nb`` is imported from the installed wheel, then that the demo
writes every report from what the wheel ships (demo data, notebooks, rules).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from weknora_nb.reports.render import NOTEBOOKS, notebooks_for
from weknora_nb.sandbox import load_demo_versions

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: what a wheel is built from; copied first, because setuptools builds in the source tree
#: (a stale ``build/`` of the checkout would leak into the wheel, and the checkout stays untouched)
SOURCES = ("pyproject.toml", "README.md", "weknora_nb")


def _build_wheel(tmp: Path) -> Path:
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
        else:
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)],
                   check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("weknora_nb-*.whl")
    return wheel


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)


def test_wheel_runs_the_demo_in_an_empty_folder(tmp_path):
    t0 = time.perf_counter()
    wheel = _build_wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert "weknora_nb/sandbox/demo/testset.jsonl" in shipped
    assert {f"weknora_nb/reports/notebooks/{nb}.ipynb" for nb in NOTEBOOKS} <= shipped

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEKNORA_")}
    env.update(PYTHONPATH=str(site), WEKNORA_NB_CACHE=str(tmp_path / "cache"), PYTHONIOENCODING="utf-8")

    where = _run(["-c", "import weknora_nb; print(weknora_nb.__file__)"], work, env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).resolve() == (site / "weknora_nb" / "__init__.py").resolve()

    demo = _run(["-m", "weknora_nb", "demo", "--repeats", "1", "--limit", "40", "--quiet"], work, env)
    assert demo.returncode == 0, demo.stdout + demo.stderr

    manifest = json.loads((work / "outputs" / "runs" / "baseline" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["testset"]["n_queries"] == 40  # --limit 40: the first 40 queries of the demo test set
    assert manifest["repeats"] == 1

    reports = work / "outputs" / "reports"
    assert (reports / "index.html").is_file()
    runs = work / "outputs" / "runs"
    missing = [f"{v}/{nb}.html" for v in load_demo_versions() for nb in notebooks_for(runs / v)
               if not (reports / v / f"{nb}.html").is_file()]
    assert (reports / "baseline" / "06_answers.html").is_file()  # judged by the sandbox's rule-based judge
    assert not missing, f"reports not written: {missing}"
    # nothing was read from the checkout: no page, manifest or notebook names its path
    leaks = [str(p.relative_to(work)) for p in (work / "outputs").rglob("*")
             if p.suffix in (".html", ".json", ".ipynb", ".jsonl") and str(ROOT) in p.read_text(encoding="utf-8")]
    assert not leaks, f"outputs that name the checkout {ROOT}: {leaks}"
    print(f"wheel {wheel.name}: {wheel.stat().st_size} bytes, {len(shipped)} files; "
          f"test {time.perf_counter() - t0:.0f} s")
