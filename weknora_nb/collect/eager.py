"""A request's body sent at once on Python 3.11, as aiohttp does on 3.12 and later.

aiohttp writes a request that has a body (every ``knowledge-search``, every judge call) in a task of its own.
From Python 3.12 it starts that task eagerly: the bytes go out before ``send`` returns. On 3.11 it can only
schedule the task, which runs once the event loop has finished the callbacks already due in its turn. When
many answers arrive together (32 requests in flight, each answered after the same 50 ms), each worker that
reads an answer and asks its next question leaves that question unsent until every other answer of the turn
is read and recorded: up to some 30 ms on a 2-core machine, added to the next request's latency. The
collection then kept 0.77-0.88 of the ideal throughput at 32 in flight; with the bodies written at once,
0.91-0.94 (``benchmarks/bench_collect.py``'s bare loop, 4 runs each in turn).

:func:`body_writes_at_once` is a task factory that starts exactly those tasks (aiohttp's
``ClientRequest.write_bytes``) at once, as 3.12's ``eager_start`` does, and every other task as usual.
:func:`weknora_nb.collect.retry.run_on_new_loop` installs it on the loops the collection layer runs on, on
Python before 3.12; a caller's own event loop (Jupyter's) is left as it is.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["body_writes_at_once"]

#: the coroutine started at once: aiohttp's writing of a request's body (module, qualified name)
_EAGER = ("aiohttp.client_reqrep", "ClientRequest.write_bytes")


def body_writes_at_once(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                        **kwargs: Any) -> asyncio.Future[Any]:
    """A task factory (``loop.set_task_factory``): aiohttp's body writes run their first step now, in the
    task's context, up to the first wait (a full socket buffer) or to the end; every other coroutine becomes an
    ordinary :class:`asyncio.Task`. A write done in that step gives a finished future, its result or its error
    (aiohttp then keeps no task, as with 3.12's eager tasks)."""
    frame = getattr(coro, "cr_frame", None)
    if frame is None or (frame.f_globals.get("__name__"), getattr(coro, "__qualname__", None)) != _EAGER:
        return asyncio.Task(coro, loop=loop, **kwargs)
    context = kwargs.get("context") or contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration as stop:
        done = loop.create_future()
        done.set_result(stop.value)
        return done
    except Exception as exc:  # noqa: BLE001 - the task's error, kept as a task would keep it
        failed = loop.create_future()
        failed.set_exception(exc)
        return failed
    return asyncio.Task(_Resumed(coro, waiting_on), loop=loop, context=context)


class _Resumed(collections.abc.Coroutine):
    """``coro``, whose first step was run by hand and stopped at ``waiting_on`` (the future it waits for), as the
    coroutine its task drives from there: the task's first step is handed ``waiting_on``; every later value sent,
    and every exception thrown (a cancellation, even one before that first step), goes to ``coro``."""

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any):
        self._coro = coro
        self._first = [waiting_on]

    def send(self, value: Any) -> Any:
        if self._first:
            return self._first.pop()
        return self._coro.send(value)

    def throw(self, *exc: Any) -> Any:
        self._first.clear()
        return self._coro.throw(*exc)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        raise TypeError("a resumed body write is driven by its task, never awaited")
