"""What every client of the collection layer shares: the retry policy, the ``Retry-After`` header,
and running a coroutine to the end from synchronous code, Ctrl-C included.

Used by the WeKnora client (:mod:`.client`), the LLM judge's client (:mod:`weknora_nb.collect.judge.llm`), the
collector and the judge run: one policy, so a judge run treats 429s, timeouts and 5xx as a collection does.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import httpx

from weknora_nb.core.errors import RequestFailed

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class RetryPolicy(Protocol):
    """The settings :func:`with_retries` reads (``ClientSettings`` and ``LLMSettings`` have them)."""

    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    retry_after_max_s: float


async def with_retries(call: Callable[[], Awaitable[_T]], policy: RetryPolicy, rng: random.Random, *,
                       what: str = "request") -> _T:
    """``call()`` up to ``policy.max_attempts`` times while it fails retryably, sleeping between attempts.

    The delay before attempt n + 1 is the server's ``Retry-After`` (at most
    ``retry_after_max_s``) or, without one, uniform in [0, min(backoff_max_s,
    backoff_base_s * 2^(n - 1))] seconds (exponential backoff with full jitter). A failure
    that is not retryable (:attr:`RequestFailed.retryable`), or the last attempt's, is raised.
    """
    attempt = 1
    while True:
        try:
            return await call()
        except RequestFailed as exc:
            if not exc.retryable or attempt >= policy.max_attempts:
                raise
            if exc.retry_after is not None:
                delay = min(exc.retry_after, policy.retry_after_max_s)
            else:
                delay = rng.uniform(0, min(policy.backoff_max_s, policy.backoff_base_s * 2 ** (attempt - 1)))
            log.debug("%s attempt %d failed (%s); retrying in %.2f s", what, attempt, exc.kind, delay)
            await asyncio.sleep(delay)
            attempt += 1


def retry_after(resp: httpx.Response) -> float | None:
    """How long the server asks to wait, in seconds: ``retry-after-ms`` (OpenAI's) or ``Retry-After``
    (seconds or an HTTP date); None when absent or unreadable."""
    ms = resp.headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def run_to_end(make: Callable[[], Awaitable[_T]], *, name: str = "weknora-nb") -> _T:
    """``await make()`` from synchronous code: on a new event loop (:func:`run_on_new_loop`), or, where
    a loop already runs (Jupyter), on a loop of its own in a thread. A KeyboardInterrupt of the waiting
    thread cancels the work there (as ``asyncio.run`` does on Ctrl-C), waits for it to stop, and is raised."""
    box: dict[str, Any] = {}

    async def main() -> _T:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_on_new_loop(main())

    def target() -> None:
        try:
            box["value"] = run_on_new_loop(main())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc
    t = threading.Thread(target=target, name=name)
    t.start()
    try:
        t.join()
    except KeyboardInterrupt:
        if "task" in box:
            box["loop"].call_soon_threadsafe(box["task"].cancel)
        t.join()
        raise
    if "error" in box:
        raise box["error"]
    value: _T = box["value"]
    return value


def run_on_new_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(coro)`` on uvloop's event loop where uvloop is installed (not on Windows), as the sandbox's
    server runs (the collector's event loop is busy with every request it makes); Ctrl-C cancels ``coro`` as
    under ``asyncio.run``."""
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        return runner.run(coro)


def _new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for :func:`run_on_new_loop`: uvloop's where it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    return loop
