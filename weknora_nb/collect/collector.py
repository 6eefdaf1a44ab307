"""Collect ranked results from WeKnora over HTTP into a resumable run folder.

A run folder (``outputs/runs/<name>/``) holds:

- ``manifest.json``    what was run against what (never the API key), counts, times;
- ``checkpoint.jsonl`` one line per finished request, appended as it completes
  (:mod:`weknora_nb.collect.checkpoint`);
- ``results.parquet``  the results table (see :mod:`weknora_nb.core.results`), compiled from
  the checkpoint at the end;
- ``chunks.parquet``   the knowledge base's chunk inventory (ids, positions, content);
- ``answers.jsonl``    the answers and their inline citations of the stages on the chat endpoint.

``latency_ms`` is the wall time of a request as the collector saw it, retries and their
back-off included (a request that needed a retry is slower for the user too).

The pipeline (:func:`collect_async`): check the arguments; open or resume the run folder
(refusing a different run); read the retrieval config; plan every (query, stage, repeat)
not yet done; warm up (requests not recorded); run the requests, repeat by repeat, by a
bounded pool of workers; write the chunk inventory; compile the results; write the final
manifest. A crash, a kill -9 or Ctrl-C loses at most the requests in flight; running again
with ``resume=True`` skips what is done and never writes a duplicate: the checkpoint keeps
one final record per request (a retried failure is replaced by its new outcome).

File I/O never runs on the event loop: the checkpoint is appended by a thread of its own,
the other files are read and written in worker threads (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import numbers
import os
import platform
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np
import pandas as pd

from weknora_nb._version import __version__
from weknora_nb.collect.checkpoint import CheckpointWriter, Records, read_checkpoint
from weknora_nb.collect.client import ClientSettings, WeKnoraClient, redact_url
from weknora_nb.collect.stages import DEFAULT_SELECTION, Stage, resolve_stages
from weknora_nb.core.errors import RequestFailed, RunExistsError, UsageError
from weknora_nb.core.files import atomic_path
from weknora_nb.core.results import write_results
from weknora_nb.core.run import ANSWERS, CHECKPOINT, CHUNKS, MANIFEST, RESULTS, read_manifest
from weknora_nb.core.testset import TestSet, load_testset

__all__ = ["collect", "collect_async", "RunSummary", "read_checkpoint", "compile_results"]

log = logging.getLogger(__name__)

#: connections per httpx pool; a collection with more requests in flight uses several pools
LANE_SIZE = 8

#: the manifest's parts that must not change when a run is resumed
_COMPARED = ("target", "testset", "stages", "repeats")


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
    """The checked arguments of a collection."""

    settings: ClientSettings
    kb_ids: list[str]
    stages: list[Stage]
    repeats: int
    concurrency: int
    warmup: int


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
                        out: str | Path, *, stages: str | Sequence[str | Stage] = DEFAULT_SELECTION,
                        repeats: int = 3, concurrency: int = 8, warmup: int = 5, system: dict | None = None,
                        resume: bool = False, retry_failed: bool = False, inventory: bool = True,
                        progress: bool = True, run_name: str | None = None) -> RunSummary:
    """Collect every (query, stage, repeat) into the run folder ``out``; see the module docstring.

    Parameters
    ----------
    settings : ClientSettings
        Base URL, timeouts, retries; the key comes from ``settings.api_key_env``.
    kb_ids : knowledge base id(s).
    testset : TestSet or path.
    stages : names ("hybrid,final"), or Stage objects.
    repeats, concurrency, warmup : N repeats (>= 1), requests in flight (>= 1), warm-up queries per stage (>= 0).
    system : the user's system description (chunking, embedding model, index, thresholds, ...).
    resume : continue a run in ``out``; without it an existing run is refused.
    retry_failed : with ``resume``, request again what failed before.
    inventory : also fetch the knowledge base's chunk list into ``chunks.parquet``.
    progress : show a progress bar; run_name : the manifest's name (default: the folder's name).

    Raises :class:`~weknora_nb.core.errors.UsageError` for an argument out of range,
    :class:`~weknora_nb.core.errors.RunExistsError` for a run folder that holds a run (without
    ``resume``) or a different run, :class:`~weknora_nb.core.errors.AuthFailed` without an API key.
    """
    t_start = time.perf_counter()
    args = _checked_arguments(settings, kb_ids, stages, repeats, concurrency, warmup)
    run = await asyncio.to_thread(_open_run, args, testset, out, system, resume, run_name)
    async with _lanes(args) as lanes:
        run.manifest["retrieval_config"] = await _retrieval_config(lanes[0])
        await asyncio.to_thread(_write_json_atomic, run.manifest_path, run.manifest)
        todo, n_skipped = _plan(args, run, retry_failed)
        if todo:
            await _warm_up(lanes[0], args, run.queries[:args.warmup])
        request_seconds = await _run_requests(lanes, args, run, todo, progress) if todo else 0.0
        if inventory:
            run.manifest["inventory"] = await _take_inventory(lanes[0], args.kb_ids, run.run_dir / CHUNKS)
    await asyncio.to_thread(_write_results, args, run)
    counts, failed = _tally(run.done, args.stages)
    await asyncio.to_thread(_write_final_manifest, run, counts, failed)
    summary = RunSummary(run.run_dir, counts, len(todo), n_skipped, time.perf_counter() - t_start, not failed,
                         failed, request_seconds)
    log.info(summary.describe())
    return summary


# -- step 1: the arguments ----------------------------------------------------------------
def _checked_arguments(settings: ClientSettings, kb_ids: list[str] | str, stages: str | Sequence[str | Stage],
                       repeats: int, concurrency: int, warmup: int) -> _Arguments:
    """The arguments checked and normalised; :class:`UsageError` names the first one that is not allowed."""
    for argument, value, minimum in (("--repeats", repeats, 1), ("--concurrency", concurrency, 1),
                                     ("--warmup", warmup, 0)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
            raise UsageError(argument=argument, allowed=f">= {minimum}", got=value)
    ids = [kb_ids] if isinstance(kb_ids, str) else list(kb_ids)
    if not ids or not all(isinstance(k, str) and k for k in ids):
        raise UsageError(argument="--kb-id", allowed="one or more non-empty knowledge base ids", got=kb_ids)
    return _Arguments(settings, ids, resolve_stages(stages), int(repeats), int(concurrency), int(warmup))


# -- step 2: the run folder ---------------------------------------------------------------
def _open_run(args: _Arguments, testset: TestSet | str | Path, out: str | Path, system: dict | None,
              resume: bool, run_name: str | None) -> _Run:
    """Load the test set, create or reopen the run folder and read what its checkpoint holds.

    A folder that holds a run is refused unless ``resume``; a resumed run must have the same
    target, test set, stages and repeats (:data:`_COMPARED`). Blocking: run in a worker thread.
    """
    testset_path = None
    if not isinstance(testset, TestSet):
        testset_path = str(testset)
        testset = load_testset(testset)
    run_dir = Path(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    name = run_name or run_dir.name
    base = _manifest_base(args, testset, testset_path, name, system)
    previous = read_manifest(run_dir) if (run_dir / MANIFEST).exists() else None
    if (previous or (run_dir / CHECKPOINT).exists()) and not resume:
        raise RunExistsError(f"{run_dir} already holds a run; pass resume=True (--resume) to continue it, "
                             "or choose another output folder")
    if previous:
        changed = [k for k in _COMPARED if json.dumps(previous.get(k), sort_keys=True)
                   != json.dumps(base.get(k), sort_keys=True)]
        if changed:
            raise RunExistsError(f"{run_dir} holds a different run (changed: {', '.join(changed)}); "
                                 "resume only with the same target, test set, stages and repeats")
    done = read_checkpoint(run_dir / CHECKPOINT)
    manifest = {**base, "status": "running", "started_at": (previous or {}).get("started_at") or _now(),
                "resumed_at": [*(previous or {}).get("resumed_at", []), _now()] if previous else []}
    queries = [(q, t) for q, t in testset.queries[["query_id", "query"]].itertuples(index=False)]
    return _Run(run_dir, name, queries, manifest, done)


def _manifest_base(args: _Arguments, testset: TestSet, testset_path: str | None, run_name: str,
                   system: dict | None) -> dict[str, Any]:
    """What a run is: target (never the key), test set, stages, repeats, concurrency, timeouts, system."""
    settings = args.settings
    return {
        "run_name": run_name,
        "workbench": {"name": "weknora-nb", "version": __version__, "python": platform.python_version()},
        "target": {"base_url": redact_url(settings.base_url), "knowledge_base_ids": list(args.kb_ids),
                   "api_key_env": settings.api_key_env, "tenant_id": settings.tenant_id},
        "testset": {"path": testset_path, "hash": testset.hash, "n_queries": len(testset),
                    "n_valid": testset.n_valid, "n_invalid": len(testset.invalid_ids)},
        "stages": {s.name: s.to_dict() for s in args.stages},
        "repeats": args.repeats, "concurrency": args.concurrency, "warmup": args.warmup,
        "timeouts": {"read_s": settings.timeout_s, "connect_s": settings.connect_timeout_s,
                     "max_attempts": settings.max_attempts},
        "system": system,
    }


@contextlib.asynccontextmanager
async def _lanes(args: _Arguments) -> AsyncIterator[list[WeKnoraClient]]:
    """One pooled connection per request in flight, in pools of at most :data:`LANE_SIZE`.

    httpx's pool scans all its connections on every request, so many small pools cost less
    than one big one. Raises :class:`~weknora_nb.core.errors.AuthFailed` without an API key.
    """
    n_lanes = -(-args.concurrency // LANE_SIZE)
    per_lane = replace(args.settings, max_connections=-(-args.concurrency // n_lanes))
    # one SSL context for all pools: the CA store is loaded once (about 20 ms, blocking, but a
    # one-off before any request is in flight)
    tls = httpx.create_ssl_context()
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(WeKnoraClient(per_lane, ssl_context=tls)) for _ in range(n_lanes)]


# -- steps 3 to 5: retrieval config, plan, warm-up ---------------------------------------
async def _retrieval_config(client: WeKnoraClient) -> dict[str, Any]:
    """The tenant's retrieval config, or ``{"unavailable": "<kind>: <message>"}``."""
    try:
        return await client.retrieval_config()
    except RequestFailed as exc:
        return {"unavailable": f"{exc.kind}: {exc}"}


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


async def _warm_up(client: WeKnoraClient, args: _Arguments, queries: list[tuple[str, str]]) -> None:
    """Send ``queries`` once per stage, one at a time, to warm the server's caches; nothing is recorded."""
    for stage in args.stages:
        for _, text in queries:
            with contextlib.suppress(RequestFailed):
                await _call(client, stage, args.kb_ids, text)


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
            rec = await _request_record(client, req, args.kb_ids)
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
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"collecting {name}", unit="req")


async def _request_record(client: WeKnoraClient, req: _Request, kb_ids: list[str]) -> dict[str, Any]:
    """Make one request; its checkpoint record: ok with its rows and latency, or the failure's kind."""
    rec: dict[str, Any] = {"query_id": req.query_id, "stage": req.stage.name, "repeat": req.repeat, "at": _now()}
    try:
        t0 = time.perf_counter()
        items, extra = await _call(client, req.stage, kb_ids, req.text)
        ms = (time.perf_counter() - t0) * 1000.0
        rows, dropped = _rows(items, req.stage)
        rec.update(status="ok", latency_ms=round(ms, 3), rows=rows, n_dropped=dropped, **extra)
    except RequestFailed as exc:
        rec.update(status=exc.kind, latency_ms=None, error=str(exc)[:500], rows=[])
    return rec


async def _call(client: WeKnoraClient, stage: Stage, kb_ids: list[str],
                query: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One request at ``stage``'s endpoint: its result objects, and for chat its answer and citations."""
    params = stage.request_params()
    if stage.endpoint == "hybrid-search":
        if len(kb_ids) > 1:
            params.setdefault("knowledge_base_ids", kb_ids)
        return await client.hybrid_search(kb_ids[0], query, **params), {}
    if stage.endpoint == "knowledge-search":
        return await client.knowledge_search(kb_ids, query, **params), {}
    chat = await client.chat(kb_ids, query, **params)
    return chat.references, {"answer": chat.answer, "citations": chat.citations}


def _rows(items: list[dict[str, Any]], stage: Stage) -> tuple[list[list[Any]], int]:
    """Result objects to compact rows [rank, chunk_id, score, knowledge_id, chunk_index, match_type,
    sub_chunk_ids, base_score, model_score]; rank = position among the kept (primary) results."""
    rows: list[list[Any]] = []
    dropped = 0
    for it in items:
        mt = it.get("match_type")
        if stage.keep_match_types is not None and mt is not None and int(mt) not in stage.keep_match_types:
            dropped += 1
            continue
        meta = it.get("metadata") or {}
        rows.append([len(rows) + 1, str(it.get("id", "")), _float(it.get("score")), it.get("knowledge_id"),
                     it.get("chunk_index"), mt, list(it.get("sub_chunk_id") or []),
                     _float(meta.get("base_score")), _float(meta.get("model_score"))])
    return rows, dropped


def _float(x: Any) -> float | None:
    try:
        return None if x is None or x == "" else float(x)
    except (TypeError, ValueError):
        return None


# -- step 7: the inventory ----------------------------------------------------------------
async def _take_inventory(client: WeKnoraClient, kb_ids: list[str], path: Path) -> dict[str, Any]:
    """Write the chunk inventory to ``path``; the manifest's ``inventory`` entry (counts, or why not)."""
    try:
        inv = await _inventory(client, kb_ids)
    except RequestFailed as exc:
        return {"unavailable": f"{exc.kind}: {exc}"}
    await asyncio.to_thread(write_results, inv, path)  # any frame: an atomic Parquet write
    return {"chunks": len(inv), "knowledge": int(inv["knowledge_id"].nunique()) if len(inv) else 0}


async def _inventory(client: WeKnoraClient, kb_ids: list[str]) -> pd.DataFrame:
    """Every chunk of every knowledge of the knowledge bases, one row each."""
    rows = []
    for kb in kb_ids:
        for k in await client.list_knowledge(kb):
            for c in await client.list_chunks(str(k["id"])):
                rows.append({"chunk_id": str(c.get("id")), "knowledge_base_id": kb,
                             "knowledge_id": str(c.get("knowledge_id", k["id"])),
                             "knowledge_title": k.get("title"), "chunk_index": c.get("chunk_index"),
                             "is_enabled": bool(c.get("is_enabled", True)), "content": c.get("content", "")})
    return pd.DataFrame(rows, columns=["chunk_id", "knowledge_base_id", "knowledge_id", "knowledge_title",
                                       "chunk_index", "is_enabled", "content"])


# -- steps 8 to 10: results, manifest, summary -------------------------------------------
def _write_results(args: _Arguments, run: _Run) -> None:
    """Compile the checkpoint's records into ``results.parquet`` (and ``answers.jsonl``). Blocking."""
    results = compile_results(run.done, args.stages, [q for q, _ in run.queries], args.repeats)
    write_results(results, run.run_dir / RESULTS)
    _write_answers(run.done, run.run_dir / ANSWERS)


def compile_results(done: Records, stages: list[Stage], query_order: list[str], repeats: int) -> pd.DataFrame:
    """Checkpoint records to the results table, ordered by stage, repeat, query, rank."""
    cols: dict[str, list[Any]] = {
        k: [] for k in ("query_id", "stage", "repeat", "rank", "chunk_id", "score", "knowledge_id", "chunk_index",
                        "match_type", "latency_ms", "status", "error", "sub_chunk_ids", "base_score", "model_score")}
    empty = [[None] * 9]
    for s in stages:
        for r in range(1, repeats + 1):
            for q in query_order:
                rec = done.get((q, s.name, r))
                if rec is None:
                    continue
                rows = rec.get("rows") or empty
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
                cols["sub_chunk_ids"] += [json.dumps(x, ensure_ascii=False) if x else None for x in subs]
                cols["base_score"] += base
                cols["model_score"] += model
    df = pd.DataFrame(cols)
    for c in ("rank", "chunk_index", "match_type"):
        df[c] = pd.array(df[c], dtype="Int64")
    df["repeat"] = df["repeat"].astype(np.int64)
    for c in ("score", "latency_ms", "base_score", "model_score"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in ("query_id", "stage", "chunk_id", "knowledge_id", "status", "error", "sub_chunk_ids"):
        df[c] = df[c].astype("string")
    return df


def _write_answers(done: Records, path: Path) -> None:
    """The answers and citations of the chat requests, one JSON line each (no file when there are none)."""
    recs = [r for r in done.values() if "answer" in r]
    if not recs:
        return
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
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


def _write_final_manifest(run: _Run, counts: dict[str, dict[str, int]], failed: list[dict[str, Any]]) -> None:
    """The manifest with the run's outcome: status (complete or incomplete), end time, counts. Blocking."""
    dropped = int(sum(r.get("n_dropped", 0) for r in run.done.values()))
    run.manifest.update(status="incomplete" if failed else "complete", ended_at=_now(), counts=counts,
                        n_failed=len(failed), dropped_non_primary=dropped)
    _write_json_atomic(run.manifest_path, run.manifest)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically and durably (temp file, fsync, rename). Blocking."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def collect(*args: Any, **kwargs: Any) -> RunSummary:
    """Synchronous :func:`collect_async`; also works where an event loop already runs (Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(collect_async(*args, **kwargs))
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(collect_async(*args, **kwargs))
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc
    t = threading.Thread(target=target, name="weknora-nb-collect")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
