"""Shared helpers and fixtures of the test suite, and how it runs in parallel (pytest-xdist)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from weknora_nb.core.results import _coerce

# ranx, one of the references the metrics are checked against, runs its metric functions here as the Python they
# are written in rather than compiled by numba: in a fresh environment (every CI run, a new user's first
# `make test`) numba compiles them, parallel loops and all, for 60-70 s of one core before ranx's first
# evaluation, while the reference tests' whole run interpreted takes 2-3 s. The formulas are the same source
# either way; NUMBA_DISABLE_JIT=0 in the environment checks against the compiled functions instead, and
# benchmarks/bench_scoring.py always does (on 10 M rows). Set before anything imports numba, which reads it once.
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")
# pytest keeps each test module it rewrites (for its assertion messages) in tests/__pycache__, unless writing
# bytecode is off, as PYTHONDONTWRITEBYTECODE turns it off on CI machines and in many containers: then every
# worker of every run rewrites every test module again (collection 9-11 s instead of 5.6 s of a core). Turned back
# on for this process only: the processes the tests start keep the environment's setting.
sys.dont_write_bytecode = False


def example_share() -> float:
    """The share of its examples each property test draws: ``WEKNORA_NB_EXAMPLES`` (a number in (0, 1]), 1 when
    unset. ``make test-fast`` sets the Makefile's ``FAST_EXAMPLES`` (0.25); ``make test`` (and so CI) sets 1."""
    text = os.environ.get("WEKNORA_NB_EXAMPLES", "1")
    try:
        share = float(text)
    except ValueError:
        share = float("nan")
    if not 0 < share <= 1:   # NaN fails it too
        raise pytest.UsageError(f"WEKNORA_NB_EXAMPLES: a number in (0, 1] is allowed, got {text!r}")
    return share


def pytest_configure(config: pytest.Config) -> None:
    """A bad ``WEKNORA_NB_EXAMPLES`` stops the run before collection, with one line."""
    example_share()


def examples(n: int) -> int:
    """How many examples a property test written for ``n`` draws in this run: ``n`` times
    :func:`example_share`, rounded, and at least 10 (or ``n``, when smaller)."""
    share = example_share()
    return n if share == 1 else min(n, max(10, round(n * share)))


def interruptible() -> None:
    """``preexec_fn`` of a subprocess a test interrupts (SIGINT): the signal's default action, whatever this
    process inherited. A shell without job control (a script's ``make test &``) starts its background commands
    with SIGINT ignored, every process below inherits that, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def results_frame(rows: list[tuple]) -> pd.DataFrame:
    """Build a typed results table from (query_id, stage, repeat, rank, chunk_id, score[, status]) tuples."""
    cols = ["query_id", "stage", "repeat", "rank", "chunk_id", "score", "status"]
    full = [tuple(r) + ("ok",) * (7 - len(r)) for r in rows]
    return _coerce(pd.DataFrame(full, columns=cols), "<test>", [])


def ranked(query_id: str, chunks: list[str], stage: str = "final", repeat: int = 1) -> list[tuple]:
    """Rows of one successful request returning ``chunks`` in order (scores falling)."""
    if not chunks:
        return [(query_id, stage, repeat, None, None, None, "ok")]
    return [(query_id, stage, repeat, i + 1, c, float(len(chunks) - i), "ok") for i, c in enumerate(chunks)]


def failed(query_id: str, kind: str = "timeout", stage: str = "final", repeat: int = 1) -> list[tuple]:
    return [(query_id, stage, repeat, None, None, None, kind)]


@pytest.fixture
def worked_testset():
    from weknora_nb import TestSet
    return TestSet.from_records([
        {"query_id": "q1", "query": "worked example", "relevant": {"A": 3, "B": 2, "C": 1}},
    ])


#: the 250-section document two test modules serve (tests/test_contract_api.py, tests/test_client_weknora.py): one
#: text, so that one embedding seed (:data:`BIG_SEED`) holds its passages for both
BIG_SECTIONS = 250
BIG_TITLE = '第 {i} 节 <配置> & "引号" \'s'  # characters WeKnora up to v0.6.3 escapes in listings (C53)
BIG_SECTION_3 = "配置项 <b>timeout</b> & retry 的默认值写在 'app.yaml' 里。"


#: the embedding seed of the big documents (tests/test_fixture_seeds.py; tools/write_test_seeds.py writes it)
BIG_SEED = Path(__file__).resolve().parent / "fixtures" / "big_seed"


def write_big_documents(root: Path, *, seed: bool = True) -> None:
    """``root/docs/big``: ``long.md``, one chunk per section (titles holding ``<``, ``&`` and quotes; section 3
    also in its text), and ``short.md`` (one chunk): the knowledge ids ``big.long`` and ``big.short``.

    ``seed``: also copy their embedding seed (:data:`BIG_SEED`) into ``root/cache``, the folder's read-only seed
    (added to a ``cache`` folder already there), so that a sandbox over ``root`` embeds none of them."""
    (root / "docs" / "big").mkdir(parents=True)
    if seed:
        shutil.copytree(BIG_SEED, root / "cache", dirs_exist_ok=True)
    sections = [f"## {BIG_TITLE.format(i=i)}\n\n这是第 {i} 节的内容，讲参数 P{i} 的设置方法与默认值 {i * 3}。"
                for i in range(BIG_SECTIONS)]
    sections[3] = f"## {BIG_TITLE.format(i=3)}\n\n{BIG_SECTION_3}"
    (root / "docs" / "big" / "long.md").write_text("\n\n".join(["# 大文档", *sections]), encoding="utf-8")
    (root / "docs" / "big" / "short.md").write_text("# 短文档\n\n## 唯一一节\n\n只有一个分块。\n", encoding="utf-8")


@pytest.fixture(scope="session")
def embedding_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One embedding cache folder for the sandboxes of the whole run (``SandboxServer(cache_dir=...)``), shared by
    the xdist workers: each model embeds a passage or query once per run, not once per test module. Entries are
    keyed by model and text, and written atomically (a worker may drop another's entries: they are computed
    again, never read torn)."""
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        root = root.parent  # the run's folder, above each worker's popen-gwN
    folder = root / "embedding-cache"
    folder.mkdir(exist_ok=True)
    return folder


# -- the demo, run once by the wheel built from the sources (tests/test_wheel.py, tests/test_reports.py) --------------
ROOT = Path(__file__).resolve().parents[1]
#: what a wheel is built from; copied first, because setuptools builds in the source tree
#: (a stale ``build/`` of the checkout would leak into the wheel, and the checkout stays untouched)
WHEEL_SOURCES = ("pyproject.toml", "README.md", "weknora_nb")
#: the demo run from the wheel: its first 40 queries (every version, every stage, judging, the integrity checks,
#: every notebook), 2 repeats, into ``--out``. The full demo (every query, default options) runs in CI after
#: `make test`, from a wheel too (`make wheel-demo`: .ci/wheel-demo checks the same things of its pages)
DEMO_LIMIT, DEMO_REPEATS = 40, 2


@dataclass
class WheelDemo:
    """The wheel, where it was installed (``site``, on ``PYTHONPATH`` in ``env``), the empty folder the demo ran
    in (``work``), its ``--out`` folder, and the two processes run there: ``where`` (which ``weknora_nb`` is
    imported) and ``demo``."""

    wheel: Path
    shipped: set[str]
    site: Path
    work: Path
    out: Path
    env: dict[str, str]
    where: subprocess.CompletedProcess
    demo: subprocess.CompletedProcess


def _build_wheel(tmp: Path) -> Path:
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
        else:
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)],
                   check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("weknora_nb-*.whl")
    return wheel


@pytest.fixture(scope="session")
def demo_from_wheel(tmp_path_factory: pytest.TempPathFactory) -> WheelDemo:
    """The wheel built from the sources, installed outside the checkout (``--target``: the checkout's editable
    install stays in the venv and provides the dependencies), ``weknora-nb demo`` run by it in an empty folder
    with no ``WEKNORA_*`` variable of the caller's (once a session: both tests that need a demo read this one)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(tmp)
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    work = tmp / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEKNORA_")}
    env.update(PYTHONPATH=str(site), WEKNORA_NB_CACHE=str(tmp / "cache"), PYTHONIOENCODING="utf-8")

    def run(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=1200)
    where = run(["-c", "import weknora_nb; print(weknora_nb.__file__)"])
    out = work / "outputs"
    demo = run(["-m", "weknora_nb", "demo", "--out", str(out), "--limit", str(DEMO_LIMIT),
                "--repeats", str(DEMO_REPEATS), "--quiet"])
    return WheelDemo(wheel, set(zipfile.ZipFile(wheel).namelist()), site, work, out, env, where, demo)


# -- running in parallel (pytest-xdist: the Makefile runs `pytest -n auto --dist loadfile --no-loadscope-reorder`) -----
# A test file is one unit of work: its tests run on one worker, so that each module-scoped fixture (sandbox
# collections, rendered reports) is built once. The units are started longest first (the order the workers
# collect, see pytest_collection_modifyitems below), so that no long one starts last.

#: the longest unit: the tests that read the demo run by the wheel (:func:`demo_from_wheel`), run together
#: (one demo) and started first
RUN_FIRST = ("tests/test_reports.py::test_the_demo_end_to_end",
             "tests/test_reports.py::test_every_page_of_the_demo_reads_as_a_report_in_a_browser",
             "tests/test_wheel.py::test_wheel_runs_the_demo_in_an_empty_folder")
#: files that pay the same once-per-process cost, run as one unit (on one worker): importing ranx (and numba),
#: about 2 s
SHARED_UNITS = {"tests/test_export.py": "ranx", "tests/test_metrics_reference.py": "ranx"}


def _unit(nodeid: str) -> str:
    """The unit of work (run on one worker) of the test ``nodeid``."""
    if nodeid in RUN_FIRST:
        return "demo"
    path = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(path, path)


def _uses_shared_fixtures(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture of this suite (a test module's or a conftest's) wider than one test."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope != "function" and defs[-1].baseid.startswith("tests")
                                    for defs in info.name2fixturedefs.values())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the tests of :data:`RUN_FIRST` a unit of their own and :data:`SHARED_UNITS` joined."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)
    return FileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the tests ordered as units, longest first: :data:`RUN_FIRST`, then the files holding a
    ``slow`` test, then those with shared fixtures, then the rest (each in file order; a file's tests in theirs).
    In a run without workers nothing changes."""
    if not hasattr(config, "workerinput"):
        return

    units = [_unit(item.nodeid) for item in items]
    slow = {u for u, item in zip(units, items, strict=True) if item.get_closest_marker("slow")}
    shared = {u for u, item in zip(units, items, strict=True) if _uses_shared_fixtures(item)}
    first_seen: dict[str, int] = {}
    for i, u in enumerate(units):
        first_seen.setdefault(u, i)

    def rank(i: int) -> tuple[int, int, int]:
        u = units[i]
        return (0 if u == "demo" else 1 if u in slow else 2 if u in shared else 3), first_seen[u], i
    items[:] = [items[i] for i in sorted(range(len(items)), key=rank)]
