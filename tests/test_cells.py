"""Tables people read (weknora_nb.reports.cells through safe.table): blanks for missing values, 3 decimals,
plain column names, text left-aligned with its line breaks, citations as chips, everything still escaped."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from weknora_nb.reports import cells, safe


def cell_texts(html: str) -> list[str]:
    return re.findall(r"<td[^>]*>(.*?)</td>", html)


def test_missing_values_are_blank_and_floats_have_three_decimals():
    df = pd.DataFrame({"a": [0.123456, np.nan, 1.5], "b": [None, "x", pd.NA], "n": pd.array([1, None, 3], "Int64"),
                       "p_holm": [0.0002, 0.5, np.nan]})
    html = safe.table(df)
    texts = cell_texts(html)
    for bad in ("None", "NaN", "nan", "&lt;NA&gt;", "<NA>"):
        assert bad not in texts
    assert "0.123" in texts and "1.500" in texts and "<0.001".replace("<", "&lt;") in texts
    assert "<th>p (Holm)</th>" in html and "<th>n</th>" in html


def test_text_is_escaped_left_aligned_with_line_breaks_and_citations_as_chips():
    df = pd.DataFrame({"answer": ['<script>alert(1)</script>\nsecond line <kb doc="政策.md" chunk_id="c1" />'],
                       "score": [0.5]})
    html = safe.table(df)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;<br>second line" in html
    assert '<span class="wk-cite" title="c1">政策.md</span>' in html
    assert '<td class="wk-text">' in html and '<td class="wk-num">0.500</td>' in html
    assert "\\n" not in html


def test_a_citation_cannot_smuggle_markup_through_its_attributes():
    html = safe.table(pd.DataFrame({"t": ['<kb doc="x&quot; onmouseover=&quot;a" chunk_id="<b>" />']}))
    assert "<b>" not in html and "onmouseover=\"" not in html


def test_an_interval_pair_reads_as_one_column_and_long_tables_collapse():
    df = pd.DataFrame({"metric": ["m"] * 30, "ci_low": [0.1] * 30, "ci_high": [0.25] * 30})
    html = safe.table(df, limit=10)
    assert "<th>95 % CI</th>" in html and "[0.100, 0.250]" in html and "ci_low" not in html
    assert html.count("<tr>") == 2 + 10 + 20 and "<details" in html and "the other 20 rows" in html


def test_value_texts():
    assert cells.value_text(True) == "yes" and cells.value_text([1, None, 2.0]) == "1, , 2"
    assert cells.number(12345.678, 0) == "12,346" and cells.number(-0.0001) == ">-0.001"
    assert cells.cut("abcdef", 4) == "abc…" and cells.cut(None, 4) == ""


def drilldown_fixture() -> dict:
    evil = "<img src=x onerror=alert(1)>"
    labels = pd.DataFrame({"chunk_id": ["d:1", "d:2"], "grade": [3, 1], "content": [evil + "\n" + "长" * 300, "b"]})
    top = pd.DataFrame({"rank": [1, 2], "chunk_id": ["d:9", "d:1"], "grade": [0, 3], "score": [0.91234, np.nan],
                        "content": ["x", evil]})
    return {"query_id": "q<1>", "query": "问题 " + evil, "answer": None, "labels": labels,
            "returned": {"final": top, "vector": top.iloc[:1], "keyword": top},
            "causes": [{"stage": "final", "causes": ["rerank demoted"], "evidence": [evil]}]}


def test_a_drilldown_is_one_grid_in_pipeline_order_escaped_and_collapsible():
    from weknora_nb.reports.drill_view import drilldown_html

    html = drilldown_html(drilldown_fixture(), open_=False)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert html.startswith('<details class="wk-drill" id="dd-q&lt;1&gt;"><summary>')   # collapsed
    assert " open>" in drilldown_html(drilldown_fixture(), open_=True).split("<summary>")[0]
    grid = html.split('class="dataframe wk-table wk-grid">')[1].split("</table>")[0]
    assert re.findall(r"<th>(\w+)</th>", grid) == ["rank", "vector", "keyword", "final"]   # pipeline order
    assert '<td class="wk-text wk-g3"' in grid and "★ d:1" in grid and "★ d:9" not in grid
    assert "score 0.912" in grid and "NaN" not in html and "nan" not in cell_texts(html)
    assert "rerank demoted" in html and "evidence (1)" in html


def test_the_manifest_reads_as_a_summary_with_the_whole_manifest_collapsed():
    from weknora_nb.reports.summary_view import manifest_html

    manifest = {"run_name": "r<1>", "status": "complete",
                "target": {"base_url": "http://h", "knowledge_base_ids": ["kb"]},
                "testset": {"path": "t.jsonl", "n_queries": 3, "n_valid": 3, "hash": "sha256:abc"},
                "stages": {"final": {"endpoint": "knowledge-search"}}, "counts": {"final": {"ok": 6}},
                "retrieval_config": {"effective": {"vector_threshold": 0.15}}, "repeats": 2}
    html = manifest_html(manifest, {"chunking.separators": ["\n\n", "。"], "run_name": "r<1>"})
    summary, full = html.split("<details", 1)
    assert "r&lt;1&gt; (complete)" in summary and "final (knowledge-search: ok 6)" in summary
    assert "vector_threshold 0.150" in summary and "chunking.separators" not in summary
    assert "the whole manifest (2 keys)" in full and "chunking.separators" in full and "\\n" not in html


def test_row_labels_are_row_headers_and_a_default_index_is_not_shown():
    named = pd.DataFrame({"final": [1, 0]}, index=pd.Index(["unexplained", "<b>x</b>"], name=None))
    html = safe.table(named, index=True)
    assert '<th>unexplained</th>' in html and "<th></th>" in html and "<b>x" not in html
    plain = safe.table(pd.DataFrame({"a": [1]}), index=True)
    assert "<th>index</th>" not in plain and plain.count("<th>") == 1 and "<td class=\"wk-num\">1</td>" in plain


def test_a_citation_cut_off_at_the_end_is_dropped():
    assert cells.markup(safe.esc('answer <kb doc="a.md" chunk_id="c1" /> then <kb doc="b.md" chunk_i…')) == (
        'answer <span class="wk-cite" title="c1">a.md</span> then …')


def test_anchored_cells_link_to_a_fragment_of_the_page_only():
    html = safe.table(pd.DataFrame({"query_id": ["q<1>", "javascript:alert(1)", None], "n": [1, 2, 3]}),
                      anchors={"query_id": "dd-"})
    assert '<a href="#dd-q%3C1%3E">q&lt;1&gt;</a>' in html and '<a href="#dd-javascript%3Aalert%281%29">' in html
    assert html.count("<a ") == 2   # a blank cell links nowhere


@pytest.mark.parametrize(("delta", "said"), [(70.0, "70 ms slower than the baseline: weigh the gain against"),
                                             (-70.0, "70 ms faster than the baseline."),
                                             (0.2, "as fast as the baseline")])
def test_the_latency_line_of_a_recommendation_says_faster_or_slower_as_the_sign_says(delta, said):
    from weknora_nb.analysis.compare import latency_line

    line = latency_line(425.0, delta)
    assert line.startswith("- Latency p95 425 ms") and said in line
    assert ("slower" in line) == (delta >= 1) and ("faster" in line) == (delta <= -1)
