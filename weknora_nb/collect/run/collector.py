"""Collect ranked results from WeKnora over HTTP into a resumable run folder.

A run folder (``outputs/runs/<name>/``) holds:

- ``manifest.json``    what was run against what (never the API key), what the server said
  about itself, counts, times;
- ``checkpoint.jsonl`` one line per finished request, appended as it completes
  (:mod:`weknora_nb.collect.run.checkpoint`);
- ``results.parquet``  the results table (see :mod:`weknora_nb.core.results`), compiled from
  the checkpoint at the end;
- ``chunks.parquet``   the knowledge bases' chunk inventory (:mod:`weknora_nb.collect.run.inventory`), and
  ``knowledge.parquet`` their knowledge list (every knowledge, those without chunks too);
- ``answers.jsonl``    the answers and their inline citations of the stages on the chat endpoint;
- ``.collect.lock``    while a collection runs: who runs it (:mod:`weknora_nb.collect.run.lock`).

``latency_ms`` is the wall time of a request as the collector saw it, retries and their
back-off included (a request that needed a retry is slower for the user too).

The pipeline (:func:`collect_async`): check the arguments (``out`` must be a folder) and the
test set; lock the run folder when it exists (a collector already at work on it refuses this
one at once, :class:`~weknora_nb.core.errors.RunLockedError`); ask the server about its
knowledge bases, version and retrieval config (:mod:`weknora_nb.collect.run.preflight`: a missing
knowledge base or a refused key stops here, before anything is written); fit the stages to FAQ
knowledge bases; lock (creating it) and open or resume the run folder (refusing a different run); plan
every (query, stage, repeat) not yet done; probe each endpoint once (a refused key or missing
capability stops here; hybrid-search's method is settled, docs/weknora-contract.md C15); warm
up (requests not recorded); run the requests, repeat by repeat, by a bounded pool of workers;
write the chunk inventory; delete the chat sessions the run created (C58/C59); compile the
results; write the final manifest. With ``integrity`` (the default; it needs the inventory) the inventory
is also listed before the requests (its fingerprint, the retrieval config and the knowledge bases'
configuration kept in the manifest: a resumed run keeps its first start), the end inventory is checked
(:mod:`weknora_nb.collect.run.snapshot`) and compared with the start: the manifest's ``integrity`` holds the
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

This module runs the pipeline; its steps are modules of their own: :mod:`.arguments` (checked),
:mod:`.folder` (the run folder and its manifest), :mod:`.requests` (plan, probe, warm-up, requests),
:mod:`.results` (results table, answers, counts, :class:`~weknora_nb.collect.run.results.RunSummary`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from weknora_nb.collect.http.client import ClientSettings, WeKnoraClient
from weknora_nb.collect.http.retry import run_to_end
from weknora_nb.collect.run.arguments import Arguments, checked_arguments
from weknora_nb.collect.run.folder import (
    RunFolder,
    open_run,
    recording_a_stop,
    refuse_used_folder,
    write_final_manifest,
    write_json_atomic,
    write_stopped_manifest,
)
from weknora_nb.collect.run.inventory import list_inventory, write_inventory
from weknora_nb.collect.run.lock import RunLock
from weknora_nb.collect.run.notes import record_findings, record_inventory_counts, shown_families
from weknora_nb.collect.run.preflight import (
    ServerFacts,
    adapt_stages,
    check_embedding_models,
    read_server,
    reranker_notes,
)
from weknora_nb.collect.run.requests import LANE_SIZE, Request, collect_requests, open_lanes
from weknora_nb.collect.run.results import RunSummary, flag_counts, tally, write_run_results
from weknora_nb.collect.run.sessions import delete_sessions
from weknora_nb.collect.run.shown import Families
from weknora_nb.collect.run.snapshot import integrity_entry, take_snapshot
from weknora_nb.collect.run.stages import Stage, with_chat_agent
from weknora_nb.core.errors import AuthFailed, UsageError
from weknora_nb.core.run import CHUNKS, check_run_name
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.core.weknora import UI_CHAT_AGENT

log = logging.getLogger(__name__)


async def collect_async(settings: ClientSettings, kb_ids: list[str] | str, testset: TestSet | str | Path,
                        out: str | Path, *, stages: str | Sequence[str | Stage] | None = None,
                        repeats: int = 3, concurrency: int = 8, warmup: int = 5, system: dict | None = None,
                        resume: bool = False, retry_failed: bool = False, inventory: bool = True,
                        progress: bool = True, run_name: str | None = None,
                        keep_sessions: bool = False, integrity: bool = True,
                        chat_agent: str | None = UI_CHAT_AGENT) -> RunSummary:
    """Collect every (query, stage, repeat) into the run folder ``out``; see the module docstring.

    Parameters
    ----------
    settings : ClientSettings
        Base URL, timeouts, retries; the key comes from ``settings.api_key_env``.
    kb_ids : knowledge base id(s).
    testset : TestSet or path.
    stages : names ("hybrid,final"), or Stage objects; None: the default stages
        (:data:`~weknora_nb.collect.run.stages.DEFAULT_SELECTION`), fitted to FAQ knowledge bases.
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
    chat_agent : the agent chat stages name, as the web UI's chat does (default ``builtin-quick-answer``,
        C103); ``"none"`` (or None) sends no ``agent_id`` (config.yaml's conversation settings, C66).

    Raises :class:`~weknora_nb.core.errors.UsageError` for an argument out of range (or a keyword
    stage asked for on FAQ knowledge bases only, an ``out`` that is a file, or hybrid-search stages over
    knowledge bases of different embedding models, C107),
    :class:`~weknora_nb.core.errors.RunExistsError` for a run folder that holds a run (without
    ``resume``) or a different run, :class:`~weknora_nb.core.errors.RunLockedError` for a run folder
    another collector is at work on, :class:`~weknora_nb.core.errors.StorageError` for a file that
    cannot be written (what was written before is kept: resume goes on from it),
    :class:`~weknora_nb.core.errors.NotFound` for a knowledge base the server does not have,
    :class:`~weknora_nb.core.errors.AuthFailed` without an API key or when the server refuses it
    (the message says why: platform key without tenant, wrong tenant, missing capability).
    """
    t_start = time.perf_counter()
    args = checked_arguments(settings, kb_ids, stages, repeats, concurrency, warmup, out, chat_agent)
    _check_name(run_name, Path(out))
    options = _Options(system, resume, retry_failed, inventory, progress, run_name, keep_sessions, integrity)
    lock = RunLock(out)
    try:
        if Path(out).is_dir():
            lock.acquire()  # another collector at work on this folder refuses this one at once
        ts, testset_path = await asyncio.to_thread(_load_testset, testset)
        refuse_used_folder(Path(out), resume)
        done = await _collect(args, ts, testset_path, Path(out), options, lock)
        with recording_a_stop(done.run):
            await asyncio.to_thread(write_run_results, done.args, done.run, done.families)
            counts, failed = tally(done.run.done, done.args.stages)
            await asyncio.to_thread(write_final_manifest, done.run, counts, failed)
    finally:
        lock.release()
    summary = RunSummary(done.run.run_dir, counts, len(done.todo), done.n_skipped, time.perf_counter() - t_start,
                         not failed, failed, done.request_seconds, flag_counts(done.run.done, done.args.stages))
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

    args: Arguments
    run: RunFolder
    todo: list[Request]
    n_skipped: int
    request_seconds: float
    families: Families


async def _collect(args: Arguments, ts: TestSet, testset_path: str | None, out: Path, options: _Options,
                   lock: RunLock) -> _Collected:
    """Ask the server, lock and open the run folder, make the requests, take the inventory, close the sessions.

    A stop on the way is recorded in the manifest before it is raised: an auth failure (``stopped``,
    its sessions deleted), Ctrl-C (``interrupted``), a file that cannot be written (``stopped``).
    """
    async with open_lanes(args) as lanes:
        facts = await read_server(lanes[0], args.kb_ids)
        args, notes = _fit_stages(args, facts, options.run_name or out.name)
        notes += await check_embedding_models(lanes[0], facts, args.kb_ids, args.stages)  # before any request
        reranker, more = await reranker_notes(lanes[0], facts)
        lock.acquire()  # creates the folder: nothing was written before the server answered
        run = await asyncio.to_thread(open_run, args, ts, testset_path, out,
                                      (options.system, facts, [*notes, *more]), options.resume, options.run_name)
        run.manifest["reranker"] = reranker
        with recording_a_stop(run):
            start_chunks = await _start_snapshot(run, lanes[0], args, facts, options)
            await asyncio.to_thread(write_json_atomic, run.manifest_path, run.manifest)
            end_chunks = None
            try:
                todo, n_skipped, request_seconds = await collect_requests(lanes, args, run, options.retry_failed,
                                                                          options.progress)
                if options.inventory:
                    end_chunks = await _end_inventory(run, lanes[0], args, facts, (options, ts, start_chunks))
            except AuthFailed as exc:
                await _close_sessions(run, lanes, options.keep_sessions)
                await asyncio.to_thread(write_stopped_manifest, run, "stopped", f"{exc.kind}: {exc}")
                raise
            await _close_sessions(run, lanes, options.keep_sessions)
            record_findings(run, args, lanes)
            families = shown_families(run, start_chunks, end_chunks)
            record_inventory_counts(run, end_chunks)
    return _Collected(args, run, todo, n_skipped, request_seconds, families)


async def _start_snapshot(run: RunFolder, client: WeKnoraClient, args: Arguments, facts: ServerFacts,
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


async def _end_inventory(run: RunFolder, client: WeKnoraClient, args: Arguments, facts: ServerFacts,
                         context: tuple[_Options, TestSet, pd.DataFrame | None]) -> pd.DataFrame | None:
    """The end inventory into ``chunks.parquet`` / ``knowledge.parquet``; with the integrity checks the end
    snapshot too, checked against the test set's labels and compared with the start (``integrity``, notes).
    Returns the end inventory's chunks (None when a knowledge list could not be read)."""
    options, ts, start_chunks = context
    in_flight = min(LANE_SIZE, args.concurrency)
    if not options.integrity:
        inventory = await list_inventory(client, args.kb_ids, server_version=facts.version, in_flight=in_flight)
        await asyncio.to_thread(write_inventory, inventory, run.run_dir / CHUNKS)
        run.manifest["inventory"] = inventory.entry
        return None if inventory.unavailable else inventory.chunks
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
    return None if end.inventory.unavailable else end.inventory.chunks


def _load_testset(testset: TestSet | str | Path) -> tuple[TestSet, str | None]:
    """The test set, and the absolute path it was read from (None for a TestSet object), so that report
    and gate find it from any folder. Blocking."""
    if isinstance(testset, TestSet):
        return testset, None
    return load_testset(testset), str(Path(testset).resolve())


def _check_name(run_name: str | None, out: Path) -> None:
    """:class:`UsageError` when the run's name (``run_name``, else the folder's name) could not name its report
    (:func:`~weknora_nb.core.run.check_run_name`): refused before the run is made, by the rule ``report`` applies."""
    if run_name is not None:
        check_run_name(run_name, "run_name", error=UsageError)
    else:
        check_run_name(out.resolve().name, "--out (the run folder's name names the run and its report)",
                       error=UsageError)


def _fit_stages(args: Arguments, facts: ServerFacts, run_name: str) -> tuple[Arguments, list[str]]:
    """The arguments with the stages fitted to the knowledge bases' types (:func:`adapt_stages`),
    the FAQ knowledge bases and the sessions' title; and the notes the manifest records."""
    stages, notes = adapt_stages(args.stages, defaults=args.default_stages, kb_types=facts.kb_types)
    stages = [with_chat_agent(s, args.chat_agent) for s in stages]
    faq = tuple(kb for kb, t in facts.kb_types.items() if t == "faq")
    endpoints = {s.endpoint for s in stages}
    if "chat" in endpoints and "knowledge-search" in endpoints:
        chat = (f"chat the settings of agent {args.chat_agent} (C66, C103: the web UI's chat)" if args.chat_agent
                else "chat the server's config.yaml conversation settings (C66)")
        notes.append(f"final and citations run different settings: knowledge-search runs the tenant retrieval "
                     f"config (C29), {chat}, with query rewrite and history; a difference between them is not one "
                     "variable")
    if "chat" in endpoints and not args.chat_agent:
        notes.append("chat stages send no agent_id (--chat-agent none): config.yaml's conversation settings, no "
                     "rerank (C66); the web UI's chat runs an agent's (C103)")
    fitted = replace(args, stages=stages, faq_kb_ids=faq, session_title=f"weknora-nb {run_name}",
                     vector_retrieval=facts.vector_retrieval)
    return fitted, facts.notes + notes


async def _close_sessions(run: RunFolder, lanes: list[WeKnoraClient], keep: bool) -> None:
    """Delete the chat sessions the lanes created (unless ``keep``); counts into the manifest's ``sessions``."""
    run.manifest["sessions"] = await delete_sessions(lanes, keep=keep, in_flight=LANE_SIZE,
                                                     before=run.manifest.get("sessions"))


def collect(*args: Any, **kwargs: Any) -> RunSummary:
    """Synchronous :func:`collect_async`; also works where an event loop already runs (Jupyter).

    Ctrl-C (KeyboardInterrupt) stops the collection cleanly either way: the requests in flight
    are cancelled, the checkpoint is flushed, the manifest says ``interrupted``, the run folder's
    lock is let go; then KeyboardInterrupt is raised (resume to go on).
    """
    return run_to_end(lambda: collect_async(*args, **kwargs), name="weknora-nb-collect")
