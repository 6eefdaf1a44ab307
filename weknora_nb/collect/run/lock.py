"""One collector per run folder: an exclusive lock held for the whole collection.

Two collectors on one run folder would both make every request (twice the load on the
server) and both append to its checkpoint. So a collection holds ``fcntl.flock`` on
``<run folder>/.collect.lock`` from before it writes anything until it ends, and writes who
it is into that file as JSON: ``pid``, ``host``, ``command`` (the command line, URLs
redacted) and ``started_at``. A second collector, resuming or not, is refused at once with a
:class:`~weknora_nb.core.errors.RunLockedError` naming the holder.

The file is removed when the collection ends, however it ends (done, failed, Ctrl-C). A
file that is still there with its lock free was left by a collector that was killed
(kill -9, a crash, a power cut): the operating system released its lock with the process,
and the next collector takes it over, saying so in a log line.

Where ``fcntl`` does not exist (Windows) there is no lock, and a log line says so.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from weknora_nb.collect.http.redact import redact_command
from weknora_nb.core.errors import RunLockedError, writing

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: the lock file's name in a run folder
LOCK_FILE = ".collect.lock"


class RunLock:
    """The lock of the run folder ``run_dir``: ``with RunLock(run_dir): ...`` or :meth:`acquire` / :meth:`release`.

    ``command`` is recorded (redacted) as the holder's command line; default ``sys.argv``.
    """

    def __init__(self, run_dir: str | Path, command: Sequence[str] | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.command = redact_command(sys.argv if command is None else command)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock (nothing to do when this object holds it), creating the run folder if needed.

        Raises :class:`RunLockedError` at once when another live process holds it, and
        :class:`~weknora_nb.core.errors.StorageError` when the folder cannot be written.
        """
        if self._fd is not None:
            return
        if fcntl is None:  # pragma: no cover - Windows
            log.warning("%s: no file locks on this system; do not run two collectors on it at once", self.run_dir)
            return
        with writing(self.run_dir):
            self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            with writing(self.path):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise RunLockedError(_locked_message(self.run_dir, holder), holder) from None
            if _is_the_file_at(fd, self.path):
                break
            os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
        try:
            self._take_over(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _take_over(self, fd: int) -> None:
        """Log a holder left behind by a collector that is gone, then write ourselves in."""
        previous = _read(fd)
        if previous:
            log.warning("%s: taking over the lock left by %s, which is no longer running (killed or crashed); "
                        "its requests in flight were lost and are requested again", self.run_dir,
                        _describe(previous))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
              "started_at": datetime.now(UTC).isoformat(timespec="seconds")}
        data = (json.dumps(me, ensure_ascii=False) + "\n").encode("utf-8")
        with writing(self.path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def release(self) -> None:
        """Remove the lock file and let the lock go (nothing to do when it is not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: a waiting collector sees a new file, not ours
        except OSError as exc:  # a read-only folder by now: the lock is free anyway, the next one takes it over
            log.debug("%s: lock file not removed (%s)", self.path, exc)
        finally:
            os.close(fd)


def read_holder(run_dir: str | Path) -> dict[str, Any]:
    """What the lock file of ``run_dir`` says about its holder (empty: no file, or nothing readable)."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return {}
    try:
        return _read(fd)
    finally:
        os.close(fd)


def _read(fd: int) -> dict[str, Any]:
    """The holder written in the open lock file ``fd`` (empty when it holds nothing readable)."""
    try:
        data = json.loads(os.pread(fd, 65536, 0).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_the_file_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _describe(holder: dict[str, Any]) -> str:
    """``pid 123 on host h since 2026-01-01T10:00:00+00:00``, from what the holder wrote."""
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} "
            f"since {holder.get('started_at', '?')}")


def _locked_message(run_dir: Path, holder: dict[str, Any]) -> str:
    """The one line that refuses a second collector."""
    who = _describe(holder) if holder else "another process (it has not written its name yet)"
    command = " ".join(holder.get("command") or [])
    return (f"{run_dir} is being collected by {who}"
            f"{f' ({command})' if command else ''}; wait until it ends, or stop it, then run again with --resume")
