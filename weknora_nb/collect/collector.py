"""Collect ranked results from WeKnora over HTTP into a resumable run folder.

A run folder (``outputs/runs/<name>/``) holds:

- ``manifest.json``    what was run against what (never the API key), what the server said
  about itself, counts, times;
- ``checkpoint.jsonl`` one line per finished request, appended as it completes
  (:mod:`weknora_nb.collect.checkpoint`);
- ``results.parquet``  the results table (see :mod:`weknora_nb.core.results`), compiled from
  the checkpoint at the end;
- ``chunks.parquet``   the knowledge bases' chunk inventory (:mod:`weknora_nb.collect.inventory`), and
  ``knowledge.parquet`` their knowledge list (every knowledge, those without chunks too);
- ``answers.jsonl``    the answers and their inline citations of the stages on the chat endpoint;
- ``.collect.lock``    while a collection runs: who runs it (:mod:`weknora_nb.collect.lock`).

``latency_ms`` is the wall time of a request as the collector saw it, retries and their
back-off included (a request that needed a retry is slower for the user too).

The pipeline (:func:`collect_async`): check the arguments (``out`` must be a folder) and the
test set; lock the run folder when it exists (a collector already at work on it refuses this
one at once, :class:`~weknora_nb.core.errors.RunLockedError`); ask the server about its
knowledge bases, version and retrieval config (:mod:`weknora_nb.collect.preflight`: a missing
knowledge base or a refused key stops here, before anything is written); fit the stages to FAQ
knowledge bases; lock (creating it) and open or resume the run folder (refusing a different run); plan
every (query, stage, repeat) not yet done; probe each endpoint once (a refused key or missing
capability stops here; hybrid-search's method is settled, docs/weknora-contract.md C15); warm
up (requests not recorded); run the requests, repeat by repeat, by a bounded pool of workers;
write the chunk inventory; delete the chat sessions the run created (C58/C59); compile the
results; write the final manifest. With ``integrity`` (the default; it needs the inventory) the inventory
is also listed before the requests (its fingerprint, the retrieval config and the knowledge bases'
configuration kept in the manifest: a resumed run keeps its first start), the end inventory is checked
(:mod:`weknora_nb.collect.integrity`) and compared with the start: the manifest's ``integrity`` holds the
findings, and a change during the run is a ``changed_during_run`` finding and a note.
A crash, a kill -9 or Ctrl-C loses at most the requests in flight; running again with
``resume=True`` skips what is done and never writes a duplicate: the checkpoint keeps one final
record per request (a retried failure is replaced by its new outcome). An auth failure in the middle
(a key revoked) stops the collection: the manifest says ``stopped`` and the run can be resumed. So
does a file that cannot be written (a read-only folder, a full disk:
:class:`~weknora_nb.core.errors.StorageError`, ``stopped``) and Ctrl-C (``interrupted``): the
checkpoint is flushed first and the lock is let go however the collection ends.
The test set's path is recorded absolute (report and gate find it from any folder); a resumed run
must have the same test set content, wherever its file now is.

Manifest keys about the server: ``server`` (``GET /api/v1/system/info``, C56, or
``{"error"}``), ``knowledge_bases`` (each one's configuration, C49), ``retrieval_config``
(``raw`` as read and ``effective`` as WeKnora applies it, C30/C57), ``system`` (the user's
description merged over the server's) with ``system_sources``, ``stages.<name>.settings_source``
and, for hybrid-search, ``stages.<name>.method``; ``sessions`` (created, deleted, kept) and
``notes`` (what a reader of the figures must know: stages dropped or added, final and
citations running different settings, no inline citations, escaped content, a knowledge base
that changed during the run); ``integrity`` (``checks``, ``findings``, ``facts``, ``fingerprint``
{start, end}, ``content_changed``, ``retrieval_config_changed``, ``knowledge_base_config_changed``,
``snapshots`` {start, end}; ``{"skipped": why}`` without the checks).

File I/O never runs on the event loop while requests are in flight: the checkpoint is appended
by a thread of its own, the other files are read and written in worker threads
(``asyncio.to_thread``); only the lock's few system calls (before the requests, and after) and
the manifest of a collection that is stopping run on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import numbers
import os
import platform
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from weknora_nb._version import __version__
from weknora_nb.collect.checkpoint import CheckpointWriter, Records, read_checkpoint
from weknora_nb.collect.client import ClientSettings, WeKnoraClient, server_address
from weknora_nb.collect.integrity import integrity_entry, take_snapshot
from weknora_nb.collect.inventory import take_inventory, write_inventory
from weknora_nb.collect.lock import RunLock
from weknora_nb.collect.preflight import ServerFacts, adapt_stages, read_server, system_description
from weknora_nb.collect.retry import run_to_end
from weknora_nb.collect.sessions import delete_sessions
from weknora_nb.collect.stages import DEFAULT_SELECTION, Stage, resolve_stages
from weknora_nb.core.errors import AuthFailed, RequestFailed, RunExistsError, StorageError, UsageError, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.progress import progress_bar
from weknora_nb.core.results import write_results
from weknora_nb.core.run import ANSWERS, CHECKPOINT, CHUNKS, MANIFEST, RESULTS, read_manifest
from weknora_nb.core.testset import TestSet, load_testset

__all__ = ["collect", "collect_async", "RunSummary", "read_checkpoint", "compile_results"]

log = logging.getLogger(__name__)

#: connections per httpx pool; a collection with more requests in flight uses several pools
LANE_SIZE = 8

#: the manifest's parts that must not change when a run is resumed
_COMPARED = ("target", "testset", "stages", "repeats")
#: what defines a stage (the rest of a manifest's stage entry is what the run found out)
_STAGE_DEFINITION = ("endpoint", "params", "keep_match_types")


@dataclass
class RunSummary:
    """The outcome of a collection."""

    run_dir: Path
    counts: dict[str, dict[str, int]]  # stage -> {"ok": n, "<kind>": n}
    n_requests: int
    n_skipped: int
    seconds: float
    complete: bool
    failed: list[dict[str, Any]] = field(default_factory=list)
    request_seconds: float = 0.0  # the request phase alone: first request sent to last one recorded

    @property
    def requests_per_second(self) -> float:
        """Throughput of the request phase (requests recorded / ``request_seconds``)."""
        return self.n_requests / self.request_seconds if self.request_seconds > 0 else 0.0

    def describe(self) -> str:
        """A few lines for a person: requests made and skipped, time, counts per stage and status."""
        rate = f" ({self.requests_per_second:.1f} req/s while requesting)" if self.request_seconds > 0 else ""
        lines = [f"run {self.run_dir}: {self.n_requests} request(s) made, {self.n_skipped} already done, "
                 f"{self.seconds:.1f} s{rate}"]
        for stage, c in self.counts.items():
            parts = ", ".join(f"{k} {v}" for k, v in c.items())
            lines.append(f"  {stage:10s} {parts}")
        if not self.complete:
            lines.append(f"INCOMPLETE: {len(self.failed)} request(s) failed; run again with resume and "
                         "retry_failed (--resume --retry-failed) to retry them")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Arguments:
    """The checked arguments of a collection (``stages`` fitted to the knowledge bases once known)."""

    settings: ClientSettings
    kb_ids: list[str]
    stages: list[Stage]
    repeats: int
    concurrency: int
    warmup: int
    default_stages: bool = False  # no stages were asked for: the defaults, fitted to the knowledge bases
    faq_kb_ids: tuple[str, ...] = ()  # the knowledge bases of type faq (searched by faq-search stages)
    session_title: str = "weknora-nb"  # the title of the chat sessions the run creates


@dataclass
class _Run:
    """A run folder opened for collection: where it is, what it runs, its manifest so far, what is done."""

    run_dir: Path
    name: str
    queries: list[tuple[str, str]]  # (query_id, query text), in test-set order
    manifest: dict[str, Any]
    done: Records

    @property
    def manifest_path(self) -> Path:
        return self.run_dir / MANIFEST

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / CHECKPOINT


class _Request(NamedTuple):
    """One request to make: a query of the test set at a stage, for one repeat."""

    query_id: str
    text: str
    stage: Stage
    repeat: int


async def collect_async(settings: ClientSettings, kb_ids: list[str] | str, testset: TestSet | str | Path,
                        out: str | Path, *, stages: str | Sequence[str | Stage] | None = None,
                        repeats: int = 3, concurrency: int = 8, warmup: int = 5, system: dict | None = None,
                        resume: bool = False, retry_failed: bool = False, inventory: bool = True,
                        progress: bool = True, run_name: str | None = None,
                        keep_sessions: bool = False, integrity: bool = True) -> RunSummary:
    """Collect every (query, stage, repeat) into the run folder ``out``; see the module docstring.

    Parameters
    ----------
    settings : ClientSettings
        Base URL, timeouts, retries; the key comes from ``settings.api_key_env``.
    kb_ids : knowledge base id(s).
    testset : TestSet or path.
    stages : names ("hybrid,final"), or Stage objects; None: the default stages
        (:data:`~weknora_nb.collect.stages.DEFAULT_SELECTION`), fitted to FAQ knowledge bases.
    repeats, concurrency, warmup : N repeats (>= 1), requests in flight (>= 1), warm-up queries per stage (>= 0).
    system : the user's system description (chunking, embedding model, index, thresholds, ...),
        merged over what the server says.
    resume : continue a run in ``out``; without it an existing run is refused.
    retry_failed : with ``resume``, request again what failed before.
    inventory : also fetch the knowledge bases' chunk list into ``chunks.parquet``.
    progress : show a progress bar; run_name : the manifest's name (default: the folder's name).
    keep_sessions : keep the chat sessions the run created (default: deleted at the end).
    integrity : run the integrity checks through the API (needs ``inventory``): the inventory and the
        configs snapshotted at the start and at the end, the end checked; into the manifest's ``integrity``.

    Raises :class:`~weknora_nb.core.errors.UsageError` for an argument out of range (or a keyword
    stage asked for on FAQ knowledge bases only, or an ``out`` that is a file),
    :class:`~weknora_nb.core.errors.RunExistsError` for a run folder that holds a run (without
    ``resume``) or a different run, :class:`~weknora_nb.core.errors.RunLockedError` for a run folder
    another collector is at work on, :class:`~weknora_nb.core.errors.StorageError` for a file that
    cannot be written (what was written before is kept: resume goes on from it),
    :class:`~weknora_nb.core.errors.NotFound` for a knowledge base the server does not have,
    :class:`~weknora_nb.core.errors.AuthFailed` without an API key or when the server refuses it
    (the message says why: platform key without tenant, wrong tenant, missing capability).
    """
    t_start = time.perf_counter()
    args = _checked_arguments(settings, kb_ids, stages, repeats, concurrency, warmup, out)
    options = _Options(system, resume, retry_failed, inventory, progress, run_name, keep_sessions, integrity)
    lock = RunLock(out)
    try:
        if Path(out).is_dir():
            lock.acquire()  # another collector at work on this folder refuses this one at once
        ts, testset_path = await asyncio.to_thread(_load_testset, testset)
        _refuse_used_folder(Path(out), resume)
        done = await _collect(args, ts, testset_path, Path(out), options, lock)
        with _recording_a_stop(done.run):
            await asyncio.to_thread(_write_results, done.args, done.run)
            counts, failed = _tally(done.run.done, done.args.stages)
            await asyncio.to_thread(_write_final_manifest, done.run, counts, failed)
    finally:
        lock.release()
    summary = RunSummary(done.run.run_dir, counts, len(done.todo), done.n_skipped, time.perf_counter() - t_start,
                         not failed, failed, done.request_seconds)
    log.info(summary.describe())
    return summary


@dataclass(frozen=True)
class _Options:
    """The choices of a collection that are not about what is measured (see :func:`collect_async`)."""

    system: dict | None
    resume: bool
    retry_failed: bool
    inventory: bool
    progress: bool
    run_name: str | None
    keep_sessions: bool
    integrity: bool = True


class _Collected(NamedTuple):
    """What the request phase did: the arguments as fitted, the run, the requests made and skipped."""

    args: _Arguments
    run: _Run
    todo: list[_Request]
    n_skipped: int
    request_seconds: float


async def _collect(args: _Arguments, ts: TestSet, testset_path: str | None, out: Path, options: _Options,
                   lock: RunLock) -> _Collected:
    """Ask the server, lock and open the run folder, make the requests, take the inventory, close the sessions.

    A stop on the way is recorded in the manifest before it is raised: an auth failure (``stopped``,
    its sessions deleted), Ctrl-C (``interrupted``), a file that cannot be written (``stopped``).
    """
    async with _lanes(args) as lanes:
        facts = await read_server(lanes[0], args.kb_ids)
        args, notes = _fit_stages(args, facts, options.run_name or out.name)
        lock.acquire()  # creates the folder: nothing was written before the server answered
        run = await asyncio.to_thread(_open_run, args, ts, testset_path, out, (options.system, facts, notes),
                                      options.resume, options.run_name)
        with _recording_a_stop(run):
            start_chunks = await _start_snapshot(run, lanes[0], args, facts, options)
            await asyncio.to_thread(_write_json_atomic, run.manifest_path, run.manifest)
            try:
                todo, n_skipped, request_seconds = await _collect_requests(lanes, args, run, options.retry_failed,
                                                                           options.progress)
                if options.inventory:
                    await _end_inventory(run, lanes[0], args, facts, (options, ts, start_chunks))
            except AuthFailed as exc:
                await _close_sessions(run, lanes, options.keep_sessions)
                await asyncio.to_thread(_write_stopped_manifest, run, "stopped", f"{exc.kind}: {exc}")
                raise
            await _close_sessions(run, lanes, options.keep_sessions)
            _record_findings(run, args, lanes)
    return _Collected(args, run, todo, n_skipped, request_seconds)


async def _start_snapshot(run: _Run, client: WeKnoraClient, args: _Arguments, facts: ServerFacts,
                          options: _Options) -> pd.DataFrame | None:
    """With the integrity checks: the knowledge base as it is before the requests, into the manifest's
    ``integrity.snapshots.start`` (fingerprint, retrieval config, knowledge bases' configuration); the start
    inventory, for the end to name what changed. A resumed run keeps its first start (None: not listed now)."""
    if not (options.integrity and options.inventory):
        why = "not asked for (--no-check)" if not options.integrity else "no inventory (--no-inventory)"
        run.manifest["integrity"] = {"skipped": why}
        return None
    if ((run.manifest.get("integrity") or {}).get("snapshots") or {}).get("start"):
        return None
    read = facts.retrieval_config
    raw = read["raw"] if read.get("raw") is not None else {"error": read.get("error")}
    snap = await take_snapshot(client, args.kb_ids, server_version=facts.version,
                               in_flight=min(LANE_SIZE, args.concurrency), retrieval_config=raw,
                               knowledge_bases=facts.knowledge_bases)
    start = {**snap.to_json(), **({"taken_at_resume": True} if run.manifest.get("resumed_at") else {})}
    run.manifest["integrity"] = {"snapshots": {"start": start}}
    return snap.inventory.chunks


async def _end_inventory(run: _Run, client: WeKnoraClient, args: _Arguments, facts: ServerFacts,
                         context: tuple[_Options, TestSet, pd.DataFrame | None]) -> None:
    """The end inventory into ``chunks.parquet`` / ``knowledge.parquet``; with the integrity checks the end
    snapshot too, checked against the test set's labels and compared with the start (``integrity``, notes)."""
    options, ts, start_chunks = context
    in_flight = min(LANE_SIZE, args.concurrency)
    if not options.integrity:
        run.manifest["inventory"] = await take_inventory(client, args.kb_ids, run.run_dir / CHUNKS,
                                                         server_version=facts.version, in_flight=in_flight)
        return
    end = await take_snapshot(client, args.kb_ids, server_version=facts.version, in_flight=in_flight)
    await asyncio.to_thread(write_inventory, end.inventory, run.run_dir / CHUNKS)
    run.manifest["inventory"] = end.inventory.entry
    start = ((run.manifest.get("integrity") or {}).get("snapshots") or {}).get("start") or {}
    entry, notes = await asyncio.to_thread(integrity_entry, start, end, labels=ts.qrels, start_chunks=start_chunks)
    run.manifest["integrity"] = entry
    run.manifest.setdefault("notes", []).extend(notes)
    problems = sum(f["severity"] == "problem" for f in entry["findings"])
    if problems:
        log.warning("integrity: %d problem(s) found in the knowledge base (manifest: integrity)", problems)


@contextlib.contextmanager
def _recording_a_stop(run: _Run) -> Iterator[None]:
    """Within the block, Ctrl-C (a cancelled task) and a :class:`StorageError` are recorded in the manifest
    (``interrupted``, ``stopped``) before they go on; a manifest that cannot be written stays as it was."""
    try:
        yield
    except (asyncio.CancelledError, KeyboardInterrupt):
        with contextlib.suppress(StorageError):
            _write_stopped_manifest(run, "interrupted", "interrupted (Ctrl-C); resume to go on")
        raise
    except StorageError as exc:
        with contextlib.suppress(StorageError):
            _write_stopped_manifest(run, "stopped", f"storage: {exc}")
        raise


# -- step 1: the arguments and the test set ---------------------------------------------
def _checked_arguments(settings: ClientSettings, kb_ids: list[str] | str,
                       stages: str | Sequence[str | Stage] | None, repeats: int, concurrency: int,
                       warmup: int, out: str | Path) -> _Arguments:
    """The arguments checked and normalised; :class:`UsageError` names the first one that is not allowed."""
    _check_out(Path(out))
    for argument, value, minimum in (("--repeats", repeats, 1), ("--concurrency", concurrency, 1),
                                     ("--warmup", warmup, 0)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
            raise UsageError(argument=argument, allowed=f">= {minimum}", got=value)
    ids = [kb_ids] if isinstance(kb_ids, str) else list(kb_ids)
    if not ids or not all(isinstance(k, str) and k for k in ids):
        raise UsageError(argument="--kb-id", allowed="one or more non-empty knowledge base ids", got=kb_ids)
    chosen = resolve_stages(DEFAULT_SELECTION if stages is None else stages)
    return _Arguments(settings, ids, chosen, int(repeats), int(concurrency), int(warmup),
                      default_stages=stages is None)


def _check_out(out: Path) -> None:
    """:class:`UsageError` (``--out``) when the run folder, or the nearest of its parents that exists, is a file."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == out else f" inside {path}"
                raise UsageError(f"--out must name a run folder{where}, but {path} is a file; "
                                 "choose a folder, e.g. outputs/runs/NAME")
            return


def _load_testset(testset: TestSet | str | Path) -> tuple[TestSet, str | None]:
    """The test set, and the absolute path it was read from (None for a TestSet object), so that report
    and gate find it from any folder. Blocking."""
    if isinstance(testset, TestSet):
        return testset, None
    return load_testset(testset), str(Path(testset).resolve())


def _refuse_used_folder(run_dir: Path, resume: bool) -> None:
    """:class:`RunExistsError` when ``run_dir`` holds a run and ``resume`` was not asked for."""
    if not resume and ((run_dir / MANIFEST).exists() or (run_dir / CHECKPOINT).exists()):
        raise RunExistsError(f"{run_dir} already holds a run; pass resume=True (--resume) to continue it, "
                             "or choose another output folder")


# -- step 2: what the server says, the stages fitted, the run folder ---------------------
def _fit_stages(args: _Arguments, facts: ServerFacts, run_name: str) -> tuple[_Arguments, list[str]]:
    """The arguments with the stages fitted to the knowledge bases' types (:func:`adapt_stages`),
    the FAQ knowledge bases and the sessions' title; and the notes the manifest records."""
    stages, notes = adapt_stages(args.stages, defaults=args.default_stages, kb_types=facts.kb_types)
    faq = tuple(kb for kb, t in facts.kb_types.items() if t == "faq")
    endpoints = {s.endpoint for s in stages}
    if "chat" in endpoints and "knowledge-search" in endpoints:
        notes.append("final and citations run different settings: knowledge-search runs the tenant retrieval "
                     "config (C29), chat the server's config.yaml conversation settings with query rewrite and "
                     "history (C66); a difference between them is not one variable")
    return replace(args, stages=stages, faq_kb_ids=faq, session_title=f"weknora-nb {run_name}"), facts.notes + notes


def _open_run(args: _Arguments, testset: TestSet, testset_path: str | None, out: str | Path,
              described: tuple[dict | None, ServerFacts, list[str]], resume: bool, run_name: str | None) -> _Run:
    """Create or reopen the run folder and read what its checkpoint holds.

    ``described`` is (the user's system description, what the server said, the notes so far).
    A folder that holds a run is refused unless ``resume``; a resumed run must have the same
    target, test set, stage definitions and repeats (:data:`_COMPARED`). Blocking: run in a
    worker thread.
    """
    run_dir = Path(out)
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
    name = run_name or run_dir.name
    base = _manifest_base(args, testset, testset_path, name, described)
    previous = read_manifest(run_dir) if (run_dir / MANIFEST).exists() else None
    _refuse_used_folder(run_dir, resume)
    if previous:
        changed = [k for k in _COMPARED if json.dumps(_comparable(previous, k), sort_keys=True)
                   != json.dumps(_comparable(base, k), sort_keys=True)]
        if changed:
            raise RunExistsError(f"{run_dir} holds a different run (changed: {', '.join(changed)}); "
                                 "resume only with the same target, test set, stages and repeats")
    done = read_checkpoint(run_dir / CHECKPOINT)
    manifest = {**base, "status": "running", "started_at": (previous or {}).get("started_at") or _now(),
                "resumed_at": [*(previous or {}).get("resumed_at", []), _now()] if previous else []}
    if previous:
        _carry_over(previous, manifest)
    queries = [(q, t) for q, t in testset.queries[["query_id", "query"]].itertuples(index=False)]
    return _Run(run_dir, name, queries, manifest, done)


def _carry_over(previous: dict[str, Any], manifest: dict[str, Any]) -> None:
    """What a resumed run keeps from its earlier collections: the sessions counted, each hybrid-search
    stage's method (a resumed run with nothing left to request sends none) and the integrity start snapshot."""
    if previous.get("sessions"):
        manifest["sessions"] = previous["sessions"]
    start = ((previous.get("integrity") or {}).get("snapshots") or {}).get("start")
    if start:  # the knowledge base as it was when the run began, not when it was resumed
        manifest["integrity"] = {"snapshots": {"start": start}}
    for name, stage in manifest["stages"].items():
        method = ((previous.get("stages") or {}).get(name) or {}).get("method")
        if method:
            stage["method"] = method


def _comparable(manifest: dict[str, Any], key: str) -> Any:
    """The part ``key`` of a manifest as a resumed run must repeat it (stages: their definitions only; the
    test set: its content, wherever its file now is or however its path was written)."""
    value = manifest.get(key)
    if key == "stages" and isinstance(value, dict):
        return {n: {k: d.get(k) for k in _STAGE_DEFINITION} for n, d in value.items() if isinstance(d, dict)}
    if key == "testset" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "path"}
    return value


def _manifest_base(args: _Arguments, testset: TestSet, testset_path: str | None, run_name: str,
                   described: tuple[dict | None, ServerFacts, list[str]]) -> dict[str, Any]:
    """What a run is: target (never the key), test set, stages, repeats, concurrency, timeouts, and what
    the server said about itself (server, knowledge bases, retrieval config, the system description)."""
    settings = args.settings
    user_system, facts, notes = described
    system, sources = system_description(user_system, facts)
    return {
        "run_name": run_name,
        "workbench": {"name": "weknora-nb", "version": __version__, "python": platform.python_version()},
        "target": {"base_url": server_address(settings.base_url), "knowledge_base_ids": list(args.kb_ids),
                   "api_key_env": settings.api_key_env, "tenant_id": settings.tenant_id},
        "testset": {"path": testset_path, "hash": testset.hash, "n_queries": len(testset),
                    "n_valid": testset.n_valid, "n_invalid": len(testset.invalid_ids)},
        "stages": {s.name: s.to_dict() for s in args.stages},
        "repeats": args.repeats, "concurrency": args.concurrency, "warmup": args.warmup,
        "timeouts": {"read_s": settings.timeout_s, "connect_s": settings.connect_timeout_s,
                     "max_attempts": settings.max_attempts},
        "server": facts.server, "knowledge_bases": facts.knowledge_bases, "retrieval_config": facts.retrieval_config,
        "system": system, "system_sources": sources, "notes": list(notes),
    }


@contextlib.asynccontextmanager
async def _lanes(args: _Arguments) -> AsyncIterator[list[WeKnoraClient]]:
    """One pooled connection per request in flight, in clients of at most :data:`LANE_SIZE` connections.

    The split was made for httpcore's pool, which scanned all its connections on every request;
    on aiohttp's (:mod:`weknora_nb.collect.transport`) it costs nothing. Raises
    :class:`~weknora_nb.core.errors.AuthFailed` without an API key.
    """
    n_lanes = -(-args.concurrency // LANE_SIZE)
    per_lane = replace(args.settings, max_connections=-(-args.concurrency // n_lanes))
    async with contextlib.AsyncExitStack() as stack:   # the lanes share the process's SSL context (default_tls)
        yield [await stack.enter_async_context(WeKnoraClient(per_lane)) for _ in range(n_lanes)]


# -- steps 3 to 6: plan, probe, warm-up, requests ----------------------------------------
async def _collect_requests(lanes: list[WeKnoraClient], args: _Arguments, run: _Run, retry_failed: bool,
                            progress: bool) -> tuple[list[_Request], int, float]:
    """Plan, probe, warm up and make the requests; (the requests made, those skipped, the request phase's seconds)."""
    todo, n_skipped = _plan(args, run, retry_failed)
    if not todo:
        return todo, n_skipped, 0.0
    await _probe(lanes, args, run.queries[0][1])
    await _warm_up(lanes[0], args, run.queries[:args.warmup])
    with writing(run.checkpoint_path):  # an append that failed (a full disk): a StorageError naming the file
        request_seconds = await _run_requests(lanes, args, run, todo, progress)
    return todo, n_skipped, request_seconds


def _plan(args: _Arguments, run: _Run, retry_failed: bool) -> tuple[list[_Request], int]:
    """The requests still to make, repeat by repeat, stage by stage, in test-set order; and how many
    are skipped (done: ok, or failed when failures are not retried)."""
    todo = [_Request(q, t, s, r) for r in range(1, args.repeats + 1) for s in args.stages for q, t in run.queries
            if not _is_done(run.done.get((q, s.name, r)), retry_failed)]
    n_skipped = len(run.queries) * len(args.stages) * args.repeats - len(todo)
    if n_skipped:
        log.info("resuming: %d request(s) already done, %d to go", n_skipped, len(todo))
    return todo, n_skipped


def _is_done(record: dict[str, Any] | None, retry_failed: bool) -> bool:
    return record is not None and (record["status"] == "ok" or not retry_failed)


async def _probe(lanes: list[WeKnoraClient], args: _Arguments, query: str) -> None:
    """One request per endpoint of the stages, with ``query``, before anything is recorded (nothing of it is).

    An :class:`AuthFailed` (a refused key, a wrong tenant, a missing capability) stops the
    collection here instead of failing every request; hybrid-search's method (POST, or GET
    on v0.6.2, C15) is settled and shared by every lane. The chat endpoint is probed by
    creating a session (C58; deleted with the others at the end), so no answer is generated.
    Other failures are left to the requests.
    """
    client = lanes[0]
    probed: set[str] = set()
    for stage in args.stages:
        if stage.endpoint in probed:
            continue
        probed.add(stage.endpoint)
        try:
            if stage.endpoint == "chat":
                await client.create_session(args.session_title)
            else:
                await _call(client, stage, args, query)
        except AuthFailed:
            raise
        except RequestFailed as exc:
            log.info("probing %s failed (%s); the requests will tell", stage.endpoint, exc)
    for lane in lanes[1:]:
        lane.hybrid_method = lane.hybrid_method or client.hybrid_method


async def _warm_up(client: WeKnoraClient, args: _Arguments, queries: list[tuple[str, str]]) -> None:
    """Send ``queries`` once per stage, one at a time, to warm the server's caches; nothing is recorded
    (an :class:`AuthFailed` still stops the collection)."""
    for stage in args.stages:
        for _, text in queries:
            try:
                await _call(client, stage, args, text)
            except AuthFailed:
                raise
            except RequestFailed:
                pass


# -- step 6: the requests -----------------------------------------------------------------
async def _run_requests(lanes: list[WeKnoraClient], args: _Arguments, run: _Run, todo: list[_Request],
                        progress: bool) -> float:
    """Make the requests of ``todo`` with ``args.concurrency`` workers spread over the lanes.

    Each finished request is appended to the checkpoint and to ``run.done``. Returns the
    seconds of the request phase: first request sent to the last record written.
    """
    queue: asyncio.Queue[_Request] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    bar = _progress_bar(len(todo), run.name) if progress else None
    ckpt = CheckpointWriter(run.checkpoint_path)
    await ckpt.open()

    async def worker(client: WeKnoraClient) -> None:
        while True:
            try:
                req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            rec = await _request_record(client, req, args)
            ckpt.append(rec)
            run.done[(req.query_id, req.stage.name, req.repeat)] = rec
            if bar is not None:
                bar.update(1)

    t_requests = time.perf_counter()
    workers = [asyncio.ensure_future(worker(lanes[i % len(lanes)])) for i in range(min(args.concurrency, len(todo)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:  # after a failure: stop the others before the checkpoint closes
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await ckpt.aclose()  # every record handed over is written
        request_seconds = time.perf_counter() - t_requests
        if bar is not None:
            bar.close()
    return request_seconds


def _progress_bar(total: int, name: str) -> Any:
    return progress_bar(total=total, desc=f"collecting {name}", unit="req")


async def _request_record(client: WeKnoraClient, req: _Request, args: _Arguments) -> dict[str, Any]:
    """Make one request; its checkpoint record: ok with its rows and latency, or the failure's kind with its
    message, HTTP status and envelope code (C11). An :class:`AuthFailed` is raised, not recorded."""
    rec: dict[str, Any] = {"query_id": req.query_id, "stage": req.stage.name, "repeat": req.repeat, "at": _now()}
    try:
        t0 = time.perf_counter()
        items, extra = await _call(client, req.stage, args, req.text)
        ms = (time.perf_counter() - t0) * 1000.0
        rows, dropped, questions = _rows(items, req.stage)
        rec.update(status="ok", latency_ms=round(ms, 3), rows=rows, n_dropped=dropped, **extra)
        if questions:
            rec["matched_questions"] = questions
    except AuthFailed:
        raise
    except RequestFailed as exc:
        rec.update(status=exc.kind, latency_ms=None, error=str(exc)[:500], rows=[])
        if exc.status is not None:
            rec["http_status"] = exc.status
        if exc.code is not None:
            rec["error_code"] = exc.code
    return rec


async def _call(client: WeKnoraClient, stage: Stage, args: _Arguments,
                query: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One request at ``stage``'s endpoint: its result objects, and for chat its answer, citations, session."""
    params = stage.request_params()
    kb_ids = args.kb_ids
    if stage.endpoint == "hybrid-search":
        if len(kb_ids) > 1:
            params.setdefault("knowledge_base_ids", kb_ids)
        return await client.hybrid_search(kb_ids[0], query, **params), {}
    if stage.endpoint == "knowledge-search":
        return await client.knowledge_search(kb_ids, query, **params), {}
    if stage.endpoint == "faq-search":
        return await _faq_search(client, list(args.faq_kb_ids) or kb_ids, query, params), {}
    chat = await client.chat(kb_ids, query, title=args.session_title, **params)
    return chat.references, {"answer": chat.answer, "citations": chat.citations, "session_id": chat.session_id}


async def _faq_search(client: WeKnoraClient, kb_ids: list[str], query: str,
                      params: dict[str, Any]) -> list[dict[str, Any]]:
    """FAQ search of each knowledge base (C45), its entries (C46) as result objects: ``id`` is the
    entry's ``chunk_id``; with several knowledge bases, best score first (stable)."""
    found = [{"id": e.get("chunk_id"), "score": e.get("score"), "knowledge_id": e.get("knowledge_id"),
              "match_type": e.get("match_type"), "matched_question": e.get("matched_question")}
             for kb in kb_ids for e in await client.faq_search(kb, query, **params)]
    if len(kb_ids) > 1:
        found.sort(key=lambda r: -(_float(r["score"]) or 0.0))
    return found


def _rows(items: list[dict[str, Any]], stage: Stage) -> tuple[list[list[Any]], int, list[Any]]:
    """Result objects to compact rows [rank, chunk_id, score, knowledge_id, chunk_index, match_type,
    sub_chunk_ids, base_score, model_score]; rank = position among the kept (primary) results.

    Also how many were dropped (match types the stage does not keep) and, for FAQ entries, the
    matched question of each row (an empty list when no result carries one).
    """
    rows: list[list[Any]] = []
    questions: list[Any] = []
    dropped = 0
    for it in items:
        mt = _int(it.get("match_type"))
        if stage.keep_match_types is not None and mt is not None and mt not in stage.keep_match_types:
            dropped += 1
            continue
        meta = it.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        kid, subs = it.get("knowledge_id"), it.get("sub_chunk_id")
        rows.append([len(rows) + 1, str(it.get("id", "")), _float(it.get("score")),
                     None if kid is None else str(kid), _int(it.get("chunk_index")), mt,
                     [str(x) for x in subs] if isinstance(subs, list) else [],
                     _float(meta.get("base_score")), _float(meta.get("model_score"))])
        questions.append(it.get("matched_question"))
    return rows, dropped, questions if any(q is not None for q in questions) else []


def _float(x: Any) -> float | None:
    if type(x) is float:   # what JSON numbers mostly are: no conversion to try
        return x
    try:
        return None if x is None or x == "" else float(x)
    except (TypeError, ValueError):
        return None


def _int(x: Any) -> int | None:
    """``x`` as an integer (``3``, ``3.0``, ``"3"``), else None."""
    if type(x) is int and -(1 << 53) <= x <= 1 << 53:   # as the float it would go through, the same value
        return x
    value = _float(x)
    return int(value) if value is not None and value.is_integer() else None


# -- step 7: the sessions, and what the run found out ------------------------------------
async def _close_sessions(run: _Run, lanes: list[WeKnoraClient], keep: bool) -> None:
    """Delete the chat sessions the lanes created (unless ``keep``); counts into the manifest's ``sessions``."""
    run.manifest["sessions"] = await delete_sessions(lanes, keep=keep, in_flight=LANE_SIZE,
                                                     before=run.manifest.get("sessions"))


def _record_findings(run: _Run, args: _Arguments, lanes: list[WeKnoraClient]) -> None:
    """What the run found out, into the manifest: hybrid-search's method (C15), the inline citations of
    chat stages (C65), HTML-escaped inventory content (C53), with a note for each a reader must know."""
    stages, notes = run.manifest["stages"], run.manifest.setdefault("notes", [])
    method = next((c.hybrid_method for c in lanes if c.hybrid_method), None)
    for s in args.stages:
        if s.endpoint == "hybrid-search" and method:
            stages[s.name]["method"] = method
        if s.endpoint == "chat":
            answers = [r for (_, name, _), r in run.done.items() if name == s.name and r["status"] == "ok"]
            with_citations = sum(1 for r in answers if r.get("citations"))
            stages[s.name]["inline_citations"] = {"answers": len(answers), "with_citations": with_citations}
            if answers and not with_citations:
                notes.append(f"stage {s.name}: no inline citations in any answer (WeKnora writes them from v0.7.2, "
                             "C65); its figures rest on the references event")
    if any(d.get("method") == "GET" for d in stages.values()):
        notes.append("hybrid-search is routed for GET only on this server (WeKnora v0.6.2, C15): sent by GET")
    content = (run.manifest.get("inventory") or {}).get("content") or {}
    if content.get("escaped"):
        notes.append("the chunk listing returned HTML-escaped content (WeKnora up to v0.6.3, C53): the inventory "
                     "holds it unescaped")


# -- steps 8 to 10: results, manifest, summary -------------------------------------------
def _write_results(args: _Arguments, run: _Run) -> None:
    """Compile the checkpoint's records into ``results.parquet`` (and ``answers.jsonl``). Blocking."""
    results = compile_results(run.done, args.stages, [q for q, _ in run.queries], args.repeats)
    with writing(run.run_dir / RESULTS):
        write_results(results, run.run_dir / RESULTS)
    _write_answers(run.done, run.run_dir / ANSWERS)


def compile_results(done: Records, stages: list[Stage], query_order: list[str], repeats: int) -> pd.DataFrame:
    """Checkpoint records to the results table, ordered by stage, repeat, query, rank."""
    cols: dict[str, list[Any]] = {
        k: [] for k in ("query_id", "stage", "repeat", "rank", "chunk_id", "score", "knowledge_id", "chunk_index",
                        "match_type", "latency_ms", "status", "error", "sub_chunk_ids", "base_score", "model_score")}
    width = 9
    empty = [[None] * width]
    sub_text: dict[tuple[Any, ...], str] = {}   # a list's JSON text, written once (repeats hold the same lists)
    for s in stages:
        for r in range(1, repeats + 1):
            for q in query_order:
                rec = done.get((q, s.name, r))
                if rec is None:
                    continue
                rows = [[*row, *[None] * (width - len(row))] for row in rec.get("rows") or empty]  # older: shorter
                n = len(rows)
                rank, cid, score, kid, cidx, mt, subs, base, model = zip(*rows, strict=True)  # this request's columns
                cols["query_id"] += [q] * n
                cols["stage"] += [s.name] * n
                cols["repeat"] += [r] * n
                cols["rank"] += rank
                cols["chunk_id"] += cid
                cols["score"] += score
                cols["knowledge_id"] += kid
                cols["chunk_index"] += cidx
                cols["match_type"] += mt
                cols["latency_ms"] += [rec.get("latency_ms")] * n
                cols["status"] += [rec["status"]] * n
                cols["error"] += [rec.get("error")] * n
                cols["sub_chunk_ids"] += [_list_text(x, sub_text) if x else None for x in subs]
                cols["base_score"] += base
                cols["model_score"] += model
    return pd.DataFrame({c: _typed(c, values) for c, values in cols.items()})


def _typed(column: str, values: list[Any]) -> Any:
    """A results column of :func:`compile_results` from its values (the checkpoint's: checked numbers, strings
    and None), built with its type (pandas infers none): Int64, int64, float64 (None as NaN) or string."""
    if column in ("rank", "chunk_index", "match_type"):
        return pd.array(values, dtype="Int64")
    if column == "repeat":
        return np.array(values, dtype=np.int64)
    if column in ("score", "latency_ms", "base_score", "model_score"):
        return np.array(values, dtype=np.float64)
    return pd.array(values, dtype="string")


def _list_text(ids: list[Any], written: dict[tuple[Any, ...], str]) -> str:
    """``json.dumps(ids, ensure_ascii=False)``, each list's text kept in ``written``."""
    key = tuple(ids)
    text = written.get(key)
    if text is None:
        text = written[key] = json.dumps(ids, ensure_ascii=False)
    return text


def _write_answers(done: Records, path: Path) -> None:
    """The answers and citations of the chat requests, one JSON line each (no file when there are none)."""
    recs = [r for r in done.values() if "answer" in r]
    if not recs:
        return
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for r in sorted(recs, key=lambda r: (r["stage"], r["repeat"], r["query_id"])):
            fh.write(json.dumps({k: r[k] for k in ("query_id", "stage", "repeat", "answer", "citations")},
                                ensure_ascii=False) + "\n")


def _tally(done: Records, stages: list[Stage]) -> tuple[dict[str, dict[str, int]], list[dict[str, Any]]]:
    """Requests per stage and status (``{"final": {"ok": 30, "server": 3}}``, in stage order), and the
    failed requests (query_id, stage, repeat, status, error), sorted by key."""
    counts: dict[str, dict[str, int]] = {}
    failed = []
    for (query_id, stage, repeat), rec in sorted(done.items()):
        c = counts.setdefault(stage, {"ok": 0})
        c[rec["status"]] = c.get(rec["status"], 0) + 1
        if rec["status"] != "ok":
            failed.append({"query_id": query_id, "stage": stage, "repeat": repeat, "status": rec["status"],
                           "error": rec.get("error")})
    return {s.name: counts.get(s.name, {"ok": 0}) for s in stages}, failed


def _write_stopped_manifest(run: _Run, status: str, why: str) -> None:
    """The manifest of a collection that stopped before its end (an auth failure, Ctrl-C, a file that
    could not be written): ``status``, why, end time, requests done so far. Blocking."""
    run.manifest.update(status=status, stopped_by=why[:500], ended_at=_now(), n_done=len(run.done))
    _write_json_atomic(run.manifest_path, run.manifest)


def _write_final_manifest(run: _Run, counts: dict[str, dict[str, int]], failed: list[dict[str, Any]]) -> None:
    """The manifest with the run's outcome: status (complete or incomplete), end time, counts. Blocking."""
    dropped = int(sum(r.get("n_dropped", 0) for r in run.done.values()))
    run.manifest.update(status="incomplete" if failed else "complete", ended_at=_now(), counts=counts,
                        n_failed=len(failed), dropped_non_primary=dropped)
    _write_json_atomic(run.manifest_path, run.manifest)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically and durably (temp file, fsync, rename). Blocking.

    An OS error (a read-only folder, a full disk) is a :class:`StorageError` naming ``path``."""
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def collect(*args: Any, **kwargs: Any) -> RunSummary:
    """Synchronous :func:`collect_async`; also works where an event loop already runs (Jupyter).

    Ctrl-C (KeyboardInterrupt) stops the collection cleanly either way: the requests in flight
    are cancelled, the checkpoint is flushed, the manifest says ``interrupted``, the run folder's
    lock is let go; then KeyboardInterrupt is raised (resume to go on).
    """
    return run_to_end(lambda: collect_async(*args, **kwargs), name="weknora-nb-collect")
