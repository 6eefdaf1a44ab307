"""Collect ranked results from WeKnora over HTTP into a resumable run folder.

A run folder (``outputs/runs/<name>/``) holds:

- ``manifest.json``    what was run against what (never the API key), counts, times;
- ``checkpoint.jsonl`` one line per finished request, appended as it completes;
- ``results.parquet``  the results table (see :mod:`weknora_nb.results`), compiled from
  the checkpoint at the end;
- ``chunks.parquet``   the knowledge base's chunk inventory (ids, positions, content);

``latency_ms`` is the wall time of a request as the collector saw it, retries and their
back-off included (a request that needed a retry is slower for the user too).
- ``answers.jsonl``    the chat answers and their inline citations (``citations`` stage).

The pipeline: warm-up requests (not recorded), then every (query, stage, repeat) not yet
done, repeat by repeat, by a bounded pool of workers. A crash, a kill -9 or Ctrl-C loses
at most the requests in flight; running again with ``resume=True`` skips what is done and
never writes a duplicate: the checkpoint keeps one final record per request (a retried
failure is replaced by its new outcome).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd

from weknora_nb._version import __version__
from weknora_nb.collect.client import ClientSettings, WeKnoraClient, redact_url
from weknora_nb.collect.stages import Stage, resolve_stages
from weknora_nb.core.errors import RequestFailed, RunExistsError, RunFolderError
from weknora_nb.core.files import atomic_path
from weknora_nb.core.results import write_results
from weknora_nb.core.run import ANSWERS, CHECKPOINT, CHUNKS, MANIFEST, RESULTS
from weknora_nb.core.testset import TestSet, load_testset

__all__ = ["collect", "collect_async", "RunSummary", "read_checkpoint"]

log = logging.getLogger(__name__)

#: connections per httpx pool; a collection with more requests in flight uses several pools
LANE_SIZE = 8



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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_json_atomic(path: Path, obj: Any) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def read_checkpoint(path: str | Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The last record of every request in a checkpoint; a torn last line (a kill mid-write) is dropped."""
    p = Path(path)
    records: dict[tuple[str, str, int], dict[str, Any]] = {}
    if not p.exists():
        return records
    raw = p.read_bytes()
    lines = raw.split(b"\n")
    good_end = 0
    for i, line in enumerate(lines):
        if not line.strip():
            good_end += len(line) + 1
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if i >= len(lines) - 2:  # only the tail can be torn
                log.warning("%s: dropping a torn last line (%d bytes)", p, len(line))
                break
            raise RunFolderError(f"{p}: line {i + 1} is not valid JSON; the checkpoint is damaged") from None
        records[(rec["query_id"], rec["stage"], int(rec["repeat"]))] = rec
        good_end += len(line) + 1
    if good_end < len(raw):
        with open(p, "r+b") as fh:
            fh.truncate(good_end)
    return records


def _rows(items: list[dict[str, Any]], stage: Stage) -> tuple[list[list[Any]], int]:
    """Result objects to compact rows [rank, chunk_id, score, knowledge_id, chunk_index, match_type,
    sub_chunk_ids, base_score, model_score]; rank = position among the kept (primary) results."""
    rows, dropped = [], 0
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


async def _call(client: WeKnoraClient, stage: Stage, kb_ids: list[str], query: str) -> tuple[list[dict], dict]:
    params = stage.request_params()
    if stage.endpoint == "hybrid-search":
        if len(kb_ids) > 1:
            params.setdefault("knowledge_base_ids", kb_ids)
        return await client.hybrid_search(kb_ids[0], query, **params), {}
    if stage.endpoint == "knowledge-search":
        return await client.knowledge_search(kb_ids, query, **params), {}
    chat = await client.chat(kb_ids, query, **params)
    return chat.references, {"answer": chat.answer, "citations": chat.citations}


async def _timed(client: WeKnoraClient, stage: Stage, kb_ids: list[str], query: str):
    t0 = time.perf_counter()
    out = await _call(client, stage, kb_ids, query)
    return out, (time.perf_counter() - t0) * 1000.0


def _manifest_base(settings: ClientSettings, kb_ids: list[str], testset: TestSet, testset_path: str | None,
                   stages: list[Stage], repeats: int, concurrency: int, warmup: int, run_name: str,
                   system: dict | None) -> dict[str, Any]:
    return {
        "run_name": run_name,
        "workbench": {"name": "weknora-nb", "version": __version__, "python": platform.python_version()},
        "target": {"base_url": redact_url(settings.base_url), "knowledge_base_ids": list(kb_ids),
                   "api_key_env": settings.api_key_env, "tenant_id": settings.tenant_id},
        "testset": {"path": testset_path, "hash": testset.hash, "n_queries": len(testset),
                    "n_valid": testset.n_valid, "n_invalid": len(testset.invalid_ids)},
        "stages": {s.name: s.to_dict() for s in stages},
        "repeats": repeats, "concurrency": concurrency, "warmup": warmup,
        "timeouts": {"read_s": settings.timeout_s, "connect_s": settings.connect_timeout_s,
                     "max_attempts": settings.max_attempts},
        "system": system,
    }


_COMPARED = ("target", "testset", "stages", "repeats")


async def collect_async(settings: ClientSettings, kb_ids: list[str] | str, testset: TestSet | str | Path,
                        out: str | Path, *, stages: str | list[str] | list[Stage] = "vector,keyword,hybrid,final",
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
    repeats, concurrency, warmup : N repeats (>= 1), requests in flight (>= 1), warm-up queries per stage.
    system : the user's system description (chunking, embedding model, index, thresholds, ...).
    resume : continue a run in ``out``; without it an existing run is refused.
    retry_failed : with ``resume``, request again what failed before.
    """
    t_start = time.perf_counter()
    if repeats < 1 or concurrency < 1 or warmup < 0:
        raise ValueError("repeats and concurrency must be >= 1 and warmup >= 0")
    kb_ids = [kb_ids] if isinstance(kb_ids, str) else list(kb_ids)
    testset_path = None
    if not isinstance(testset, TestSet):
        testset_path = str(testset)
        testset = load_testset(testset)
    if isinstance(stages, list) and stages and all(isinstance(s, Stage) for s in stages):
        stage_objs: list[Stage] = list(stages)  # type: ignore[arg-type]
    else:
        stage_objs = resolve_stages(stages)  # type: ignore[arg-type]
    run_dir = Path(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    name = run_name or run_dir.name
    manifest_path, ckpt_path = run_dir / MANIFEST, run_dir / CHECKPOINT
    base = _manifest_base(settings, kb_ids, testset, testset_path, stage_objs, repeats, concurrency, warmup, name,
                          system)
    previous = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else None
    if (previous or ckpt_path.exists()) and not resume:
        raise RunExistsError(f"{run_dir} already holds a run; pass resume=True (--resume) to continue it, "
                             "or choose another output folder")
    if previous:
        changed = [k for k in _COMPARED if json.dumps(previous.get(k), sort_keys=True)
                   != json.dumps(base.get(k), sort_keys=True)]
        if changed:
            raise RunExistsError(f"{run_dir} holds a different run (changed: {', '.join(changed)}); "
                                 "resume only with the same target, test set, stages and repeats")
    done = read_checkpoint(ckpt_path)
    manifest = {**base, "status": "running", "started_at": (previous or {}).get("started_at") or _now(),
                "resumed_at": [*(previous or {}).get("resumed_at", []), _now()] if previous else []}

    # One pooled connection per request in flight, in pools of at most LANE_SIZE: httpx's pool
    # scans all its connections on every request, so many small pools cost less than one big one.
    n_lanes = -(-concurrency // LANE_SIZE)
    tls = httpx.create_ssl_context()  # one for all pools: the CA store is loaded once
    async with contextlib.AsyncExitStack() as stack:
        lanes = [await stack.enter_async_context(
            WeKnoraClient(replace(settings, max_connections=-(-concurrency // n_lanes)), ssl_context=tls))
            for _ in range(n_lanes)]
        client = lanes[0]
        try:
            manifest["retrieval_config"] = await client.retrieval_config()
        except RequestFailed as exc:
            manifest["retrieval_config"] = {"unavailable": f"{exc.kind}: {exc}"}
        _write_json_atomic(manifest_path, manifest)

        queries = testset.queries[["query_id", "query"]].itertuples(index=False)
        qlist = [(q, t) for q, t in queries]
        todo = [(q, t, s, r) for r in range(1, repeats + 1) for s in stage_objs for q, t in qlist
                if not ((q, s.name, r) in done and (done[(q, s.name, r)]["status"] == "ok" or not retry_failed))]
        n_skipped = len(qlist) * len(stage_objs) * repeats - len(todo)
        if n_skipped:
            log.info("resuming: %d request(s) already done, %d to go", n_skipped, len(todo))

        if todo and warmup:
            for s in stage_objs:
                for q, t in qlist[:warmup]:
                    try:
                        await _call(client, s, kb_ids, t)
                    except RequestFailed:
                        pass

        bar = None
        if progress and todo:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(todo), desc=f"collecting {name}", unit="req")
        queue: asyncio.Queue = asyncio.Queue()
        for item in todo:
            queue.put_nowait(item)
        with open(ckpt_path, "a", encoding="utf-8") as ckpt:

            async def worker(client: WeKnoraClient) -> None:
                while True:
                    try:
                        qid, text, stage, rep = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    rec: dict[str, Any] = {"query_id": qid, "stage": stage.name, "repeat": rep, "at": _now()}
                    try:
                        (items, extra), ms = await _timed(client, stage, kb_ids, text)
                        rows, dropped = _rows(items, stage)
                        rec.update(status="ok", latency_ms=round(ms, 3), rows=rows, n_dropped=dropped, **extra)
                    except RequestFailed as exc:
                        rec.update(status=exc.kind, latency_ms=None, error=str(exc)[:500], rows=[])
                    ckpt.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    ckpt.flush()
                    done[(qid, stage.name, rep)] = rec
                    if bar is not None:
                        bar.update(1)

            t_requests = time.perf_counter()
            try:
                await asyncio.gather(*(worker(lanes[i % n_lanes])
                                       for i in range(min(concurrency, max(len(todo), 1)))))
            finally:
                request_seconds = time.perf_counter() - t_requests
                if bar is not None:
                    bar.close()

        if inventory:
            try:
                inv = await _inventory(client, kb_ids)
                write_results(inv, run_dir / CHUNKS)  # any frame: an atomic Parquet write
                manifest["inventory"] = {"chunks": len(inv), "knowledge": int(inv["knowledge_id"].nunique())
                                         if len(inv) else 0}
            except RequestFailed as exc:
                manifest["inventory"] = {"unavailable": f"{exc.kind}: {exc}"}

    results = compile_results(done, stage_objs, [q for q, _ in qlist], repeats)
    write_results(results, run_dir / RESULTS)
    _write_answers(done, run_dir / ANSWERS)
    counts: dict[str, dict[str, int]] = {}
    failed = []
    for (q, s, r), rec in sorted(done.items()):
        c = counts.setdefault(s, {"ok": 0})
        c[rec["status"]] = c.get(rec["status"], 0) + 1
        if rec["status"] != "ok":
            failed.append({"query_id": q, "stage": s, "repeat": r, "status": rec["status"],
                           "error": rec.get("error")})
    counts = {s.name: counts.get(s.name, {"ok": 0}) for s in stage_objs}
    complete = not failed
    manifest.update(status="complete" if complete else "incomplete", ended_at=_now(), counts=counts,
                    n_failed=len(failed), dropped_non_primary=int(sum(r.get("n_dropped", 0) for r in done.values())))
    _write_json_atomic(manifest_path, manifest)
    summary = RunSummary(run_dir, counts, len(todo), n_skipped, time.perf_counter() - t_start, complete, failed,
                         request_seconds if todo else 0.0)
    log.info(summary.describe())
    return summary


async def _inventory(client: WeKnoraClient, kb_ids: list[str]) -> pd.DataFrame:
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


def compile_results(done: dict[tuple[str, str, int], dict[str, Any]], stages: list[Stage],
                    query_order: list[str], repeats: int) -> pd.DataFrame:
    """Checkpoint records to the results table, ordered by stage, repeat, query, rank."""
    cols = {k: [] for k in ("query_id", "stage", "repeat", "rank", "chunk_id", "score", "knowledge_id",
                            "chunk_index", "match_type", "latency_ms", "status", "error", "sub_chunk_ids",
                            "base_score", "model_score")}
    empty = [[None] * 9]
    for s in stages:
        for r in range(1, repeats + 1):
            for q in query_order:
                rec = done.get((q, s.name, r))
                if rec is None:
                    continue
                rows = rec.get("rows") or empty
                n = len(rows)
                rank, cid, score, kid, cidx, mt, subs, base, model = zip(*rows)  # columns of this request
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


def _write_answers(done: dict, path: Path) -> None:
    recs = [r for r in done.values() if "answer" in r]
    if not recs:
        return
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for r in sorted(recs, key=lambda r: (r["stage"], r["repeat"], r["query_id"])):
            fh.write(json.dumps({k: r[k] for k in ("query_id", "stage", "repeat", "answer", "citations")},
                                ensure_ascii=False) + "\n")


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
