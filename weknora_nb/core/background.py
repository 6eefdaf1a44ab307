"""Work started in a thread of its own (:func:`in_background`), its result or its exception handed over by a
future: what lets scoring read a results file while the test set loads, or build two halves of a text at once
(Arrow and numpy work without the interpreter lock)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def in_background(work: Callable[[], Any], name: str) -> Future[Any]:
    """``work()`` started in a daemon thread of its own named ``name``: its result, or its exception, comes out
    of the future's ``result()``. Being a daemon, it never holds up the end of the process (a command that
    stops with an error does not wait for work it no longer needs)."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
