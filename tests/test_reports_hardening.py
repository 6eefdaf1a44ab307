"""Reports that data cannot inject into, redirect or crash: names and texts holding markup or
``$``, runs whose every request failed, run names that point elsewhere, reports rendered at once.

The run folders are crafted (a test set, ``results.parquet`` written with ``write_results``,
``chunks.parquet``, ``manifest.json``); the notebooks really run (papermill) and the pages
are parsed as HTML.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import stat
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from weknora_nb.core.errors import RunFolderError, UsageError
from weknora_nb.core.results import write_results
from weknora_nb.core.run import load_run
from weknora_nb.core.testset import TestSet
from weknora_nb.reports import figures, kernel, safe, tables
from weknora_nb.reports import notebook as wn
from weknora_nb.reports.index_page import write_index, write_overview
from weknora_nb.reports.render import Report, notebooks_for, render_report

from .conftest import failed, ranked, results_frame

IMG = "<img src=x onerror=alert(1)>"
SCRIPT = "<script>alert(2)</script>"
N = 12


# ---------------------------------------------------------------------------------------
# crafted run folders
# ---------------------------------------------------------------------------------------
def craft_testset(root: Path, *, text: str = "plain", tag: str = "plain", query_type: str = "factual") -> Path:
    """``N`` queries; odd ones carry ``text`` in their query and answer, ``tag`` and ``query_type``."""
    recs = [{"query_id": f"q{i}", "query": f"{text} query {i}" if i % 2 else f"query {i}",
             "relevant": {f"c{i}": 3, f"d{i}": 1}, "query_type": query_type if i % 2 else "factual",
             "tags": [tag] if i % 2 else ["plain"], "answer": f"answer {text}"} for i in range(N)]
    path = root / "testset.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    TestSet.from_records(recs).to_jsonl(path)
    return path


def craft_run(runs: Path, folder: str, testset: Path, *, stages: list[str], run_name: str | None = None,
              failing: tuple[str, ...] = (), content: str = "chunk text", seed: int = 0) -> Path:
    """A run folder of ``stages`` x ``N`` queries x 2 repeats: every third query misses its grade-3 chunk
    (degraded); the requests of ``failing`` stages all fail (``server`` for even, ``timeout`` for odd
    queries); every chunk's text is ``content``."""
    ts = TestSet.from_records([json.loads(x) for x in testset.read_text(encoding="utf-8").splitlines()])
    rows: list[tuple] = []
    for st in stages:
        for i in range(N):
            for rep in (1, 2):
                if st in failing:
                    rows += failed(f"q{i}", "timeout" if i % 2 else "server", stage=st, repeat=rep)
                else:
                    hit = (i + seed) % 3
                    rows += ranked(f"q{i}", [f"c{i}", "x"] if hit else ["x", "y", f"d{i}"], stage=st, repeat=rep)
    df = results_frame(rows)
    df["latency_ms"] = 40.0 + (df.index % 7) * 10
    d = runs / folder
    d.mkdir(parents=True)
    write_results(df, d / "results.parquet")
    ids = [f"c{i}" for i in range(N)] + [f"d{i}" for i in range(N)] + ["x", "y"]
    pd.DataFrame({"chunk_id": ids, "knowledge_id": "k1", "chunk_index": range(len(ids)), "is_enabled": True,
                  "content": f"{content} {SCRIPT}"}).to_parquet(d / "chunks.parquet")
    (d / "manifest.json").write_text(json.dumps({
        "run_name": run_name or folder, "started_at": f"2026-11-0{seed + 1}T00:00:00+00:00",
        "testset": {"path": str(testset), "hash": ts.hash}, "system": {"seed": seed},
        "stages": {st: {"endpoint": "knowledge-search"} for st in stages}}), encoding="utf-8")
    return d


# ---------------------------------------------------------------------------------------
# reading pages as HTML
# ---------------------------------------------------------------------------------------
class Page(HTMLParser):
    """A page parsed: markup that came from the data (``injected``) and the text it shows."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.injected: list[str] = []
        self.text: list[str] = []
        self._script = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if any(k.startswith("on") for k in a) or (tag == "img" and a.get("src") == "x"):
            self.injected.append(f"<{tag} {attrs}>")
        if any((v or "").strip().lower().startswith("javascript:") for v in a.values()):
            self.injected.append(f"<{tag} {attrs}>")
        self._script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._script = False

    def handle_data(self, data: str) -> None:
        if self._script and "alert(" in data:
            self.injected.append(f"<script>{data[:80]}")
        self.text.append(data)

    @property
    def shown(self) -> str:
        return "".join(self.text)


def parsed(path: Path) -> Page:
    return Page(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------
# 1, 6. markup in names and texts is text
# ---------------------------------------------------------------------------------------
def test_every_table_and_note_shows_markup_in_labels_as_text():
    table = pd.DataFrame({"stage": [IMG, "final"], "metric": "recall@10", "mean": [0.5, 0.9], "ci_low": 0.4,
                          "ci_high": [0.6, 0.95], "tier": ["fail", "excellent"]})
    styled = tables.style_tiers(table).to_html()
    frame = safe.table(pd.DataFrame({IMG: [SCRIPT]}, index=pd.Index([IMG], name=SCRIPT)), index=True)
    notes = [safe.text(f"{IMG} vs {SCRIPT}:\n- {IMG}"), safe.bullets([IMG, SCRIPT]), safe.esc(IMG)]
    for page in (styled, frame, *notes):
        p = Page(page)
        assert not p.injected, page
        assert IMG in p.shown or SCRIPT in p.shown, page  # the payload is there, as text
    assert IMG in Page(styled).shown  # the row label


def test_links_of_the_index_pages_are_relative_paths_whatever_the_run_is_called(tmp_path):
    name = "javascript:alert(1)"
    rep = Report(name, tmp_path / name, tmp_path / name / "index.html", headline={
        "stage": IMG, "metrics": [("ndcg@5", 0.5, "fail")], "counts": {}, "warnings": [SCRIPT], "failed": [IMG],
        "vs": {"metric": "ndcg@5", "baseline": IMG, "delta": 0.1, "ci": (0.0, 0.2), "p_holm": 0.01}})
    rep.folder.mkdir()
    rep.pages["02_metrics"] = rep.folder / "02_metrics.html"
    write_index(rep)
    overview = write_overview([rep], tmp_path / "index.html")
    for page in (rep.index, overview):
        p = parsed(page)
        assert not p.injected
        assert name in p.shown
    assert 'href="javascript%3Aalert%281%29/index.html"' in overview.read_text(encoding="utf-8")
    with pytest.raises(UsageError):
        safe.href("/etc/passwd")


@pytest.mark.slow
def test_markup_in_stage_tag_type_query_and_chunk_text_reaches_the_reports_only_as_text(tmp_path):
    """Stage names, tags, query types, query and chunk text hold markup; run names (which cannot hold
    ``<`` or ``>``) hold character references, which must show as written."""
    ts = craft_testset(tmp_path, text=f"{IMG} {SCRIPT}", tag=IMG, query_type=IMG)
    base_name, evil_name = "base &amp; 'y'", "evil &lt;b&gt; 'x'"
    base = craft_run(tmp_path / "runs", "base", ts, stages=[IMG, "final"], run_name=base_name, content=IMG, seed=1)
    evil = craft_run(tmp_path / "runs", "evil", ts, stages=[IMG, "final"], run_name=evil_name, content=IMG)
    rep = render_report(evil, [base], out_root=tmp_path / "reports", notebooks=["02_metrics", "04_degraded",
                                                                                "05_compare"])
    assert rep.folder == (tmp_path / "reports" / evil_name).resolve()
    for page in [*rep.pages.values(), rep.index]:
        p = parsed(page)
        assert not p.injected, (page.name, p.injected)
        assert IMG in p.shown or page == rep.index, page.name  # the index shows no stage label but its focus
        assert evil_name in p.shown, page.name
    assert SCRIPT in parsed(rep.pages["04_degraded"]).shown  # the chunk text and the query, drilled into
    assert base_name in parsed(rep.pages["05_compare"]).shown and base_name in parsed(rep.index).shown


# ---------------------------------------------------------------------------------------
# 2. names holding $ are shown as they are
# ---------------------------------------------------------------------------------------
MATH = ["$x^$", "a$b$c", "$\\frac{"]


def test_figures_show_names_holding_dollar_signs_literally():
    table = pd.DataFrame({"stage": MATH, "metric": "recall@10", "mean": [0.5, 0.6, 0.7], "ci_low": 0.4,
                          "ci_high": 0.8, "tier": "pass"})
    strata = pd.DataFrame({"label": MATH, "metric": "ndcg@5", "mean": [0.5, 0.6, 0.7]})
    made = [figures.metric_bars(table), figures.recall_funnel(table),
            figures.heatmap(strata, title=MATH[2]), figures.latency_cdf({m: [10.0, 20.0] for m in MATH}),
            figures.cause_bars(pd.DataFrame({m: [1, 2] for m in MATH}, index=["vector miss", "unexplained"]))]
    for fig in made:
        fig.savefig(io.BytesIO(), format="png")  # drawing parses no math text
    labels = [t.get_text() for t in made[1].axes[0].get_yticklabels()]
    assert sorted(labels) == sorted(MATH)
    assert made[2].axes[0].get_title() == MATH[2]


@pytest.mark.parametrize(("low", "high", "shown"), [(0.5, 2000.0, {"1", "10", "100", "1000"}),
                                                   (12.0, 80.0, {"20", "30", "40", "60"}),
                                                   (3.0, 40000.0, {"10", "100", "1000", "10000"})])
def test_log_axes_are_labelled_in_plain_numbers(low, high, shown):
    """With math text off (names holding $), a log axis keeps readable labels: matplotlib's own are math text."""
    fig = figures.latency_cdf({"v": np.geomspace(low, high, 50)})
    fig.savefig(io.BytesIO(), format="png")  # the labels are set at the draw
    ax = fig.axes[0]
    labels = {t.get_text() for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True)} - {""}
    assert labels >= shown and not any("$" in t or "mathdefault" in t for t in labels), labels


def _stage_table(stages: list[str], metrics: list[str]) -> pd.DataFrame:
    """A metric table as tables.metric_table gives it: every mean near 1 (the tallest bars), its interval."""
    rows = [{"stage": st, "metric": m, "mean": 0.98 - 0.05 * i, "ci_low": 0.9 - 0.05 * i, "ci_high": 1.0,
             "tier": "pass"} for i, st in enumerate(stages) for m in metrics]
    return pd.DataFrame(rows)


def test_the_stage_legend_covers_no_bar_and_the_funnel_values_no_interval():
    stages = ["vector", "keyword", "hybrid", "final", "citations"]
    table = _stage_table(stages, ["recall@5", "recall@10", "hit@5"])
    fig = figures.metric_bars(table)
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert not legend.overlaps(fig.axes[0].get_window_extent())  # beside the axes: no bar under it

    fig = figures.recall_funnel(table)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text()]
    assert len(labels) == len(stages)
    for t in labels:
        assert t.get_position()[0] > 1.0 and ax.get_xlim()[1] > t.get_position()[0]  # right of ci_high, shown


def test_cause_bars_stay_readable_with_every_cause_and_stage():
    causes = [f"cause {i}" for i in range(17)]
    summary = pd.DataFrame({st: range(1, 18) for st in ["vector", "keyword", "hybrid", "final", "citations"]},
                           index=causes)
    fig = figures.cause_bars(summary)
    fig.canvas.draw()
    thickness = [p.get_window_extent().height for p in fig.axes[0].patches]
    assert len(thickness) == 85 and min(thickness) >= 4  # pixels, at the figure's dpi


@pytest.mark.slow
def test_notebooks_render_names_holding_dollar_signs_and_braces(tmp_path):
    ts = craft_testset(tmp_path, text="$\\frac{", tag="$x^$", query_type="a$b$c")
    run_name = "run $x^$ {run_dir}"  # papermill formats output paths: braces are literal here
    run = craft_run(tmp_path / "runs", "m", ts, stages=["$x^$", "a$b$c", "final"], run_name=run_name)
    rep = render_report(run, out_root=tmp_path / "reports", notebooks=["01_collect", "03_stratify", "05_compare"])
    assert rep.folder.name == run_name and (rep.folder / "03_stratify.ipynb").is_file()
    for nb, page in rep.pages.items():
        text = page.read_text(encoding="utf-8")
        assert "Traceback" not in text and 'data-mime-type="application/vnd.jupyter.stderr"' not in text, nb
    assert "$x^$" in parsed(rep.pages["03_stratify"]).shown


# ---------------------------------------------------------------------------------------
# 3. a run whose every request failed
# ---------------------------------------------------------------------------------------
def test_a_stage_whose_every_request_failed_is_named_with_its_kinds(tmp_path):
    ts = craft_testset(tmp_path)
    run = load_run(craft_run(tmp_path / "runs", "half", ts, stages=["vector", "final"], failing=("vector",)))
    assert tables.failed_stages(run.scores) == {"vector": {"server": 12, "timeout": 12}}
    assert tables.all_stages(run) == ["final", "vector"] and tables.report_stage(run, "vector") == "vector"
    note = wn.unless_failed(run, lambda: "figure", stage="vector")
    assert "Every request of stage vector failed (kinds: server 12, timeout 12)" in note.data
    assert wn.unless_failed(run, lambda: "figure", stage="final") == "figure"
    assert wn.unless_failed(run, lambda: "figure") == "figure"
    with pytest.raises(UsageError, match="final, vector"):
        tables.report_stage(run, "hybrid")


@pytest.mark.slow
def test_a_run_whose_every_request_failed_renders_every_notebook_saying_so(tmp_path):
    ts = craft_testset(tmp_path)
    run = craft_run(tmp_path / "runs", "down", ts, stages=["vector", "final"], failing=("vector", "final"))
    rep = render_report(run, out_root=tmp_path / "reports")
    assert set(rep.pages) == set(notebooks_for(run))
    said = "Every request of stage final failed (kinds: server 12, timeout 12)"
    for page in [*rep.pages.values(), rep.index]:
        text = page.read_text(encoding="utf-8")
        assert said in parsed(page).shown, page.name
        assert "Traceback" not in text and 'data-mime-type="application/vnd.jupyter.stderr"' not in text, page.name
    assert rep.headline["stage"] == "final" and rep.headline["metrics"] == []


# ---------------------------------------------------------------------------------------
# 4. data never decides where a report is written
# ---------------------------------------------------------------------------------------
@pytest.fixture
def one_run(tmp_path):
    ts = craft_testset(tmp_path)
    return craft_run(tmp_path / "runs", "r", ts, stages=["final"])


def set_run_name(run: Path, name: str) -> None:
    m = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    m["run_name"] = name
    (run / "manifest.json").write_text(json.dumps(m), encoding="utf-8")


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", ["../outside/x", "{outside}/abs", ".", "..", "a/../../outside/y", "x\0y"])
def test_a_run_name_cannot_put_the_report_outside_the_reports_folder(tmp_path, one_run, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    set_run_name(one_run, name.format(outside=outside))
    before = files_under(tmp_path)
    with pytest.raises(RunFolderError, match="run_name"):
        render_report(one_run, out_root=tmp_path / "reports", notebooks=[])
    assert files_under(tmp_path) == before  # nothing written anywhere
    assert not (tmp_path / "index.html").exists() and not list(outside.iterdir())


def test_a_symlink_in_the_reports_folder_pointing_out_counts_as_outside(tmp_path, one_run):
    outside, reports = tmp_path / "outside", tmp_path / "reports"
    outside.mkdir()
    reports.mkdir()
    (reports / "r").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunFolderError, match="run_name.*'r'"):
        render_report(one_run, out_root=reports, notebooks=[])
    assert not any(outside.iterdir())


def test_only_the_packaged_notebooks_are_rendered(tmp_path, one_run):
    with pytest.raises(UsageError, match="notebooks"):
        render_report(one_run, out_root=tmp_path / "reports", notebooks=["../../evil"])
    assert not (tmp_path / "reports").exists()


# ---------------------------------------------------------------------------------------
# 5. reports rendered at the same time
# ---------------------------------------------------------------------------------------
def test_each_kernel_has_its_sockets_and_connection_file_in_a_private_folder_removed_afterwards(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    managers: list = []
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    done = kernel.execute(nb, out / "run.ipynb", {}, kernel_name="python3", cwd=work, started=managers.append)
    km = managers[0]
    private = Path(km.connection_file).parent
    assert Path(km.ip).is_absolute() and Path(km.ip).parent == private and private.name.startswith("weknora-nb-kernel-")
    assert not private.is_relative_to(tmp_path) and not private.exists()   # removed with the kernel
    assert not asyncio.run(km.is_alive())
    assert done.cells[0].outputs[0].text == "42\n"
    assert not list(work.iterdir())  # nothing in the kernel's working folder


def test_a_private_kernel_folder_is_readable_by_its_owner_only(tmp_path):
    seen: list = []
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}

    def started(km) -> None:
        private = Path(km.connection_file).parent
        seen.append((stat.S_IMODE(private.stat().st_mode), sorted(p.name for p in private.iterdir())))

    kernel.execute(nb, tmp_path / "run.ipynb", {}, kernel_name="python3", cwd=tmp_path, started=started)
    mode, names = seen[0]
    assert mode & 0o777 == 0o700 and "kernel.json" in names   # the sockets (ip-N) are made there as the kernel binds


@pytest.mark.slow
def test_reports_rendered_at_once_on_runs_of_one_folder_all_succeed(tmp_path):
    """Three ``weknora-nb report`` processes at once, two kernels each (two processes collided often, three
    nearly always, before each kernel had a private folder); nothing of the kernels is left in the runs folder.
    Each renders the two notebooks named (``--notebooks``): the pages asked for, no other."""
    ts = craft_testset(tmp_path)
    runs = tmp_path / "runs"
    names = ["a", "b", "c"]
    dirs = [craft_run(runs, name, ts, stages=["vector", "final"], seed=i) for i, name in enumerate(names)]
    before = {p.name for p in runs.iterdir()}
    env = {k: v for k, v in os.environ.items() if k != "WEKNORA_API_KEY"}
    asked = ["03_stratify", "01_collect"]
    procs = [subprocess.Popen([sys.executable, "-m", "weknora_nb", "report", "--run", str(d), "--out",
                               str(tmp_path / "reports"), "--jobs", "2", "--notebooks", ",".join(asked)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for d in dirs]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "index.html" in out
    assert {p.name for p in runs.iterdir()} == before  # no socket, no connection file in the runs folder
    for name in names:
        pages = {p.name for p in (tmp_path / "reports" / name).glob("*.html")}
        assert pages == {"index.html"} | {f"{nb}.html" for nb in asked}
        index = (tmp_path / "reports" / name / "index.html").read_text(encoding="utf-8")
        assert index.index("03_stratify.html") < index.index("01_collect.html")  # in the order asked


def test_a_figure_is_described_by_its_titles_axes_and_series():
    import matplotlib.pyplot as plt

    from weknora_nb.reports.figures import describe

    fig, (a, b) = plt.subplots(1, 2)
    a.plot([0, 1], label="基线 <baseline>")
    a.plot([1, 0], label="rerank")
    a.legend()
    a.set_title("召回 recall@10\n along the pipeline")
    a.set_xlabel("rank")
    b.set_ylabel("queries")
    fig.suptitle("Versions side by side")
    assert describe(fig) == ("Versions side by side | 召回 recall@10 along the pipeline; x: rank; "
                             "series: 基线 <baseline>, rerank | y: queries")
    plt.close(fig)
    empty = plt.figure()
    assert describe(empty) == "a figure"
    plt.close(empty)
