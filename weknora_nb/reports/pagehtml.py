"""A report page's HTML from its executed notebook: nbconvert's HTML exporter with the reports' template
(``templates/report``: JupyterLab's, each figure's description as its alt text, no script fetched from the
internet, so that a page opens from disk or an attachment).

Every page of a run's report opens with a navigation header (:class:`Nav`): links to the top index (every run's
report, ``../index.html``), the run's index and the previous and next notebook of the run, then the page's one
H1, naming the notebook and the run (the notebook's own ``# ...`` title line is taken out so that it is not said
twice); the browser title (``<title>``) names them too. Code is hidden unless ``show_code`` (``--show-code``): a
report is read, not run. The header is built here with :mod:`weknora_nb.reports.safe` (every name escaped) and
given to the template as a resource (nbconvert's public ``from_notebook_node(nb, resources)``)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import writing
from weknora_nb.reports.safe import esc, href

log = logging.getLogger(__name__)

#: the reports' templates
TEMPLATES = str(Path(__file__).parent / "templates")
#: where the top index (every run's report) lies, from a run's report folder
TOP_INDEX = "../index.html"


@dataclass(frozen=True)
class Nav:
    """Where a page stands: its ``run``, its ``notebook`` and the notebooks of the run's report, in order."""

    run: str
    notebook: str
    notebooks: tuple[str, ...]

    def neighbours(self) -> tuple[str | None, str | None]:
        """The notebooks before and after this one in the run's report (None at either end)."""
        i = self.notebooks.index(self.notebook) if self.notebook in self.notebooks else -1
        before = self.notebooks[i - 1] if i > 0 else None
        after = self.notebooks[i + 1] if 0 <= i < len(self.notebooks) - 1 else None
        return before, after


def title_of(nb: Any, fallback: str) -> str:
    """The notebook's title: its first Markdown cell's ``# `` line (``01 · Collect``), else ``fallback``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
            return first[2:].strip() if first.startswith("# ") else fallback
    return fallback


def _without_title(nb: Any) -> Any:
    """A copy of ``nb`` whose first Markdown cell no longer starts with its ``# `` title line (the header says it)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = cell.source.lstrip().splitlines()
            if lines and lines[0].startswith("# "):
                cell.source = "\n".join(lines[1:])
            break
    return nb


def nav_header(nav: Nav, title: str) -> str:
    """The page's navigation header and H1, every name escaped, every link relative."""
    before, after = nav.neighbours()
    links = [f'<a class="wk-top" href="{href(TOP_INDEX)}">all reports</a>',
             f'<a class="wk-run" href="index.html">run {esc(nav.run)}</a>']
    if before is not None:
        links.append(f'<a class="wk-prev" rel="prev" href="{href(before + ".html")}">← {esc(before)}</a>')
    if after is not None:
        links.append(f'<a class="wk-next" rel="next" href="{href(after + ".html")}">{esc(after)} →</a>')
    pages = " ".join(f'<a href="{href(n + ".html")}">{esc(n[:2])}</a>' if n != nav.notebook
                     else f'<b aria-current="page">{esc(n[:2])}</b>' for n in nav.notebooks)
    return (f'<nav class="wk-nav" aria-label="report">{" · ".join(links)}'
            f'<span class="wk-pages">notebooks: {pages}</span></nav>'
            f'<h1 class="wk-title">{esc(title)} <span class="wk-of">— run {esc(nav.run)}</span></h1>')


def exporter(show_code: bool) -> Any:
    """The reports' exporter: nbconvert's ``HTMLExporter`` with the reports' template; code cells and prompts hidden
    unless ``show_code``. A new one for each page: nbconvert's exporters are not shared across threads."""
    from nbconvert import HTMLExporter

    logging.getLogger("traitlets").setLevel(logging.ERROR)  # nbconvert's notice of an image without alt text
    hide = not show_code
    return HTMLExporter(template_name="report", extra_template_basedirs=[TEMPLATES], exclude_input=hide,
                        exclude_input_prompt=hide, exclude_output_prompt=hide)


def page_html(nb: Any, *, show_code: bool, nav: Nav | None = None) -> str:
    """The page of the executed notebook ``nb``: with ``nav``, its header and H1, and a title naming the run."""
    resources: dict[str, Any] = {}
    if nav is not None:
        title = title_of(nb, nav.notebook)
        nb = _without_title(nb)
        nb.metadata["title"] = f"{nav.run} · {title}"  # the template escapes it into <title>
        resources["wk_header"] = nav_header(nav, title)
    body, _ = exporter(show_code).from_notebook_node(nb, resources=resources)
    return str(body)


def write_page(nb: Any, html_path: Path, *, show_code: bool, nav: Nav | None = None) -> None:
    """Write the executed notebook ``nb`` as the page ``html_path`` (:func:`page_html`)."""
    body = page_html(nb, show_code=show_code, nav=nav)
    with writing(html_path):
        html_path.write_text(body, encoding="utf-8")
