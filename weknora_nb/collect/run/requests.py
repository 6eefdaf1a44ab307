"""The request phase of a collection: every (query, stage, repeat) still to do, made by a bounded pool of workers.

:func:`collect_requests` plans what is left (a resumed run skips what is done), probes each endpoint once (a
refused key or a missing capability stops the collection there; hybrid-search's method is settled,
docs/weknora-contract.md C15), warms the server up (nothing recorded), then makes the requests, repeat by
repeat. Each finished request is one checkpoint record (:class:`~weknora_nb.collect.run.checkpoint.CheckpointWriter`):
ok with its rows and latency, or the kind of its failure. The connections are spread over lanes
(:func:`open_lanes`): clients of at most :data:`LANE_SIZE` pooled connections each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

from weknora_nb.collect.http.client import WeKnoraClient
from weknora_nb.collect.run.arguments import Arguments
from weknora_nb.collect.run.checkpoint import CheckpointWriter
from weknora_nb.collect.run.flags import REFERENCES_REBUILT, request_flags
from weknora_nb.collect.run.folder import RunFolder
from weknora_nb.collect.run.stages import Stage
from weknora_nb.core.errors import AuthFailed, ProtocolFailed, RequestFailed, writing
from weknora_nb.core.progress import progress_bar
from weknora_nb.core.results import NOT_FAILED, SKIPPED

log = logging.getLogger(__name__)


#: connections per httpx pool; a collection with more requests in flight uses several pools
LANE_SIZE = 8


class Request(NamedTuple):
    """One request to make: a query of the test set at a stage, for one repeat."""

    query_id: str
    text: str
    stage: Stage
    repeat: int


@contextlib.asynccontextmanager
async def open_lanes(args: Arguments) -> AsyncIterator[list[WeKnoraClient]]:
    """One pooled connection per request in flight, in clients of at most :data:`LANE_SIZE` connections.

    The split was made for httpcore's pool, which scanned all its connections on every request;
    on aiohttp's (:mod:`weknora_nb.collect.http.transport`) it costs nothing. Raises
    :class:`~weknora_nb.core.errors.AuthFailed` without an API key.
    """
    n_lanes = -(-args.concurrency // LANE_SIZE)
    per_lane = replace(args.settings, max_connections=-(-args.concurrency // n_lanes))
    async with contextlib.AsyncExitStack() as stack:   # the lanes share the process's SSL context (default_tls)
        yield [await stack.enter_async_context(WeKnoraClient(per_lane)) for _ in range(n_lanes)]


async def collect_requests(lanes: list[WeKnoraClient], args: Arguments, run: RunFolder, retry_failed: bool,
                           progress: bool) -> tuple[list[Request], int, float]:
    """Plan, probe, warm up and make the requests; (the requests made, those skipped, the request phase's seconds)."""
    todo, n_skipped = _plan(args, run, retry_failed)
    if not todo:
        return todo, n_skipped, 0.0
    await _probe(lanes, args, run.queries[0][1])
    await _warm_up(lanes[0], args, run.queries[:args.warmup])
    with writing(run.checkpoint_path):  # an append that failed (a full disk): a StorageError naming the file
        request_seconds = await _run_requests(lanes, args, run, todo, progress)
    return todo, n_skipped, request_seconds


def _plan(args: Arguments, run: RunFolder, retry_failed: bool) -> tuple[list[Request], int]:
    """The requests still to make, repeat by repeat, stage by stage, in test-set order; and how many
    are skipped (done: ok, or failed when failures are not retried)."""
    todo = [Request(q, t, s, r) for r in range(1, args.repeats + 1) for s in args.stages for q, t in run.queries
            if not _is_done(run.done.get((q, s.name, r)), retry_failed)]
    n_skipped = len(run.queries) * len(args.stages) * args.repeats - len(todo)
    if n_skipped:
        log.info("resuming: %d request(s) already done, %d to go", n_skipped, len(todo))
    return todo, n_skipped


def _is_done(record: dict[str, Any] | None, retry_failed: bool) -> bool:
    """Done: recorded ok or skipped (no failure), or failed when failures are not retried."""
    return record is not None and (record["status"] in NOT_FAILED or not retry_failed)


async def _probe(lanes: list[WeKnoraClient], args: Arguments, query: str) -> None:
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


async def _warm_up(client: WeKnoraClient, args: Arguments, queries: list[tuple[str, str]]) -> None:
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


async def _run_requests(lanes: list[WeKnoraClient], args: Arguments, run: RunFolder, todo: list[Request],
                        progress: bool) -> float:
    """Make the requests of ``todo`` with ``args.concurrency`` workers spread over the lanes.

    Each finished request is appended to the checkpoint and to ``run.done``. Returns the
    seconds of the request phase: first request sent to the last record written.
    """
    queue: asyncio.Queue[Request] = asyncio.Queue()
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


async def _request_record(client: WeKnoraClient, req: Request, args: Arguments) -> dict[str, Any]:
    """Make one request; its checkpoint record: ok (or skipped: a chat whose server skipped retrieval) with its
    rows, latency and flags (:mod:`.flags`), or the failure's kind with its message, HTTP status and envelope code
    (C11). An :class:`AuthFailed` is raised, not recorded."""
    rec: dict[str, Any] = {"query_id": req.query_id, "stage": req.stage.name, "repeat": req.repeat, "at": _now()}
    try:
        t0 = time.perf_counter()
        items, extra = await _call(client, req.stage, args, req.text)
        ms = (time.perf_counter() - t0) * 1000.0
        skipped = extra.pop("retrieval_skipped", False)
        flags = [] if skipped else request_flags(req.stage.endpoint, items, vector_retrieval=args.vector_retrieval)
        rows, dropped, questions = _rows(items, req.stage, keep_all=REFERENCES_REBUILT in flags)
        rec.update(status=SKIPPED if skipped else "ok", latency_ms=round(ms, 3), rows=rows, n_dropped=dropped,
                   **{k: v for k, v in extra.items() if v or k in ("answer", "citations", "session_id")})
        if flags:
            rec["flags"] = flags
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


async def _call(client: WeKnoraClient, stage: Stage, args: Arguments,
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
    return chat.references, {"answer": chat.answer, "citations": chat.citations, "session_id": chat.session_id,
                             "retrieval_skipped": chat.retrieval_skipped, "stream_errors": chat.stream_errors}


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


def _rows(items: list[dict[str, Any]], stage: Stage, *, keep_all: bool = False) -> tuple[list[list[Any]], int,
                                                                                         list[Any]]:
    """Result objects to compact rows [rank, chunk_id, score, knowledge_id, chunk_index, match_type,
    sub_chunk_ids, base_score, model_score, parent_chunk_id, chunk_type]; rank = position among the kept
    (primary) results.

    Also how many were dropped (match types the stage does not keep; none with ``keep_all``: references whose
    match types were lost, C106) and, for FAQ entries, the matched question of each row (an empty list when no
    result carries one).
    """
    rows: list[list[Any]] = []
    questions: list[Any] = []
    dropped = 0
    keep = None if keep_all else stage.keep_match_types
    for position, it in enumerate(items, start=1):
        _check_item(it, position)
        mt = _int(it.get("match_type"))
        if keep is not None and mt is not None and mt not in keep:
            dropped += 1
            continue
        meta = it.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        kid, subs = it.get("knowledge_id"), it.get("sub_chunk_id")
        rows.append([len(rows) + 1, it["id"], _float(it.get("score")),
                     None if kid is None else str(kid), _int(it.get("chunk_index")), mt,
                     [str(x) for x in subs] if isinstance(subs, list) else [],
                     _float(meta.get("base_score")), _float(meta.get("model_score")),
                     _text(it.get("parent_chunk_id")), _text(it.get("chunk_type"))])
        questions.append(it.get("matched_question"))
    return rows, dropped, questions if any(q is not None for q in questions) else []


#: the int64 range every integer of a results row is stored in
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _check_item(item: dict[str, Any], position: int) -> None:
    """:class:`ProtocolFailed` naming the field when a result item is not what WeKnora sends (its Go types,
    docs/weknora-contract.md C21): ``id`` a non-empty string without surrounding whitespace; ``match_type`` and
    ``chunk_index`` integers (int64) or null; ``score`` a number or null; ``knowledge_id`` and ``parent_chunk_id``
    strings or null; ``sub_chunk_id`` a list of non-empty strings or null. Stored as they came, such items would
    be scored as ids like ``"None"`` or pass the match-type filter unseen."""
    problem = _item_problem(item)
    if problem is not None:
        raise ProtocolFailed(f"result {position}: {problem}, not what WeKnora sends")


def _item_problem(item: dict[str, Any]) -> str | None:
    cid = item.get("id")
    if not isinstance(cid, str) or not cid.strip() or cid != cid.strip():
        return f"field 'id' is {_shown(cid)}, not a non-empty string without surrounding spaces"
    for name in ("match_type", "chunk_index"):
        v = item.get(name)
        if v is not None and (type(v) is not int or not _INT64[0] <= v <= _INT64[1]):
            return f"field {name!r} is {_shown(v)}, not an integer of the int64 range"
    score = item.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
        return f"field 'score' is {_shown(score)}, not a number"
    for name in ("knowledge_id", "parent_chunk_id"):
        if item.get(name) is not None and not isinstance(item[name], str):
            return f"field {name!r} is {_shown(item[name])}, not a string"
    subs = item.get("sub_chunk_id")
    if subs is not None and not (isinstance(subs, list) and all(isinstance(x, str) and x.strip() for x in subs)):
        return f"field 'sub_chunk_id' is {_shown(subs)}, not a list of non-empty strings"
    return None


def _shown(value: Any) -> str:
    """A JSON value as the message shows it (at most 60 characters)."""
    import json

    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(x: Any) -> str | None:
    """An id or name as text; None for a missing or empty one."""
    return str(x) if x is not None and x != "" else None


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
