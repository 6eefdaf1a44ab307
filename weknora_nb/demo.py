"""The demo: the whole workbench on the embedded sandbox, end to end.

Builds the sandbox index, serves each system version of the demo folder's ``versions.yaml``
(shipped inside the package, see :func:`weknora_nb.sandbox.demo_dir`) on loopback, ``jobs``
versions at a time (one per core by default, each in a worker process of its own with its own
server: the server and its collector share a process, so one process uses one core), collects
the demo test set at every stage with 3 repeats, judges the answers of
:data:`JUDGED_VERSIONS` with the sandbox's rule-based judge, checks each version's knowledge
base (the API, its Postgres tables as a read-only role, the test set traced into the vector
store: ``check.json`` and ``vector_trace*`` in the run folder), grades the pools of
:data:`GRADED_VERSIONS` with the sandbox's rule-based relevance grader and puts the demo's human sample beside the
grades (docs/method.md section 16: notebooks 02 and 05 show the corrected figures), renders all reports (baseline
alone, then each other version compared with the baseline, except those measured on a test set
of their own: the FAQ knowledge base's, the parent-child one's), stops the sandbox and returns
the path of ``<out>/reports/index.html``.

Cold start (docs/method.md section 17): before the versions are measured, :func:`generate_coldstart` generates
:data:`COLDSTART_N` questions from the first version's chunks with the sandbox's rule-based generator
(``weknora-nb testset generate``), and the run :data:`COLDSTART` measures them together with the labelled ones at
the retrieval paths (:data:`COLDSTART_STAGES`): its 03_stratify page sets their figures and overlap beside the
labelled set's.

Nothing here needs a checkout: the demo data and the notebooks are read from the installed
package, and everything is written under ``out`` (``./outputs`` by default, relative to the
current folder).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import multiprocessing
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from weknora_nb.collect.checks.embeddings import EMBEDDINGS_API_KEY_ENV, EmbeddingSettings
from weknora_nb.collect.checks.integrity import run_checks
from weknora_nb.collect.http.client import API_KEY_ENV, ClientSettings
from weknora_nb.collect.judge.llm import JUDGE_API_KEY_ENV, LLMSettings
from weknora_nb.collect.judge.manifest import RULE_GRADER_MODEL, RULE_JUDGE_MODEL
from weknora_nb.collect.judge.options import JudgeOptions
from weknora_nb.collect.judge.pointwise import judge_run
from weknora_nb.collect.run.collector import collect
from weknora_nb.collect.run.results import RunSummary
from weknora_nb.core.errors import RunExistsError, UsageError
from weknora_nb.core.progress import progress_bar
from weknora_nb.core.segmenter import jieba_ready
from weknora_nb.core.testset import load_testset
from weknora_nb.reports.index_page import write_overview
from weknora_nb.reports.render import Report, ReportRequest, render_reports
from weknora_nb.sandbox import SandboxServer, VersionConfig, build_index, demo_dir, load_demo_versions

log = logging.getLogger(__name__)
DEMO_STAGES = "vector,keyword,hybrid,final,citations"
#: a version with an FAQ knowledge base measures that base on its own test set (no keyword path there, C20)
FAQ_STAGES = "vector,hybrid,final,faq"
#: the single-path stages, which a parent-child version leaves out (its paths search what baseline's search)
PATH_STAGES = ("vector", "keyword")
#: the versions whose answers the sandbox's rule-based judge scores (docs/method.md section 11)
JUDGED_VERSIONS = ("baseline", "rerank")
#: the versions whose pools (the top 10 of their final stage) the sandbox's rule-based relevance grader grades, with
#: 100 labelled chunks to calibrate it (docs/method.md section 16)
GRADED_VERSIONS, GRADED_STAGE, GRADED_DEPTH, CALIBRATION = ("baseline", "rerank"), "final", 10, 100
#: the run of the cold-start set (labelled and generated questions together), the questions generated, its stages
COLDSTART, COLDSTART_N, COLDSTART_STAGES = "coldstart", 60, "vector,keyword,hybrid"


@dataclass
class DemoResult:
    """What the demo wrote: the overview page, each version's report, and the wall time of each phase (s)."""

    index: Path
    reports: list[Report]
    seconds: dict[str, float] = field(default_factory=dict)


#: the demo's test sets besides ``testset.jsonl``, by knowledge base: the FAQ knowledge base's, and the document one
#: chunked parent-child (its labels carried over to the children, ``parent-child/README.md``)
OTHER_TESTSETS = {"faq": "faq/testset.jsonl", "parent-child": "parent-child/testset.jsonl"}


def demo_testset(out: Path, limit: int | None = None, *, faq: bool = False, kind: str | None = None) -> Path:
    """The demo test set of a knowledge base (``kind``: ``faq`` for the FAQ knowledge base's, ``faq/testset.jsonl``;
    ``parent-child`` for the document knowledge base chunked parent-child, ``parent-child/testset.jsonl``; None, the
    flat document one, ``testset.jsonl``; ``faq`` = True is ``kind="faq"``): the shipped file, or (``limit`` = N) its
    first N queries in file order, written to ``<out>/testset-first-<N>.jsonl`` (``<kind>-testset-first-<N>.jsonl``)
    so that the runs' manifests point to a file that stays."""
    kind = "faq" if faq else kind
    full = demo_dir() / (OTHER_TESTSETS[kind] if kind else "testset.jsonl")
    if limit is None:
        return full
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UsageError(argument="limit", allowed="an integer >= 1", got=limit)
    ts = load_testset(full)
    first = ts.queries["query_id"].tolist()[:limit]
    path = out / f"{kind + '-' if kind else ''}testset-first-{limit}.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    ts.subset(first).to_jsonl(path)
    return path


@dataclass(frozen=True)
class VersionJob:
    """What the demo measures of one version: ``testset`` collected at ``stages`` into ``run_dir`` (``faq``: from
    the FAQ knowledge base), then judged (``judge``) and checked; ``collect`` holds the collector's other
    keyword arguments (repeats, concurrency, progress)."""

    version: str
    testset: Path
    run_dir: Path
    faq: bool
    judge: bool
    stages: str
    collect: dict[str, Any]
    name: str | None = None   # the run's name (default: the version's)
    check: bool = True


def measure_version(job: VersionJob) -> RunSummary:
    """Collect, judge and check one version (:func:`_collect_version`): what a demo worker process runs."""
    return _collect_version(job.version, job.testset, job.run_dir, faq=job.faq, judge=job.judge,
                            stages=job.stages, name=job.name, check=job.check, **job.collect)


def measure_versions(jobs: list[VersionJob], *, workers: int, progress: bool,
                     before: Callable[[], None] | None = None) -> list[RunSummary]:
    """Measure every version of ``jobs``, ``workers`` at a time, and return their summaries in ``jobs``' order.

    With one worker (or one version) they run one after another in this process, with the collector's progress
    bars. With more, each runs in a worker process (started afresh: nothing of this process's state is copied)
    whose log records reach this process's handlers; the progress bar counts finished versions. The first
    version to fail stops those not yet started and its error is raised once the running ones end (what they
    collected is in their checkpoints: a rerun resumes it). ``before`` runs here first (the demo's index
    build), while the workers start and import what they run (:func:`_ready_worker`).
    """
    if workers <= 1 or len(jobs) <= 1:
        if before is not None:
            before()
        return [measure_version(j) for j in jobs]
    quiet = [replace(j, collect={**j.collect, "progress": False}) for j in jobs]
    context = multiprocessing.get_context("spawn")
    n = min(workers, len(jobs))
    with _worker_logging(context) as queue:
        pool = ProcessPoolExecutor(max_workers=n, mp_context=context, initializer=_init_worker,
                                   initargs=(queue, logging.getLogger().getEffectiveLevel()))
        try:
            for _ in range(n):
                pool.submit(_ready_worker)   # each starts a worker now; the versions queue behind
            if before is not None:
                before()
            longest_first = sorted(range(len(jobs)), key=lambda i: _weight(jobs[i]), reverse=True)
            submitted = {i: pool.submit(measure_version, quiet[i]) for i in longest_first}  # workers end together
            futures = [submitted[i] for i in range(len(jobs))]
            _wait_for_versions(futures, [j.version for j in jobs], progress)
            return [f.result() for f in futures]
        finally:
            # every version has ended (or never started): the workers exit on their own, their interpreters'
            # teardown overlapping what comes next instead of being waited for
            pool.shutdown(wait=False, cancel_futures=True)


def _ready_worker() -> None:
    """In a demo worker process, before its first version: what every version runs imported, jieba started."""
    import weknora_nb.sandbox.runner  # noqa: F401 - the server, the engine and Postgres's client

    jieba_ready()


def _weight(job: VersionJob) -> tuple[bool, bool, int]:
    """How long a version takes, roughly, to order them: judged ones first, then those of the full test set (not
    the FAQ's), then by their number of stages."""
    return job.judge, not job.faq, len(job.stages.split(","))


def _wait_for_versions(futures: list[Future[RunSummary]], names: list[str], progress: bool) -> None:
    """Wait until every future is done or one failed (then cancel those not started), a bar of finished versions
    shown (``progress``), moved as each one ends."""
    bar = progress_bar(total=len(futures), desc="measuring versions", unit="version", disable=not progress)
    pending: set[Future[RunSummary]] = set(futures)
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            bar.set_postfix_str(", ".join(n for n, f in zip(names, futures, strict=True) if f.done()), refresh=False)
            bar.update(len(done))
            bar.refresh()   # a version is worth a line, whatever the bar's interval
            if any(f.exception() is not None for f in done):
                for f in pending:
                    f.cancel()
                wait(pending)
                return
    finally:
        bar.close()


@contextmanager
def _worker_logging(context: Any) -> Iterator[Any]:
    """A queue the worker processes log into, and a listener handing its records to this process's handlers."""
    queue = context.Queue()
    listener = logging.handlers.QueueListener(queue, _ToRoot())
    listener.start()
    try:
        yield queue
    finally:
        listener.stop()


class _ToRoot(logging.Handler):
    """Hands a record from a worker to the logger it was made by, here (and so to this process's handlers)."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


def _init_worker(queue: Any, level: int) -> None:
    """In a demo worker process: every log record goes to ``queue`` (the parent shows it), at ``level``."""
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(queue)]
    root.setLevel(level)


def _collect_version(version: str, testset: Path, run_dir: Path, *, faq: bool = False, judge: bool = False,
                     name: str | None = None, check: bool = True, **kwargs: Any) -> RunSummary:
    """Serve ``version`` and collect ``testset`` into ``run_dir`` (``faq``: from the FAQ knowledge base) as the run
    ``name`` (default the version's): resumed when the folder holds the same run, collected afresh when it holds
    another one (an older demo, another ``limit``); ``judge``: then judge its answers with the sandbox's rule-based
    judge; ``check``: then check the knowledge base."""
    with SandboxServer(version) as sb:
        kwargs.update(system=sb.describe(), run_name=name or version)
        settings = ClientSettings(sb.base_url)
        kb = sb.faq_kb_id if faq else sb.kb_id
        try:
            summary = collect(settings, kb, testset, run_dir, resume=(run_dir / "manifest.json").exists(), **kwargs)
        except RunExistsError:
            log.info("%s holds an older demo run: collecting it again", run_dir)
            shutil.rmtree(run_dir)
            summary = collect(settings, kb, testset, run_dir, **kwargs)
        if judge:
            _judge(sb, run_dir, progress=bool(kwargs.get("progress")))
        if check:
            _check(sb, kb, testset, run_dir, progress=bool(kwargs.get("progress")))
        return summary


def _stages_for(version: VersionConfig, stages: str) -> str:
    """The stages a version is measured at: an FAQ version's (:data:`FAQ_STAGES`), a version with seeded integrity
    faults only the retrieval stages of ``stages`` (its point is what the check finds and what it costs retrieval),
    a parent-child version those of ``stages`` from hybrid on (its children index the flat chunks' texts, so its
    vector and keyword paths find what baseline's find; the hybrid stage stays for the diagnosis of the later
    ones), the others ``stages``."""
    if version.faq_enabled:
        return FAQ_STAGES
    if any(version.integrity_faults().values()):
        return ",".join(s for s in stages.split(",") if s != "citations")
    if version.parent_child is not None:
        return ",".join(s for s in stages.split(",") if s not in PATH_STAGES) or stages
    return stages


def _check(sb: SandboxServer, kb: str, testset: Path, run_dir: Path, *, progress: bool) -> None:
    """``weknora-nb check`` of the served version into the run folder (``check.json``, the vector-store trace):
    the API checks, the Postgres checks as a read-only role, and the test set's queries traced into the store
    with the sandbox's embeddings endpoint. The role's password lives only in this process."""
    os.environ.setdefault(EMBEDDINGS_API_KEY_ENV, os.environ[API_KEY_ENV])  # the endpoint takes a sandbox key
    dsn = sb.reader_dsn(secrets.token_hex(16))
    model = sb.version.embedding_model
    result = run_checks(ClientSettings(sb.base_url), [kb], testset=testset, dsn=dsn,
                        embeddings=EmbeddingSettings(sb.embeddings_url, model), progress=progress)
    result.write(run_dir)
    log.info("checked %s: %d problem(s) in %d finding(s)", run_dir.name, len(result.problems), len(result.findings))


def _judge(sb: SandboxServer, run_dir: Path, *, progress: bool) -> None:
    """Judge the run's answers with the sandbox's rule-based judge (a rerun is served by the judge's cache)."""
    os.environ.setdefault(JUDGE_API_KEY_ENV, os.environ[API_KEY_ENV])  # the sandbox judge takes a sandbox key
    outcome = judge_run(run_dir, LLMSettings(f"{sb.base_url}/v1", RULE_JUDGE_MODEL),
                        JudgeOptions(repeats=3, concurrency=8, progress=progress))
    log.info("judged %s: %d judged, %d failed, %d calls, %d from the cache", run_dir.name, outcome.judged,
             outcome.failed, outcome.calls_made, outcome.cache_hits)


def _grade(out: Path, testset: Path, *, progress: bool) -> None:
    """Grade the pools of :data:`GRADED_VERSIONS` with the sandbox's rule-based relevance grader into
    ``<out>/runs/relevance-grades.jsonl`` (a rerun is served by the cache), and put the demo's human sample beside
    it (``relevance-labels.jsonl``: the labels of the queries ``testset label-next`` drew, those of ``testset``)."""
    from weknora_nb.analysis.grade_pool import grading_items
    from weknora_nb.collect.judge.relevance import GRADE_DEFAULTS, grade_items
    from weknora_nb.core.files import atomic_path
    from weknora_nb.core.grades import GRADES_FILE
    from weknora_nb.reports.grades_view import LABELS_FILE

    runs = [out / "runs" / v for v in GRADED_VERSIONS]
    items, pool, _ = grading_items(testset, runs, depth=GRADED_DEPTH, stages=[GRADED_STAGE], calibration=CALIBRATION)
    os.environ.setdefault(JUDGE_API_KEY_ENV, os.environ[API_KEY_ENV])  # the sandbox's grader takes a sandbox key
    with SandboxServer(GRADED_VERSIONS[0]) as sb:
        outcome = grade_items(items, out / "runs" / GRADES_FILE, LLMSettings(f"{sb.base_url}/v1", RULE_GRADER_MODEL),
                              JudgeOptions(**GRADE_DEFAULTS, concurrency=16, progress=progress), pool=pool)
    log.info("graded %d chunks (%d failed), %d calls, %d from the cache", outcome.judged, outcome.failed,
             outcome.calls_made, outcome.cache_hits)
    known = set(load_testset(testset).queries["query_id"])
    lines = (demo_dir() / "sample-labels.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    with atomic_path(out / "runs" / LABELS_FILE) as tmp:
        tmp.write_text("".join(x for x in lines if x.strip() and json.loads(x)["query_id"] in known), encoding="utf-8")
def generate_coldstart(out: Path, version: str, labelled: Path, n: int, *, progress: bool) -> Path:
    """Serve ``version``, generate ``n`` questions from its chunks with the sandbox's rule-based generator into
    ``<out>/generated/testset.jsonl`` (a rerun is served by its log), and write them with the ``labelled`` ones as
    ``<out>/testset-coldstart.jsonl``, the generation's closing note beside it; that path."""
    from weknora_nb.analysis.sampling import summary_path
    from weknora_nb.analysis.synthetic.curate import SyntheticCurator
    from weknora_nb.collect.generate.run import RULE_GENERATOR_MODEL, generate_testset
    from weknora_nb.core.synthetic import GenerateOptions
    from weknora_nb.core.testset import TestSet

    os.environ.setdefault(JUDGE_API_KEY_ENV, os.environ[API_KEY_ENV])  # the sandbox's generator takes a sandbox key
    generated = out / "generated" / "testset.jsonl"
    generated.parent.mkdir(parents=True, exist_ok=True)
    embedder = build_index().embedder(load_demo_versions()[version].embedding_model)
    with SandboxServer(version) as sb:   # the round trips' and the collection's query embeddings: one batch
        outcome = generate_testset(ClientSettings(sb.base_url), sb.kb_id, LLMSettings(f"{sb.base_url}/v1",
                                   RULE_GENERATOR_MODEL), JudgeOptions(concurrency=8, progress=progress),
                                   GenerateOptions(n=n), generated, SyntheticCurator, prefetch=embedder.queries)
    log.info("generated %d of %d questions from %s's chunks", outcome.note.get("kept"), n, version)
    path = out / "testset-coldstart.jsonl"
    TestSet.from_records([*load_testset(labelled).records(), *load_testset(generated).records()]).to_jsonl(path)
    note = {"combined": [str(labelled), str(generated)], "generated": outcome.note}
    summary_path(path).write_text(json.dumps(note, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def _render_all(out: Path, names: list[str], alone: set[str], show_code: bool,
                jobs: int | None = None) -> tuple[Path, list[Report]]:
    """Render the first version alone and every other one against it, except those of ``alone``
    (measured on another test set: nothing to compare), all reports' notebooks ``jobs`` at a time
    (default one per core); write the overview page."""
    runs, reports_dir = out / "runs", out / "reports"
    base = runs / names[0]
    requests = [ReportRequest(runs / v, [] if v in alone or v == names[0] else [base], reports_dir, show_code)
                for v in names]
    reports = render_reports(requests, jobs=jobs)
    return write_overview(reports, reports_dir / "index.html"), reports


def run_demo(out: str | Path = "outputs", *, repeats: int = 3, versions: list[str] | None = None,
             stages: str = DEMO_STAGES, show_code: bool = False, progress: bool = True,
             concurrency: int = 16, limit: int | None = None, jobs: int | None = None,
             coldstart: bool = True) -> DemoResult:
    """Run the demo into ``out`` (relative to the current folder) and return what it wrote.

    Parameters
    ----------
    out : folder for ``runs/<version>/`` and ``reports/`` (default ``outputs``).
    repeats : repeats of every (query, stage) request (docs/method.md section 2; default 3).
    versions : system versions of ``versions.yaml`` to run, the first being the baseline
        (default: all, in file order).
    stages, concurrency, progress : passed on to :func:`weknora_nb.collect.collect`.
    show_code : show the code cells in the HTML reports (hidden by default: a report is read, not run).
    limit : use only the first ``limit`` queries of the demo test set (quick runs and tests;
        the figures then rest on fewer than 200 valid queries and the reports say so).
    jobs : versions measured at a time, each in a worker process, and notebooks rendered at a time
        (default: one per core; 1: everything in this process, one after another).
    coldstart : generate the cold-start set from the first version's chunks and measure it as the run
        :data:`COLDSTART` (:func:`generate_coldstart`; not when the first version is an FAQ one).

    ``seconds`` of the result holds the wall time of each phase: ``index``, ``generate``, ``collect``, ``grade``,
    ``render``.
    """
    out = Path(out).resolve()
    if not os.environ.get(API_KEY_ENV):
        # the sandbox and the collector read the same variable; it lives only in this process
        os.environ[API_KEY_ENV] = f"sk-sandbox-{secrets.token_hex(12)}"
    all_versions = load_demo_versions()
    names = versions or list(all_versions)
    faq = {v for v in names if all_versions[v].faq_enabled}

    parent_child = {v for v in names if all_versions[v].parent_child is not None}
    seconds: dict[str, float] = {}

    cold = [COLDSTART] if coldstart and names[0] not in faq else []

    def build() -> None:
        t0 = time.perf_counter()
        build_index(show_progress=progress)
        for v in names:
            build_index(parent_child=all_versions[v].parent_child).warm(all_versions[v])
        seconds["index"] = time.perf_counter() - t0
        if cold:
            generate_coldstart(out, names[0], demo_testset(out, limit), min(COLDSTART_N, limit or COLDSTART_N),
                               progress=progress)
            seconds["generate"] = time.perf_counter() - t0 - seconds["index"]

    def kind(v: str) -> str | None:
        return "faq" if v in faq else "parent-child" if v in parent_child else None

    t0 = time.perf_counter()
    collect_options = {"repeats": repeats, "concurrency": concurrency, "progress": progress}
    work = [VersionJob(v, demo_testset(out, limit, kind=kind(v)), out / "runs" / v, faq=v in faq,
                       judge=v in JUDGED_VERSIONS and "citations" in stages and v not in faq,
                       stages=_stages_for(all_versions[v], stages), collect=collect_options)
            for v in names]
    work += [VersionJob(names[0], out / "testset-coldstart.jsonl", out / "runs" / c, faq=False, judge=False,
                        stages=COLDSTART_STAGES, collect=collect_options, name=c, check=False) for c in cold]
    for summary in measure_versions(work, workers=jobs or os.cpu_count() or 1, progress=progress, before=build):
        log.info(summary.describe())
    # the workers started during the index (and the cold-start set's generation)
    seconds["collect"] = time.perf_counter() - t0 - seconds["index"] - seconds.get("generate", 0.0)

    t0 = time.perf_counter()
    if all(v in names for v in GRADED_VERSIONS) and GRADED_STAGE in stages.split(","):
        _grade(out, demo_testset(out, limit), progress=progress)
    seconds["grade"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    index, reports = _render_all(out, names + cold, faq | parent_child | set(cold), show_code, jobs)
    seconds["render"] = time.perf_counter() - t0
    return DemoResult(index, reports, seconds)
