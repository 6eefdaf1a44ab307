"""A report page's HTML (reports/pagehtml.py): nbconvert's exporter with the reports' template: each figure's
description as its alt text, escaped; nbconvert's accessibility attributes; no script fetched from the internet."""

from __future__ import annotations

import base64
import re

import nbformat
import pytest
from bs4 import BeautifulSoup

from weknora_nb.reports.pagehtml import exporter, write_page

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


@pytest.mark.parametrize("no_input", [True, False])
def test_each_figure_carries_its_description_and_every_image_an_alt(no_input):
    html, _ = exporter(no_input).from_notebook_node(notebook())
    soup = BeautifulSoup(html, features="html.parser")
    alts = [img.get("alt") for img in soup.find_all("img")]
    assert 'ndcg@5 按阶段 "<b>" & more' in alts   # the description, escaped in the page and read back whole
    assert '"<b>" & more' not in html   # escaped in the page
    assert alts.count(NO_DESCRIPTION) == 2        # the undescribed figure and the Markdown image
    assert all(alt is not None for alt in alts)
    assert set("报告已有") <= set(soup.get_text()) and "说明" in alts   # Chinese as itself, in text and alt


@pytest.mark.parametrize("no_input", [True, False])
def test_a_page_fetches_no_script_from_the_internet(tmp_path, no_input):
    page = tmp_path / "page.html"
    write_page(notebook(), page, no_input=no_input)
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc=\"?https?://", html, re.I), "an external script"
    assert "require.min.js" not in html and "cdnjs" not in html
    assert "<div>escaped</div>" not in html and "&lt;div&gt;escaped&lt;/div&gt;" in html


def test_code_is_hidden_with_no_input_and_shown_without():
    def inputs(no_input: bool) -> list[str]:
        html, _ = exporter(no_input).from_notebook_node(notebook())
        soup = BeautifulSoup(html, features="html.parser")
        return [div.get_text() for div in soup.select("div.jp-CodeCell div.jp-InputArea")]

    assert inputs(True) == [] and any("print('x')" in text for text in inputs(False))
