"""A real browser: JupyterLab started here, driven in headless Chromium (Debian's ``chromium``) by Playwright.

The labelling notebook (07_label) is run, grade buttons are clicked and a shortcut key pressed,
and the labels log on disk must hold exactly those grades; then the metrics notebook (02_metrics)
runs with ``interactive=True`` and changing its stage dropdown must change the figure.

Skipped when chromium (or Playwright) is not installed here; ``.ci/run`` installs chromium, so CI
runs it. Playwright uses the system browser: it never downloads one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nbformat
import pytest

from weknora_nb.core.results import write_results
from weknora_nb.core.testset import TestSet
from weknora_nb.reports.render import notebooks_dir

from .conftest import ranked, results_frame

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = shutil.which("chromium")
STARTUP_SECONDS = 60  # a deadline for the server to answer, not an assertion on speed
# JupyterLab settings for the test: every cell rendered (no windowing), the kernel started without asking,
# no news fetched
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none",
                                                                   "autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


@dataclass
class Lab:
    root: Path
    url: str
    token: str
    home: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_parameters(source: Path, dest: Path, **params: object) -> Path:
    """A copy of the notebook ``source`` whose ``parameters`` cell assigns ``params`` (and nothing else)."""
    nb = nbformat.read(source, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nbformat.write(nb, dest)
    return dest


def our_processes(marker: str) -> list[str]:
    """Processes whose command line mentions ``marker`` (the test's runtime folder: the server's kernels)."""
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmd and int(p.name) != os.getpid():
            found.append(f"{p.name}: {cmd}")
    return found


def wait_for_status(base: str, token: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            r = httpx.get(f"{base}/api/status", headers={"Authorization": f"token {token}"}, timeout=2)
            if r.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"JupyterLab did not answer within {STARTUP_SECONDS} s:\n{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server (it shuts its kernels down), then anything left of its process group."""
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: the server stops and shuts its kernels down
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started (kernels that outlived the server)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed here (apt-get install -y chromium; .ci/run installs it)")
    pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (requirements-test.txt)")
    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("jupyter-home")
    runtime = home / "runtime"
    for name, value in SETTINGS.items():
        (home / "settings" / name).parent.mkdir(parents=True, exist_ok=True)
        (home / "settings" / name).write_text(json.dumps(value), encoding="utf-8")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(runtime),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "IPYTHONDIR": str(home / "ipython"), "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    env.pop("WEKNORA_API_KEY", None)
    token, port = secrets.token_hex(16), free_port()
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
             "--ServerApp.shutdown_no_activity_timeout=600", "--LabApp.news_url=None"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    try:
        wait_for_status(f"http://127.0.0.1:{port}", token, proc, log)
        yield Lab(root, f"http://127.0.0.1:{port}", token, home)
    finally:
        stop(proc)
    assert not our_processes(str(runtime)), "processes left behind"


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def notebook_page(browser, lab: Lab, notebook: str) -> Iterator:
    """A page with ``notebook`` open in JupyterLab and Run > Run All Cells chosen once its kernel is idle.

    When the block fails, a screenshot is saved next to the server's log and the notebook's error
    outputs are added to the failure, so a failure in CI says what the browser showed."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    try:
        # a workspace of its own, reset: no tab of an earlier test is restored beside this notebook (Run All
        # would otherwise go to whichever tab JupyterLab activates last)
        page.goto(f"{lab.url}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}?reset&token={lab.token}")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for()
        # the status bar says "No Kernel | Initializing", "Python 3 (ipykernel) | Connecting", then "... | Idle"
        page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"^(?!No Kernel).* \| Idle$")).wait_for()
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item:visible", has_text="Run All Cells").first.click()
        yield page
    except Exception as exc:
        shot = lab.home / f"{Path(notebook).stem}-failure.png"
        page.screenshot(path=str(shot), full_page=True)
        stderr = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        errors = page.locator(stderr).all_inner_texts()
        exc.add_note(f"screenshot: {shot}\nerror outputs: {errors}\nserver log: {lab.home / 'server.log'}")
        raise
    finally:
        page.close()


def labelling_worksheet(path: Path) -> Path:
    import csv

    rows = [("q1", "年假怎么申请", "d1:000", "年假申请须提前三天提交 <script>alert(1)</script>"),
            ("q1", "年假怎么申请", "d1:001", "病假需要医院证明。"),
            ("q2", "VPN reset", "d2:000", "Reset the VPN in the portal."),
            ("q2", "VPN reset", "d2:001", "The canteen opens at noon.")]
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        w = csv.writer(f)
        w.writerow(["query_id", "query", "chunk_id", "knowledge_title", "content", "found_in", "best_rank", "grade",
                    "assessor", "note"])
        w.writerows([q, text, c, f"doc {c}", content, "final", 1, "", "", ""] for q, text, c, content in rows)
    return path


def grade_in_the_browser(page) -> None:
    """Grades 3, 0, Back and regrade 1, the key 2, Skip: each waited for on the page before the next."""
    panel = page.locator(".wk-labelling")
    panel.wait_for()
    assert "candidate 1 of 4" in page.locator(".wk-progress-text").inner_text()
    assert page.locator(".wk-chunk").inner_text().count("<script>alert(1)</script>") == 1  # shown as text
    assert page.locator(".wk-chunk mark").first.inner_text() == "年假申请"  # the bigrams 年假 and 申请
    page.locator(".wk-grade-3").click()
    page.get_by_text("candidate 2 of 4").wait_for()
    page.locator(".wk-grade-0").click()
    page.get_by_text("candidate 3 of 4").wait_for()
    page.locator(".wk-back").click()
    page.get_by_text("You graded this 0 (not relevant) before").wait_for()
    page.locator(".wk-grade-1").click()   # the regrade: a new line that wins
    page.get_by_text("candidate 3 of 4").wait_for()
    panel.hover()
    page.keyboard.press("2")              # the shortcut for grade 2, while the pointer is over the panel
    page.get_by_text("candidate 4 of 4").wait_for()
    page.locator(".wk-skip").click()
    page.get_by_text("All 4 candidates judged").wait_for()


def test_grades_clicked_in_the_labelling_notebook_are_in_the_log(lab, browser):
    sheet = labelling_worksheet(lab.root / "worksheet.csv")
    labels = lab.root / "labels.jsonl"
    with_parameters(notebooks_dir() / "07_label.ipynb", lab.root / "07_label.ipynb",
                    worksheet=str(sheet), labels_log=str(labels), assessor="browser-li")
    with notebook_page(browser, lab, "07_label.ipynb") as page:
        grade_in_the_browser(page)
    lines = [json.loads(x) for x in labels.read_text(encoding="utf-8").splitlines()]
    assert [(x["query_id"], x["chunk_id"], x["grade"], x["assessor"]) for x in lines] == [
        ("q1", "d1:000", 3, "browser-li"), ("q1", "d1:001", 0, "browser-li"), ("q1", "d1:001", 1, "browser-li"),
        ("q2", "d2:000", 2, "browser-li"), ("q2", "d2:001", None, "browser-li")]


def small_run(root: Path) -> Path:
    """A run folder of 12 queries and two stages whose per-query figures differ (manifest + results.parquet)."""
    recs = [{"query_id": f"q{i}", "query": f"query {i}", "relevant": {f"c{i}a": 3, f"c{i}b": 1}} for i in range(12)]
    ts = TestSet.from_records(recs)
    ts.to_jsonl(root / "testset.jsonl")
    rows: list[tuple] = []
    for i in range(12):
        rows += ranked(f"q{i}", [f"c{i}a", "x", f"c{i}b"] if i % 2 else ["x", "y", f"c{i}a"], stage="hybrid")
        rows += ranked(f"q{i}", [f"c{i}a", f"c{i}b"] if i % 3 else ["z", "x"], stage="final")
    run = root / "runs" / "tiny"
    run.mkdir(parents=True)
    write_results(results_frame(rows), run / "results.parquet")
    manifest = {"run_name": "tiny", "testset": {"path": str(root / "testset.jsonl"), "hash": ts.hash}}
    (run / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return run


def test_the_stage_dropdown_of_the_metrics_notebook_changes_the_figure(lab, browser):
    run = small_run(lab.root)
    with_parameters(notebooks_dir() / "02_metrics.ipynb", lab.root / "02_metrics.ipynb", run_dir=str(run),
                    stage=None, metrics=None, resamples=50, domain_adjustment=0.0, grades=None,
                    interactive=True)
    with notebook_page(browser, lab, "02_metrics.ipynb") as page:
        select = page.locator(".widget-dropdown select")
        select.wait_for()
        figure = page.locator(".widget-output img")
        figure.wait_for()
        before = figure.get_attribute("src")
        assert before and before.startswith("data:image/png;base64,")
        shown = select.evaluate("s => s.options[s.selectedIndex].text")
        other = next(o for o in select.locator("option").all_inner_texts() if o != shown)
        assert {shown, other} == {"hybrid", "final"}
        select.select_option(label=other)
        page.wait_for_function("before => { const img = document.querySelector('.widget-output img');"
                               " return img !== null && img.src !== before; }", arg=before)
        after = figure.get_attribute("src")
    assert after and after.startswith("data:image/png;base64,") and after != before
