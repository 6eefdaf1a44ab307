"""Reports rendered in parallel and the render cache (issue 17).

Notebooks really run (papermill, kept kernels); the run folders are crafted as in
tests/test_reports_hardening.py. What is compared is what a reader gets: the executed notebooks'
outputs and the HTML pages, the random ids every rendering gives aside.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from weknora_nb import cli
from weknora_nb.core import run as core_run
from weknora_nb.core.errors import ReportError
from weknora_nb.core.results import read_results, write_results
from weknora_nb.reports import cache as rc
from weknora_nb.reports import render as render_module
from weknora_nb.reports.render import (
    CACHE_FOLDER,
    ReportRequest,
    _Page,
    _render_page,
    default_jobs,
    render_report,
    render_reports,
)

from .test_reports_hardening import craft_run, craft_testset

NOTEBOOKS = ("01_collect", "02_metrics", "03_stratify", "04_degraded", "05_compare")  # 06: these runs hold no answers
CACHED = ("02_metrics", "03_stratify")  # the notebooks that keep more than the run in the cache


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    """A baseline ``a`` and a version ``b`` of it (another seed: other queries degraded)."""
    ts = craft_testset(tmp_path)
    runs = tmp_path / "runs"
    return (craft_run(runs, "a", ts, stages=["vector", "final"], seed=0),
            craft_run(runs, "b", ts, stages=["vector", "final"], seed=1))


def requests(a: Path, b: Path, out: Path, notebooks: tuple[str, ...] = NOTEBOOKS,
             a_notebooks: tuple[str, ...] | None = None) -> list[ReportRequest]:
    """``a``'s report alone (its ``a_notebooks``, default ``notebooks``) and ``b``'s against ``a``."""
    return [ReportRequest(a, (), out, notebooks=notebooks if a_notebooks is None else a_notebooks),
            ReportRequest(b, (a,), out, notebooks=notebooks)]


#: what differs between any two renderings, parallel or not: the id papermill gives the injected-parameters cell
#: (every cell id is left out), the one pandas gives each styled table (random each time) and the addresses in reprs
RANDOM_IDS = re.compile(r'(?<=id=")cell-id=[0-9a-f-]+(?=")'
                        r'|(?<=T_)[0-9a-f]{5}(?=[_"\\\s])|(?<= at 0x)[0-9a-f]+')


def html(page: Path) -> str:
    """A page as a reader sees it, the random ids aside."""
    return RANDOM_IDS.sub("", page.read_text(encoding="utf-8"))


def outputs(executed: Path) -> list:
    """The cells of an executed notebook as a reader sees them (source, execution count and outputs), the
    random ids aside."""
    nb = nbformat.read(executed, as_version=4)
    return [(c.cell_type, c.source, c.get("execution_count"), RANDOM_IDS.sub("", json.dumps(c.get("outputs"))))
            for c in nb.cells]


# ---------------------------------------------------------------------------------------
# parallel = sequential
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_reports_rendered_in_parallel_equal_those_rendered_one_notebook_after_another(two_runs, tmp_path):
    """Two reports sharing the kernels (the baseline's two pages, then the version's five), rendered by one
    kernel one notebook after another and by three at once: the same notebooks, pages and index pages."""
    a, b = two_runs
    pages = (NOTEBOOKS[:2], NOTEBOOKS)
    seq = render_reports(requests(a, b, tmp_path / "seq", a_notebooks=pages[0]), jobs=1)
    par = render_reports(requests(a, b, tmp_path / "par", a_notebooks=pages[0]), jobs=3)
    for s, p, notebooks in zip(seq, par, pages, strict=True):
        assert list(s.pages) == list(p.pages) == list(notebooks)  # the order of the pages
        for nb in notebooks:
            assert outputs(s.folder / f"{nb}.ipynb") == outputs(p.folder / f"{nb}.ipynb"), nb
            assert html(s.pages[nb]) == html(p.pages[nb]), nb
        assert s.index.read_bytes() == p.index.read_bytes()
        assert s.headline == p.headline and "vs" in par[1].headline
    first = nbformat.read(par[1].folder / "05_compare.ipynb", as_version=4)
    assert [c.execution_count for c in first.cells if c.cell_type == "code"][:2] == [1, 2]  # numbered from 1


def test_the_default_number_of_jobs_is_one_per_core_and_never_more_than_the_pages():
    assert default_jobs(1) == 1
    assert 1 <= default_jobs(100) <= (os.cpu_count() or 1)
    assert default_jobs(2) <= 2


# ---------------------------------------------------------------------------------------
# each notebook in a kernel of its own
# ---------------------------------------------------------------------------------------
LEAKS = textwrap.dedent("""\
    import os, sys
    import matplotlib
    x = 1
    matplotlib.rcParams["font.size"] = 31
    os.environ["WEKNORA_NB_LEAK"] = "1"
    sys.path.insert(0, "/nowhere")
    os.chdir("/")
    print(os.environ.get("WEKNORA_NB_CACHE"))
""")
LOOKS = textwrap.dedent("""\
    import os, sys, tempfile
    import matplotlib
    print("x" in globals(), matplotlib.rcParams["font.size"], os.environ.get("WEKNORA_NB_LEAK"),
          os.getcwd(), "/nowhere" in sys.path, os.environ.get("WEKNORA_NB_CACHE"))
""")


def page(tmp_path: Path, name: str, code: str, cache: Path | None = None) -> _Page:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell("1 + 1")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return _Page(name, nb, {}, tmp_path / f"{name}.ipynb", tmp_path / f"{name}.html", tmp_path, False, cache, 1.0)


@pytest.mark.slow
def test_each_notebook_runs_in_a_new_kernel_and_leaves_no_private_folder(tmp_path, monkeypatch):
    """A page that changes its kernel (names, matplotlib's settings, the environment, the module path, the working
    folder) leaves nothing to the next page of the same thread; each kernel finds the render cache in its
    environment, and its private socket folder is gone once its page is written."""
    monkeypatch.delenv("WEKNORA_NB_CACHE", raising=False)
    cache = tmp_path / "cache"
    managers: list = []
    _render_page(page(tmp_path, "leaks", LEAKS), "python3", managers.append)
    _render_page(page(tmp_path, "after", LOOKS, cache), "python3", managers.append)
    shown = "".join(o.get("text", "") for o in nbformat.read(tmp_path / "after.ipynb", as_version=4).cells[0].outputs)
    assert shown == f"False 10.0 None {tmp_path} False {cache}\n"
    leaks = nbformat.read(tmp_path / "leaks.ipynb", as_version=4).cells[0].outputs
    assert "".join(o.get("text", "") for o in leaks) == "None\n"   # no cache given: none in the kernel
    assert [c.execution_count for c in nbformat.read(tmp_path / "after.ipynb", as_version=4).cells] == [1, 2]
    folders = [Path(km.connection_file).parent for km in managers]
    assert len(set(folders)) == 2 and all(f.name.startswith("weknora-nb-kernel-") and not f.exists() for f in folders)


# ---------------------------------------------------------------------------------------
# failures
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_failing_notebook_in_a_parallel_render_raises_the_report_error_of_the_first_failed_page(two_runs, tmp_path):
    a, b = two_runs
    reqs = [ReportRequest(run, base, tmp_path / "r", notebooks=NOTEBOOKS,
                          parameters={"rules_path": str(tmp_path / f"no-{run.name}.yaml")})
            for run, base in ((a, ()), (b, (a,)))]
    with pytest.raises(ReportError) as err:
        render_reports(reqs, jobs=2)
    e = err.value
    assert e.notebook == "03_stratify" and "no-a.yaml" in str(e)  # the first request's page, whichever failed first
    assert "stratify(" in e.source and f"cell {e.cell}" in str(e)
    assert e.partial_html == tmp_path / "r" / "a" / "03_stratify.html"
    assert "no-a.yaml" in e.partial_html.read_text(encoding="utf-8")
    assert not (tmp_path / "r" / "a" / "index.html").exists()  # no index for a report that failed


@pytest.mark.slow
def test_after_a_failure_the_next_render_in_the_same_process_succeeds(two_runs, tmp_path):
    a, _ = two_runs
    with pytest.raises(ReportError):
        render_report(a, out_root=tmp_path / "r", notebooks=["03_stratify"], jobs=2,
                      parameters={"stage": "no-such-stage"})
    rep = render_report(a, out_root=tmp_path / "r", notebooks=["01_collect", "03_stratify"], jobs=2)
    assert set(rep.pages) == {"01_collect", "03_stratify"}


# ---------------------------------------------------------------------------------------
# the render cache
# ---------------------------------------------------------------------------------------
@pytest.fixture
def counted(monkeypatch) -> list[str]:
    """The run folders :func:`weknora_nb.core.run.load_run` really loaded (not from the cache), in order."""
    loads: list[str] = []
    real = rc.load_run

    def load(path, **kw):
        loads.append(Path(path).name)
        return real(path, **kw)
    monkeypatch.setattr(rc, "load_run", load)
    return loads


def entries(folder: Path, kind: str = "run") -> list[str]:
    return sorted(p.name for p in folder.glob(f"{kind}-*.pickle.z"))


def test_a_run_is_loaded_once_and_loaded_again_when_its_files_change(two_runs, tmp_path, counted):
    a, _ = two_runs
    cache = tmp_path / "cache"
    first = rc.cached_run(a, folder=cache)
    again = rc.cached_run(a, folder=cache)
    assert counted == ["a"]  # the second from the cache
    pd.testing.assert_frame_equal(first.scores.summary, again.scores.summary)
    assert again is not first  # each caller its own copy
    assert rc.cached_run(a, metrics=None, folder=cache) is not None and counted == ["a"]
    rc.cached_run(a, metrics=["ndcg@5"], folder=cache)  # other metrics: another entry
    assert counted == ["a", "a"] and len(entries(cache)) == 2
    old = entries(cache)

    results = read_results(a / "results.parquet")
    write_results(results[results["rank"] != 1], a / "results.parquet")  # the run changed
    changed = rc.cached_run(a, folder=cache)
    assert counted == ["a", "a", "a"]
    assert not changed.scores.summary.equals(first.scores.summary)
    assert len(entries(cache)) == 2 and entries(cache) != old  # the entry replaced, not added

    m = json.loads((a / "manifest.json").read_text(encoding="utf-8"))
    (a / "manifest.json").write_text(json.dumps({**m, "notes": ["re-labelled"]}), encoding="utf-8")
    assert rc.cached_run(a, folder=cache).manifest["notes"] == ["re-labelled"]
    assert counted == ["a", "a", "a", "a"]


def test_a_changed_test_set_is_a_changed_run(two_runs, tmp_path, counted):
    a, _ = two_runs
    cache = tmp_path / "cache"
    rc.cached_run(a, folder=cache)
    ts = tmp_path / "testset.jsonl"
    ts.write_text(ts.read_text(encoding="utf-8").replace('"d0": 1', '"d0": 2'), encoding="utf-8")
    with pytest.raises(Exception, match="not the one this run was collected with"):  # as load_run says
        rc.cached_run(a, folder=cache)
    assert counted == ["a", "a"]


def test_a_damaged_entry_or_one_others_may_write_is_not_used(two_runs, tmp_path, counted, caplog):
    a, _ = two_runs
    cache = tmp_path / "cache"
    rc.cached_run(a, folder=cache)
    (entry,) = [cache / n for n in entries(cache)]
    whole = entry.read_bytes()
    entry.write_bytes(b"not a pickle")
    assert rc.cached_run(a, folder=cache).name == "a" and counted == ["a", "a"]  # computed again, rewritten
    rc.cached_run(a, folder=cache)
    assert counted == ["a", "a"]
    entry.write_bytes(whole[:len(whole) // 2])   # cut short, as by a full disk
    assert rc.cached_run(a, folder=cache).name == "a" and counted == ["a", "a", "a"]
    rc.cached_run(a, folder=cache)               # written whole again: read from the cache
    assert counted == ["a", "a", "a"]
    entry.chmod(0o666)
    rc.cached_run(a, folder=cache)
    assert counted == ["a", "a", "a", "a"]

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="weknora_nb.reports.notebook"):
        rc.cached_run(a, folder=shared)
        rc.cached_run(a, folder=shared)
    assert counted[4:] == ["a", "a"] and not list(shared.iterdir())
    assert "others can write to it" in caplog.text


def test_answer_values_are_computed_once_per_rendering_and_again_when_the_answers_change(tmp_path, monkeypatch):
    from weknora_nb.analysis import answers

    a = craft_run(tmp_path / "runs", "a", craft_testset(tmp_path), stages=["final", "citations"])
    cited = {i: f"c{i}" if i % 2 else "x" for i in range(10)}
    (a / "answers.jsonl").write_text("".join(json.dumps(
        {"query_id": f"q{i}", "stage": "citations", "repeat": rep, "answer": "答", "citations": [c]},
        ensure_ascii=False) + "\n" for i, c in cited.items() for rep in (1, 2)), encoding="utf-8")
    cache = tmp_path / "cache"
    computed: list[str] = []
    real = answers._answer_values
    monkeypatch.setattr(answers, "_answer_values", lambda run, stage: computed.append(run.name) or real(run, stage))
    monkeypatch.setattr(answers, "values_cache",
                        lambda run, stage, compute: rc.cached_answer_values(run, stage, compute, folder=cache))

    first = answers.answer_values(rc.cached_run(a, folder=cache))
    again = answers.answer_values(rc.cached_run(a, folder=cache))   # another run object: from the render cache
    assert computed == ["a"] and len(entries(cache, "answers")) == 1
    pd.testing.assert_frame_equal(first, again)
    assert first.loc["q1", "citation_precision"] == 1.0 and first.loc["q0", "citation_precision"] == 0.0

    (a / "answers.jsonl").write_text((a / "answers.jsonl").read_text(encoding="utf-8").replace('["x"]', '["c0"]'),
                                     encoding="utf-8")   # the answers changed
    changed = answers.answer_values(rc.cached_run(a, folder=cache))
    assert computed == ["a", "a"] and changed.loc["q0", "citation_precision"] == 1.0
    assert len(entries(cache, "answers")) == 1   # the older entry replaced
    answers.answer_values(core_run.load_run(a, cache=False))   # a run not from the cache: computed, not kept
    assert computed == ["a", "a", "a"]


COMPUTE_ONCE = """
import sys, time
from pathlib import Path
from weknora_nb.reports.notebook import cached
folder, log = Path(sys.argv[1]), Path(sys.argv[2])
def compute():
    with log.open("a") as f:
        f.write("computed\\n")
    time.sleep(2.0)
    return {"answer": 42}
print(cached("slow", ("slot", "content"), compute, folder=folder)["answer"])
"""


@pytest.mark.slow
def test_processes_needing_one_value_at_once_compute_it_once(tmp_path):
    script = tmp_path / "once.py"
    script.write_text(COMPUTE_ONCE, encoding="utf-8")
    log = tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), str(log)],
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    assert [p.communicate(timeout=60)[0].strip() for p in procs] == ["42"] * 3
    assert log.read_text(encoding="utf-8") == "computed\n"


def test_the_runs_a_comparison_loads_in_a_rendering_kernel_come_from_the_cache(two_runs, tmp_path, counted,
                                                                               monkeypatch):
    from weknora_nb.analysis.compare import compare_runs

    a, b = two_runs
    monkeypatch.setenv(rc.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(core_run, "run_cache", rc.cached_run)  # as use_in_this_kernel sets it
    first = compare_runs([a, b])
    second = compare_runs([a, b])
    assert counted == ["a", "b"]
    pd.testing.assert_frame_equal(first.metrics, second.metrics)


@pytest.mark.slow
def test_a_second_rendering_reuses_the_cache_and_a_changed_run_is_rendered_anew(two_runs, tmp_path, counted):
    a, b = two_runs
    out = tmp_path / "reports"
    render_reports(requests(a, b, out, CACHED), jobs=2)
    cache = out / CACHE_FOLDER
    stored = {p.name: p.stat().st_mtime_ns for p in cache.glob("*.pickle.z")}
    assert {n.split("-")[0] for n in stored} >= {"run", "stratify", "coverage"}
    assert len(counted) == len(set(counted))  # the headline figures loaded a run at most once (or found it)
    loaded = len(counted)

    render_reports(requests(a, b, out, CACHED), jobs=2)
    assert {p.name: p.stat().st_mtime_ns for p in cache.glob("*.pickle.z")} == stored  # nothing computed again
    assert len(counted) == loaded

    page = (out / "b" / "02_metrics.html").read_text(encoding="utf-8")
    results = read_results(b / "results.parquet")
    write_results(results[results["rank"] != 1], b / "results.parquet")
    render_reports(requests(a, b, out, CACHED)[1:], jobs=2)   # b's report again (a's would come from the cache)
    assert (out / "b" / "02_metrics.html").read_text(encoding="utf-8") != page
    assert {p.name for p in cache.glob("run-*.pickle.z")} != {n for n in stored if n.startswith("run-")}


@pytest.mark.slow
def test_rendering_without_the_cache_writes_none(two_runs, tmp_path):
    a, _ = two_runs
    render_report(a, out_root=tmp_path / "reports", notebooks=["01_collect"], cache=False)
    assert not (tmp_path / "reports" / CACHE_FOLDER).exists()


# ---------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------
def test_report_refuses_no_jobs(two_runs, capsys):
    a, _ = two_runs
    assert cli.main(["report", "--run", str(a), "--jobs", "0"]) == 2
    assert "argument --jobs: must be an integer >= 1" in capsys.readouterr().err


def test_report_refuses_unknown_notebooks_and_those_the_run_has_no_data_for(two_runs, capsys):
    a, _ = two_runs
    for given in ("bogus,02_metrics", ",", "../../evil"):
        assert cli.main(["report", "--run", str(a), "--notebooks", given]) == 2
        err = capsys.readouterr().err
        assert ("argument --notebooks: each name must be one of " + ", ".join(render_module.NOTEBOOKS)) in err, err
        assert f"Got {given!r} instead." in err and err.count("\n") == 1
    assert cli.main(["report", "--run", str(a), "--notebooks", "02_metrics,06_answers"]) == 2
    err = capsys.readouterr().err
    assert f"--notebooks: 06_answers needs answers.jsonl in {a}" in err and err.count("\n") == 1


@pytest.mark.slow
def test_report_renders_with_the_jobs_given(two_runs, tmp_path):
    a, _ = two_runs
    assert cli.main(["report", "--run", str(a), "--out", str(tmp_path / "r"), "--jobs", "2"]) == 0
    assert (tmp_path / "r" / "a" / "05_compare.html").is_file()
