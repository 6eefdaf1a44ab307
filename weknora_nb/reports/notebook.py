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

import glob
import hashlib
import itertools
import json
import logging
import os
import pickle
import stat
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
from IPython.display import HTML, Pretty, display

from weknora_nb.core.errors import WeknoraNbError
from weknora_nb.core.files import waiting_lock
from weknora_nb.core.metrics import DEFAULT_METRICS
from weknora_nb.core.pipeline import role_of
from weknora_nb.core.run import MANIFEST, RESULTS, Run, flatten, load_run
from weknora_nb.reports import safe
from weknora_nb.reports.tables import all_stages, failure_lines, html_table, report_stage

__all__ = ["open_run", "open_collection", "describe", "manifest_table", "request_counts", "stage_latencies",
           "warnings_note", "settings_note", "excluded_table", "choose", "text", "bullets", "table", "show_html",
           "failure_note", "unless_failed", "stratify", "label_coverage", "traffic_weighted", "integrity_findings",
           "integrity_note", "broken_labels", "drilldown"]


def describe(run: Run, stage: str | None = None) -> str:
    """One line: the run's name, its stages, its test set's hash and (when given) the focus stage."""
    focus = f", focus stage {stage}" if stage is not None else ""
    return f"run {run.name}: stages {all_stages(run)}, test set {run.testset.hash[:19]}...{focus}"


def _figure_style() -> None:
    """:func:`weknora_nb.reports.figures.figure_style`, matplotlib imported only now: the rendering process
    plans its pages with this module and draws nothing (importing pyplot there took 0.45 s of the demo's
    render, before any kernel was busy)."""
    from weknora_nb.reports.figures import figure_style

    figure_style()


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
    _figure_style()
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
        from weknora_nb.collect.client import ClientSettings

        system = yaml.safe_load(Path(system_yaml).read_text(encoding="utf-8")) if system_yaml else None
        summary = run_collection(ClientSettings(base_url), kb_ids, testset_path, run_dir, stages=stages,
                                 repeats=repeats, concurrency=concurrency, system=system,
                                 resume=Path(run_dir, MANIFEST).exists())
        display(Pretty(summary.describe()))
    run = cached_run(run_dir)
    _figure_style()
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


def table(df: pd.DataFrame, *, index: bool = False) -> HTML:
    """A DataFrame shown as an escaped HTML table (:func:`safe.table`); ``index``: show its row labels."""
    return HTML(safe.table(df, index=index))


def show_html(html: str) -> HTML:
    """``html`` shown as HTML: only what :mod:`weknora_nb.reports.safe` or :mod:`.tables` built (escaped)."""
    return HTML(html)


def failure_note(run: Run, stages: Iterable[str] | None = None) -> HTML | None:
    """The sentence ``Every request of stage X failed (kinds: ...)`` for each such stage (of ``stages``,
    default all), escaped; None when there is none."""
    lines = failure_lines(run.scores, None if stages is None else list(stages))
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
    """What was run against what: the manifest flattened to key / value (it holds no secret)."""
    flat = flatten({k: v for k, v in run.manifest.items() if k not in ("counts",)})
    df = pd.DataFrame([(k, json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v)
                       for k, v in flat.items()], columns=["key", "value"])
    return HTML(html_table(df))


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
        rules_digest = None if rules is None else _file_digest(Path(rules))
    except OSError:
        key = None  # by_group says what is wrong with the rules file
    else:
        key = _derived_key(run, "stratify", stage, rules_digest, resamples)
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
    """The run's warnings (incomplete, too few valid queries, adjusted thresholds), or that there is none."""
    return bullets(run.scores.warnings, empty="No warnings: the run is complete and the test set is large enough.")


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

    t = cached("coverage", _derived_key(run, "coverage", k), lambda: coverage_table([run], k=k))
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


def drilldown(run: Run, diagnosis: Any, query_id: str) -> HTML:
    """One degraded query's drill-down (:func:`weknora_nb.reports.tables.drilldown_html`) with an ``integrity``
    column beside its labels: what is wrong with a labelled chunk (missing, disabled, parse failed, no
    embedding, duplicated), empty when nothing is."""
    from weknora_nb.core.integrity import broken_chunks
    from weknora_nb.reports.tables import drilldown_html

    dd = diagnosis.drilldown(query_id)
    broken = broken_chunks(integrity_findings(run)[0])
    dd["labels"] = dd["labels"].assign(integrity=[", ".join(broken.get(str(c), [])) for c in dd["labels"]["chunk_id"]])
    return HTML(drilldown_html(dd))


# ---------------------------------------------------------------------------------------
# the render cache: what a rendering computes from a run, computed once
# ---------------------------------------------------------------------------------------
__all__ += ["CACHE_ENV", "cache_folder", "cached", "cached_run"]
log = logging.getLogger(__name__)
#: the environment variable naming the render cache's folder (set in the kernels that render reports;
#: unset in a live session, where nothing is cached)
CACHE_ENV = "WEKNORA_NB_CACHE"
#: the environment variable holding the rendering process's :func:`code_version` in its kernels
CODE_ENV = "WEKNORA_NB_CACHE_CODE"
_CACHE_FORMAT = "2"  # 2: entries compressed with Zstandard (_pack)
_MISS = object()
_refused: set[str] = set()
#: the render-cache key of each run :func:`cached_run` returned, by id (with a reference to check it is that run)
_run_keys: dict[int, tuple[weakref.ref, tuple[str, str]]] = {}
T = TypeVar("T")


def cache_folder() -> Path | None:
    """The render cache's folder (:data:`CACHE_ENV`), or None: nothing is cached."""
    value = os.environ.get(CACHE_ENV)
    return Path(value) if value else None


def _digest(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode("utf-8", "surrogatepass")).hexdigest()


def _file_digest(path: Path) -> str:
    """SHA-256 of the bytes of ``path`` (OSError when it cannot be read)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def code_version() -> str:
    """What a cached value depends on besides its inputs: the package's source, Python and the libraries
    whose objects are stored (a change to any of them is a different key). A rendering's kernels take
    the rendering process's (:data:`CODE_ENV`), so that all of one rendering's entries have one."""
    return os.environ.get(CODE_ENV) or _source_version()


@lru_cache(maxsize=1)
def _source_version() -> str:
    import pyarrow

    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{sys.version} {pd.__version__} {np.__version__} {pyarrow.__version__}".encode())
    for p in sorted(pkg.rglob("*.py")):
        h.update(str(p.relative_to(pkg)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _run_key(run_dir: str | Path, metrics: Iterable[str] | None, domain_adjustment: float) -> tuple[str, str] | None:
    """The key of a run loaded and scored: ``(slot, content)``, the slot naming what was asked (the run
    folder, the metrics, the adjustment), the content hashing the bytes of its manifest, results table and
    test set with :func:`code_version`. None when a file cannot be read (then nothing is cached and
    :func:`load_run` says what is wrong)."""
    from weknora_nb.core.metrics import parse_metrics
    from weknora_nb.core.run import _recorded_testset, read_manifest

    p = Path(run_dir).resolve()
    try:
        names = tuple(m.name for m in parse_metrics(metrics))  # None and the default list: one slot
        testset = _recorded_testset(p, read_manifest(p)).resolve()
        files = [_file_digest(f) for f in (p / MANIFEST, p / RESULTS, testset)]
    except (WeknoraNbError, OSError):
        return None
    slot = _digest("run", p, names, float(domain_adjustment))
    return slot, _digest(_CACHE_FORMAT, code_version(), slot, testset, *files)


def usable_cache(folder: Path) -> bool:
    """Make ``folder`` (mode 0700) and tell whether it may hold the cache: a real folder (not a link) of
    this user that no one else can write to, since what it holds is loaded with pickle. Said once when not."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.lstat()
    except OSError as exc:
        problem = f"it cannot be made ({exc.strerror or exc})"
    else:
        uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
        problem = ("it is a link" if stat.S_ISLNK(st.st_mode) else
                   "it is not a folder" if not stat.S_ISDIR(st.st_mode) else
                   "it belongs to another user" if st.st_uid != uid else
                   "others can write to it" if st.st_mode & 0o022 else "")
    if problem and str(folder) not in _refused:
        _refused.add(str(folder))
        log.warning("render cache %s not used: %s; everything is computed", folder, problem)
    return not problem


def _entry(folder: Path, kind: str, key: tuple[str, str]) -> Path:
    return folder / f"{kind}-{key[0][:16]}-{key[1][:32]}.pickle.z"


def _load(path: Path) -> Any:
    """The value stored at ``path``, or :data:`_MISS` (no entry, one this user did not write, or one
    that cannot be read back: it is then computed again)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return _MISS
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o022:
            return _MISS
        try:
            return _unpack(f.read())
        except Exception as exc:  # noqa: BLE001 - an entry from another version or a damaged one: a miss
            log.debug("render cache entry %s not used: %s", path, exc)
            return _MISS


#: how an entry is compressed: Zstandard at level 1 (pyarrow's codec). On a run's 34 MB pickle it takes a third
#: of zlib's level 1 time to write (0.025 s against 0.090) and half to read (0.025 s against 0.054), and the entry
#: is smaller (1.6 MB against 2.5); a rendering reads each run's entry once per page that shows it
_CODEC, _LEVEL = "zstd", 1


def _pack(value: Any) -> bytes:
    """An entry's bytes: the length of ``value``'s pickle (8 bytes, little-endian), then the pickle compressed."""
    raw = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return len(raw).to_bytes(8, "little") + pa.Codec(_CODEC, _LEVEL).compress(raw, asbytes=True)


def _unpack(data: bytes) -> Any:
    """The value of an entry :func:`_pack` wrote (what damaged bytes raise, the caller takes as a miss)."""
    size = int.from_bytes(data[:8], "little")
    return pickle.loads(pa.Codec(_CODEC).decompress(memoryview(data)[8:], size, asbytes=True))


def _store(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` atomically (a private temporary file renamed over it), then remove
    the entries of the same slot with another content (older inputs). A failure to write is logged:
    the cache only saves time."""
    data = _pack(value)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".z")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("render cache entry %s not written: %s", path, exc.strerror or exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return
    slot = path.name.rsplit("-", 1)[0]
    for old in path.parent.glob(f"{glob.escape(slot)}-*.pickle.z"):
        if old.name != path.name:
            old.unlink(missing_ok=True)


def cached(kind: str, key: tuple[str, str] | None, compute: Callable[[], T], *, folder: Path | None = None) -> T:
    """``compute()``, computed once for ``key`` and kept in the render cache.

    ``folder``: the cache's folder (default :func:`cache_folder`; None there: ``compute()``, nothing
    kept). ``key``: ``(slot, content)`` (None: not cached); a new content replaces the slot's older
    entry. Kernels rendering at the same time share the folder: the first to need a value computes
    it while the others wait for it (a lock per slot), and entries are written atomically (a reader
    sees a whole entry or none). Values must pickle.
    """
    folder = folder if folder is not None else cache_folder()
    if key is None or folder is None or not usable_cache(folder):
        return compute()
    path = _entry(folder, kind, key)
    value = _load(path)
    if value is _MISS:
        with _computing(path):
            value = _load(path)  # stored by the process that held the lock before
            if value is _MISS:
                value = compute()
                _store(path, value)
    return value


def _computing(entry: Path) -> AbstractContextManager[None]:
    """The lock of ``entry``'s slot (a lock file beside it, :func:`weknora_nb.core.files.waiting_lock`): one
    process computes a value while the others that need it wait, then read it."""
    return waiting_lock(entry.parent / (entry.name.rsplit("-", 1)[0] + ".lock"))


def cached_run(run_dir: str | Path, *, metrics: Iterable[str] | None = None, domain_adjustment: float = 0.0,
               folder: Path | None = None) -> Run:
    """:func:`weknora_nb.core.run.load_run` of ``run_dir`` (``metrics``, ``domain_adjustment``), from the
    render cache when the run's manifest, results table and test set are the bytes it was computed from.

    A rendering's kernels set it as :data:`weknora_nb.core.run.run_cache`, so that the runs other
    functions load (a comparison's, the history's) come from the cache too.
    """
    metrics = None if metrics is None else list(metrics)
    key = _run_key(run_dir, metrics, domain_adjustment) if (folder or cache_folder()) is not None else None
    run = cached("run", key, lambda: load_run(run_dir, metrics=metrics, domain_adjustment=domain_adjustment,
                                              cache=False), folder=folder)
    if key is not None:
        _run_keys[id(run)] = (weakref.ref(run), key)
        weakref.finalize(run, _run_keys.pop, id(run), None)
    return run


def cached_answer_values(run: Run, stage: str, compute: Callable[[], pd.DataFrame], *,
                         folder: Path | None = None) -> pd.DataFrame:
    """``compute()`` (:func:`weknora_nb.analysis.answers.answer_values` of ``run`` at ``stage``), from the render cache
    when ``run`` came from :func:`cached_run` and its answers and judgements files are the bytes the values were
    computed from. A rendering's kernels set it as :data:`weknora_nb.analysis.answers.values_cache`."""
    from weknora_nb.core.answers import JUDGEMENTS
    from weknora_nb.core.run import ANSWERS

    paths = [run.path / name for name in (ANSWERS, JUDGEMENTS)]
    try:
        files = [_file_digest(p) if p.is_file() else "-" for p in paths]
    except OSError:   # a file that cannot be read: computed, and its error said where it is read
        return compute()
    key = _derived_key(run, "answers", stage)   # the files' bytes are the content: changed, the entry is replaced
    return cached("answers", None if key is None else (key[0], _digest(key[1], *files)), compute, folder=folder)


def _derived_key(run: Run, what: str, *params: object) -> tuple[str, str] | None:
    """The key of a value computed from ``run`` (one :func:`cached_run` returned) with ``params``; None
    for any other run (it is not cached)."""
    known = _run_keys.get(id(run))
    if known is None or known[0]() is not run:
        return None
    slot = _digest(what, known[1][0], *params)
    return slot, _digest(slot, known[1][1])
