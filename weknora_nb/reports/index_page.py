"""The index pages of the reports: a run's ``index.html`` (its headline figures and its notebooks) and the
overview linking every run's report. Every text from a run is escaped (:mod:`weknora_nb.reports.safe`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from weknora_nb.core.errors import writing
from weknora_nb.core.pipeline import HEADLINE_METRIC
from weknora_nb.reports.fonts import embed_font
from weknora_nb.reports.pagehtml import TOP_INDEX
from weknora_nb.reports.report import Report
from weknora_nb.reports.safe import esc, href


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
                           "failed": failure_lines(run.scores), "baselines": len(baselines),
                           **_about(run.manifest)}
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


def _about(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the top index says of a run besides its figures: its test set (file name, queries, hash), the date it
    was collected and its status."""
    ts = manifest.get("testset") or {}
    return {"testset": {"name": Path(str(ts.get("path") or "")).name, "n_queries": ts.get("n_queries"),
                        "hash": ts.get("hash")},
            "date": str(manifest.get("started_at") or "")[:10], "status": str(manifest.get("status") or "")}


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
        from weknora_nb.reports.overview_page import comparison_words

        vs = f"<p><b>{e(comparison_words(v))}</b> (95 % CI, p = {v['p_holm']:.3g} after Holm)</p>"
    elif not h.get("baselines") and "05_compare" in report.pages:
        vs = "<p>No baseline given: 05_compare shows the history of the runs, no comparison.</p>"
    warns = "".join(f'<p class="warn">{e(w)}</p>' for w in [*h.get("failed", []), *h.get("warnings", [])])
    links = "".join(f'<li><a href="{href(p.name)}">{e(nb)}</a></li>' for nb, p in report.pages.items())
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(report.run)}</title>{_STYLE}</head><body>"
            f'<p><a href="{href(TOP_INDEX)}">all reports</a></p>'
            f"<h1>weknora-nb report: {e(report.run)}</h1><p>Stage <b>{e(h.get('stage', ''))}</b>; {e(counts)}</p>"
            f"{vs}{warns}<table><tr><th>metric</th><th>mean</th><th>tier</th></tr>{rows}</table>"
            f"<h2>Notebooks</h2><ul>{links}</ul></body></html>")
    with writing(report.index):
        report.index.write_text(page, encoding="utf-8")
    return report.index


def write_overview(reports: list[Report], path: Path) -> Path:
    """A top-level ``index.html``: every run's report in a table of runs grouped by test set, with its focus
    figures, tiers and comparison (:mod:`weknora_nb.reports.overview_page`, all text escaped)."""
    from weknora_nb.reports.overview_page import overview_html

    page = overview_html(reports, path.parent, _STYLE)
    with writing(path):
        path.write_text(page, encoding="utf-8")
    embed_font([path])
    return path


#: the mark of a top index written by :func:`write_listing` (one :func:`write_overview` wrote is never replaced)
LISTING_MARK = "<!-- weknora-nb: listing of the reports folder -->"


def write_listing(out_root: Path) -> Path | None:
    """``out_root/index.html``, the top index every page links to ("all reports"), as a list of the reports in
    ``out_root`` (each folder holding an ``index.html``), when there is none yet or the one there is such a list
    (the demo's overview, :func:`write_overview`, is left alone); None when left alone."""
    path = out_root / "index.html"
    if path.exists() and LISTING_MARK not in path.read_text(encoding="utf-8", errors="replace"):
        return None
    runs = sorted(p.parent.name for p in out_root.glob("*/index.html"))
    items = "".join(f'<li><a href="{href(PurePosixPath(r, "index.html"))}">{esc(r)}</a></li>' for r in runs)
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>weknora-nb reports</title>{_STYLE}"
            f"</head><body>{LISTING_MARK}<h1>weknora-nb reports</h1><ul>{items}</ul></body></html>")
    with writing(path):
        path.write_text(page, encoding="utf-8")
    return path
