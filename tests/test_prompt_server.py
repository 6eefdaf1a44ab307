"""PromptServer: uvicorn's server stopped without its fixed waits, and still graceful with requests in flight.

The server runs in a thread on loopback, as the sandbox runs it; requests are real HTTP over httpx.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from weknora_nb.sandbox import prompt_server
from weknora_nb.sandbox.prompt_server import PromptServer


async def app(scope, receive, send) -> None:
    """Answers ``/slow`` once ``release`` is set (having set ``entered``), anything else at once."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        entered.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"whole answer"})


entered, release = threading.Event(), threading.Event()


@contextmanager
def serving() -> Iterator[tuple[PromptServer, threading.Thread, int]]:
    """A PromptServer on a free loopback port, in a thread: (server, thread, port); stopped at the end."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = PromptServer(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            thread.join(0.01)
        yield server, thread, port
    finally:
        release.set()
        server.stop_soon()
        thread.join(10)
        sock.close()


@pytest.fixture(autouse=True)
def fresh_events():
    entered.clear()
    release.clear()


@pytest.fixture
def slow_ticks(monkeypatch):
    """uvicorn's tick made 60 s: a server that stops within the test's bounds was woken, not ticked."""
    monkeypatch.setattr(prompt_server, "TICK_S", 60.0)


def test_stop_soon_wakes_the_main_loop_and_frees_the_port(slow_ticks):
    with serving() as (server, thread, port):
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "whole answer"
        server.stop_soon()
        thread.join(10)
        assert not thread.is_alive()   # with a 60 s tick, only the wake-up can have ended it
    with socket.create_server(("127.0.0.1", port)):  # nothing holds the port any more
        pass


def test_stop_soon_before_the_main_loop_runs_still_stops_the_server(slow_ticks):
    sock = socket.create_server(("127.0.0.1", 0))
    server = PromptServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.stop_soon()   # no loop yet: the first tick sees should_exit
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and server.should_exit
    sock.close()


@pytest.fixture
def graceful(monkeypatch) -> list[int]:
    """The open connections at each call of uvicorn's own (graceful) shutdown, which then runs as ever."""
    calls: list[int] = []
    original = uvicorn.Server.shutdown

    async def recorded(self, sockets=None):
        calls.append(len(self.server_state.connections))
        await original(self, sockets)
    monkeypatch.setattr(uvicorn.Server, "shutdown", recorded)
    return calls


def test_an_idle_server_shuts_down_without_uvicorns_graceful_wait(graceful):
    with serving() as (server, thread, port):
        with httpx.Client() as client:
            assert client.get(f"http://127.0.0.1:{port}/").status_code == 200
        # the client has closed its connection; wait until the server has seen it go
        deadline = time.monotonic() + 10
        while server.server_state.connections:
            assert time.monotonic() < deadline, "the server never saw the client's connection close"
            thread.join(0.01)
        server.stop_soon()
        thread.join(10)
    assert graceful == []


def test_a_request_in_flight_is_answered_whole_before_the_server_stops(graceful):
    answers: list[httpx.Response] = []
    with serving() as (server, thread, port):
        asking = threading.Thread(target=lambda: answers.append(httpx.get(f"http://127.0.0.1:{port}/slow", timeout=10)))
        asking.start()
        assert entered.wait(10)
        server.stop_soon()          # asked to stop while /slow runs
        thread.join(0.1)
        assert thread.is_alive()    # uvicorn's graceful shutdown waits for it
        release.set()
        asking.join(10)
        thread.join(10)
        assert not thread.is_alive()
    assert graceful == [1]
    assert answers[0].status_code == 200 and answers[0].text == "whole answer"
