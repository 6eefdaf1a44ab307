"""Work begun in a forked child process beside the caller's own, its result handed back pickled.

The command line's ``score`` keeps both cores busy this way: the results file is read and laid out
(:class:`~weknora_nb.core.requests.PrepareAhead`) while the parent imports pandas and parses the test set. A
thread would not do: parsing JSON and building Python objects hold the interpreter lock.

The child writes its pickled result into a temporary file with no name (nothing is left behind, whatever ends
either process) and ends at once; the parent reads the file in one call (a pipe would take hundreds of reads,
each waiting for the lock). A child that fails, or whose work has nothing to give, hands back nothing: the
caller then does the work itself and names any problem as always, so that no error depends on the child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import IO, Any

__all__ = ["Forked", "NOTHING"]

log = logging.getLogger(__name__)

#: the child's exit status when its work gave None (and when it failed: 1)
NOTHING = 3


class Forked:
    """``work()`` run in a child process forked now; :meth:`result` waits for what it returned.

    Fork only a process that is the program's own (the command line's) and where it can be forked safely:
    :meth:`possible`. Use it as a context manager (or call :meth:`close`): a child still at work when the
    caller stops is killed.
    """

    def __init__(self, work: Callable[[], Any], name: str):
        self.name = name
        #: how the child ended, once reaped: its exit status, or minus the signal that ended it
        self.exitcode: int | None = None
        self._file: IO[bytes] | None = tempfile.TemporaryFile()   # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()   # over reaping and closing
        self._pid: int | None = None
        try:
            self._pid = os.fork()
        except OSError as exc:   # no process to be had (a limit, memory): the caller does the work itself
            log.debug("%s: no child process (%s): done here", name, exc)
            self.close()
            return
        if self._pid == 0:   # the child: it never returns
            _child(self._file.fileno(), work)

    @staticmethod
    def possible() -> bool:
        """Whether this process may be forked: Linux (``fork`` is its own start method there) and no thread
        of the program's own started yet (a child would inherit a lock some other thread holds)."""
        return sys.platform == "linux" and threading.active_count() == 1

    def result(self) -> Any:
        """What ``work()`` returned, or None: it returned None, failed, or the child died (its exit status is in
        :attr:`exitcode`). The child is reaped and its file dropped."""
        self._reap()
        with self._lock:
            data = None
            if self.exitcode == 0 and self._file is not None:
                self._file.seek(0)
                data = self._file.read()
        self.close()
        if data is None:
            log.debug("%s: the child process gave nothing (exit %s): done here", self.name, self.exitcode)
            return None
        return pickle.loads(data)

    def close(self) -> None:
        """Kill the child if it is still at work, reap it, and drop its file (from any thread, while another
        waits in :meth:`result`)."""
        with self._lock:
            if self._pid is not None:   # not reaped: the number is still the child's, a zombie's at worst
                with contextlib.suppress(ProcessLookupError):   # reaped by the system (SIGCHLD ignored)
                    os.kill(self._pid, signal.SIGKILL)
                self._wait()
            if self._file is not None:
                self._file.close()
                self._file = None

    def _reap(self) -> None:
        """Wait for the child's end, then reap it: the waiting leaves it unreaped (a zombie), so that
        :meth:`close` in another thread may still kill it by its number meanwhile."""
        pid = self._pid
        if pid is not None:
            with contextlib.suppress(ChildProcessError):   # close() reaped it meanwhile
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with self._lock:
            if self._pid is not None:
                self._wait()

    def _wait(self) -> None:
        """Reap the child (the lock held): its exit status into :attr:`exitcode` (None when the system reaped it
        already, as it does with SIGCHLD ignored: it then gave nothing)."""
        assert self._pid is not None
        with contextlib.suppress(ChildProcessError):
            self.exitcode = os.waitstatus_to_exitcode(os.waitpid(self._pid, 0)[1])
        self._pid = None

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child(fd: int, work: Callable[[], Any]) -> None:
    """What the child process runs: ``work()`` pickled into the file ``fd``, then its end, at once (``os._exit``:
    nothing of the parent's is flushed or torn down twice), with status 0; :data:`NOTHING` when the work gave
    None, 1 when anything goes wrong, even an interrupt. It writes nothing else: its standard output and error
    go to the null device."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        value = work()
        if value is None:
            code = NOTHING
        else:
            data = memoryview(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
            while data:
                data = data[os.write(fd, data):]
            code = 0
    except BaseException:  # noqa: BLE001, S110 - the parent does the work itself and names any problem
        pass
    finally:
        os._exit(code)
