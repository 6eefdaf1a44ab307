"""Small helpers that keep the notebooks thin: each returns something Jupyter displays.

Every notebook starts with its ``parameters`` cell and one setup call: :func:`open_run`
(the run loaded and scored, the CJK font set, the focus stage resolved, one line shown),
or :func:`open_collection` in 01_collect, which may run the collection first.

Interactive controls (ipywidgets) are only built when ``interactive`` is true (a live
JupyterLab session); rendered reports call the same functions with ``interactive=False``
and get the static equivalent: every choice a widget offers, shown one after another.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import HTML, Markdown, Pretty, display

from weknora_nb.core.metrics import DEFAULT_METRICS
from weknora_nb.core.pipeline import role_of
from weknora_nb.core.run import MANIFEST, Run, flatten, load_run
from weknora_nb.reports.figures import use_cjk_font
from weknora_nb.reports.tables import html_table

__all__ = ["open_run", "open_collection", "describe", "manifest_table", "request_counts", "stage_latencies",
           "warnings_md", "settings_note", "excluded_table", "choose", "md", "show_html"]


def describe(run: Run, stage: str | None = None) -> str:
    """One line: the run's name, its stages, its test set's hash and (when given) the focus stage."""
    focus = f", focus stage {stage}" if stage is not None else ""
    return f"run {run.name}: stages {run.stages}, test set {run.testset.hash[:19]}...{focus}"


def open_run(run_dir: str | Path, *, metrics: Iterable[str] | None = None, stage: str | None = None,
             domain_adjustment: float = 0.0, needs: Iterable[str] = ()) -> tuple[Run, str]:
    """A notebook's setup: the run scored, the CJK font set for figures, the focus stage; shows :func:`describe`.

    ``metrics`` (None: the defaults) plus the metrics the notebook ``needs``; ``domain_adjustment``
    (0, or 0.05-0.10) lowers every tier threshold, so tables colour by the adjusted tiers;
    ``stage``: the focus stage, else ``final`` when the run has it, else the stage furthest down
    the pipeline (:meth:`Run.focus_stage`, which raises :class:`UsageError` naming the stages
    when ``stage`` is not one of them).
    """
    if needs:
        metrics = list(dict.fromkeys([*(DEFAULT_METRICS if metrics is None else metrics), *needs]))
    run = load_run(run_dir, metrics=metrics, domain_adjustment=domain_adjustment)
    use_cjk_font()
    focus = run.focus_stage(stage)
    display(Pretty(describe(run, focus)))
    return run, focus


def open_collection(run_dir: str | Path, *, collect: bool = False, base_url: str = "", kb_ids: str | list[str] = "",
                    testset_path: str | Path = "", stages: str = "", repeats: int = 1, concurrency: int = 8,
                    system_yaml: str | Path = "") -> Run:
    """01_collect's setup: with ``collect``, run (or resume, when ``run_dir`` holds a manifest) the collection
    and show its summary; then the run, loaded, the CJK font set and :func:`describe` shown.

    ``system_yaml``: an optional YAML file describing the system (chunking, model, index, ...).
    The API key is read from ``WEKNORA_API_KEY`` by the client, never passed here.
    """
    if collect:
        import yaml

        from weknora_nb.collect import collect as run_collection
        from weknora_nb.collect.client import ClientSettings

        system = yaml.safe_load(Path(system_yaml).read_text(encoding="utf-8")) if system_yaml else None
        summary = run_collection(ClientSettings(base_url), kb_ids, testset_path, run_dir, stages=stages,
                                 repeats=repeats, concurrency=concurrency, system=system,
                                 resume=Path(run_dir, MANIFEST).exists())
        display(Pretty(summary.describe()))
    run = load_run(run_dir)
    use_cjk_font()
    display(Pretty(describe(run)))
    return run


def md(text: str) -> Markdown:
    """``text`` shown as Markdown."""
    return Markdown(text)


def show_html(text: str) -> HTML:
    """``text`` (already escaped HTML) shown as HTML."""
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
    """Latency (ms) of each stage's successful requests, retries included."""
    req = run.scores.requests
    ok = req[req["status"] == "ok"]
    return {str(s): g["latency_ms"].to_numpy(dtype=float) for s, g in ok.groupby("stage", sort=False)}


def warnings_md(run: Run) -> Markdown:
    """The run's warnings (incomplete, too few valid queries, adjusted thresholds), or that there is none."""
    ws = run.scores.warnings
    if not ws:
        return Markdown("No warnings: the run is complete and the test set is large enough.")
    return Markdown("\n".join(f"- **{w}**" for w in ws))


def settings_note(run: Run) -> Markdown | None:
    """One line when the run's final and citations stages, shown side by side, ran different settings:
    knowledge-search the tenant retrieval config, the chat the server's conversation settings
    (``docs/weknora-contract.md`` C66), so a difference between them is not one variable. From the
    manifest's ``stages.<name>.settings_source``; None when it is not recorded (older runs) or the same.
    """
    defs = run.stage_definitions
    first: dict[str, str] = {}
    for stage in run.stages:
        first.setdefault(role_of(stage, defs.get(stage)), stage)
    final, citations = first.get("final"), first.get("citations")
    if final is None or citations is None:
        return None
    a, b = ((defs.get(s) or {}).get("settings_source") for s in (final, citations))
    if not a or not b or a == b:
        return None
    return Markdown(f"*Note: {citations} ran different settings from {final} (the {b}, not the {a}): "
                    f"a difference between the two is not one variable.*")


def excluded_table(run: Run, limit: int = 50) -> HTML:
    """The excluded queries and requests with the reason, the first ``limit`` of them."""
    ex = run.scores.excluded
    note = f"<p>{len(ex)} exclusion(s); the first {min(limit, len(ex))} are listed.</p>" if len(ex) > limit else ""
    return HTML(note + html_table(ex.head(limit)))


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
    keys = list(options)
    for combo in itertools.product(*(options[k] for k in keys)):
        choice = dict(zip(keys, combo, strict=True))
        display(Markdown(" · ".join(f"**{k}**: {v}" for k, v in choice.items())))
        display(render(**choice))
