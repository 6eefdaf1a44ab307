"""The checkpoint of a run: one JSON line per finished request, appended as requests finish.

A record is ``{"query_id", "stage", "repeat", "at", "status", "latency_ms", "rows", ...}``;
its key is ``(query_id, stage, repeat)``. A request retried on resume is appended again,
and the last record of a key is the one that counts (:func:`read_checkpoint`), so the
file never needs rewriting and a resumed run never holds a request twice.

Appending happens on a thread of its own (:class:`CheckpointWriter`): the collector's
event loop hands over the lines of the requests that finished in one turn of the loop
and goes on sending requests, so a slow disk never stalls the requests in flight. The
writer flushes them to the operating system as soon as it has them, so a crash or a
kill -9 of the process loses at most the requests in flight (and the lines of the last
turn of the loop, a fraction of a millisecond); a torn last line is dropped when the
checkpoint is read again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from pathlib import Path
from typing import IO, Any

from weknora_nb.core.errors import RunFolderError, reading, writing
from weknora_nb.core.jsontext import json_bytes

log = logging.getLogger(__name__)

#: (query_id, stage, repeat): one request of a run
RequestKey = tuple[str, str, int]
#: the last record of every request, by key
Records = dict[RequestKey, dict[str, Any]]

_CLOSE = None  # the writer thread's stop signal, queued after the last line


def read_checkpoint(path: str | Path) -> Records:
    """The last record of every request in a checkpoint; a torn last line (a kill mid-write) is dropped.

    The file is truncated after its last whole line, so that appending goes on from there.
    A line that is not a record (not JSON, or not the shape the collector writes) anywhere but
    at the end means the file is damaged: :class:`~weknora_nb.core.errors.RunFolderError`
    naming the line. A file that cannot be read is an :class:`~weknora_nb.core.errors.InputError`;
    one whose torn tail cannot be cut off, a :class:`~weknora_nb.core.errors.StorageError`.
    """
    p = Path(path)
    if not p.exists():
        return {}
    with reading(p):
        raw = p.read_bytes()
    records, good_end = _parse(p, raw)
    if good_end < len(raw):
        with writing(p), open(p, "r+b") as fh:
            fh.truncate(good_end)
    return records


def count_records(path: str | Path) -> int | None:
    """How many requests a checkpoint holds, without changing it; None when it cannot be read."""
    p = Path(path)
    try:
        return len(_parse(p, p.read_bytes())[0]) if p.exists() else 0
    except (OSError, RunFolderError):
        return None


def _parse(p: Path, raw: bytes) -> tuple[Records, int]:
    """The records of a checkpoint's bytes, and where its last whole line ends."""
    records: Records = {}
    lines = raw.split(b"\n")
    good_end = 0
    for i, line in enumerate(lines):
        if not line.strip():
            good_end += len(line) + 1
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            if i >= len(lines) - 2:  # only the tail can be torn
                log.warning("%s: dropping a torn last line (%d bytes)", p, len(line))
                break
            raise RunFolderError(f"{p}: line {i + 1} is not valid JSON; the checkpoint is damaged") from None
        problem = _record_problem(rec)
        if problem:
            raise RunFolderError(f"{p}: line {i + 1} is not a request record ({problem}); the checkpoint is damaged")
        records[(rec["query_id"], rec["stage"], rec["repeat"])] = _beyond_int64(rec)
        good_end += len(line) + 1
    return records, min(good_end, len(raw))


#: the types of a result row's fields: [rank, chunk_id, score, knowledge_id, chunk_index, match_type,
#: sub_chunk_ids, base_score, model_score, parent_chunk_id, chunk_type] (None allowed in all but rank and
#: chunk_id; a shorter row, of an older checkpoint, lacks the last ones)
_ROW_TYPES: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("rank", (int,)), ("chunk_id", (str,)), ("score", (int, float)), ("knowledge_id", (str,)),
    ("chunk_index", (int,)), ("match_type", (int,)), ("sub_chunk_ids", (list,)), ("base_score", (int, float)),
    ("model_score", (int, float)), ("parent_chunk_id", (str,)), ("chunk_type", (str,)))


def _record_problem(rec: Any) -> str | None:
    """What makes ``rec`` unlike a record the collector writes (None: nothing)."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    required: tuple[tuple[str, tuple[type, ...]], ...] = (
        ("query_id", (str,)), ("stage", (str,)), ("repeat", (int,)), ("status", (str,)))
    for key, kinds in required:
        if not _is(rec.get(key), kinds):
            return f"{key!r} missing or not a {kinds[0].__name__}"
    optional: tuple[tuple[str, tuple[type, ...]], ...] = (
        ("latency_ms", (int, float)), ("n_dropped", (int,)), ("error", (str,)), ("flags", (list,)),
        ("stream_errors", (list,)))
    for key, kinds in optional:
        if rec.get(key) is not None and not _is(rec[key], kinds):
            return f"{key!r} is not a {kinds[0].__name__}"
    if "answer" in rec and not isinstance(rec.get("citations"), list):
        return "an answer without its list of citations"
    rows = rec.get("rows")
    if rows is None:
        return None
    if not isinstance(rows, list):
        return "'rows' is not a list"
    for row in rows:
        if not isinstance(row, list) or not 2 <= len(row) <= len(_ROW_TYPES):
            return f"a row that is not a list of 2 to {len(_ROW_TYPES)} fields"
        for (name, kinds), value in zip(_ROW_TYPES, row, strict=False):  # missing fields are None
            if (value is not None or name in ("rank", "chunk_id")) and not _is(value, kinds):
                return f"a row whose {name} is {value!r}"
    return None


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    """``isinstance(value, kinds)``, a bool being no number."""
    return isinstance(value, kinds) and not isinstance(value, bool)


def _beyond_int64(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec``, or, when a row of it holds an integer beyond the int64 range a results table stores (a collector
    before that rule recorded what a server sent), the same request recorded as failed (``protocol``), so that the
    run can be resumed and the request made again with ``--retry-failed``."""
    for row in rec.get("rows") or []:
        for (name, _), value in zip(_ROW_TYPES, row, strict=False):
            if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
                return {**rec, "status": "protocol", "rows": [], "latency_ms": None,
                        "error": f"a result's {name} is beyond the int64 range, not what WeKnora sends"}
    return rec


class CheckpointWriter:
    """Appends records to a checkpoint file from a thread of its own.

    Use as ``async with CheckpointWriter(path) as ckpt: ckpt.append(record)``. ``append``
    never blocks the event loop: it serialises the record; at the end of the loop's turn the
    lines of that turn are queued together, and the thread writes everything queued in one
    call and flushes it (one wake-up of the thread per turn, not per record). Leaving the ``async with`` block
    (or :meth:`aclose`) waits, off the event loop, until every line handed over is written
    and the file is closed. A write that failed (a full disk) is raised by every later
    ``append``, or by ``aclose`` when no append raised it.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._pending: list[str] = []  # this turn's lines, not handed over yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_raised = False
        self._closed = False

    async def __aenter__(self) -> CheckpointWriter:
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Open the file for appending (in a worker thread) and start the writer thread."""
        self._loop = asyncio.get_running_loop()
        with writing(self.path):
            fh = await asyncio.to_thread(open, self.path, "a", encoding="utf-8")
        self._thread = threading.Thread(target=self._write_lines, args=(fh,), name="weknora-nb-checkpoint",
                                        daemon=True)
        self._thread.start()

    def append(self, record: dict[str, Any]) -> None:
        """Queue one record (a JSON line) for writing; raises the error of a write that failed before."""
        if self._error is not None:
            self._error_raised = True
            raise self._error
        if self._closed or self._thread is None or self._loop is None:
            raise RuntimeError(f"checkpoint {self.path} is not open for appending")
        self._pending.append(json_bytes(record).decode("utf-8") + "\n")
        if len(self._pending) == 1:
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        """Queue this turn's lines for the writer thread (the end of the turn, or closing)."""
        if self._pending:
            self._lines.put("".join(self._pending))
            self._pending = []

    async def aclose(self) -> None:
        """Write every queued line, close the file and stop the thread (waited for off the event loop)."""
        if self._closed or self._thread is None:
            return
        self._closed = True
        self._hand_over()
        self._lines.put(_CLOSE)
        await asyncio.to_thread(self._thread.join)
        if self._error is not None and not self._error_raised:  # not raised by an append yet
            self._error_raised = True
            raise self._error

    def _write_lines(self, fh: IO[str]) -> None:
        """The writer thread: write what is queued, in one call per wake-up, until the stop signal.

        After a failed write the lines that follow are dropped (the error is raised on the
        event loop's side instead); the thread still runs to the stop signal, so closing never hangs.
        """
        try:
            closing = False
            while not closing:
                batch = [self._lines.get()]
                while not self._lines.empty():
                    batch.append(self._lines.get_nowait())
                lines = [x for x in batch if x is not _CLOSE]
                closing = len(lines) < len(batch)
                if lines and self._error is None:
                    try:
                        fh.write("".join(lines))
                        fh.flush()
                    except BaseException as exc:  # re-raised on the event loop's side
                        self._error = exc
        finally:
            try:
                fh.close()
            except BaseException as exc:
                self._error = self._error or exc
