"""Render the notebooks of a run into self-contained HTML reports (papermill + nbconvert).

``render_report(run_dir, baselines)`` executes each notebook of ``notebooks/`` with
papermill into ``outputs/reports/<run>/`` (the executed ``.ipynb`` and its ``.html``) and
writes an ``index.html`` that links them with the headline figures. A notebook that fails
leaves its partial notebook and HTML (papermill marks the failing cell at the top) and
raises :class:`ReportError` naming the notebook and the cell. The executed notebook is
written once, when it ends or a cell fails, not after every cell (papermill's default: two
writes a cell, 1,000 for the demo's reports): a kernel that dies mid-notebook leaves none.

Each notebook gets only the parameters its ``parameters`` cell declares (run_dir,
baseline_dirs, interactive=False and the ``parameters`` given; the others are dropped).
Cells tagged ``baseline`` need a baseline to compare with and run only when baselines are
given; cells tagged ``no-baseline`` (what a reader sees instead) only when none is: so
05_compare rendered without a baseline says so once and shows the history.

Notebooks run in parallel: ``jobs`` at a time (default one per core, :func:`default_jobs`),
across the notebooks of every report given to :func:`render_reports` (the demo renders its
versions' reports together). Each of the ``jobs`` threads keeps one kernel for the notebooks
it executes and resets it between them (:class:`_Kernel`): starting a kernel and importing
pandas, matplotlib and the package is paid once per thread, not once per notebook. What the
notebooks compute from a run (the run loaded and scored, groups, label coverage) and the
runs the index pages' headline comparisons use are kept in the render cache, ``<reports
folder>/.cache`` (:func:`weknora_nb.reports.notebook.cached`), keyed by the content of the
run's files, so each is computed once and found by every notebook (and every later
rendering) that needs it.
The pages, their order and their content do not depend on ``jobs``.

Reports carry no secret (notebooks never take an API key as a parameter) and escape every
text that comes from the run, the test set or the knowledge base (:mod:`weknora_nb.reports.safe`).

Data never decides where a file goes: the report folder of a run (its ``run_name``) is
resolved and must lie inside the reports folder, only the packaged notebooks are rendered,
and each kernel's IPC sockets and connection file live in a private temporary folder
(never the runs folder, so that reports rendered at the same time cannot collide).
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import ReportError, RunFolderError, UsageError, writing
from weknora_nb.core.interpreter import fewer_collections
from weknora_nb.core.pipeline import HEADLINE_METRIC
from weknora_nb.core.run import ANSWERS, MANIFEST, check_run_name, read_manifest
from weknora_nb.reports.safe import esc, href

__all__ = ["NOTEBOOKS", "ReportError", "Report", "ReportRequest", "render_report", "render_reports", "default_jobs",
           "write_index", "notebooks_dir", "CACHE_FOLDER"]

log = logging.getLogger(__name__)

NOTEBOOKS = ("01_collect", "02_metrics", "03_stratify", "04_degraded", "05_compare", "06_answers")
#: notebooks rendered only when the run folder holds this file (06: a run without a chat stage has no answers)
NEEDS = {"06_answers": ANSWERS}
#: the render cache's folder inside the reports folder (:func:`weknora_nb.reports.notebook.cached`)
CACHE_FOLDER = ".cache"
#: at most this many kernels by default, whatever the number of cores (each holds a run in memory)
MAX_DEFAULT_JOBS = 8


@dataclass
class Report:
    run: str
    folder: Path
    index: Path
    pages: dict[str, Path] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    headline: dict[str, Any] = field(default_factory=dict)


def _kernel_manager_class() -> type:
    """The kernel manager papermill starts kernels with.

    Kernels talk to papermill over local IPC sockets: nothing listens on TCP, and ipykernel
    does not warn about an unencrypted TCP transport on every notebook. Each kernel's sockets
    and connection file are made in a private folder (``tempfile.mkdtemp``: mode 0700, given by
    absolute path, removed when the kernel is cleaned up or the manager is collected): a
    relative socket path would be made in the kernel's working folder (the runs folder), where
    two reports rendered at the same time would pick the same names and talk to each other's
    kernels ("Invalid Signature", "Kernel didn't respond").

    Shutting a kernel down does not interrupt it first. jupyter_client sends SIGINT before
    every shutdown request (to stop code that still runs); papermill shuts the kernel down
    right after its last reply (``kernel_info``) arrives, while the kernel may still be in
    that message's handler, where the SIGINT becomes a KeyboardInterrupt that ipykernel logs
    as ``[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel.`` after a successful
    run. The shutdown request (and the kill after its grace period) still stops a kernel
    that is busy; the kernel's own log is left as it is, so a real error still shows.
    """
    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kw: Any):
            kw.setdefault("transport", "ipc")
            self._clients: list[Any] = []
            private = Path(tempfile.mkdtemp(prefix="weknora-nb-kernel-"))
            self._remove_private = weakref.finalize(self, shutil.rmtree, private, ignore_errors=True)
            kw.setdefault("connection_file", str(private / "kernel.json"))
            if kw["transport"] == "ipc":
                kw.setdefault("ip", str(private / "ipc"))
            super().__init__(**kw)
            self.client_factory = _ready_client_class()

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart=restart)
            if not restart:
                self._remove_private()

        cleanup_resources = _async_cleanup_resources

        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:  # set by _async_shutdown_kernel before it interrupts
                return
            await super()._async_interrupt_kernel()

        def client(self, **kw: Any) -> Any:
            kc = super().client(**kw)
            self._clients.append(kc)
            return kc

        def stop_clients(self) -> None:
            """Stop the channels of every client made so far (papermill leaves open those of a kernel it was given)."""
            while self._clients:
                self._clients.pop().stop_channels()
    return IPCKernelManager


@functools.cache
def _ready_client_class() -> type:
    """The kernel client of :func:`_kernel_manager_class`: ready as soon as the kernel has answered.

    jupyter_client's ``wait_for_ready`` asks for ``kernel_info`` until the reply comes on the
    shell channel and a message on IOPub (its subscription works), then reads IOPub until it
    has been quiet for 0.2 s. Each page makes two clients (the kernel's reset, papermill's
    run), so that quiet wait was 0.4 s of idle time a page. This client stops after the first
    two steps: what the wait would have read is status messages of its ``kernel_info`` requests,
    and every reader (papermill's client, ``execute_interactive``) skips the messages whose
    parent is not its own request.
    """
    import math
    from queue import Empty

    from jupyter_client.asynchronous import AsyncKernelClient

    class ReadyClient(AsyncKernelClient):
        async def wait_for_ready(self, timeout: float | None = None) -> None:
            deadline = time.monotonic() + (math.inf if timeout is None else timeout)
            while True:
                self.kernel_info()
                try:
                    msg = await self.shell_channel.get_msg(timeout=1)
                except Empty:
                    pass
                else:
                    if msg["msg_type"] == "kernel_info_reply":
                        try:
                            await self.iopub_channel.get_msg(timeout=0.2)
                        except Empty:
                            pass   # IOPub not connected yet: ask again
                        else:
                            self._handle_kernel_info_reply(msg)
                            return
                if not await self.is_alive():
                    raise RuntimeError("Kernel died before replying to kernel_info")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")

    return ReadyClient


#: what :func:`kernel_setup` saw, for :func:`kernel_reset` (in a kernel's process)
_KERNEL_STATE: dict[str, Any] = {}
_SETUP = '__import__("weknora_nb.reports.render", fromlist=["kernel_setup"]).kernel_setup()'
_RESET = ('__import__("weknora_nb.reports.render", fromlist=["kernel_reset"]).kernel_reset({cwd!r}, {cache!r}, '
          '{code!r})')


def kernel_setup() -> None:
    """Run in a kernel :class:`_Kernel` started: import what the notebooks use, activate matplotlib's
    inline backend and apply the figure style (once per kernel, not once per notebook), then note the
    state :func:`kernel_reset` brings the kernel back to."""
    import warnings

    import matplotlib
    import matplotlib.pyplot as plt

    from weknora_nb.reports import notebook  # noqa: F401  (pandas, numpy, IPython.display, the package)
    from weknora_nb.reports.figures import figure_style

    plt.close(plt.figure())  # the inline backend is set up by the first figure
    figure_style()
    _describe_figures()
    _KERNEL_STATE.update(rc=matplotlib.rcParams.copy(), filters=list(warnings.filters), env=dict(os.environ),
                         path=list(sys.path))


def _describe_figures() -> None:
    """In a kernel: each figure shown carries its description (:func:`weknora_nb.reports.figures.describe`) as
    the image's metadata, which the reports' template writes as its alt text. The image is the inline backend's,
    byte for byte."""
    from IPython import get_ipython
    from matplotlib.figure import Figure

    from weknora_nb.reports.figures import describe

    png = get_ipython().display_formatter.formatters["image/png"]
    draw = png.lookup_by_type(Figure)

    def with_description(fig: Figure) -> Any:
        data = draw(fig)
        return data if data is None else (data, {"alt": describe(fig)})
    png.for_type(Figure, with_description)


def kernel_reset(cwd: str, cache: str | None, code: str | None = None) -> None:
    """Run in a kept kernel before its next notebook: the state :func:`kernel_setup` noted.

    The user's names and the output history are cleared and the execution count starts at 1
    again (IPython's ``%reset``); figures are closed and matplotlib's settings restored; the
    warning filters restored and what was warned once will be warned again; the module search
    path and the environment restored, with the render cache folder ``cache``
    (:data:`weknora_nb.reports.notebook.CACHE_ENV`, every run loaded through
    :func:`weknora_nb.reports.notebook.cached_run` and its answers' values through
    :func:`weknora_nb.reports.notebook.cached_answer_values`; None: no cache) and the rendering process's
    ``code`` version (:func:`weknora_nb.reports.notebook.code_version`); the working folder is ``cwd``.
    Modules stay imported: that is the point. What survives the reset (modules, their caches, what
    :func:`kernel_setup` imported: kept for the kernel's life; every page is reset before it runs) is then left
    out of the garbage collector's passes (``gc.freeze``): IPython's reset runs a full collection, and the
    passes a notebook's cells set off would otherwise walk every object the earlier notebooks left (jieba's
    dictionary among them); a frozen object is still freed when its last reference goes.
    """
    import warnings

    import matplotlib
    import matplotlib.pyplot as plt
    from IPython import get_ipython

    from weknora_nb.analysis import answers
    from weknora_nb.core import run
    from weknora_nb.reports.notebook import CACHE_ENV, CODE_ENV, cached_answer_values, cached_run

    shell = get_ipython()
    shell.reset(new_session=False)
    shell.execution_count = 1
    plt.close("all")
    dict.update(matplotlib.rcParams, _KERNEL_STATE["rc"])  # as matplotlib.rc_context restores them
    warnings.simplefilter("default")  # changes the filters' version: the once-per-place records are dropped
    warnings.filters[:] = _KERNEL_STATE["filters"]  # type: ignore[index]
    os.environ.clear()
    os.environ.update(_KERNEL_STATE["env"])
    sys.path[:] = _KERNEL_STATE["path"]
    if cache is not None:
        os.environ[CACHE_ENV] = cache
    if code is not None:
        os.environ[CODE_ENV] = code
    run.run_cache = None if cache is None else cached_run
    answers.values_cache = None if cache is None else cached_answer_values
    os.chdir(cwd)
    gc.collect()
    gc.freeze()


#: the variables that size the thread pools of the numeric libraries a kernel may load: OpenBLAS (under NumPy
#: and SciPy), OpenMP, MKL
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def kernel_environment(threads: int | None) -> dict[str, str]:
    """The environment a kernel starts in: this process's, each of :data:`THREAD_VARIABLES` not set in it set to
    ``threads`` (None: none set). Kernels rendering at once get the cores' share each (``_Pool``): each with a
    BLAS pool over every core, their pools only took turns, the idle threads spinning (the demo's render: 5 %
    of the kernels' CPU, 4 % of the wall time)."""
    env = dict(os.environ)
    if threads is not None:
        for name in THREAD_VARIABLES:
            env.setdefault(name, str(threads))
    return env


class _Kernel:
    """A kernel kept for the notebooks one thread executes, one after another.

    Starting a kernel and importing what the notebooks use (pandas, matplotlib, the package)
    takes 1-2 s; a kept kernel pays it once. It is started (:func:`_kernel_manager_class`:
    private IPC sockets) and set up (:func:`kernel_setup`) for its first notebook and reset
    (:func:`kernel_reset`) before each one, so that a notebook finds the kernel as a new one
    would be after its set-up. A kernel that died is replaced by a new one for the next notebook.
    """

    def __init__(self, name: str, threads: int | None = None):
        self.name = name
        self.threads = threads   # the numeric libraries' threads in the kernel (:func:`kernel_environment`)
        self.km: Any = None
        self.exporters: dict[bool, Any] = {}   # HTML exporters by no_input: nbconvert is not shared across threads

    def render(self, page: _Page) -> float:
        """Execute ``page`` into its ``.ipynb`` and ``.html``; seconds taken. A failing cell: the partial
        notebook and HTML written, then :class:`ReportError` naming the notebook and the cell."""
        import nbformat
        import papermill as pm

        t0 = time.perf_counter()
        try:
            self._ready(page)
            # the notebook is written once, at its end (or at its failing cell), not at every cell's start and end
            nb = pm.execute_notebook(page.source, _literal(page.executed), parameters=page.declared,
                                     kernel_name=self.name, progress_bar=False, log_output=False,
                                     request_save_on_cell_execute=False, km=self.km)
        except pm.PapermillExecutionError as exc:
            self._to_html(nbformat.read(page.executed, as_version=4), page.html, no_input=False)
            _embed_font([page.html])
            raise ReportError(page.notebook, *_failed_cell(page.executed), exc.ename, str(exc.evalue)[:300],
                              page.html) from exc
        finally:
            self._after()
        self._to_html(nb, page.html, no_input=page.no_input)
        return time.perf_counter() - t0

    def _to_html(self, nb: Any, html_path: Path, *, no_input: bool) -> None:
        """:func:`~weknora_nb.reports.pagehtml.write_page` with this thread's exporter for ``no_input`` (its
        templates compiled once)."""
        from weknora_nb.reports.pagehtml import exporter, write_page

        if no_input not in self.exporters:
            self.exporters[no_input] = exporter(no_input)
        write_page(nb, html_path, self.exporters[no_input])

    def _ready(self, page: _Page) -> None:
        """A kernel started and set up (when there is none or it died), then reset for ``page``."""
        from jupyter_core.utils import run_sync

        if self.km is not None and not run_sync(self.km.is_alive)():
            self._drop()
        if self.km is None:
            km = _kernel_manager_class()(kernel_name=self.name)
            # no history database: kernels at once would write one file, and numbering restarts at each reset
            run_sync(km.start_kernel)(cwd=str(page.cwd), env=kernel_environment(self.threads),
                                      extra_arguments=["--HistoryManager.enabled=False"])
            self.km = km
            self._run(_SETUP)
        from weknora_nb.reports.notebook import code_version

        cache = None if page.cache is None else str(page.cache)
        self._run(_RESET.format(cwd=str(page.cwd), cache=cache, code=code_version() if cache else None))

    def _run(self, code: str) -> None:
        """Execute ``code`` in the kernel silently (no output, no history, no execution count)."""
        from jupyter_core.utils import run_sync

        async def execute() -> dict[str, Any]:
            kc = self.km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            reply: dict[str, Any] = await kc.execute_interactive(code, silent=True, store_history=False,
                                                                 timeout=120, output_hook=lambda msg: None)
            return reply

        try:
            content = run_sync(execute)()["content"]
        finally:
            self.km.stop_clients()
        if content["status"] != "ok":
            raise RuntimeError(f"the kernel could not be prepared: {content.get('ename')}: {content.get('evalue')}")

    def _after(self) -> None:
        """After a notebook: its clients' channels closed; a kernel that died dropped."""
        from jupyter_core.utils import run_sync

        if self.km is None:
            return
        self.km.stop_clients()
        if not run_sync(self.km.is_alive)():
            self._drop()

    def _drop(self) -> None:
        from jupyter_core.utils import run_sync

        km, self.km = self.km, None
        run_sync(km.cleanup_resources)()

    def close(self) -> None:
        """Stop the kernel once its pages are written: killed, its resources cleaned up.

        The kernel keeps nothing to save (no history, every page written), and a shutdown request
        races ipykernel 7 with itself: the request stops the kernel's loops while its control thread
        still flushes the output streams after the handler, and now and then that flush finds the
        IOPub pipe closed ("Uncaught exception in ZMQStream callback ... Socket operation on
        non-socket" on the kernel's stderr, once in a CI run of the demo).
        """
        from jupyter_core.utils import run_sync

        km, self.km = self.km, None
        if km is None:
            return
        try:
            run_sync(km.shutdown_kernel)(now=True)
        except Exception as exc:  # noqa: BLE001 - the pages are written: a kernel that will not stop is killed
            log.debug("kernel shutdown failed (%s): killed", exc)
            _kill(km)

    def kill(self) -> None:
        """Kill the kernel's process now (from another thread: Ctrl-C); its thread then ends."""
        _kill(self.km)


def _kill(km: Any) -> None:
    """Kill the process of ``km``'s kernel, if it has one."""
    process = getattr(getattr(km, "provisioner", None), "process", None)
    if process is not None:
        process.kill()


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


def _literal(path: Path) -> str:
    """``path`` as papermill takes it literally (papermill ``str.format``s output paths: ``{`` would be a field)."""
    return str(path).replace("{", "{{").replace("}", "}}")


def cjk_font_css(text: str) -> str:
    """A ``<style>`` that embeds the CJK characters of ``text`` as a subset of WenQuanYi Micro Hei.

    The font is the last fallback of the report's font stacks, so a reader whose machine has
    no Chinese font still sees every character; "" when ``text`` has no CJK character or the
    font package is missing.
    """
    import base64
    import io

    chars = {ord(c) for c in text if ord(c) >= 0x2E80}
    if not chars:
        return ""
    try:
        import paperang_p2_fonts_cjk
        from fontTools import subset
        from fontTools.ttLib import TTFont
    except ImportError:
        log.warning("no CJK font package: reports rely on the reader's fonts for Chinese")
        return ""
    path = next((Path(paperang_p2_fonts_cjk.__file__).parent / "fonts").glob("*.tt*"))
    font = TTFont(str(path), fontNumber=0)
    options = subset.Options()
    options.hinting = False
    options.layout_features = ["*"]
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    sub = subset.Subsetter(options)
    sub.populate(unicodes=chars)
    sub.subset(font)
    buf = io.BytesIO()
    font.save(buf)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    stack = ("system-ui, -apple-system, 'Segoe UI', 'PingFang SC', 'Microsoft YaHei', 'Noto Sans CJK SC', "
             "sans-serif, 'weknora-cjk'")
    return (f"<style>@font-face{{font-family:'weknora-cjk';src:url(data:font/ttf;base64,{data}) format('truetype');}}"
            f":root{{--jp-content-font-family:{stack};--jp-ui-font-family:{stack};"
            f"--jp-code-font-family:monospace, 'weknora-cjk';}}body{{font-family:{stack};}}</style>")


def _embed_font(pages: list[Path]) -> None:
    """Add one shared CJK font subset (the characters of all ``pages``) to each page's head."""
    texts = [p.read_text(encoding="utf-8") for p in pages]
    css = cjk_font_css("".join(set("".join(texts))))  # each character once: the pages are megabytes of it
    if not css:
        return
    for p, t in zip(pages, texts, strict=True):
        with writing(p):
            p.write_text(t.replace("</head>", css + "</head>", 1), encoding="utf-8")


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
    no_input: bool = False
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
    no_input: bool
    cache: Path | None
    cost: float
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
    from weknora_nb.reports.notebook import usable_cache

    notebooks = list(req.notebooks)
    unknown = [nb for nb in notebooks if nb not in NOTEBOOKS]
    if unknown:
        raise UsageError(argument="notebooks", allowed=NOTEBOOKS, got=unknown)
    run_dir = Path(req.run_dir).resolve()
    bases = [Path(b).resolve() for b in req.baselines]
    name = str(read_manifest(run_dir).get("run_name") or run_dir.name)
    out_root = Path(req.out_root or run_dir.parent.parent / "reports").resolve()
    folder = _report_folder(out_root, name, run_dir / MANIFEST)
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    params = {"run_dir": str(run_dir), "baseline_dirs": [str(b) for b in bases], "interactive": False,
              **(req.parameters or {})}
    store = out_root / CACHE_FOLDER if cache else None
    if store is not None and not usable_cache(store):  # said here once, not in every notebook
        store = None
    pages = []
    for nb in notebooks_for(run_dir, notebooks):
        source, declared = _notebook_for(notebooks_dir() / f"{nb}.ipynb", params)
        cost = _COMPARE_COST if nb == "05_compare" and bases else _COST.get(nb, 1.0)
        pages.append(_Page(nb, source, declared, folder / f"{nb}.ipynb", folder / f"{nb}.html", run_dir.parent,
                           req.no_input, store, cost))
    return _Plan(Report(name, folder, folder / "index.html"), run_dir, bases, params, store, pages)


def render_report(run_dir: str | Path, baselines: Iterable[str | Path] = (), *, out_root: str | Path | None = None,
                  no_input: bool = False, notebooks: Iterable[str] = NOTEBOOKS, kernel: str = "python3",
                  parameters: dict[str, Any] | None = None, jobs: int | None = None, cache: bool = True) -> Report:
    """Execute the notebooks for ``run_dir`` (compared with ``baselines``) and write the HTML reports.

    ``parameters`` (e.g. ``stage``, ``metrics``, ``domain_adjustment``) go to the notebooks
    that declare them and to the index's headline figures. ``notebooks``: names from
    :data:`NOTEBOOKS`. The report goes to ``out_root/<run name>`` (:class:`RunFolderError` when
    the run's name would put it anywhere else). ``jobs``: notebooks executed at once (default
    :func:`default_jobs`; 1: one after another); ``cache``: keep what the notebooks compute in
    ``out_root/.cache`` (:mod:`weknora_nb.reports.notebook`, "the render cache") and reuse it.
    """
    req = ReportRequest(run_dir, tuple(baselines), out_root, no_input, tuple(notebooks), parameters)
    return render_reports([req], jobs=jobs, kernel=kernel, cache=cache)[0]


def render_reports(requests: Sequence[ReportRequest], *, jobs: int | None = None, kernel: str = "python3",
                   cache: bool = True) -> list[Report]:
    """Render several reports (each as :func:`render_report` does), their notebooks ``jobs`` at a time.

    Every request is checked before any notebook runs. The notebooks of all reports share the
    ``jobs`` kernels (each kept for the notebooks it runs, reset between them: see
    :class:`_Kernel`), the longest first, while this thread computes the index pages' headline
    figures; reports, their pages and their order are the same whatever ``jobs`` is. When a
    notebook fails no other one starts: those running finish, and the :class:`ReportError` of the
    first failed page (in the order of ``requests`` and :data:`NOTEBOOKS`) is raised, its partial
    notebook and HTML written. Then each report's index page, and one CJK font subset for the
    characters of every page, embedded in each. The garbage collector runs less often meanwhile
    (:func:`~weknora_nb.core.interpreter.fewer_collections`).
    """
    plans = [_plan(r, cache=cache) for r in requests]
    pages = [p for plan in plans for p in plan.pages]
    with fewer_collections():   # the pages' HTML parse trees are many objects, in reference cycles
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
        _embed_font([path for plan in plans for path in [*plan.report.pages.values(), plan.report.index]])
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
    import weknora_nb.reports.notebook  # noqa: F401
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
    """Threads that execute ``pages``, each with its :class:`_Kernel`, the most costly first; each page
    gets its ``seconds`` or its ``error``. After the first error no page starts."""

    def __init__(self, pages: list[_Page], jobs: int, kernel: str):
        self.pages = pages
        self.queue = sorted(pages, key=lambda p: -p.cost)  # stable: equal costs keep the report order
        self.lock = threading.Lock()
        n = min(jobs, len(pages))
        threads = max(1, (os.cpu_count() or 1) // n) if n > 1 else None
        self.kernels = [_Kernel(kernel, threads) for _ in range(n)]
        self.threads = [threading.Thread(target=self._work, args=(k,), name=f"weknora-nb-render-{i}", daemon=True)
                        for i, k in enumerate(self.kernels)]
        for t in self.threads:
            t.start()

    def _next(self) -> _Page | None:
        with self.lock:
            if not self.queue or any(p.error is not None for p in self.pages):
                return None
            return self.queue.pop(0)

    def _work(self, k: _Kernel) -> None:
        try:
            while (page := self._next()) is not None:
                try:
                    page.seconds = k.render(page)
                    log.info("rendered %s (%.1f s)", page.html, page.seconds)
                except BaseException as exc:  # noqa: BLE001 - kept on the page, raised by render_reports
                    page.error = exc
        finally:
            k.close()

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def stop(self) -> None:
        """No page starts any more and the kernels are killed (Ctrl-C): the threads end soon after."""
        with self.lock:
            self.queue.clear()
        for k in self.kernels:
            k.kill()


def headline(run_dir: Path, baselines: list[Path], *, stage: str | None = None,
             metrics: Iterable[str] | None = None, domain_adjustment: float = 0.0,
             cache: Path | None = None) -> dict[str, Any]:
    """The figures an index page shows: the focus stage's means and tiers, counts, warnings, and the
    headline metric's delta to the first baseline (95 % CI, p after Holm).

    The focus stage is :func:`weknora_nb.reports.tables.report_stage` of ``stage``; the tiers
    follow ``domain_adjustment``. ``failed``: a sentence for each stage whose every request
    failed (such a focus stage has no figure and no comparison). ``cache``: the render cache
    folder, where the runs loaded and scored by the notebooks are found (None: load them).
    """
    from weknora_nb.reports.notebook import cached_run
    from weknora_nb.reports.tables import failure_lines, report_stage

    metrics = None if metrics is None else list(metrics)
    run = cached_run(run_dir, metrics=metrics, domain_adjustment=domain_adjustment, folder=cache)
    stage = report_stage(run, stage)
    s = run.scores.summary[run.scores.summary["stage"] == stage]
    out: dict[str, Any] = {"stage": stage, "metrics": [(r.metric, r.mean, r.tier) for r in s.itertuples()],
                           "counts": run.scores.counts.to_dict(), "warnings": run.scores.warnings,
                           "failed": failure_lines(run.scores), "baselines": len(baselines)}
    if baselines and stage in run.scores.stages:
        from weknora_nb.analysis.compare import compare_runs

        runs = [cached_run(p, metrics=metrics, folder=cache) for p in [*baselines, run_dir]]
        cmp = compare_runs(runs, stage=stage, metrics=metrics, resamples=2000)
        row = cmp.metrics[cmp.metrics["run"] == run.name].set_index("metric")
        if HEADLINE_METRIC in row.index:
            r = row.loc[HEADLINE_METRIC]
            out["vs"] = {"metric": HEADLINE_METRIC, "baseline": r["baseline"], "delta": r["delta"],
                         "ci": (r["ci_low"], r["ci_high"]), "p_holm": r["p_holm"]}
    return out


_STYLE = """<style>body{font-family:"WenQuanYi Micro Hei","Noto Sans CJK SC",sans-serif;margin:2em;max-width:70em}
td,th{padding:2px 8px;text-align:left}.excellent{background:#1a9850}.good{background:#91cf60}
.pass{background:#fee08b}.fail{background:#f46d43}.warn{color:#a50026}</style>"""


def _tier(t: Any) -> str:
    """A tier name, or "" for a metric without tiers."""
    return t if isinstance(t, str) else ""


def _label(metric: str) -> str:
    """How a metric name reads in a sentence: ``ndcg@5`` as ``NDCG@5``."""
    return metric.upper()


def write_index(report: Report) -> Path:
    """``index.html`` of one run: links to its notebooks and its headline figures (all text escaped)."""
    e = esc
    h = report.headline
    rows = "".join(f'<tr><td>{e(m)}</td><td class="{e(_tier(t))}">{v:.3f}</td><td>{e(_tier(t))}</td></tr>'
                   for m, v, t in h.get("metrics", []))
    c = h.get("counts", {})
    counts = (f"{c.get('n_valid', 0)} valid / {c.get('n_queries', 0)} queries, {c.get('n_invalid', 0)} invalid, "
              f"{c.get('n_failed', 0)} failed and {c.get('n_missing', 0)} missing requests")
    vs = ""
    if "vs" in h:
        v = h["vs"]
        vs = (f"<p>{e(_label(v['metric']))} vs {e(str(v['baseline']))}: {v['delta']:+.3f} (95 % CI "
              f"[{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}], p = {v['p_holm']:.3g} after Holm)</p>")
    elif not h.get("baselines") and "05_compare" in report.pages:
        vs = "<p>No baseline given: 05_compare shows the history of the runs, no comparison.</p>"
    warns = "".join(f'<p class="warn">{e(w)}</p>' for w in [*h.get("failed", []), *h.get("warnings", [])])
    links = "".join(f'<li><a href="{href(p.name)}">{e(nb)}</a></li>' for nb, p in report.pages.items())
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(report.run)}</title>{_STYLE}</head><body>"
            f"<h1>weknora-nb report: {e(report.run)}</h1><p>Stage <b>{e(h.get('stage', ''))}</b>; {e(counts)}</p>"
            f"{vs}{warns}<table><tr><th>metric</th><th>mean</th><th>tier</th></tr>{rows}</table>"
            f"<h2>Notebooks</h2><ul>{links}</ul></body></html>")
    with writing(report.index):
        report.index.write_text(page, encoding="utf-8")
    return report.index


def write_overview(reports: list[Report], path: Path) -> Path:
    """A top-level ``index.html`` linking several runs' reports with their headline figures (all text escaped)."""
    e = esc
    items = []
    for r in reports:
        m = {k: (v, t) for k, v, t in r.headline.get("metrics", [])}
        figs = ", ".join(f"{k} {v:.3f}" for k, (v, _) in m.items() if k in ("recall@10", HEADLINE_METRIC, "hit@5"))
        vs = ""
        if "vs" in r.headline:
            v = r.headline["vs"]
            vs = (f"; {_label(v['metric'])} vs {v['baseline']}: {v['delta']:+.3f} "
                  f"[{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]")
        rel = r.index.relative_to(path.parent)
        items.append(f'<li><a href="{href(rel)}">{e(r.run)}</a>: {e(figs + vs)}</li>')
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>weknora-nb reports</title>{_STYLE}"
            f"</head><body><h1>weknora-nb reports</h1><ul>{''.join(items)}</ul></body></html>")
    with writing(path):
        path.write_text(page, encoding="utf-8")
    _embed_font([path])
    return path
