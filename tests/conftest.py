"""Shared helpers for the test suite."""

from __future__ import annotations

import pandas as pd
import pytest

from weknora_nb.core.results import _coerce


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


# -- running in parallel (pytest-xdist; the Makefile runs `pytest -n auto --dist loadgroup --no-loadscope-reorder`) --
#: the two longest tests (each runs a whole demo in a subprocess): started first, so that no worker is left
#: running one of them alone at the end
RUN_FIRST = ("tests/test_reports.py::test_the_demo_end_to_end",
             "tests/test_wheel.py::test_wheel_runs_the_demo_in_an_empty_folder")


def _suite_fixture_scopes(item: pytest.Item) -> set[str]:
    """The scopes wider than a test of the fixtures this suite defines (in a test module or a conftest) that
    ``item`` uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {defs[-1].scope for defs in info.name2fixturedefs.values()
            if defs and defs[-1].scope != "function" and defs[-1].baseid.startswith("tests")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--dist loadgroup``: the tests of a module that use one of the suite's shared (module or session)
    fixtures go to one worker together (an ``xdist_group`` named after the module), so that each expensive
    fixture is built once; the work is ordered longest first (:data:`RUN_FIRST`, other ``slow`` tests, groups
    holding a ``slow`` test, other groups, then single tests, each in file order), so that no long unit starts
    last. Without xdist nothing changes."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    group: dict[int, str] = {}
    for i, item in enumerate(items):
        if _suite_fixture_scopes(item):
            group[i] = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group[i]))
    slow_units = {group.get(i, item.nodeid) for i, item in enumerate(items) if item.get_closest_marker("slow")}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(group.get(i, item.nodeid), i)

    def rank(i: int) -> tuple[int, int, int]:
        unit = group.get(i, items[i].nodeid)
        grouped, slow = i in group, unit in slow_units
        kind = 0 if unit in RUN_FIRST else 1 if slow and not grouped else 2 if slow else 3 if grouped else 4
        return kind, first_seen[unit], i
    items[:] = [items[i] for i in sorted(range(len(items)), key=rank)]
