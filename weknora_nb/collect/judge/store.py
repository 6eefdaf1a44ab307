"""What the judge keeps on disk: its cache, its judgement log and its lock.

- :class:`JudgeCache`: a SQLite file (default ``<runs folder>/.judge-cache.sqlite``, shared by the
  runs beside each other) mapping a request's hash to the reply that was read from it. Only
  replies that passed the strict reading are kept, so a failure is asked again another time. The
  key is a hash of everything that decides a reply (see ``weknora_nb.collect.judge``); the file
  holds no key, no URL's secret, only replies and their token counts.
- :class:`JudgementLog`: a JSON-lines file, one record per finished judgement, appended,
  flushed and ``fsync``-ed one at a time, so a killed judge loses at most the calls in flight.
  Reading it drops a torn last line (a kill mid-write) and cuts the file after its last whole
  line; a damaged line elsewhere is a :class:`~weknora_nb.core.errors.RunFolderError`. A key is
  written once: the judge appends only keys it does not hold, and :meth:`JudgementLog.rewrite`
  (atomic) removes records before they are judged again.
- :class:`JudgeLock`: the collector's run-folder lock (:class:`~weknora_nb.collect.run.lock.RunLock`) on a
  file of its own, ``.judge.lock``: one judge per run folder at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from weknora_nb.collect.run.lock import RunLock
from weknora_nb.core.errors import RunFolderError, RunLockedError, StorageError, reading, writing
from weknora_nb.core.files import atomic_path

log = logging.getLogger(__name__)

CACHE_FILE = ".judge-cache.sqlite"
LOCK_FILE = ".judge.lock"
#: the key of a record: (query_id, stage, repeat, judge_repeat) for a judgement, (query_id, chunk_id, judge_repeat)
#: for a relevance grade: strings, then integers
Key = tuple[str | int, ...]
#: the fields that make a judgement's key
JUDGEMENT_KEYS = ("query_id", "stage", "repeat", "judge_repeat")


class JudgeCache:
    """Replies by request hash, in SQLite. ``read_only`` (the dry run) never creates or changes the file.

    SQLite's own errors (a read-only or damaged file) are :class:`StorageError` naming the file:
    the package's translation helpers know OS errors, and SQLite raises its own.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False):
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        if read_only and not self.path.exists():
            return
        try:
            if read_only:
                self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
            else:
                with writing(self.path):
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, timeout=30)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL, "
                                 "created_at TEXT NOT NULL)")
                self._db.commit()
        except sqlite3.Error as exc:
            raise StorageError(self.path, f"the judge cache cannot be used: {exc}") from exc

    def get(self, key: str) -> dict[str, Any] | None:
        """The reply kept for ``key``, or None."""
        if self._db is None:
            return None
        try:
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise StorageError(self.path, f"the judge cache cannot be read: {exc}") from exc
        return json.loads(row[0]) if row else None

    def put(self, key: str, reply: dict[str, Any]) -> None:
        """Keep ``reply`` for ``key`` (committed at once)."""
        if self._db is None:
            raise StorageError(self.path, "the judge cache was opened read-only")
        try:
            self._db.execute("INSERT OR REPLACE INTO replies (key, reply, created_at) VALUES (?, ?, ?)",
                             (key, json.dumps(reply, ensure_ascii=False), datetime.now(UTC).isoformat()))
            self._db.commit()
        except sqlite3.Error as exc:
            raise StorageError(self.path, f"the judge cache cannot be written: {exc}") from exc

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class JudgementLog:
    """The records of a judge run, one JSON line each; ``key_of(record)`` is a record's :data:`Key`."""

    def __init__(self, path: str | Path, key_of: Callable[[dict[str, Any]], Key]):
        self.path = Path(path)
        self.key_of = key_of
        self._fh: IO[str] | None = None

    def read(self) -> dict[Key, dict[str, Any]]:
        """Every record by key (a torn last line dropped and cut off); {} when there is no file."""
        if not self.path.exists():
            return {}
        with reading(self.path):
            raw = self.path.read_bytes()
        records: dict[Key, dict[str, Any]] = {}
        lines = raw.split(b"\n")
        good_end = 0
        for i, line in enumerate(lines):
            if line.strip():
                try:
                    rec = json.loads(line)
                    key = self.key_of(rec)
                except (ValueError, KeyError, TypeError, RecursionError):
                    if i >= len(lines) - 2:  # only the tail can be torn
                        log.warning("%s: dropping a torn last line (%d bytes)", self.path, len(line))
                        break
                    raise RunFolderError(f"{self.path}: line {i + 1} is not a judgement record; the file is "
                                         "damaged") from None
                records[key] = rec
            good_end += len(line) + 1
        good_end = min(good_end, len(raw))
        if good_end < len(raw):
            with writing(self.path), open(self.path, "r+b") as fh:
                fh.truncate(good_end)
        return records

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the file by ``records`` (atomic: the old file or the new one, never half of either)."""
        with writing(self.path), atomic_path(self.path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def open(self) -> None:
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    async def append(self, record: dict[str, Any]) -> None:
        """Write one record as one line, flush it, and ``fsync`` it (off the event loop)."""
        if self._fh is None:
            raise RuntimeError(f"{self.path} is not open for appending")
        with writing(self.path):
            self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._fh.flush()
            await asyncio.to_thread(os.fsync, self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            with writing(self.path):
                self._fh.close()
            self._fh = None


def judgement_key(rec: dict[str, Any]) -> Key:
    return record_key(rec, JUDGEMENT_KEYS)


def record_key(rec: dict[str, Any], names: tuple[str, ...]) -> Key:
    """The key of a record of a judge's log: its fields ``names`` (the first two strings, the others integers);
    a :class:`TypeError` when it is not a whole record (a torn or foreign line)."""
    key = tuple(rec[n] for n in names)
    if not (all(isinstance(k, str) for k in key[:2]) and all(isinstance(k, int) for k in key[2:])
            and rec.get("status") in ("judged", "failed")):
        raise TypeError("not a judgement record")
    return key


def read_judgements(path: str | Path) -> list[dict[str, Any]]:
    """The records of a judgement log (``judgements.jsonl`` or a pairwise log), one per judgement."""
    return list(JudgementLog(path, judgement_key).read().values())


class JudgeLock(RunLock):
    """One process at a time on a folder's LLM work: the run-folder lock on ``lock_file`` (default the judge's
    ``.judge.lock``); a refusal names the holder and says what it is doing (``doing``: "judged") and what to run
    again once it ends (``again``: "the judge")."""

    def __init__(self, run_dir: str | Path, command: list[str] | None = None, *, lock_file: str = LOCK_FILE,
                 doing: str = "judged", again: str = "the judge"):
        super().__init__(run_dir, command)
        self.path = self.run_dir / lock_file
        self.doing, self.again = doing, again

    def acquire(self) -> None:
        try:
            super().acquire()
        except RunLockedError as exc:
            h = exc.holder
            who = f"pid {h.get('pid', '?')} on host {h.get('host', '?')} since {h.get('started_at', '?')}" if h \
                else "another process"
            raise RunLockedError(f"{self.run_dir} is being {self.doing} by {who}; wait until it ends, or stop it, "
                                 f"then run {self.again} again (it goes on where it stopped)", h) from None


def reopen_log(log: JudgementLog, done: dict[Key, dict[str, Any]], *, replace: bool,
               retry_failed: bool) -> dict[Key, dict[str, Any]]:
    """The records of ``log`` to keep (``done``, as read): none with ``replace``, the failed ones dropped with
    ``retry_failed``; the log rewritten to hold just those, then open for appending."""
    if replace and done:
        done = {}
        log.rewrite([])
    elif retry_failed and any(r["status"] == "failed" for r in done.values()):
        done = {k: r for k, r in done.items() if r["status"] != "failed"}
        log.rewrite(done.values())
    log.open()
    return done
