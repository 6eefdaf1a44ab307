"""The top index of the reports (``<reports>/index.html``): a table of runs grouped by test set, what an analyst
scans first.

Runs measured on different test sets are not comparable, so each test set has a table of its own (its file name,
queries and hash in the heading). A row: the run (a link to its report), its focus stage, the focus figures
(NDCG@5, Recall@10, Hit@5) each with its acceptance tier as a word and a colour (told apart without colour), the
comparison with the baseline in words (``NDCG@5 vs baseline: +0.199 [+0.135, +0.263], significant``: the 95 %
interval excludes 0), the date it was collected and its status. Every text from a run is escaped
(:mod:`weknora_nb.reports.safe`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weknora_nb.core.pipeline import HEADLINE_METRIC
from weknora_nb.reports.report import Report
from weknora_nb.reports.safe import esc, href

#: the figures of a row, in this order
FOCUS_METRICS = (HEADLINE_METRIC, "recall@10", "hit@5")


def _figure(metrics: Mapping[str, tuple[float, Any]], metric: str) -> str:
    if metric not in metrics:
        return "<td></td>"
    value, tier = metrics[metric]
    word = tier if isinstance(tier, str) else ""
    return f'<td class="{esc(word)}">{value:.3f}{" " + esc(word) if word else ""}</td>'


def comparison_words(vs: Mapping[str, Any]) -> str:
    """``NDCG@5 vs baseline: +0.199 [+0.135, +0.263], significant`` (the interval excludes 0) or ``not
    significant``."""
    low, high = vs["ci"]
    significant = low > 0 or high < 0
    return (f"{str(vs['metric']).upper()} vs {vs['baseline']}: {vs['delta']:+.3f} [{low:+.3f}, {high:+.3f}], "
            f"{'significant' if significant else 'not significant'}")


def _row(r: Report, root: Path) -> str:
    h = r.headline
    metrics = {m: (v, t) for m, v, t in h.get("metrics", [])}
    vs = comparison_words(h["vs"]) if "vs" in h else ("no baseline given" if not h.get("baselines") else "")
    warn = " ⚠ " + "; ".join(h["failed"]) if h.get("failed") else ""
    return (f'<tr><td><a href="{href(r.index.relative_to(root))}">{esc(r.run)}</a></td>'
            f"<td>{esc(h.get('stage', ''))}</td>{''.join(_figure(metrics, m) for m in FOCUS_METRICS)}"
            f"<td>{esc(vs)}</td><td>{esc(h.get('date', ''))}</td><td>{esc(h.get('status', ''))}{esc(warn)}</td></tr>")


def overview_html(reports: list[Report], root: Path, style: str) -> str:
    """The page (see the module); ``root``: the folder it is written in; ``style``: the reports' index style."""
    groups: dict[str, list[Report]] = {}
    for r in reports:
        groups.setdefault(str((r.headline.get("testset") or {}).get("hash") or ""), []).append(r)
    head = ("<tr><th>run</th><th>focus stage</th>" + "".join(f"<th>{esc(m.upper())}</th>" for m in FOCUS_METRICS)
            + "<th>comparison</th><th>collected</th><th>status</th></tr>")
    parts = []
    for members in groups.values():
        ts = members[0].headline.get("testset") or {}
        title = (f"Test set {ts.get('name') or 'unknown'}"
                 + (f": {ts['n_queries']} queries" if ts.get("n_queries") else "")
                 + (f" (hash {str(ts['hash'])[:19]}…)" if ts.get("hash") else ""))
        rows = "\n".join(_row(r, root) for r in members)
        parts.append(f"<h2>{esc(title)}</h2><table>{head}\n{rows}\n</table>")
    lead = (f"{len(reports)} runs on {len(groups)} test sets. Each figure is the mean at the run's focus stage "
            "with its acceptance tier (excellent, good, pass, fail: as a word and a colour); runs on different "
            "test sets are not comparable, so each test set has its own table.")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>weknora-nb reports</title>{style}</head>"
            f"<body><h1>weknora-nb reports</h1><p>{esc(lead)}</p>{''.join(parts)}</body></html>")
