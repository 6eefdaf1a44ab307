"""Notebooks executed with papermill and read as rendered HTML; the demo end to end."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pandas as pd
import papermill as pm
import pytest

from weknora_nb.collect import collect
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.collect.judge.llm import JUDGE_API_KEY_ENV, LLMSettings
from weknora_nb.collect.judge.manifest import RULE_JUDGE_MODEL
from weknora_nb.collect.judge.options import JudgeOptions
from weknora_nb.collect.judge.pointwise import judge_run
from weknora_nb.core.errors import ReportError
from weknora_nb.core.run import load_run
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.reports import figures, kernel, tables
from weknora_nb.reports import notebook as wn
from weknora_nb.reports.index_page import headline
from weknora_nb.reports.render import NOTEBOOKS, notebooks_dir, render_report
from weknora_nb.sandbox import SandboxServer, demo_dir

from .conftest import DEMO_LIMIT

KEY = "sk-report-test-9d8c7b6a5f4e"
EVIL = '<script>alert("kb")</script>'

SECTIONS = {
    "01_collect": ["01 · Collect", "Manifest", "Requests per stage", "Latency"],
    "02_metrics": ["02 · Metrics", "The metric table", "Counts and exclusions", "Label coverage",
                   "Corrected figures: LLM grades and a human sample", "Recall funnel", "Distributions"],
    "03_stratify": ["03 · Stratify", "Heatmaps", "Weakest groups", "By source"],
    "04_degraded": ["04 · Degraded queries", "What each stage ran", "Causes by stage", "Drill-down"],
    "05_compare": ["05 · Compare", "Configuration difference", "Deltas", "Latency cost", "Recommendation",
                   "Answers beside retrieval", "Label coverage", "The delta corrected by a human sample",
                   "Effect sizes", "Which query types gain", "Every version side by side", "History"],
    "06_answers": ["06 · Answers", "Scores", "By query type", "The worst answers", "Citations", "Citation order",
                   "Judge stability", "Cost", "sandbox-rule-judge", "rule-based judge, not a language model"],
}


@contextmanager
def stderr_and_logs(lines: list[str]):
    """Collect what is written to file descriptor 2 (this process and the kernels it starts) and every
    log record of level ERROR or above, as lines, into ``lines``."""
    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")
    handler = Collect(logging.ERROR)
    logging.getLogger().addHandler(handler)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            logging.getLogger().removeHandler(handler)
            f.seek(0)
            lines.extend(f.read().decode("utf-8", "replace").splitlines())


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
        f"# 页面脚本说明\n\n## 嵌入脚本的页面\n\n门户首页嵌入了一段脚本 {EVIL} 用来统计访问量，"
        "上线前须经安全组审查。\n",
        encoding="utf-8")
    full = load_testset(demo_dir() / "testset.jsonl")
    recs = full.subset(full.queries["query_id"].tolist()[::12]).records()
    # mislabelled: degraded, drilled into
    recs.append({"query_id": "xss", "query": "门户首页嵌入的统计脚本要谁审查？", "query_type": "factual",
                 "tags": ["long-tail"], "relevant": {"policies.09-access-requests:000": 3}})
    ts = tmp / "testset.jsonl"
    TestSet.from_records(recs).to_jsonl(ts)
    old = os.environ.get("WEKNORA_API_KEY")
    os.environ["WEKNORA_API_KEY"] = KEY
    try:
        for v in ("baseline", "rerank"):
            with SandboxServer(v, data_dir=data, cache_dir=tmp / "cache") as sb:
                collect(ClientSettings(sb.base_url), sb.kb_id, ts, tmp / "runs" / v, repeats=2, warmup=1,
                        stages="vector,keyword,hybrid,final,citations", progress=False, system=sb.describe())
                os.environ[JUDGE_API_KEY_ENV] = KEY  # the sandbox's rule-based judge takes a sandbox key
                judge_run(tmp / "runs" / v, LLMSettings(sb.base_url + "/v1", RULE_JUDGE_MODEL), JudgeOptions(repeats=2))
        with stderr_and_logs([]) as stderr:
            rep = render_report(tmp / "runs" / "rerank", [tmp / "runs" / "baseline"], out_root=tmp / "reports")
    finally:
        os.environ.pop(JUDGE_API_KEY_ENV, None)
        if old is None:
            os.environ.pop("WEKNORA_API_KEY")
        else:
            os.environ["WEKNORA_API_KEY"] = old
    return tmp, rep, stderr


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_every_notebook_renders_its_sections_without_errors(reports, nb):
    tmp, rep, _ = reports
    page = rep.pages[nb].read_text(encoding="utf-8")
    for title in SECTIONS[nb]:
        assert title in page, f"{nb}: section {title!r} missing"
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in page
    assert "Traceback" not in page
    assert 'class="jp-OutputArea-output" data-mime-type="application/vnd.jupyter.error"' not in page
    assert not re.search(r'<script[^>]+src="https?://', page)  # self-contained


@pytest.mark.slow
@pytest.mark.parametrize("nb", ["01_collect", "02_metrics", "03_stratify", "04_degraded", "05_compare", "06_answers"])
def test_figures_are_embedded(reports, nb):
    page = reports[1].pages[nb].read_text(encoding="utf-8")
    assert re.search(r'<img[^>]+src="data:image/png;base64,', page)


@pytest.mark.slow
def test_each_figure_is_described_in_its_alt_text(reports):
    """Every image carries its figure's description (titles, axes, series: figures.describe), escaped, never
    nbconvert's "No description has been provided for this image"."""
    described = {}
    for nb, path in reports[1].pages.items():
        page = path.read_text(encoding="utf-8")
        images = re.findall(r"<img[^>]*>", page)
        alts = [re.search(r'alt="([^"]*)"', img) for img in images]
        assert all(alts) and "No description has been provided" not in page, nb
        described[nb] = [a.group(1) for a in alts if a]
    assert described["02_metrics"][0].startswith("Metrics by stage (95 % CI); y: mean over valid queries")
    assert any(a.startswith("Latency; x: latency (ms); y: share of requests; series: ")
               for a in described["01_collect"])
    assert any("Causes of degraded queries" in a for a in described["04_degraded"])


@pytest.mark.slow
def test_the_answers_page_shows_the_chat_stage_whatever_focus_stage_the_command_sets(reports, capsys):
    from weknora_nb import cli

    tmp, _, _ = reports
    for extra in ([], ["--stage", "final"]):
        out = tmp / f"cli-answers{len(extra)}"
        assert cli.main(["report", "--run", str(tmp / "runs" / "rerank"), "--notebooks", "06_answers", "--out",
                         str(out), *extra]) == 0
        page = (out / "rerank" / "06_answers.html").read_text(encoding="utf-8")
        shown = re.search(r"(\d+) answers at stage (\w+)", page)
        assert shown and int(shown.group(1)) > 0 and shown.group(2) == "citations", extra


@pytest.mark.slow
def test_tier_colours_and_counts_in_the_metric_report(reports):
    page = reports[1].pages["02_metrics"].read_text(encoding="utf-8")
    assert "background-color: #" in page and any(c in page for c in ("#1a9850", "#91cf60", "#fee08b", "#f46d43"))
    assert "invalid queries (excluded)" in page and "not statistically significant" in page


@pytest.mark.slow
def test_knowledge_base_text_is_escaped(reports):
    tmp, rep, _ = reports
    shown = 0
    for nb, page in rep.pages.items():
        text = page.read_text(encoding="utf-8")
        assert EVIL not in text, nb
        shown += text.count("&lt;script&gt;alert(")
    assert shown > 0  # the chunk's text is in a report, escaped


@pytest.mark.slow
def test_no_secret_anywhere_in_the_reports(reports):
    tmp, rep, _ = reports
    for p in (tmp / "reports").rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), p
    for p in (tmp / "runs").rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), p


@pytest.mark.slow
def test_index_links_the_notebooks_with_headline_figures(reports):
    index = reports[1].index.read_text(encoding="utf-8")
    for nb in NOTEBOOKS:
        assert f'href="{nb}.html"' in index
    assert "NDCG@5 vs baseline" in index and "ndcg@5" in index


@pytest.mark.slow
def test_a_failing_notebook_leaves_a_partial_report_and_names_the_cell(reports):
    tmp, _, _ = reports
    missing = tmp / "no-such-rules.yaml"
    with pytest.raises(ReportError) as err:
        render_report(tmp / "runs" / "rerank", out_root=tmp / "broken", notebooks=["03_stratify"],
                      parameters={"rules_path": str(missing)})
    assert err.value.notebook == "03_stratify" and "no-such-rules.yaml" in str(err.value)
    assert "stratify(" in err.value.source and f"cell {err.value.cell}" in str(err.value)
    assert err.value.partial_html.exists()
    assert "no-such-rules.yaml" in err.value.partial_html.read_text(encoding="utf-8")


@pytest.mark.slow
def test_an_unknown_stage_fails_in_the_setup_call_naming_the_stages(reports):
    tmp, _, _ = reports
    with pytest.raises(ReportError) as err:
        render_report(tmp / "runs" / "rerank", out_root=tmp / "broken-stage", notebooks=["03_stratify"],
                      parameters={"stage": "no-such-stage"})
    assert err.value.notebook == "03_stratify" and "no-such-stage" in str(err.value)
    failed = nbformat.read(err.value.partial_html.with_suffix(".ipynb"), as_version=4).cells[err.value.cell - 1]
    assert "open_run(" in failed.source and "UsageError" in str(err.value)
    assert "vector, keyword, hybrid, final, citations" in str(err.value)
    assert "no-such-stage" in err.value.partial_html.read_text(encoding="utf-8")


def injected(executed: Path) -> set[str]:
    """The names of the parameters papermill injected into an executed notebook."""
    nb = nbformat.read(executed, as_version=4)
    cells = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    return set(re.findall(r"^(\w+) = ", cells[0].source, flags=re.M)) if cells else set()


@pytest.mark.slow
def test_each_notebook_gets_only_the_parameters_it_declares(reports):
    tmp, rep, _ = reports
    for nb in NOTEBOOKS:
        declared = set(pm.inspect_notebook(str(notebooks_dir() / f"{nb}.ipynb")))
        got = injected(rep.folder / f"{nb}.ipynb")
        assert "run_dir" in got and got <= declared, nb
    assert "baseline_dirs" in injected(rep.folder / "05_compare.ipynb")
    assert "baseline_dirs" not in injected(rep.folder / "02_metrics.ipynb")
    assert "interactive" not in injected(rep.folder / "01_collect.ipynb")


def test_the_notebooks_are_committed_without_outputs():
    for nb in NOTEBOOKS:
        book = nbformat.read(notebooks_dir() / f"{nb}.ipynb", as_version=4)
        code = [c for c in book.cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata.get("tags", []), nb
        assert all(not c.outputs and c.execution_count is None for c in code), nb
        assert sum("open_run(" in c.source or "open_collection(" in c.source for c in code) == 1, nb


@pytest.mark.slow
def test_a_comparison_without_baseline_says_so_once_and_shows_the_history(reports):
    tmp, _, _ = reports
    rep = render_report(tmp / "runs" / "baseline", out_root=tmp / "alone", notebooks=["05_compare"])
    page = rep.pages["05_compare"].read_text(encoding="utf-8")
    assert page.count("No baseline was given") == 1 and "History" in page
    for section in ("Configuration difference", "Deltas", "Latency cost", "Recommendation"):
        assert section not in page
    assert "Traceback" not in page and 'data-mime-type="application/vnd.jupyter.stderr"' not in page
    assert "No baseline given" in rep.index.read_text(encoding="utf-8")
    with_baseline = reports[1].pages["05_compare"].read_text(encoding="utf-8")
    assert "No baseline was given" not in with_baseline


def styled_colours(page: str) -> dict[tuple[str, str], str]:
    """(stage, metric) -> background colour of each cell of the tier table in ``page`` (a Styler's HTML)."""
    rows = dict(re.findall(r'<th [^>]*\bid="(T_\w+_level0_row\d+)"[^>]*>([^<]+)</th>', page))
    cols = dict(re.findall(r'<th [^>]*\bid="(T_\w+_level0_col\d+)"[^>]*>([^<]+)</th>', page))
    colours: dict[tuple[str, str], str] = {}
    for selectors, colour in re.findall(r"((?:#T_\w+_row\d+_col\d+(?:, )?)+) \{\s*background-color: (#\w+);", page):
        for uid, r, c in re.findall(r"#(T_\w+)_row(\d+)_col(\d+)", selectors):
            colours[(rows[f"{uid}_level0_row{r}"], cols[f"{uid}_level0_col{c}"])] = colour
    return colours


@pytest.mark.slow
def test_domain_adjustment_reaches_the_tier_colours(reports):
    tmp, rep, _ = reports
    run_dir = tmp / "runs" / "rerank"
    plain, adjusted = load_run(run_dir).scores, load_run(run_dir, domain_adjustment=0.1).scores
    before, after = plain.summary_wide("tier"), adjusted.summary_wide("tier")
    moved = [(s, m) for s in after.index for m in after.columns
             if isinstance(after.loc[s, m], str) and after.loc[s, m] != before.loc[s, m]]
    assert moved  # 30 tiered cells: some lie within 10 % below a bound
    # the table functions: colours follow the scores' adjusted tiers, the caption says so
    html = tables.style_tiers(tables.metric_table(adjusted, resamples=100)).to_html()
    colours = styled_colours(html)
    assert all(colours[c] == tables.TIER_COLOURS[after.loc[c]] for c in moved)
    assert "thresholds lowered by 10%" in html
    assert styled_colours(tables.style_tiers(tables.metric_table(plain, resamples=100)).to_html())[moved[0]] \
        == tables.TIER_COLOURS[before.loc[moved[0]]]
    # the rendered notebook: 02 run with domain_adjustment=0.1 (the other notebooks' parameters dropped)
    adj = render_report(run_dir, out_root=tmp / "adjusted", notebooks=["02_metrics"],
                        parameters={"domain_adjustment": 0.1, "rules_path": None, "k": 5})
    page_colours = styled_colours(adj.pages["02_metrics"].read_text(encoding="utf-8"))
    default_colours = styled_colours(rep.pages["02_metrics"].read_text(encoding="utf-8"))
    for cell in moved:
        assert page_colours[cell] == tables.TIER_COLOURS[after.loc[cell]] != default_colours[cell], cell
    assert dict(((m, t) for m, _, t in adj.headline["metrics"])) == after.loc[adj.headline["stage"]].to_dict()


def test_style_tiers_recomputes_tiers_for_an_explicit_adjustment():
    table = pd.DataFrame({"stage": ["final"], "metric": ["recall@10"], "mean": [0.85], "ci_low": [0.8],
                          "ci_high": [0.9], "tier": ["good"]})
    assert styled_colours(tables.style_tiers(table).to_html())[("final", "recall@10")] == tables.TIER_COLOURS["good"]
    html = tables.style_tiers(table, domain_adjustment=0.1).to_html()  # 0.85 >= 0.9 x 0.9: excellent
    assert styled_colours(html)[("final", "recall@10")] == tables.TIER_COLOURS["excellent"]


@pytest.mark.slow
def test_headline_follows_the_stage_parameter(reports):
    tmp, _, _ = reports
    h = headline(tmp / "runs" / "rerank", [tmp / "runs" / "baseline"], stage="vector", metrics=["ndcg@5"])
    assert h["stage"] == "vector" and [m for m, _, _ in h["metrics"]] == ["ndcg@5"]
    assert h["vs"]["metric"] == "ndcg@5" and h["vs"]["baseline"] == "baseline"


def test_recall_funnel_follows_the_pipeline_with_custom_stages():
    table = pd.DataFrame({"stage": ["final-b", "hybrid-100", "vector", "extra"], "metric": "recall@10",
                          "mean": [0.5, 0.6, 0.4, 0.3], "ci_low": 0.2, "ci_high": 0.7})
    definitions = {"hybrid-100": {"endpoint": "hybrid-search", "params": {}},
                   "final-b": {"endpoint": "knowledge-search", "params": {}}}
    fig = figures.recall_funnel(table, definitions=definitions)
    top_down = [t.get_text() for t in fig.axes[0].get_yticklabels()][::-1]
    assert top_down == ["vector", "hybrid-100", "final-b", "extra"]


@pytest.mark.slow
def test_open_run_resolves_the_focus_stage_and_scores_with_the_adjustment(reports):
    tmp, _, _ = reports
    run, stage = wn.open_run(tmp / "runs" / "rerank", domain_adjustment=0.05, needs=["recall@20"])
    assert stage == "final" and run.scores.domain_adjustment == 0.05
    assert "recall@20" in run.scores.metric_names and "ndcg@5" in run.scores.metric_names
    assert wn.open_run(tmp / "runs" / "rerank", stage="vector", metrics=["hit@5"])[1] == "vector"


@pytest.mark.slow
def test_the_degraded_report_says_what_ran_and_counts_unexplained_queries(reports):
    tmp, rep, _ = reports
    page = rep.pages["04_degraded"].read_text(encoding="utf-8")
    assert "tenant retrieval config" in page and "agent configuration (builtin-quick-answer)" in page  # C103
    assert re.search(r"<th>unexplained</th>", page)  # the summary's row, shown even when 0
    # the rerank version registers a rerank model: its final lists carry model scores, and the table says it ran
    final = load_run(tmp / "runs" / "rerank").results.query("stage == 'final'")
    assert final["model_score"].notna().any() and "lists carry model_score" in page


@pytest.mark.slow
@pytest.mark.contract("C66")
def test_the_settings_note_shows_only_when_final_and_citations_ran_different_settings(reports):
    from types import SimpleNamespace

    def stub(final: str | None, citations: str | None, stages=("hybrid", "final", "citations")):
        defs = {"final": {"endpoint": "knowledge-search"}, "citations": {"endpoint": "chat"}}
        for name, source in (("final", final), ("citations", citations)):
            if source:
                defs[name]["settings_source"] = source
        return SimpleNamespace(stages=list(stages), stage_definitions=defs)
    note = wn.settings_note(stub("tenant retrieval config", "server conversation config"))
    assert note is not None and "citations ran different settings from final" in note.data
    assert wn.settings_note(stub(None, None)) is None  # an older manifest records no settings source
    assert wn.settings_note(stub("request", "request")) is None
    assert wn.settings_note(stub("a", "b", stages=("final",))) is None
    # the rendered metric report carries the note exactly when the run's manifest calls for it
    tmp, rep, _ = reports
    page = rep.pages["02_metrics"].read_text(encoding="utf-8")
    expected = wn.settings_note(load_run(tmp / "runs" / "rerank")) is not None
    assert page.count("ran different settings") == (1 if expected else 0)   # said once, under the metric table


@pytest.mark.slow
def test_rendering_prints_no_error_line(reports):
    assert not [line for line in reports[2] if "ERROR" in line]


SLOW_KERNEL_INFO = """import inspect, time
kernel = get_ipython().kernel
reply = kernel.shell_handlers["kernel_info_request"]
async def slow_kernel_info(*args):
    result = reply(*args)
    if inspect.isawaitable(result):
        await result
    time.sleep(0.5)  # papermill has its reply and shuts the kernel down while this handler still runs
kernel.shell_handlers["kernel_info_request"] = slow_kernel_info
kernel.log.error("a real kernel error")"""


def test_the_kernel_is_not_interrupted_at_shutdown_and_real_errors_still_show(tmp_path, capfd):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SLOW_KERNEL_INFO)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    kernel.execute(nb, tmp_path / "out.ipynb", {}, kernel_name="python3", cwd=tmp_path)
    err = capfd.readouterr().err
    assert "ERROR | a real kernel error" in err  # the kernel's log is not silenced
    assert "KeyboardInterrupt" not in err


@pytest.mark.slow
@pytest.mark.browser
def test_the_pages_of_a_report_read_as_reports_in_a_browser(reports):
    """The report of the fixture (every notebook, the run's index, the top index) in headless Chromium at 1280 px:
    navigation header, title and H1 naming the run, at most 12,000 px tall, no cell reading None/NaN/<NA>/\\n, no
    code shown (tests/report_pages.py)."""
    from .report_pages import problems

    wrong, heights = problems(reports[0] / "reports")
    assert not wrong, wrong
    assert set(heights) >= {f"rerank/{nb}.html" for nb in NOTEBOOKS}


@pytest.mark.slow
@pytest.mark.browser
def test_every_page_of_the_demo_reads_as_a_report_in_a_browser(demo_from_wheel):
    """Every page of the demo's reports (every version's notebooks and index, the overview), as above."""
    from .report_pages import problems

    assert demo_from_wheel.demo.returncode == 0
    wrong, heights = problems(demo_from_wheel.out / "reports")
    assert not wrong, wrong
    assert "rerank/04_degraded.html" in heights and "index.html" in heights


@pytest.mark.slow
def test_the_demo_end_to_end(demo_from_wheel):
    """``weknora-nb demo`` (run by the wheel built from these sources, in an empty folder: the session's
    fixture, see tests/conftest.py for its options) writes every version's report and the overview."""
    proc, out = demo_from_wheel.demo, demo_from_wheel.out
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if "ERROR" in line], proc.stderr[-3000:]
    index = out / "reports" / "index.html"
    assert str(index) in proc.stdout
    text = index.read_text(encoding="utf-8")
    for v in ("baseline", "rerank", "hnsw-m4"):
        assert f'href="{v}/index.html"' in text
        assert (out / "reports" / v / "05_compare.html").exists()
    # the top index: a table of runs by test set, the comparison in words
    assert re.search(r"rerank</a></td>.*NDCG@5 vs baseline: \+0\.\d+ \[\+0\.\d+, \+0\.\d+\], significant", text)
    assert text.count("<h2>Test set ") == 4   # the demo's, the faq's, the parent-child's and the cold-start set
    # the pools of baseline and rerank graded by the sandbox's rule-based grader; the pages say what graded them
    grades = json.loads((out / "runs" / "relevance-grades.json").read_text(encoding="utf-8"))
    assert grades["served_models"] == ["sandbox-rule-grader"] and grades["rule_based"]
    assert grades["status"] == "complete"
    page = (out / "reports" / "rerank" / "05_compare.html").read_text(encoding="utf-8")
    assert "The delta corrected by a human sample" in page
    assert "grades: LLM (sandbox-rule-grader, a rule-based grader, not a language model" in page
    # the cold-start set: generated from the baseline's chunks by the rule-based generator, measured beside the
    # labelled queries, its figures and overlap by source on its 03 page (docs/method.md section 17)
    note = json.loads((out / "generated" / "testset.jsonl.summary.json").read_text(encoding="utf-8"))
    assert note["reached"] and note["kept"] == DEMO_LIMIT and not note["quota"]["documents_over_quota"]
    assert 'href="coldstart/index.html"' in text
    page = (out / "reports" / "coldstart" / "03_stratify.html").read_text(encoding="utf-8")
    for said in ("By source", "not a language model", "Keyword minus vector", "synthetic"):
        assert said in page
    # the parent-child version: its final stage scored as the user sees it, beside its results' own ids (02), and
    # the queries degraded under one scoring only (04)
    assert 'href="parent-child/index.html"' in text
    page = (out / "reports" / "parent-child" / "02_metrics.html").read_text(encoding="utf-8")
    assert re.search(r"\d+ of \d+ results of stage final show chunks besides their own id", page)
    assert "own ids only" in page and "recall@50" in page
    page = (out / "reports" / "parent-child" / "04_degraded.html").read_text(encoding="utf-8")
    assert re.search(r"At stage final, \d+ queries change sides|No result of stage final shows", page)
    page = (out / "reports" / "baseline" / "02_metrics.html").read_text(encoding="utf-8")
    assert "No result of this run shows chunks besides its own id" in page or "results of stage" in page
    # the version whose HNSW graph is built sparse (m 4) is seen missing through its index at a low ef_search
    # (0.85 at ef_search 10 on these queries; 0.995 when the trace's searches ran on generic plans, exact ones)
    sweep = json.loads((out / "runs" / "hnsw-m4" / "vector_trace.json").read_text(encoding="utf-8"))["sweep"]
    recall_at_10 = {row["ef_search"]: row["recall"]["10"] for row in sweep}
    assert recall_at_10[10] < 0.95 and recall_at_10[400] > recall_at_10[10]
