"""Settings of the Python interpreter held for the length of a block of work.

Each is process-wide. The first block to open saves the setting and changes it, the last one to close
restores it, so blocks may nest and overlap across threads. A caller's own tuning in the same direction is
kept (a shorter switch interval, a higher threshold).

- :func:`short_switches`: how often threads take turns with the interpreter lock;
- :func:`fewer_collections`: how often the cyclic garbage collector runs.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Generic, TypeVar

__all__ = ["short_switches", "fewer_collections", "YOUNG_THRESHOLD"]

T = TypeVar("T")

#: :func:`fewer_collections`' youngest-generation threshold (Python's default: 700)
YOUNG_THRESHOLD = 5000


class _Held(Generic[T]):
    """A process-wide setting (read with ``read``, set with ``write``) changed while at least one block holds it."""

    def __init__(self, read: Callable[[], T], write: Callable[[T], None]):
        self._read, self._write = read, write
        self._lock = threading.Lock()
        self._users = 0
        self._before: T | None = None

    @contextmanager
    def held(self, value: Callable[[T], T]) -> Iterator[None]:
        """The setting ``value(setting before)`` within the block (see the module's docstring)."""
        with self._lock:
            if not self._users:
                self._before = self._read()
                self._write(value(self._before))
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if not self._users:
                    self._write(self._before)  # type: ignore[arg-type]  # set by the first block


def _set_threshold(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(*thresholds)


_switch_interval: _Held[float] = _Held(sys.getswitchinterval, sys.setswitchinterval)
_gc_thresholds: _Held[tuple[int, int, int]] = _Held(gc.get_threshold, _set_threshold)


def short_switches(seconds: float = 0.0005) -> AbstractContextManager[None]:
    """Threads take turns with the interpreter lock every ``seconds`` (or sooner) within the block, then as
    before. A thread doing Arrow or numpy work needs the lock for a moment between long stretches without it,
    while one parsing Python objects holds it and by default gives it up every 5 ms only: each of those moments
    would wait that long."""
    return _switch_interval.held(lambda before: min(seconds, before))


def fewer_collections(young: int = YOUNG_THRESHOLD) -> AbstractContextManager[None]:
    """The cyclic garbage collector runs about ``young / 700`` times less often within the block, then as before.

    Its youngest generation is collected once ``young`` more container objects were made than freed (Python's
    default: 700), and each older one after 10 collections of the one below, so every generation comes that
    much less often. A full collection walks every object the process holds: in a demo worker (a sandbox's
    index, jieba's dictionary of 500,000 words, the collection's records) about 0.15 s each, 16 of them for
    the baseline version with Python's default and 2 with 5,000 (its garbage collection 3.6 s of CPU against
    1.4 s). Objects outside reference cycles are freed as always; garbage in cycles lives a little longer.
    """
    return _gc_thresholds.held(lambda before: (max(young, before[0]), before[1], before[2]))
