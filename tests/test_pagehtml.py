"""A report page's HTML (reports/pagehtml.py, issue 17): the accessibility pass done on the template's text gives
the tree nbconvert's own pass (a BeautifulSoup parse, the attributes set, the tree written out) gives."""

from __future__ import annotations

import base64

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbconvert import HTMLExporter

from weknora_nb.reports.pagehtml import NO_DESCRIPTION, RAW_TEXT, TEMPLATES, accessible, exporter

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
def test_the_page_is_read_as_the_tree_nbconverts_own_pass_writes(no_input):
    nb = notebook()
    ours, _ = exporter(no_input).from_notebook_node(nb)
    nbconvert = HTMLExporter(template_name="report", extra_template_basedirs=[TEMPLATES], exclude_input=no_input,
                             exclude_input_prompt=no_input, exclude_output_prompt=no_input)
    theirs, _ = nbconvert.from_notebook_node(nb)
    assert str(BeautifulSoup(ours, features="html.parser")) == theirs
    no_alt = f'alt="{NO_DESCRIPTION}"'
    assert ours.count(no_alt) == theirs.count(no_alt) == 2   # the undescribed figure, a.png
    assert 'alt="ndcg@5 按阶段 &quot;&lt;b&gt;&quot; &amp; more"' in ours
    # every Chinese character written as itself (the Markdown heading's too): the page's font subset is made of them
    assert {c for c in ours if ord(c) >= 0x2E80} == {c for c in theirs if ord(c) >= 0x2E80} >= set("报告已有说明")


def test_text_where_the_parser_sees_no_tag_is_left_as_it_is():
    for element in RAW_TEXT:   # script and style, with title and textarea where Python reads them as text
        raw = f'<{element}>x = "<img src=a>"</{element}><!-- <div class="jp-OutputArea-output"> -->'
        assert accessible(raw) == raw
    assert accessible('<img src="a" alt>') == '<img src="a" alt>'
    div = "<div class='jp-OutputArea-output' tabindex='2'>"
    assert accessible(div) == div.replace("'2'", '"0"')


def test_numeric_references_are_written_as_characters_but_for_markup_quotes_and_controls():
    assert accessible("<h1>&#25253;&#x544A; &#183;</h1>") == "<h1>报告 ·</h1>"
    kept = "&#60;&#62;&#38;&#34;&#39;&#10;&#0;&#xD800;&#1114112;&#65535;"
    assert accessible(f"<p title='&#39;'>{kept}</p>") == f"<p title='&#39;'>{kept}</p>"


def test_clean_html_gives_nbconverts_sanitised_text_and_keeps_it_for_short_texts():
    from nbconvert.filters.strings import clean_html as theirs

    from weknora_nb.reports import pagehtml

    cell = '<div class="highlight"><pre><span class="n">x</span> <script>alert(1)</script>&lt;中文&gt;</pre></div>'
    long = "<p>" + "长" * pagehtml._CLEAN_KEPT_CHARS + "<img src=x onerror=y></p>"
    before = pagehtml._kept_clean.cache_info()
    for text in (cell, cell.encode("utf-8"), cell, long, TRICKY):
        assert pagehtml.clean_html(text) == theirs(text)
    after = pagehtml._kept_clean.cache_info()
    assert after.hits - before.hits >= 2         # the same cell's text (as str or bytes) sanitised once
    assert "<script" not in pagehtml.clean_html(cell) and "<img" not in pagehtml.clean_html(long)  # escaped
