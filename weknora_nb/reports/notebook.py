"""Small helpers that keep the notebooks thin: each returns something Jupyter displays.

Interactive controls (ipywidgets) are only built when ``interactive`` is true (a live
JupyterLab session); rendered reports call the same functions with ``interactive=False``
and get the static equivalent: every choice a widget offers, shown one after another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import HTML, Markdown, display

from weknora_nb.core.run import Run, flatten, load_run
from weknora_nb.reports.tables import html_table

__all__ = ["load", "manifest_table", "request_counts", "stage_latencies", "warnings_md", "excluded_table",
           "choose", "md", "show_html", "read_inventory"]


def load(run_dir: str | Path, metrics: Iterable[str] | None = None) -> Run:
    """The run, scored (test set from its manifest)."""
    return load_run(run_dir, metrics=metrics)


def md(text: str) -> Markdown:
    return Markdown(text)


def show_html(text: str) -> HTML:
    return HTML(text)


def manifest_table(run: Run) -> HTML:
    """What was run against what: the manifest flattened to key / value (it holds no secret)."""
    flat = flatten({k: v for k, v in run.manifest.items() if k not in ("counts",)})
    df = pd.DataFrame([(k, json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v)
                       for k, v in flat.items()], columns=["key", "value"])
    return HTML(html_table(df))


def request_counts(run: Run) -> pd.DataFrame:
    """Requests per stage: ok and each failure kind, and the share that failed."""
    req = run.scores.requests
    t = pd.crosstab(req["stage"], req["status"])
    t["failed %"] = (100 * (1 - t.get("ok", 0) / t.sum(axis=1))).round(2)
    return t


def stage_latencies(run: Run) -> dict[str, np.ndarray]:
    req = run.scores.requests
    ok = req[req["status"] == "ok"]
    return {str(s): g["latency_ms"].to_numpy(dtype=float) for s, g in ok.groupby("stage", sort=False)}


def warnings_md(run: Run) -> Markdown:
    ws = run.scores.warnings
    if not ws:
        return Markdown("No warnings: the run is complete and the test set is large enough.")
    return Markdown("\n".join(f"- **{w}**" for w in ws))


def excluded_table(run: Run, limit: int = 50) -> HTML:
    ex = run.scores.excluded
    note = f"<p>{len(ex)} exclusion(s); the first {min(limit, len(ex))} are listed.</p>" if len(ex) > limit else ""
    return HTML(note + html_table(ex.head(limit)))


def read_inventory(run: Run) -> pd.DataFrame | None:
    p = run.path / "chunks.parquet"
    return pd.read_parquet(p) if p.exists() else None


def choose(render: Callable[..., Any], interactive: bool, **options: list) -> None:
    """Show ``render(**choice)`` for every combination of ``options`` (static) or behind dropdowns (live)."""
    if interactive:
        try:
            import ipywidgets as w
        except ImportError:
            interactive = False
    if interactive:
        controls = {k: w.Dropdown(options=v, description=k) for k, v in options.items()}
        out = w.interactive_output(lambda **kw: display(render(**kw)), controls)
        display(w.HBox(list(controls.values())), out)
        return
    import itertools

    keys = list(options)
    for combo in itertools.product(*(options[k] for k in keys)):
        choice = dict(zip(keys, combo))
        display(Markdown(" · ".join(f"**{k}**: {v}" for k, v in choice.items())))
        display(render(**choice))
