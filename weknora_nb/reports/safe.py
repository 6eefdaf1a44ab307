"""One rule for every text that reaches a report's HTML: it is data, never markup.

Stage names, tags, query types, run names, query and chunk text, answers and baseline names
come from users and knowledge bases, so every one of them is escaped (``<``, ``>``, ``&``,
``"`` and ``'``) before it reaches a page: the notebooks show HTML only through the functions
here, never Markdown with data in it (Markdown lets raw HTML and links through).

- :func:`esc` is the rule: a value as text that HTML shows literally;
- :func:`table` a DataFrame (cells, index and column labels, their names), readable
  (:mod:`weknora_nb.reports.cells`: 3 decimals, blanks for missing values, plain column names, text
  left-aligned with its line breaks, citations as chips), the rows past ``limit`` collapsed;
- :func:`styled` a pandas ``Styler`` (cells, row and column labels);
- :func:`text` plain text (paragraphs, ``- `` bullets) and :func:`bullets` a list of items;
- :func:`href` a link to a file of the report, relative and percent-encoded (never a
  ``javascript:`` or other scheme, whatever the run is called).
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from weknora_nb.core.errors import UsageError
from weknora_nb.reports import cells

if TYPE_CHECKING:
    import pandas as pd
    from pandas.io.formats.style import Styler


def esc(value: Any) -> str:
    """``value`` as text that HTML shows literally (in an element or a quoted attribute)."""
    return html.escape(str(value), quote=True)


def table(df: pd.DataFrame, *, index: bool = False, limit: int | None = None, raw: bool = False,
          fold: Mapping[str, int] | None = None, anchors: Mapping[str, str] | None = None) -> str:
    """``df`` as an HTML table, every cell, label and label name escaped.

    The cells read as :mod:`weknora_nb.reports.cells` says (``raw``: as :func:`str` gives them, for tables whose
    cells are already the text to show), number columns right-aligned and text left-aligned (class ``wk-num`` /
    ``wk-text``); ``index``: the row labels first, as row headers (``<th>``; a default 0, 1, 2... index is not
    shown, an unnamed level has a blank column name); ``limit``: the rows past the first ``limit`` in a collapsed
    block under the table (``<details>``), so that a long listing does not make the page long; ``fold``: column
    name -> characters, a longer text of that column cut there, the whole of it in a collapsed block in its cell;
    ``anchors``: column name -> prefix, each cell of that column a link to the element of the page whose id is the
    prefix and the cell's text (``query_id`` -> ``#dd-q0004``, percent-encoded: a fragment, never a scheme)."""
    levels = 0 if not index or (df.index.name is None and type(df.index).__name__ == "RangeIndex") else df.index.nlevels
    frame = df.reset_index(allow_duplicates=True) if levels else df
    columns: list[tuple[str, list[str], bool]] = []
    names = list(frame.columns)
    for i, name in enumerate(names):
        if i < levels:
            label = "" if df.index.names[i] is None else cells.plain_name(name)
            columns.append((label, [cells.value_text(v) for v in frame.iloc[:, i]], False))
            continue
        if raw:
            columns.append((str(name), ["" if cells.is_missing(v) else str(v) for v in frame.iloc[:, i]], False))
            continue
        if name == cells.CI_COLUMNS[1] and cells.CI_COLUMNS[0] in names:
            continue
        if name == cells.CI_COLUMNS[0] and cells.CI_COLUMNS[1] in names:
            texts = cells.interval_texts(frame.iloc[:, i], frame.iloc[:, names.index(cells.CI_COLUMNS[1])])
            columns.append((cells.CI_NAME, texts, True))
            continue
        texts, numeric = cells.column_texts(frame.iloc[:, i])
        columns.append((cells.plain_name(name), texts, numeric))
    n = len(frame)
    shown = n if limit is None or n <= limit else limit
    head = "<thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c, _, _ in columns) + "</tr></thead>"

    folds = [(fold or {}).get(str(name)) for name in names if not (not raw and name == cells.CI_COLUMNS[1]
                                                                      and cells.CI_COLUMNS[0] in names)]

    targets = [(anchors or {}).get(str(name)) for name in names if not (not raw and name == cells.CI_COLUMNS[1]
                                                                         and cells.CI_COLUMNS[0] in names)]

    def cell(text: str, limit: int | None, target: str | None = None) -> str:
        if target is not None and text:
            return f'<a href="{esc("#" + quote(target + text, safe=""))}">{esc(text)}</a>'
        if limit is None or len(text) <= limit:
            return cells.markup(esc(text))
        return (f'<details class="wk-cell"><summary>{cells.markup(esc(cells.cut(text, limit)))}</summary>'
                f"{cells.markup(esc(text))}</details>")

    def body(rows: range) -> str:
        out = []
        for r in rows:
            tds = []
            for j, ((_, t, num), lim, to) in enumerate(zip(columns, folds, targets, strict=True)):
                if j < levels:   # a row header: left-aligned like every header
                    tds.append(f"<th>{cell(t[r], lim)}</th>")
                else:
                    tds.append(f'<td class="{"wk-num" if num else "wk-text"}">{cell(t[r], lim, to)}</td>')
            out.append("<tr>" + "".join(tds) + "</tr>")
        return "<tbody>" + "".join(out) + "</tbody>"
    html_out = f'<table class="dataframe wk-table">{head}{body(range(shown))}</table>'
    if shown < n:
        html_out += (f'<details class="wk-more"><summary>{esc(f"the other {n - shown} rows")}</summary>'
                     f'<table class="dataframe wk-table">{head}{body(range(shown, n))}</table></details>')
    return html_out


def styled(styler: Styler) -> Styler:
    """``styler`` with its cells and its row and column labels escaped (a caption must come from :func:`esc`)."""
    return styler.format(escape="html").format_index(escape="html", axis=0).format_index(escape="html", axis=1)


def text(plain: str) -> str:
    """Plain text as HTML, in its order: blank lines separate paragraphs, lines that start with ``- `` are bullets."""
    parts: list[str] = []
    for block in str(plain).split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        for is_item, run in itertools.groupby(lines, key=lambda ln: ln.startswith("- ")):
            group = list(run)
            parts.append(bullets(ln[2:] for ln in group) if is_item else "<p>" + "<br>".join(map(esc, group)) + "</p>")
    return "\n".join(parts)


def bullets(items: Iterable[Any], *, bold: bool = False) -> str:
    """A list of items as an HTML ``<ul>``, each escaped (in bold when ``bold``)."""
    wrap = ("<b>", "</b>") if bold else ("", "")
    return "<ul>" + "".join(f"<li>{wrap[0]}{esc(i)}{wrap[1]}</li>" for i in items) + "</ul>"


def href(path: str | PurePath) -> str:
    """A relative link to ``path`` for an ``href`` attribute: the path percent-encoded.

    Every ``:`` is encoded too, so a first segment such as ``javascript:x`` is a file name, not
    a scheme; an absolute path is refused (a report links only to its own files).
    """
    p = PurePath(path)
    if p.is_absolute():
        raise UsageError(f"a report links only to relative paths, not {str(p)!r}")
    return esc(quote(p.as_posix(), safe="/"))
