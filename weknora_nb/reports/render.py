"""Render the notebooks of a run into self-contained HTML reports (papermill + nbconvert).

``render_report(run_dir, baselines)`` executes each notebook of ``notebooks/`` with
papermill into ``outputs/reports/<run>/`` (the executed ``.ipynb`` and its ``.html``, without its code
unless ``show_code``; each page headed by links to the top index, the run's index and the run's other
notebooks, :mod:`weknora_nb.reports.pagehtml`) and writes an ``index.html`` that links them with the
headline figures. A notebook that fails
leaves its partial notebook and HTML (papermill marks the failing cell at the top) and
raises :class:`ReportError` naming the notebook and the cell.

Each notebook gets only the parameters its ``parameters`` cell declares (run_dir,
baseline_dirs, interactive=False and the ``parameters`` given; the others are dropped).
Cells tagged ``baseline`` need a baseline to compare with and run only when baselines are
given; cells tagged ``no-baseline`` (what a reader sees instead) only when none is: so
05_compare rendered without a baseline says so once and shows the history.

Each notebook runs in a kernel of its own, as papermill runs it (:mod:`weknora_nb.reports.kernel`),
``jobs`` at a time (default one per core, :func:`default_jobs`), across the notebooks of every
report given to :func:`render_reports` (the demo renders its versions' reports together). What the
notebooks compute from a run (the run loaded and scored, groups, label coverage) is kept in the
render cache, ``<reports folder>/.cache`` (:mod:`weknora_nb.reports.cache`), keyed by the content of
the run's files, so each is computed once and found by every notebook (and every later rendering)
that needs it. The pages, their order and their content do not depend on ``jobs``.

Reports carry no secret (notebooks never take an API key as a parameter) and escape every
text that comes from the run, the test set or the knowledge base (:mod:`weknora_nb.reports.safe`).

Data never decides where a file goes: the report folder of a run (its ``run_name``) is
resolved and must lie inside the reports folder, and only the packaged notebooks are rendered.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import NotComparableError, ReportError, RunFolderError, UsageError, writing
from weknora_nb.core.run import ANSWERS, MANIFEST, check_run_name, read_manifest
from weknora_nb.reports import kernel
from weknora_nb.reports.fonts import embed_font
from weknora_nb.reports.index_page import headline, write_index, write_listing
from weknora_nb.reports.report import Report

log = logging.getLogger(__name__)

NOTEBOOKS = ("01_collect", "02_metrics", "03_stratify", "04_degraded", "05_compare", "06_answers")
#: notebooks rendered only when the run folder holds this file (06: a run without a chat stage has no answers)
NEEDS = {"06_answers": ANSWERS}
#: the render cache's folder inside the reports folder (:func:`weknora_nb.reports.cache.cached`)
CACHE_FOLDER = ".cache"
#: at most this many kernels by default, whatever the number of cores (each holds a run in memory)
MAX_DEFAULT_JOBS = 8


def notebooks_dir() -> Path:
    """The notebooks shipped with the package (``weknora_nb/reports/notebooks``; ``notebooks/`` of a checkout)."""
    return Path(__file__).resolve().parent / "notebooks"


def _report_folder(out_root: Path, name: str, manifest: Path) -> Path:
    """The folder of a run's report: ``out_root / name`` resolved (symlinks followed), which must be
    a folder inside ``out_root``; else :class:`RunFolderError` naming the manifest's ``run_name``.

    ``name`` is data (``run_name``, else the run folder's name): ``../x``, ``/tmp/x``, ``.`` or a
    symlink in ``out_root`` that points out would write elsewhere. The name must first be a safe
    folder name (:func:`weknora_nb.core.run.check_run_name`); the resolved folder is then checked,
    since a safe name can still be a symlink that leads out.
    """
    check_run_name(name, manifest)
    folder = (out_root / name).resolve()
    if folder == out_root or not folder.is_relative_to(out_root):
        raise RunFolderError(f"{manifest}, field 'run_name': the run name {name!r} does not name a folder inside "
                             f"the reports folder {out_root}; a run name is one folder name")
    return folder


def _failed_cell(nb_path: Path) -> tuple[int | None, str]:
    """1-based position (among all cells of the executed notebook) and first source line of the failed cell."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    for i, c in enumerate(nb.cells, start=1):
        if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.get("outputs", [])):
            return i, c.source.strip().splitlines()[0][:80] if c.source.strip() else ""
    return None, ""


def _notebook_for(src: Path, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The notebook ``src`` as it will run, and the parameters it declares (the others dropped).

    Cells tagged ``baseline`` are left out when ``params`` has no ``baseline_dirs``, cells
    tagged ``no-baseline`` when it has.
    """
    import nbformat
    import papermill as pm

    declared = pm.inspect_notebook(str(src))
    nb = nbformat.read(src, as_version=4)
    drop = "no-baseline" if params.get("baseline_dirs") else "baseline"
    nb.cells = [c for c in nb.cells if drop not in c.get("metadata", {}).get("tags", [])]
    return nb, {k: v for k, v in params.items() if k in declared}


def notebooks_for(run_dir: str | Path, notebooks: Iterable[str] = NOTEBOOKS) -> list[str]:
    """The notebooks of ``notebooks`` a report of ``run_dir`` renders: those whose :data:`NEEDS` the
    run folder meets (06_answers only for a run with answers)."""
    return [n for n in notebooks if n not in NEEDS or (Path(run_dir) / NEEDS[n]).is_file()]


@dataclass(frozen=True)
class ReportRequest:
    """One report to render (:func:`render_reports`): the arguments of :func:`render_report`."""

    run_dir: str | Path
    baselines: Sequence[str | Path] = ()
    out_root: str | Path | None = None
    show_code: bool = False
    notebooks: Sequence[str] = NOTEBOOKS
    parameters: dict[str, Any] | None = None


@dataclass
class _Page:
    """One notebook of one report, to execute: where it runs and is written, and what came of it."""

    notebook: str
    source: Any  # the NotebookNode, cells tagged for the other case left out
    declared: dict[str, Any]
    executed: Path
    html: Path
    cwd: Path
    show_code: bool
    cache: Path | None
    cost: float
    nav: Any = None  # pagehtml.Nav: the page's place in its run's report
    seconds: float = 0.0
    error: BaseException | None = None


@dataclass
class _Plan:
    """A report checked and laid out before anything runs."""

    report: Report
    run_dir: Path
    baselines: list[Path]
    params: dict[str, Any]
    cache: Path | None
    pages: list[_Page]


#: roughly how long each notebook takes on the demo (s, beyond the kernel): the longest start first
_COST = {"01_collect": 1.0, "02_metrics": 2.5, "03_stratify": 1.2, "04_degraded": 8.0, "05_compare": 2.0,
         "06_answers": 2.2}
_COMPARE_COST = 9.5  # 05_compare given baselines


def default_jobs(pages: int) -> int:
    """How many notebooks run at once by default: one per core (``os.cpu_count()``), at most
    :data:`MAX_DEFAULT_JOBS` (each kernel holds a run in memory) and at most ``pages``."""
    return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_JOBS, pages))


def _plan(req: ReportRequest, *, cache: bool) -> _Plan:
    """Check one request (notebook names, the report folder) and lay out its pages; the folder is made."""
    from weknora_nb.reports.cache import usable_cache

    notebooks = list(req.notebooks)
    unknown = [nb for nb in notebooks if nb not in NOTEBOOKS]
    if unknown:
        raise UsageError(argument="notebooks", allowed=NOTEBOOKS, got=unknown)
    run_dir = Path(req.run_dir).resolve()
    bases = [Path(b).resolve() for b in req.baselines]
    manifest = read_manifest(run_dir)
    _check_baselines(manifest, bases, (req.parameters or {}).get("stage"))
    name = str(manifest.get("run_name") or run_dir.name)
    out_root = Path(req.out_root or run_dir.parent.parent / "reports").resolve()
    folder = _report_folder(out_root, name, run_dir / MANIFEST)
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    params = {"run_dir": str(run_dir), "baseline_dirs": [str(b) for b in bases], "interactive": False,
              **(req.parameters or {})}
    store = out_root / CACHE_FOLDER if cache else None
    if store is not None and not usable_cache(store):  # said here once, not in every notebook
        store = None
    from weknora_nb.reports.pagehtml import Nav

    pages = []
    names = tuple(notebooks_for(run_dir, notebooks))
    for nb in names:
        source, declared = _notebook_for(notebooks_dir() / f"{nb}.ipynb", params)
        cost = _COMPARE_COST if nb == "05_compare" and bases else _COST.get(nb, 1.0)
        pages.append(_Page(nb, source, declared, folder / f"{nb}.ipynb", folder / f"{nb}.html", run_dir.parent,
                           req.show_code, store, cost, Nav(name, nb, names)))
    return _Plan(Report(name, folder, folder / "index.html"), run_dir, bases, params, store, pages)


def _check_baselines(manifest: dict[str, Any], baselines: list[Path], stage: str | None) -> None:
    """:class:`NotComparableError` before any notebook runs when a baseline cannot be compared with the run, as
    the gate refuses it: another test set that no lineage relates to the run's (``rescore_plan``), or a baseline
    without the run's focus stage (``stage``, else ``final``, else the last of the pipeline)."""
    from weknora_nb.core.lineage import rescore_plan
    from weknora_nb.core.pipeline import focus_stage

    stages = list(manifest.get("stages") or {})
    focus = focus_stage(stages, stage, manifest.get("stages")) if stages else None
    for b in baselines:
        other = read_manifest(b)
        ours, theirs = (manifest.get("testset") or {}).get("hash"), (other.get("testset") or {}).get("hash")
        if ours != theirs:
            path, why = rescore_plan(other, manifest)
            if path is None:
                raise NotComparableError(f"--baseline {b} was collected on another test set than the run: {why}")
        if focus is not None and focus not in (other.get("stages") or {}):
            raise NotComparableError(f"--baseline {b} has no stage {focus!r}, the report's focus stage (its stages: "
                                     f"{', '.join(other.get('stages') or {}) or 'none'}); give --stage one both hold")


def render_report(run_dir: str | Path, baselines: Iterable[str | Path] = (), *, out_root: str | Path | None = None,
                  show_code: bool = False, notebooks: Iterable[str] = NOTEBOOKS, kernel: str = "python3",
                  parameters: dict[str, Any] | None = None, jobs: int | None = None, cache: bool = True) -> Report:
    """Execute the notebooks for ``run_dir`` (compared with ``baselines``) and write the HTML reports.

    ``parameters`` (e.g. ``stage``, ``metrics``, ``domain_adjustment``) go to the notebooks
    that declare them and to the index's headline figures. ``notebooks``: names from
    :data:`NOTEBOOKS`. The report goes to ``out_root/<run name>`` (:class:`RunFolderError` when
    the run's name would put it anywhere else). ``show_code``: the code cells shown in the pages (hidden by
    default: a report is read, not run). ``jobs``: notebooks executed at once (default
    :func:`default_jobs`; 1: one after another); ``cache``: keep what the notebooks compute in
    ``out_root/.cache`` (:mod:`weknora_nb.reports.notebook`, "the render cache") and reuse it.
    """
    req = ReportRequest(run_dir, tuple(baselines), out_root, show_code, tuple(notebooks), parameters)
    return render_reports([req], jobs=jobs, kernel=kernel, cache=cache)[0]


def render_reports(requests: Sequence[ReportRequest], *, jobs: int | None = None, kernel: str = "python3",
                   cache: bool = True) -> list[Report]:
    """Render several reports (each as :func:`render_report` does), their notebooks ``jobs`` at a time.

    Every request is checked before any notebook runs. The notebooks of all reports are executed by ``jobs``
    threads, each notebook in a kernel of its own, the longest first, while this thread computes the index pages'
    headline figures; reports, their pages and their order are the same whatever ``jobs`` is. When a notebook
    fails no other one starts: those running finish, and the :class:`ReportError` of the first failed page (in the
    order of ``requests`` and :data:`NOTEBOOKS`) is raised, its partial notebook and HTML written. Then each
    report's index page, the top index its pages link to when there is none yet
    (:func:`~weknora_nb.reports.index_page.write_listing`), and one CJK font subset for the characters of every
    page, embedded in each.
    """
    plans = [_plan(r, cache=cache) for r in requests]
    pages = [p for plan in plans for p in plan.pages]
    _import_before_threads()
    pool = _Pool(pages, jobs or default_jobs(len(pages)), kernel)
    try:
        heads = [_headline_of(plan) for plan in plans]
        pool.join()
    except BaseException:
        pool.stop()
        raise
    failed = next((p.error for p in pages if p.error is not None), None)
    if failed is not None:
        raise failed
    for plan, head in zip(plans, heads, strict=True):
        if isinstance(head, Exception):
            raise head
        report = plan.report
        report.headline = head
        for page in plan.pages:
            report.pages[page.notebook] = page.html
            report.seconds[page.notebook] = page.seconds
        write_index(report)
    listings = [write_listing(root) for root in dict.fromkeys(plan.report.folder.parent for plan in plans)]
    embed_font([path for plan in plans for path in [*plan.report.pages.values(), plan.report.index]]
               + [p for p in listings if p is not None])
    return [plan.report for plan in plans]


def _import_before_threads() -> None:
    """Import what the threads of a :class:`_Pool` and the headline figures use, in this thread first:
    two threads importing one package at once can fail (``KeyError: 'IPython'`` in importlib)."""
    import IPython.paths  # noqa: F401
    import jupyter_client.manager  # noqa: F401
    import jupyter_core.utils  # noqa: F401
    import nbconvert  # noqa: F401
    import papermill  # noqa: F401

    import weknora_nb.analysis.compare  # noqa: F401
    import weknora_nb.reports.cache  # noqa: F401
    import weknora_nb.reports.pagehtml  # noqa: F401
    import weknora_nb.reports.tables  # noqa: F401


def _headline_of(plan: _Plan) -> dict[str, Any] | Exception:
    """:func:`headline` of a planned report, or what it raised (raised after the notebooks' errors)."""
    params = plan.params
    try:
        return headline(plan.run_dir, plan.baselines, stage=params.get("stage"), metrics=params.get("metrics"),
                        domain_adjustment=params.get("domain_adjustment") or 0.0, cache=plan.cache)
    except Exception as exc:  # noqa: BLE001 - a notebook's failure says more, and is raised first
        return exc


class _Pool:
    """Threads that execute ``pages``, each page in a kernel of its own, the most costly first; each page gets its
    ``seconds`` or its ``error``. After the first error no page starts."""

    def __init__(self, pages: list[_Page], jobs: int, kernel_name: str):
        self.pages = pages
        self.kernel_name = kernel_name
        self.queue = sorted(pages, key=lambda p: -p.cost)  # stable: equal costs keep the report order
        self.lock = threading.Lock()
        self.running: dict[int, Any] = {}   # thread id -> the kernel manager of the page it executes
        self.threads = [threading.Thread(target=self._work, name=f"weknora-nb-render-{i}", daemon=True)
                        for i in range(min(jobs, len(pages)))]
        for t in self.threads:
            t.start()

    def _next(self) -> _Page | None:
        with self.lock:
            if not self.queue or any(p.error is not None for p in self.pages):
                return None
            return self.queue.pop(0)

    def _started(self, km: Any) -> None:
        with self.lock:
            self.running[threading.get_ident()] = km

    def _work(self) -> None:
        while (page := self._next()) is not None:
            try:
                page.seconds = _render_page(page, self.kernel_name, self._started)
                log.info("rendered %s (%.1f s)", page.html, page.seconds)
            except BaseException as exc:  # noqa: BLE001 - kept on the page, raised by render_reports
                page.error = exc
            finally:
                with self.lock:
                    self.running.pop(threading.get_ident(), None)

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def stop(self) -> None:
        """No page starts any more and the running kernels are killed (Ctrl-C): the threads end soon after."""
        with self.lock:
            self.queue.clear()
            running = list(self.running.values())
        for km in running:
            kernel.kill(km)


def _render_page(page: _Page, kernel_name: str, started: Any = None) -> float:
    """Execute ``page`` in a kernel of its own into its ``.ipynb`` and ``.html``; seconds taken. A failing cell:
    the partial notebook and HTML written, then :class:`ReportError` naming the notebook and the cell."""
    import nbformat
    import papermill as pm

    from weknora_nb.reports.pagehtml import write_page

    t0 = time.perf_counter()
    try:
        nb = kernel.execute(page.source, page.executed, page.declared, kernel_name=kernel_name, cwd=page.cwd,
                            env=_kernel_environment(page.cache), started=started)
    except pm.PapermillExecutionError as exc:
        write_page(nbformat.read(page.executed, as_version=4), page.html, show_code=True, nav=page.nav)
        embed_font([page.html])
        raise ReportError(page.notebook, *_failed_cell(page.executed), exc.ename, str(exc.evalue)[:300],
                          page.html) from exc
    write_page(nb, page.html, show_code=page.show_code, nav=page.nav)
    return time.perf_counter() - t0


def _kernel_environment(cache: Path | None) -> dict[str, str]:
    """The environment a page's kernel starts in: this process's, with the render cache folder ``cache`` and this
    code's version (:mod:`weknora_nb.reports.cache`) when there is a cache."""
    from weknora_nb.reports.cache import CACHE_ENV, CODE_ENV, code_version

    env = dict(os.environ)
    if cache is not None:
        env[CACHE_ENV], env[CODE_ENV] = str(cache), code_version()
    return env
