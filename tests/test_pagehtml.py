"""A report page's HTML (reports/pagehtml.py): nbconvert's exporter with the reports' template: each figure's
description as its alt text, escaped; nbconvert's accessibility attributes; no script fetched from the internet."""

from __future__ import annotations

import base64
import re

import nbformat
import pytest
from bs4 import BeautifulSoup

from weknora_nb.reports.pagehtml import Nav, exporter, page_html, write_page

#: nbconvert's ``alt`` of an image that has none
NO_DESCRIPTION = "No description has been provided for this image"

PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                                     "1f15c4890000000d49444154789c63f8cf000000030101004a7ce3d10000000049454e44ae426082")
                       ).decode("ascii")

#: an HTML output holding what a pass on the text could take for tags: a script and a comment with tags in
#: them, a ``>`` inside a quoted value, an unquoted class, upper case, a self-closed image, a tabindex already
#: set, a class that only contains the name, Chinese
TRICKY = """<div class="jp-OutputArea-output extra" tabindex="-1" title="a > b">已有</div>
<script>var s = '<div class="jp-OutputArea-output"><img src=x>';</script>
<!-- <img src="commented"> <div class=jp-Cell-inputWrapper> -->
<DIV CLASS=jp-Cell-inputWrapper data-x='<img src=y>'>upper</DIV>
<img src="a.png"/><img alt="" src="b.png"><IMG SRC="c.png" ALT="说明">
<div class="not-jp-OutputArea-output-either">no</div><div tabindex>bare</div>
<style>div.jp-OutputArea-output::after { content: "<img>"; }</style>
<textarea><div class="jp-OutputArea-output"></div></textarea>"""


def notebook() -> nbformat.NotebookNode:
    new = nbformat.v4
    figure = new.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})
    described = new.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"},
                               metadata={"image/png": {"alt": 'ndcg@5 按阶段 "<b>" & more'}})
    cells = [new.new_markdown_cell("# 报告\n\nSome *text* with <b>html</b> and ![an image](x.png)"),
             new.new_code_cell("print('x')", outputs=[new.new_output("stream", text="<div>escaped</div>\n")]),
             new.new_code_cell("fig", outputs=[figure, described]),
             new.new_code_cell("HTML(...)", outputs=[new.new_output("display_data", data={"text/html": TRICKY})]),
             new.new_code_cell("1/0", outputs=[new.new_output("error", ename="ZeroDivisionError", evalue="<x>",
                                                              traceback=["Traceback <here>"])])]
    nb = new.new_notebook(cells=cells)
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    return nb


@pytest.mark.parametrize("show_code", [True, False])
def test_each_figure_carries_its_description_and_every_image_an_alt(show_code):
    html, _ = exporter(show_code).from_notebook_node(notebook())
    soup = BeautifulSoup(html, features="html.parser")
    alts = [img.get("alt") for img in soup.find_all("img")]
    assert 'ndcg@5 按阶段 "<b>" & more' in alts   # the description, escaped in the page and read back whole
    assert '"<b>" & more' not in html   # escaped in the page
    assert alts.count(NO_DESCRIPTION) == 2        # the undescribed figure and the Markdown image
    assert all(alt is not None for alt in alts)
    assert set("报告已有") <= set(soup.get_text()) and "说明" in alts   # Chinese as itself, in text and alt


@pytest.mark.parametrize("show_code", [True, False])
def test_a_page_fetches_no_script_from_the_internet(tmp_path, show_code):
    page = tmp_path / "page.html"
    write_page(notebook(), page, show_code=show_code, nav=Nav("r", "02_metrics", ("01_collect", "02_metrics")))
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc=\"?https?://", html, re.I), "an external script"
    assert "require.min.js" not in html and "cdnjs" not in html
    assert "<div>escaped</div>" not in html and "&lt;div&gt;escaped&lt;/div&gt;" in html


def test_code_is_hidden_unless_shown():
    def inputs(show_code: bool) -> list[str]:
        html = page_html(notebook(), show_code=show_code)
        soup = BeautifulSoup(html, features="html.parser")
        return [div.get_text() for div in soup.select("div.jp-CodeCell div.jp-InputArea")]

    assert inputs(False) == [] and any("print('x')" in text for text in inputs(True))


@pytest.mark.parametrize(("notebook_name", "before", "after"), [("01_collect", None, "02_metrics"),
                                                                ("02_metrics", "01_collect", "04_degraded"),
                                                                ("04_degraded", "02_metrics", None)])
def test_each_page_has_the_navigation_header_and_names_its_run(notebook_name, before, after):
    run = 'v<2>&"x"'
    nav = Nav(run, notebook_name, ("01_collect", "02_metrics", "04_degraded"))
    html = page_html(notebook(), show_code=False, nav=nav)
    soup = BeautifulSoup(html, features="html.parser")
    assert soup.title.get_text() == f"{run} · 报告"
    h1s = soup.find_all("h1")
    assert len(h1s) == 1 and run in h1s[0].get_text() and "报告" in h1s[0].get_text()
    links = {a.get_text(): a["href"] for a in soup.select("nav.wk-nav a")}
    assert links["all reports"] == "../index.html" and links[f"run {run}"] == "index.html"
    assert (f"← {before}" in links) == (before is not None) and (f"{after} →" in links) == (after is not None)
    if before:
        assert links[f"← {before}"] == f"{before}.html"
    if after:
        assert links[f"{after} →"] == f"{after}.html"
    assert "<2>" not in html and "v&lt;2&gt;&amp;" in html   # the run's name escaped everywhere
