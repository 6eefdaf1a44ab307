"""A request's body sent at once on Python 3.11 (weknora_nb/collect/eager.py): aiohttp's body writes start in
the task factory, every other task as usual; the loops of the collection layer have it, through real aiohttp."""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys

import aiohttp
import pytest

from weknora_nb.collect.eager import body_writes_at_once
from weknora_nb.collect.retry import run_on_new_loop

WHERE = contextvars.ContextVar("WHERE", default="outside")


def aiohttp_named(source: str, name: str = "write_bytes", module: str = "aiohttp.client_reqrep"):
    """The coroutine function defined by ``source`` as if it were aiohttp's ``ClientRequest.write_bytes``."""
    ns: dict = {"__name__": module, "asyncio": asyncio, "WHERE": WHERE}
    exec(source, ns)  # noqa: S102 - test code, a function of the test's own
    fn = ns[name]
    fn.__qualname__ = "ClientRequest.write_bytes"
    return fn


WRITES = aiohttp_named("""
async def write_bytes(log, wait=None, fail=False):
    log.append(("started", WHERE.get()))
    if fail:
        raise OSError("the socket is gone")
    if wait is not None:
        try:
            got = await wait
        except asyncio.CancelledError:
            log.append("cancelled inside")
            raise
        log.append(("resumed", got))
    return "written"
""")


def test_a_body_write_runs_at_once_and_a_finished_one_is_a_done_future():
    async def main():
        log: list = []
        WHERE.set("the caller's")
        task = asyncio.get_running_loop().create_task(WRITES(log))
        assert log == [("started", "the caller's")] and task.done() and task.result() == "written"

        failed = asyncio.get_running_loop().create_task(WRITES([], fail=True))
        assert failed.done() and isinstance(failed.exception(), OSError)
    run_on_loop_with_factory(main())


def test_a_write_that_waits_goes_on_as_a_task_with_what_it_awaited():
    async def main():
        log: list = []
        later = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(WRITES(log, later))
        assert log == [("started", "outside")] and not task.done()
        later.set_result(42)
        assert await task == "written" and log[-1] == ("resumed", 42)

        log2: list = []
        never = asyncio.get_running_loop().create_future()
        waiting = asyncio.get_running_loop().create_task(WRITES(log2, never))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert log2 == [("started", "outside"), "cancelled inside"] and waiting.cancelled()

        log3: list = []   # cancelled before its task's first step: the write still sees the cancellation
        at_once = asyncio.get_running_loop().create_task(WRITES(log3, asyncio.get_running_loop().create_future()))
        at_once.cancel()
        with pytest.raises(asyncio.CancelledError):
            await at_once
        assert log3 == [("started", "outside"), "cancelled inside"] and at_once.cancelled()
    run_on_loop_with_factory(main())


def test_every_other_coroutine_is_an_ordinary_task_started_by_the_loop():
    other = aiohttp_named("""
async def write_bytes(log):
    log.append("ran")
""", module="someone.else")

    async def main():
        log: list = []
        task = asyncio.get_running_loop().create_task(other(log))
        assert isinstance(task, asyncio.Task) and log == [] and not task.done()
        await task
        assert log == ["ran"]
    run_on_loop_with_factory(main())


def run_on_loop_with_factory(coro):
    loop = asyncio.new_event_loop()
    loop.set_task_factory(body_writes_at_once)  # type: ignore[arg-type]
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="aiohttp starts its body writes eagerly itself from 3.12")
def test_the_collection_loops_write_aiohttps_request_bodies_at_once():
    """Through real aiohttp on loopback: ``run_on_new_loop``'s loop starts ``ClientRequest.write_bytes`` in the task
    factory (the name this relies on is still aiohttp's), the body is written before the loop's next turn, and the
    server receives it whole."""
    seen: list[tuple[str, bool]] = []

    def recording(loop, coro, **kwargs):
        task = body_writes_at_once(loop, coro, **kwargs)
        seen.append((getattr(coro, "__qualname__", "?"), task.done()))
        return task

    async def main() -> bytes:
        assert asyncio.get_running_loop().get_task_factory() is body_writes_at_once
        asyncio.get_running_loop().set_task_factory(recording)
        received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
                b"content-length")))
            received.set_result(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, aiohttp.ClientSession() as session, \
                session.post(f"http://127.0.0.1:{port}/search", json={"query": "如何重置密码"}) as resp:
            assert await resp.text() == "ok"
        return await received

    assert json.loads(run_on_new_loop(main())) == {"query": "如何重置密码"}
    writes = [done for name, done in seen if name == "ClientRequest.write_bytes"]
    assert writes == [True]
