"""Small helpers that keep the notebooks thin: each returns something Jupyter displays.

Every notebook starts with its ``parameters`` cell and one setup call: :func:`open_run`
(the run loaded and scored, the CJK font set, the focus stage resolved, one line shown),
or :func:`open_collection` in 01_collect, which may run the collection first.

Interactive controls (ipywidgets) are only built when ``interactive`` is true (a live
JupyterLab session); rendered reports call the same functions with ``interactive=False``
and get the static equivalent: every choice a widget offers, shown one after another.

What these helpers show is HTML built by :mod:`weknora_nb.reports.safe` (every text from
the run, the test set or the knowledge base escaped), never Markdown with data in it; a
figure or table with nothing to show (every request of its stage failed) is replaced by
the sentence that says so (:func:`unless_failed`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import HTML, Pretty, display

from weknora_nb.core.metrics import DEFAULT_METRICS
from weknora_nb.core.pipeline import role_of
from weknora_nb.core.run import MANIFEST, Run, flatten
from weknora_nb.reports import safe
from weknora_nb.reports.cache import cached, cached_run, derived_key, file_digest, use_in_this_kernel
from weknora_nb.reports.tables import all_stages, failure_lines, html_table, report_stage


def describe(run: Run, stage: str | None = None) -> str:
    """One line: the run's name, its stages, its test set's hash and (when given) the focus stage."""
    focus = f", focus stage {stage}" if stage is not None else ""
    return f"run {run.name}: stages {all_stages(run)}, test set {run.testset.hash[:19]}...{focus}"


def _set_up_kernel() -> None:
    """What a notebook's kernel needs before it shows anything: the figures' style and CJK font
    (:func:`weknora_nb.reports.figures.figure_style`), each figure's description as its image's alt text
    (:func:`weknora_nb.reports.figures.describe_figures`), and, in a report's kernel, the render cache
    (:func:`weknora_nb.reports.cache.use_in_this_kernel`). matplotlib is imported only now: the rendering process
    plans its pages with this module and draws nothing."""
    from weknora_nb.reports.figures import describe_figures, figure_style

    figure_style()
    describe_figures()
    use_in_this_kernel()


def open_run(run_dir: str | Path, *, metrics: Iterable[str] | None = None, stage: str | None = None,
             domain_adjustment: float = 0.0, needs: Iterable[str] = ()) -> tuple[Run, str]:
    """A notebook's setup: the run scored, the CJK font set for figures, the focus stage; shows :func:`describe`.

    ``metrics`` (None: the defaults) plus the metrics the notebook ``needs``; ``domain_adjustment``
    (0, or 0.05-0.10) lowers every tier threshold, so tables colour by the adjusted tiers;
    ``stage``: the focus stage, else ``final`` when the run has it, else the stage furthest down
    the pipeline (:func:`weknora_nb.reports.tables.report_stage`, which raises :class:`UsageError`
    naming the stages when ``stage`` is not one of them). A stage whose every request failed
    may be the focus: the failure is shown here, and again in place of each figure.
    """
    if needs:
        metrics = list(dict.fromkeys([*(DEFAULT_METRICS if metrics is None else metrics), *needs]))
    run = cached_run(run_dir, metrics=metrics, domain_adjustment=domain_adjustment)
    _set_up_kernel()
    focus = report_stage(run, stage)
    display(Pretty(describe(run, focus)))
    note = failure_note(run)
    if note is not None:
        display(note)
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
        from weknora_nb.collect.http.client import ClientSettings

        system = yaml.safe_load(Path(system_yaml).read_text(encoding="utf-8")) if system_yaml else None
        summary = run_collection(ClientSettings(base_url), kb_ids, testset_path, run_dir, stages=stages,
                                 repeats=repeats, concurrency=concurrency, system=system,
                                 resume=Path(run_dir, MANIFEST).exists())
        display(Pretty(summary.describe()))
    run = cached_run(run_dir)
    _set_up_kernel()
    display(Pretty(describe(run)))
    note = failure_note(run)
    if note is not None:
        display(note)
    return run


def text(plain: str) -> HTML:
    """Plain text (paragraphs, ``- `` bullets), escaped, shown as HTML (:func:`safe.text`)."""
    return HTML(safe.text(plain))


def bullets(items: Iterable[Any], *, empty: str = "", bold: bool = True) -> HTML:
    """``items`` as an escaped bullet list (in bold), or the plain sentence ``empty`` when there is none."""
    items = list(items)
    return HTML(safe.bullets(items, bold=bold) if items else safe.text(empty))


def table(df: pd.DataFrame, *, index: bool = False, anchors: dict[str, str] | None = None) -> HTML:
    """A DataFrame shown as an escaped HTML table (:func:`safe.table`); ``index``: show its row labels;
    ``anchors``: column -> id prefix, its cells linking to those elements of the page (04: ``{"query_id": "dd-"}``,
    each degraded query to its drill-down)."""
    return HTML(safe.table(df, index=index, anchors=anchors))


def show_html(html: str) -> HTML:
    """``html`` shown as HTML: only what :mod:`weknora_nb.reports.safe` or :mod:`.tables` built (escaped)."""
    return HTML(html)


def failure_note(run: Run, stages: Iterable[str] | None = None) -> HTML | None:
    """The sentence ``Nothing was scored: <why>`` when no request at all was, then ``Every request of stage X
    failed (kinds: ...)`` for each such stage (of ``stages``, default all), escaped; None when there is none."""
    nothing = run.scores.counts.nothing_scored
    lines = ([f"Nothing was scored: {nothing}."] if nothing is not None else [])
    lines += failure_lines(run.scores, None if stages is None else list(stages))
    if not lines:
        return None
    return HTML(f'<div class="weknora-failed">{safe.bullets(lines, bold=True)}</div>')


def unless_failed(run: Run, make: Callable[[], Any], *, stage: str | None = None) -> Any:
    """``make()`` (a figure, a table), or, when it would have nothing to show, the sentence that says why.

    Nothing to show: no request of ``stage`` succeeded (with ``stage`` None: no request of any
    stage). The sentence is :func:`failure_note` of that stage (of every stage).
    """
    scored = run.scores.stages
    if (stage in scored) if stage is not None else bool(scored):
        return make()
    note = failure_note(run, None if stage is None else [stage])
    what = f"stage {stage}" if stage is not None else "any stage"
    return note if note is not None else HTML(safe.text(f"No request of {what} was scored: nothing to show."))


def manifest_table(run: Run) -> HTML:
    """What was run against what (it holds no secret): a short summary, the manifest flattened to key / value
    collapsed under it (:func:`weknora_nb.reports.summary_view.manifest_html`)."""
    from weknora_nb.reports.summary_view import manifest_html

    return HTML(manifest_html(run.manifest, flatten({k: v for k, v in run.manifest.items() if k not in ("counts",)})))


def stratify(run: Run, stage: str, *, rules: str | Path | None = None, resamples: int = 2000) -> pd.DataFrame:
    """Every metric by group at ``stage`` (:func:`weknora_nb.analysis.stratify.stratify`) with a ``label``
    column (``group (n=12)``); shows how many groups there are, or the failure when no request of
    ``stage`` succeeded (the frame is then empty, with the same columns)."""
    from weknora_nb.analysis.stratify import stratify as by_group

    columns = ["dimension", "group", "metric", "n", "mean", "ci_low", "ci_high", "warning", "label"]
    if stage not in run.scores.stages:
        display(unless_failed(run, lambda: None, stage=stage))
        return pd.DataFrame(columns=columns)
    try:
        rules_digest = None if rules is None else file_digest(Path(rules))
    except OSError:
        key = None  # by_group says what is wrong with the rules file
    else:
        key = derived_key(run, "stratify", stage, rules_digest, resamples)
    out = cached("stratify", key, lambda: by_group(run.scores, run.testset, stage=stage, rules=rules,
                                                    resamples=resamples))
    out["label"] = out["group"] + " (n=" + out["n"].astype(str) + ")"
    display(Pretty(f"{out['group'].nunique()} groups over {out['dimension'].nunique()} dimensions at stage {stage}"))
    return out


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


def warnings_note(run: Run) -> HTML:
    """The run's warnings (incomplete, too few valid queries, adjusted thresholds; generated questions that are the
    majority or overlap far more than the others, and who wrote them: :func:`.source_view.source_notes`), or that
    there is none."""
    from weknora_nb.reports.source_view import source_notes

    return bullets([*run.scores.warnings, *source_notes(run)],
                   empty="No warnings: the run is complete and the test set is large enough.")


def settings_note(run: Run) -> HTML | None:
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
    return HTML("<p><i>" + safe.esc(f"Note: {citations} ran different settings from {final} (the {b}, not the "
                                    f"{a}): a difference between the two is not one variable.") + "</i></p>")


def excluded_table(run: Run, limit: int = 50) -> HTML:
    """The excluded queries and requests with the reason, the first ``limit`` of them."""
    ex = run.scores.excluded
    note = safe.text(f"{len(ex)} exclusion(s); the first {min(limit, len(ex))} are listed.") if len(ex) > limit else ""
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
        display(HTML("<p>" + " · ".join(f"<b>{safe.esc(k)}</b>: {safe.esc(v)}" for k, v in choice.items()) + "</p>"))
        display(render(**choice))


def label_coverage(run: Run, *, k: int = 10) -> HTML:
    """judged@K per stage (docs/method.md section 10): the share of each stage's top K that carries a
    label, 0 included. Unlabelled chunks count as irrelevant, so a low share means low figures may be
    missing labels rather than missing relevance."""
    from weknora_nb.analysis.coverage import coverage_table

    t = cached("coverage", derived_key(run, "coverage", k), lambda: coverage_table([run], k=k))
    t = t.T.rename(columns={run.name: f"judged@{k}"})
    low = t[t[f"judged@{k}"] < 0.8].index.tolist()
    note = (f"Stages with less than 80 % of their top {k} labelled: {', '.join(map(str, low))}. Pool and label "
            "them (weknora-nb testset pool) before trusting a comparison." if low else
            f"At least 80 % of every stage's top {k} is labelled.")
    return HTML(safe.table(t.round(3), index=True) + safe.text(note))


def traffic_weighted(run: Run, stage: str, *, resamples: int = 2000) -> HTML:
    """Beside each plain mean, the traffic-weighted mean (each query weighted by how often it is asked,
    the test set's ``weight``; docs/method.md section 10) with its interval; a sentence without weights."""
    from weknora_nb.analysis.evidence import weighted_figures

    weights = run.testset.queries.set_index("query_id")["weight"]
    if weights.isna().all():
        return HTML(safe.text("The test set carries no traffic weight (weknora-nb testset sample writes one per "
                              "query): every mean above is a plain mean over queries."))
    pq = run.scores.per_query_mean()
    pq = pq[pq["stage"] == stage]
    have = pq["query_id"].isin(weights.dropna().index)
    t = weighted_figures(pq[have], run.scores.metric_names, weights.dropna().astype(float), resamples=resamples)
    note = (f"{int((~have).sum())} scored queries carry no weight and are left out of this table."
            if (~have).any() else "")
    return HTML(safe.text(f"Stage {stage}: plain and traffic-weighted means.") + safe.table(t.round(4))
                + (safe.text(note) if note else ""))


# -- integrity of the knowledge base (issue 15) ----------------------------------------------------------
#: a run folder's result of ``weknora-nb check --json`` (e.g. the Postgres checks the demo runs), shown with the
#: manifest's own findings
CHECK_FILE = "check.json"


def integrity_findings(run: Run) -> tuple[list[Any], list[str], list[str]]:
    """The run's integrity findings: the manifest's ``integrity`` (``collect``'s API checks) merged with the
    run folder's :data:`CHECK_FILE` when present (each finding once); the checks applied; and the sources
    read (``manifest``, ``check.json``). A ``check.json`` that cannot be read is an :class:`InputError`."""
    from weknora_nb.core.errors import InputError, reading
    from weknora_nb.core.integrity import findings_from_json, merge_findings

    entry = run.manifest.get("integrity") or {}
    groups, checks, sources = [], list(entry.get("checks") or []), []
    if "findings" in entry:
        groups.append(findings_from_json(entry["findings"]))
        sources.append("manifest")
    path = run.path / CHECK_FILE
    if path.is_file():
        with reading(path, InputError):
            extra = json.loads(path.read_text(encoding="utf-8"))
            groups.append(findings_from_json(extra.get("findings")))
        checks += [c for c in extra.get("checks") or [] if c not in checks]
        sources.append(CHECK_FILE)
    return merge_findings(*groups), checks, sources


def integrity_note(run: Run, *, first: int = 5) -> HTML:
    """The knowledge base's integrity at the top of a report: one row per check that found something (check,
    meaning, severity, count, first subjects), ``No problems found by N checks`` when clean, a warning when
    the knowledge base changed during the run, and the counts per knowledge base; every text escaped."""
    from weknora_nb.core.integrity import PROBLEM, summary_rows

    findings, checks, sources = integrity_findings(run)
    entry = run.manifest.get("integrity") or {}
    if not sources:
        why = entry.get("skipped") or "the run was collected before the checks existed"
        return HTML(safe.text(f"No integrity check is recorded for this run ({why}). Run weknora-nb check against "
                              "the knowledge base before trusting low figures: a missing or disabled labelled "
                              "chunk lowers them for a reason that is not retrieval's."))
    n_problems = sum(f.severity == PROBLEM for f in findings)
    parts = []
    if any(f.check == "changed_during_run" for f in findings):
        parts.append('<p class="weknora-failed"><b>' + safe.esc(
            "The knowledge base changed during the run: the figures mix two states of it (the method forbids "
            "changing content, index or ranking parameters mid-test).") + "</b></p>")
    if findings:
        parts.append(safe.table(pd.DataFrame(summary_rows(findings, first=first),
                                             columns=["check", "meaning", "severity", "count", "problems",
                                                      "first subjects"])))
    verdict = (f"{n_problems} problem(s) found by {len(checks)} checks" if n_problems else
               f"No problems found by {len(checks)} checks" + (f"; {len(findings)} finding(s) for information"
                                                               if findings else ""))
    parts.append(safe.text(f"{verdict} (from the {' and '.join(sources)})."))
    kbs = (entry.get("facts") or {}).get("knowledge_bases") or {}
    if kbs:
        parts.append(safe.table(pd.DataFrame(
            [{"knowledge base": kb, "knowledge": f["knowledge"], "chunks": f["chunks"], "disabled": f["disabled"],
              "chunk types": ", ".join(f"{t} {n}" for t, n in f["chunk_types"].items())} for kb, f in kbs.items()])))
    return HTML("\n".join(parts))


def broken_labels(run: Run, query_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """The labels (of ``query_ids``, default all) that point at broken chunks: ``query_id``, ``chunk_id``,
    ``grade``, ``integrity`` (``missing``, ``disabled``, ``parse failed``, ``no embedding``, ``duplicated``:
    :data:`~weknora_nb.core.integrity.BROKEN_CHUNK`), from :func:`integrity_findings`."""
    from weknora_nb.core.integrity import broken_chunks

    broken = broken_chunks(integrity_findings(run)[0])
    qrels = run.testset.qrels
    if query_ids is not None:
        qrels = qrels[qrels["query_id"].isin(list(query_ids))]
    hit = qrels[qrels["chunk_id"].isin(broken.keys())]
    return pd.DataFrame({"query_id": hit["query_id"].astype(str), "chunk_id": hit["chunk_id"].astype(str),
                         "grade": hit["grade"].astype(int),
                         "integrity": [", ".join(broken[c]) for c in hit["chunk_id"]]}).reset_index(drop=True)


def drilldown(run: Run, diagnosis: Any, query_id: str, *, open_: bool = True) -> HTML:
    """One degraded query's drill-down (:func:`weknora_nb.reports.drill_view.drilldown_html`: the grid of what
    each stage returned) with an ``integrity`` column beside its labels: what is wrong with a labelled chunk
    (missing, disabled, parse failed, no embedding, duplicated), empty when nothing is; ``open_``: shown open."""
    from weknora_nb.core.integrity import broken_chunks
    from weknora_nb.reports.drill_view import drilldown_html

    dd = diagnosis.drilldown(query_id)
    broken = broken_chunks(integrity_findings(run)[0])
    dd["labels"] = dd["labels"].assign(integrity=[", ".join(broken.get(str(c), [])) for c in dd["labels"]["chunk_id"]])
    return HTML(drilldown_html(dd, open_=open_, definitions=run.manifest.get("stages") or {}))


def drilldowns(run: Run, diagnosis: Any, query_ids: list[str], interactive: bool) -> None:
    """The drill-downs of ``query_ids``: behind a query dropdown (live), or each in a block of its own, the first
    :data:`~weknora_nb.reports.drill_view.OPEN` open and the others collapsed to one line (static)."""
    from weknora_nb.reports.drill_view import OPEN

    if interactive:
        choose(lambda query_id: drilldown(run, diagnosis, query_id), interactive, query_id=query_ids)
        return
    for i, qid in enumerate(query_ids):
        display(drilldown(run, diagnosis, qid, open_=i < OPEN))
