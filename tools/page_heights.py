"""Read report pages as an analyst's browser shows them: headless Chromium (Playwright, the system's
``chromium``) at 1280 px wide, each page's height, title, navigation header, table cells that read ``None``,
``NaN``, ``<NA>`` or a literal ``\\n`` (outside code the knowledge base's own text holds: Markdown code
fences and spans, shown as written), and code cells shown.

    python tools/page_heights.py outputs/reports/rerank/*.html [--json]

Used by tests/report_pages.py (the browser tests of tests/test_reports.py)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

WIDTH = 1280
#: what a table cell never reads (whole cell), and what no cell holds anywhere in it
BAD_CELLS = ("None", "NaN", "nan", "NaT", "<NA>")
BAD_PARTS = ("NaN", "<NA>", "\\n", "nan [", "[nan", "nan]")

_READ = """() => {
  const noCode = t => t.replace(/```[\\s\\S]*?(```|$)/g, '').replace(/`[^`\\n]*`/g, '');
  const segments = c => {   // a folded cell: its cut text and its whole text, each on its own
    const fold = c.querySelector('details.wk-cell');
    if (!fold) return [c.textContent];
    const rest = Array.from(fold.childNodes).filter(n => n.nodeName !== 'SUMMARY').map(n => n.textContent).join('');
    return [fold.querySelector('summary').textContent, rest];
  };
  const isBad = c => {
    const t = c.textContent.trim();
    return BAD_CELLS.includes(t) || segments(c).some(s => BAD_PARTS.some(p => noCode(s).includes(p)));
  };
  const bad = Array.from(document.querySelectorAll('td, th')).filter(isBad).map(c => c.textContent.trim());
  const code = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea'))
                    .filter(e => e.offsetParent !== null).length;
  const nav = document.querySelector('nav.wk-nav');
  const links = nav ? Array.from(nav.querySelectorAll('a')).map(a => a.getAttribute('href')) : [];
  const h1 = Array.from(document.querySelectorAll('h1')).map(h => h.textContent.trim());
  return {height: document.documentElement.scrollHeight, title: document.title, nav_links: links, h1: h1,
          bad_cells: bad.slice(0, 20), n_bad_cells: bad.length, code_cells_shown: code,
          tables: document.querySelectorAll('table').length};
}"""


def chromium() -> str | None:
    """The system's Chromium (Debian's ``chromium``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def read_pages(paths: Iterable[Path], *, width: int = WIDTH) -> dict[str, dict[str, Any]]:
    """Each page (by path) as Chromium shows it ``width`` px wide: see :data:`_READ`."""
    from playwright.sync_api import sync_playwright

    script = _READ.replace("BAD_CELLS", json.dumps(BAD_CELLS)).replace("BAD_PARTS", json.dumps(BAD_PARTS))
    out: dict[str, dict[str, Any]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            for path in paths:
                page.goto(Path(path).resolve().as_uri())
                page.wait_for_load_state("load")
                out[str(path)] = page.evaluate(script)
        finally:
            browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="everything read, as JSON")
    args = ap.parse_args(argv)
    found = read_pages(args.pages)
    if args.json:
        print(json.dumps(found, ensure_ascii=False, indent=1))
        return 0
    for path, r in found.items():
        print(f"{r['height']:>7,} px  {path}  title={r['title']!r}  nav={'yes' if r['nav_links'] else 'no'}  "
              f"bad cells={r['n_bad_cells']}  code shown={r['code_cells_shown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
