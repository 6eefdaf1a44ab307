"""Render the notebooks of a run into self-contained HTML reports (papermill + nbconvert).

``render_report(run_dir, baselines)`` executes each notebook of ``notebooks/`` with
papermill into ``outputs/reports/<run>/`` (the executed ``.ipynb`` and its ``.html``) and
writes an ``index.html`` that links them with the headline figures. A notebook that fails
leaves its partial notebook and HTML (papermill marks the failing cell at the top) and
raises :class:`ReportError` naming the notebook and the cell.

Each notebook gets only the parameters its ``parameters`` cell declares (run_dir,
baseline_dirs, interactive=False and the ``parameters`` given; the others are dropped).
Cells tagged ``baseline`` need a baseline to compare with and run only when baselines are
given; cells tagged ``no-baseline`` (what a reader sees instead) only when none is: so
05_compare rendered without a baseline says so once and shows the history.

Reports carry no secret (notebooks never take an API key as a parameter) and escape every
text that comes from the run, the test set or the knowledge base (:mod:`weknora_nb.reports.safe`).

Data never decides where a file goes: the report folder of a run (its ``run_name``) is
resolved and must lie inside the reports folder, only the packaged notebooks are rendered,
and each kernel's IPC sockets and connection file live in a private temporary folder
(never the runs folder, so that reports rendered at the same time cannot collide).
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import ReportError, RunFolderError, UsageError, writing
from weknora_nb.core.pipeline import HEADLINE_METRIC
from weknora_nb.core.run import ANSWERS, MANIFEST, check_run_name, load_run, read_manifest
from weknora_nb.reports.safe import esc, href

__all__ = ["NOTEBOOKS", "ReportError", "Report", "render_report", "write_index", "notebooks_dir"]

log = logging.getLogger(__name__)

NOTEBOOKS = ("01_collect", "02_metrics", "03_stratify", "04_degraded", "05_compare", "06_answers")
#: notebooks rendered only when the run folder holds this file (06: a run without a chat stage has no answers)
NEEDS = {"06_answers": ANSWERS}
_EXTERNAL_SCRIPT = re.compile(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>', re.I)


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
            private = Path(tempfile.mkdtemp(prefix="weknora-nb-kernel-"))
            self._remove_private = weakref.finalize(self, shutil.rmtree, private, ignore_errors=True)
            kw.setdefault("connection_file", str(private / "kernel.json"))
            if kw["transport"] == "ipc":
                kw.setdefault("ip", str(private / "ipc"))
            super().__init__(**kw)

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart=restart)
            if not restart:
                self._remove_private()

        cleanup_resources = _async_cleanup_resources

        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:  # set by _async_shutdown_kernel before it interrupts
                return
            await super()._async_interrupt_kernel()
    return IPCKernelManager


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


def _to_html(nb_path: Path, html_path: Path, *, no_input: bool) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(nb_path, as_version=4)
    logging.getLogger("traitlets").setLevel(logging.ERROR)  # nbconvert's alt-text notice on every figure
    exporter = HTMLExporter(template_name="lab", exclude_input=no_input, exclude_input_prompt=no_input,
                            exclude_output_prompt=no_input)
    body, _ = exporter.from_notebook_node(nb)
    # a report opens from disk or an attachment: no scripts fetched from the internet
    body = _EXTERNAL_SCRIPT.sub("", body)
    with writing(html_path):
        html_path.write_text(body, encoding="utf-8")


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
    css = cjk_font_css("".join(texts))
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


def render_report(run_dir: str | Path, baselines: Iterable[str | Path] = (), *, out_root: str | Path | None = None,
                  no_input: bool = False, notebooks: Iterable[str] = NOTEBOOKS, kernel: str = "python3",
                  parameters: dict[str, Any] | None = None) -> Report:
    """Execute the notebooks for ``run_dir`` (compared with ``baselines``) and write the HTML reports.

    ``parameters`` (e.g. ``stage``, ``metrics``, ``domain_adjustment``) go to the notebooks
    that declare them and to the index's headline figures. ``notebooks``: names from
    :data:`NOTEBOOKS`. The report goes to ``out_root/<run name>`` (:class:`RunFolderError` when
    the run's name would put it anywhere else).
    """
    import papermill as pm

    notebooks = list(notebooks)
    unknown = [nb for nb in notebooks if nb not in NOTEBOOKS]
    if unknown:
        raise UsageError(argument="notebooks", allowed=NOTEBOOKS, got=unknown)
    run_dir = Path(run_dir).resolve()
    bases = [Path(b).resolve() for b in baselines]
    name = str(read_manifest(run_dir).get("run_name") or run_dir.name)
    out_root = Path(out_root or run_dir.parent.parent / "reports").resolve()
    folder = _report_folder(out_root, name, run_dir / MANIFEST)
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    params = {"run_dir": str(run_dir), "baseline_dirs": [str(b) for b in bases], "interactive": False,
              **(parameters or {})}
    report = Report(name, folder, folder / "index.html")
    for nb in notebooks_for(run_dir, notebooks):
        dst = folder / f"{nb}.ipynb"
        page = folder / f"{nb}.html"
        source, declared = _notebook_for(notebooks_dir() / f"{nb}.ipynb", params)
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(source, _literal(dst), parameters=declared, kernel_name=kernel, progress_bar=False,
                                log_output=False, cwd=str(run_dir.parent),
                                kernel_manager_class=_kernel_manager_class())
        except pm.PapermillExecutionError as exc:
            _to_html(dst, page, no_input=False)
            _embed_font([page])
            raise ReportError(nb, *_failed_cell(dst), exc.ename, str(exc.evalue)[:300], page) from exc
        _to_html(dst, page, no_input=no_input)
        report.pages[nb] = page
        report.seconds[nb] = time.perf_counter() - t0
        log.info("rendered %s (%.1f s)", page, report.seconds[nb])
    report.headline = headline(run_dir, bases, stage=params.get("stage"), metrics=params.get("metrics"),
                               domain_adjustment=params.get("domain_adjustment") or 0.0)
    write_index(report)
    _embed_font([*report.pages.values(), report.index])
    return report


def headline(run_dir: Path, baselines: list[Path], *, stage: str | None = None,
             metrics: Iterable[str] | None = None, domain_adjustment: float = 0.0) -> dict[str, Any]:
    """The figures an index page shows: the focus stage's means and tiers, counts, warnings, and the
    headline metric's delta to the first baseline (95 % CI, p after Holm).

    The focus stage is :func:`weknora_nb.reports.tables.report_stage` of ``stage``; the tiers
    follow ``domain_adjustment``. ``failed``: a sentence for each stage whose every request
    failed (such a focus stage has no figure and no comparison).
    """
    from weknora_nb.analysis.compare import compare_runs
    from weknora_nb.reports.tables import failure_lines, report_stage

    run = load_run(run_dir, metrics=metrics, domain_adjustment=domain_adjustment)
    stage = report_stage(run, stage)
    s = run.scores.summary[run.scores.summary["stage"] == stage]
    out: dict[str, Any] = {"stage": stage, "metrics": [(r.metric, r.mean, r.tier) for r in s.itertuples()],
                           "counts": run.scores.counts.to_dict(), "warnings": run.scores.warnings,
                           "failed": failure_lines(run.scores), "baselines": len(baselines)}
    if baselines and stage in run.scores.stages:
        cmp = compare_runs([*baselines, run_dir], stage=stage, metrics=metrics, resamples=2000)
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
