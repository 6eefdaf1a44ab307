"""Notebooks executed with papermill and read as rendered HTML; the demo end to end."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from weknora_nb.collect.client import ClientSettings
from weknora_nb.collect import collect
from weknora_nb.core.errors import ReportError
from weknora_nb.reports.render import NOTEBOOKS, render_report
from weknora_nb.sandbox import SandboxServer, demo_dir
from weknora_nb.core.testset import TestSet, load_testset

KEY = "sk-report-test-9d8c7b6a5f4e"
EVIL = '<script>alert("kb")</script>'

SECTIONS = {
    "01_collect": ["01 · Collect", "Manifest", "Requests per stage", "Latency"],
    "02_metrics": ["02 · Metrics", "The metric table", "Counts and exclusions", "Recall funnel", "Distributions"],
    "03_stratify": ["03 · Stratify", "Heatmaps", "Weakest groups"],
    "04_degraded": ["04 · Degraded queries", "Causes by stage", "Drill-down"],
    "05_compare": ["05 · Compare", "Configuration difference", "Deltas", "Latency cost", "Recommendation", "History"],
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A slice of the demo: its knowledge base plus one document whose text holds a <script>,
    30 of its queries plus one that finds that document, two versions, two repeats."""
    tmp = tmp_path_factory.mktemp("reports")
    data = tmp / "demo"
    data.mkdir()
    shutil.copytree(demo_dir() / "docs", data / "docs")
    shutil.copytree(demo_dir() / "cache", data / "cache")
    shutil.copy(demo_dir() / "versions.yaml", data / "versions.yaml")
    (data / "docs" / "policies" / "99-page-scripts.md").write_text(
        f"# 页面脚本说明\n\n## 嵌入脚本的页面\n\n门户首页嵌入了一段脚本 {EVIL} 用来统计访问量，上线前须经安全组审查。\n",
        encoding="utf-8")
    full = load_testset(demo_dir() / "testset.jsonl")
    recs = full.subset(full.queries["query_id"].tolist()[::12]).records()
    recs.append({"query_id": "xss", "query": "门户首页嵌入的统计脚本要谁审查？", "query_type": "factual",
                 "tags": ["long-tail"], "relevant": {"policies.09-access-requests:000": 3}})  # mislabelled: degraded, drilled into
    ts = tmp / "testset.jsonl"
    TestSet.from_records(recs).to_jsonl(ts)
    old = os.environ.get("WEKNORA_API_KEY")
    os.environ["WEKNORA_API_KEY"] = KEY
    try:
        for v in ("baseline", "rerank"):
            with SandboxServer(v, data_dir=data, cache_dir=tmp / "cache") as sb:
                collect(ClientSettings(sb.base_url), sb.kb_id, ts, tmp / "runs" / v, repeats=2, warmup=1,
                        stages="vector,keyword,hybrid,final,citations", progress=False, system=sb.describe())
        rep = render_report(tmp / "runs" / "rerank", [tmp / "runs" / "baseline"], out_root=tmp / "reports")
    finally:
        if old is None:
            os.environ.pop("WEKNORA_API_KEY")
        else:
            os.environ["WEKNORA_API_KEY"] = old
    return tmp, rep


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_every_notebook_renders_its_sections_without_errors(reports, nb):
    tmp, rep = reports
    page = rep.pages[nb].read_text(encoding="utf-8")
    for title in SECTIONS[nb]:
        assert title in page, f"{nb}: section {title!r} missing"
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in page
    assert "Traceback" not in page and 'class="jp-OutputArea-output" data-mime-type="application/vnd.jupyter.error"' not in page
    assert not re.search(r'<script[^>]+src="https?://', page)  # self-contained


@pytest.mark.parametrize("nb", ["01_collect", "02_metrics", "03_stratify", "04_degraded", "05_compare"])
def test_figures_are_embedded(reports, nb):
    page = reports[1].pages[nb].read_text(encoding="utf-8")
    assert re.search(r'<img[^>]+src="data:image/png;base64,', page)


def test_tier_colours_and_counts_in_the_metric_report(reports):
    page = reports[1].pages["02_metrics"].read_text(encoding="utf-8")
    assert "background-color: #" in page and any(c in page for c in ("#1a9850", "#91cf60", "#fee08b", "#f46d43"))
    assert "invalid queries (excluded)" in page and "not statistically significant" in page


def test_knowledge_base_text_is_escaped(reports):
    tmp, rep = reports
    shown = 0
    for nb, page in rep.pages.items():
        text = page.read_text(encoding="utf-8")
        assert EVIL not in text, nb
        shown += text.count("&lt;script&gt;alert(")
    assert shown > 0  # the chunk's text is in a report, escaped


def test_no_secret_anywhere_in_the_reports(reports):
    tmp, rep = reports
    for p in (tmp / "reports").rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), p
    for p in (tmp / "runs").rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), p


def test_index_links_the_notebooks_with_headline_figures(reports):
    index = reports[1].index.read_text(encoding="utf-8")
    for nb in NOTEBOOKS:
        assert f'href="{nb}.html"' in index
    assert "NDCG@5 vs baseline" in index and "ndcg@5" in index


def test_a_failing_notebook_leaves_a_partial_report_and_names_the_cell(reports):
    tmp, _ = reports
    with pytest.raises(ReportError) as err:
        render_report(tmp / "runs" / "rerank", out_root=tmp / "broken", notebooks=["03_stratify"],
                      parameters={"stage": "no-such-stage"})
    assert err.value.notebook == "03_stratify" and "no-such-stage" in str(err.value)
    assert "stratify(" in err.value.source and f"cell {err.value.cell}" in str(err.value)
    assert err.value.partial_html.exists()
    assert "no-such-stage" in err.value.partial_html.read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_demo_end_to_end(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WEKNORA_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "weknora_nb", "demo", "--out", str(tmp_path), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = tmp_path / "reports" / "index.html"
    assert str(index) in proc.stdout
    text = index.read_text(encoding="utf-8")
    for v in ("baseline", "rerank", "hnsw-m4"):
        assert f'href="{v}/index.html"' in text
        assert (tmp_path / "reports" / v / "05_compare.html").exists()
    assert re.search(r"rerank</a>: .*NDCG@5 vs baseline: \+0\.\d+", text)
