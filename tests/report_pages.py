"""Report pages read in headless Chromium (tools/page_heights.py, Playwright with the system's chromium) and held
to what an analyst needs (issue 47): every notebook page has the navigation header (the top index, the run's
index, the previous and next notebook), a title and an H1 naming its run, no page is taller than
:data:`MAX_HEIGHT` at 1280 px wide, no table cell reads ``None``, ``NaN``, ``<NA>`` or a literal ``\\n``, and no
code cell is shown."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest

MAX_HEIGHT = 12_000
TOOL = Path(__file__).resolve().parents[1] / "tools" / "page_heights.py"


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("page_heights", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_or_skip(pages: list[Path]) -> dict[str, dict[str, Any]]:
    """What Chromium shows of each page; the test is skipped where chromium or Playwright is missing."""
    if not shutil.which("chromium"):
        pytest.skip("Debian's chromium is not installed here (apt-get install -y chromium; .ci/run installs it)")
    pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (requirements-test.txt)")
    return _tool().read_pages(pages)


def problems(reports: Path) -> tuple[list[str], dict[str, int]]:
    """Every page under ``reports`` (``<run>/<notebook>.html``, the runs' and the top index) read in Chromium:
    what is wrong with each, and each page's height (px)."""
    notebooks = sorted(reports.glob("*/[0-9][0-9]_*.html"))
    indexes = sorted(reports.glob("*/index.html")) + [reports / "index.html"]
    assert notebooks and all(p.exists() for p in indexes)
    seen = read_or_skip([*notebooks, *indexes])
    wrong, heights = [], {}
    for path in [*notebooks, *indexes]:
        r = seen[str(path)]
        name = path.name if path.parent == reports else f"{path.parent.name}/{path.name}"
        heights[name] = r["height"]
        if r["height"] > MAX_HEIGHT:
            wrong.append(f"{name}: {r['height']} px tall")
        if r["n_bad_cells"]:
            wrong.append(f"{name}: {r['n_bad_cells']} cells read {r['bad_cells'][:5]}")
        if r["code_cells_shown"]:
            wrong.append(f"{name}: {r['code_cells_shown']} code cells shown")
        if path.name == "index.html":
            continue
        run = path.parent.name
        links = r["nav_links"]
        if links[:2] != ["../index.html", "index.html"]:
            wrong.append(f"{name}: navigation header {links[:4]}")
        for link in links:
            if not (path.parent / link).resolve().exists():
                wrong.append(f"{name}: a link to {link}, which does not exist")
        if run not in r["title"] or len(r["h1"]) != 1 or run not in r["h1"][0]:
            wrong.append(f"{name}: title {r['title']!r}, H1 {r['h1']}")
    return wrong, heights
