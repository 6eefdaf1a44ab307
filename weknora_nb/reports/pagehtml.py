"""A report page's HTML from its executed notebook: nbconvert's HTML exporter with the reports' template, its
accessibility pass done on the template's text (:func:`accessible`).

nbconvert's ``HTMLExporter`` ends by parsing the whole page with BeautifulSoup to give each image without
one an ``alt`` and each cell's input and output a ``tabindex``, then writes the tree out again: three quarters
of a page's export (the demo's 28 pages: 2.6 s, 0.7 s without it). :class:`ReportExporter` gives
the same elements the same attributes in the template's text; the page differs from nbconvert's only in how
the tree is written (its spacing, the order of attributes, ``<br>`` for ``<br/>``), which a browser reads
alike: tests/test_pagehtml.py holds that BeautifulSoup reads each page as the tree nbconvert's pass writes.

Two more savings leave the page as it was: each code cell's highlighted text is sanitised (bleach, parsing with
html5lib in Python) once per process rather than once per page (:func:`clean_html`: the reports of one rendering
show the same notebooks' cells again), and the notebook is validated once, after nbconvert's preprocessors, not
after each of them (``optimistic_validation``).
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from nbconvert import HTMLExporter
from nbconvert.exporters.templateexporter import TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.strings import clean_html as nbconvert_clean_html
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

from weknora_nb.core.errors import writing

__all__ = ["ReportExporter", "exporter", "write_page", "accessible", "clean_html", "NO_DESCRIPTION", "RAW_TEXT",
           "TEMPLATES"]

log = logging.getLogger(__name__)

#: the reports' templates (``report``: JupyterLab's, each figure's description as its ``alt``)
TEMPLATES = str(Path(__file__).parent / "templates")

#: nbconvert's ``alt`` of an image that has none
NO_DESCRIPTION = "No description has been provided for this image"

#: a script fetched from the internet: removed, a report opens from disk or an attachment
_EXTERNAL_SCRIPT = re.compile(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>', re.I)

#: the elements whose text Python's HTML parser, which nbconvert's pass parses with, reads as text, not tags:
#: scripts and styles (and, from the Python versions that read them so, text areas and titles)
RAW_TEXT = tuple(HTMLParser.CDATA_CONTENT_ELEMENTS) + tuple(getattr(HTMLParser, "RCDATA_CONTENT_ELEMENTS", ()))

#: what the accessibility pass reads: text it skips (comments, and :data:`RAW_TEXT` elements' text), and the
#: start tags of ``div`` and ``img`` elements (attribute values quoted, so a ``>`` inside one does not end the tag)
_PASS = re.compile(r"<!--.*?-->|<(" + "|".join(RAW_TEXT) + r""")\b.*?</\1\s*>"""
                   r"""|<(div|img)((?:\s+[^\s"'>/=]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'=<>`]+))?)*)\s*(/?)>"""
                   r"|&#(?:([0-9]{1,7})|[xX]([0-9a-fA-F]{1,6}));", re.S | re.I)

#: the characters a numeric reference stays for (markup, quotes) and those it is not decoded to (controls,
#: surrogates, noncharacters): BeautifulSoup writes the first escaped and keeps the second's reference
_KEEP_ESCAPED = frozenset("&<>\"'")
_CLASS = re.compile(r"""\sclass\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`]+))""", re.I)
_FOCUSABLE = {"jp-Cell-inputWrapper", "jp-OutputArea-output"}
_TABINDEX = re.compile(r"""(\stabindex)(?=[\s=/]|$)(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'=<>`]+))?""", re.I)


class ReportExporter(HTMLExporter):
    """nbconvert's HTML exporter, its accessibility pass done by :func:`accessible` (see the module docstring)."""

    def from_notebook_node(self, nb: Any, resources: dict[str, Any] | None = None,  # type: ignore[override]
                           **kw: Any) -> tuple[str, dict[str, Any]]:
        """``HTMLExporter.from_notebook_node`` (nbconvert 7.16-7.17): the code highlighter and the widget filter
        registered, the resources set up, the template rendered; then :func:`accessible`."""
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        self.register_filter("highlight_code",
                             self.filters.get("highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)))
        resources = self._init_resources(resources)
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(notebook_metadata=self._nb_metadata,
                                                                       parent=self, resources=resources))
        self.register_filter("clean_html", clean_html)
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        return accessible(html), resources


#: the longest text :func:`clean_html` keeps its result for (characters): a code cell's highlighted text, not a
#: large output's
_CLEAN_KEPT_CHARS = 1 << 16


def clean_html(element: str | bytes) -> str:
    """nbconvert's ``clean_html`` filter (bleach's sanitiser), the result for a text under 64 K characters kept for
    the process (the last 1,024): the lab template sanitises every code cell's highlighted source, and a rendering's
    reports show the same notebooks' cells (the demo's 28 pages: 317 cells, about 40 % of their export's time)."""
    text = element.decode() if isinstance(element, bytes) else str(element)
    return _kept_clean(text) if len(text) < _CLEAN_KEPT_CHARS else nbconvert_clean_html(text)


@lru_cache(maxsize=1024)
def _kept_clean(text: str) -> str:
    return nbconvert_clean_html(text)


def accessible(html: str) -> str:
    """``html`` with nbconvert's accessibility attributes: ``alt`` (:data:`NO_DESCRIPTION`) on each ``img``
    without one (an ``alt`` already there is kept), ``tabindex="0"`` on each ``div`` of class
    ``jp-Cell-inputWrapper`` or ``jp-OutputArea-output`` (in place of a ``tabindex`` already there). nbconvert
    sets the latter on those inside the page's ``jp-Notebook``: in the lab template, its body.

    Numeric character references outside comments, raw text and those tags are written as their characters, as
    BeautifulSoup writes them (nbconvert's Markdown headings write Chinese so: the page's CJK font subset is
    made of the characters it holds), but for markup and quotes and what is no printable character."""
    missing: list[int] = []

    def tag(m: re.Match[str]) -> str:
        if m.group(5) is not None or m.group(6) is not None:
            return _character(m)
        name, attrs = m.group(2), m.group(3)
        if name is None:   # a comment or raw text
            return m.group(0)
        names = {a.lower() for a in re.findall(r"""\s+([^\s"'>/=]+)""", _values_blanked(attrs))}
        if name.lower() == "img":
            if "alt" in names:
                return m.group(0)
            missing.append(1)
            return f'<{name}{attrs} alt="{NO_DESCRIPTION}"{m.group(4)}>'
        classes = _CLASS.search(attrs)
        value = next((g for g in classes.groups() if g is not None), "") if classes else ""
        if not _FOCUSABLE & set(value.split()):
            return m.group(0)
        if "tabindex" in names:
            attrs = _TABINDEX.sub(r'\1="0"', attrs)
            return f"<{name}{attrs}{m.group(4)}>"
        return f'<{name}{attrs} tabindex="0"{m.group(4)}>'

    out = _PASS.sub(tag, html)
    if missing:
        log.debug("alternative text is missing on %d image(s)", len(missing))
    return out


def _character(m: re.Match[str]) -> str:
    """The character of the numeric reference ``m``, or the reference where it stands for markup, a quote or
    what is no printable character."""
    code = int(m.group(5)) if m.group(5) is not None else int(m.group(6), 16)
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF or (code & 0xFFFE) == 0xFFFE or 0xFDD0 <= code <= 0xFDEF:
        return m.group(0)
    char = chr(code)
    return m.group(0) if char in _KEEP_ESCAPED or not char.isprintable() else char


def _values_blanked(attrs: str) -> str:
    """``attrs`` with each quoted value emptied, so that only attribute names are read."""
    return re.sub(r'"[^"]*"|\'[^\']*\'', '""', attrs)


def exporter(no_input: bool) -> ReportExporter:
    """The reports' exporter (JupyterLab's template, extended by ``templates/report``; ``no_input``: code cells
    and prompts hidden)."""
    logging.getLogger("traitlets").setLevel(logging.ERROR)  # nbconvert's notice of an image without alt text
    return ReportExporter(template_name="report", extra_template_basedirs=[TEMPLATES], optimistic_validation=True,
                          exclude_input=no_input, exclude_input_prompt=no_input, exclude_output_prompt=no_input)


def write_page(nb: Any, html_path: Path, page_exporter: Any) -> None:
    """Write the executed notebook ``nb`` as the page ``html_path`` with ``page_exporter`` (:func:`exporter`), no
    script fetched from the internet left in it."""
    body, _ = page_exporter.from_notebook_node(nb)
    body = _EXTERNAL_SCRIPT.sub("", body)
    with writing(html_path):
        html_path.write_text(body, encoding="utf-8")
