"""uvicorn's server, stopped as soon as it is told to.

uvicorn's :class:`uvicorn.Server` notices ``should_exit`` at its next tick (its main loop sleeps 0.1 s between
ticks), then gives open connections 0.1 s to take their shutdown notice, whether or not any is open. A sandbox
is started and stopped by every test, demo version and notebook, and each stop would wait for both.
:class:`PromptServer` keeps uvicorn's behaviour and takes out the waits that hold nothing:

- :meth:`PromptServer.stop_soon` (from any thread) sets ``should_exit`` and wakes the main loop, which then runs
  its tick at once;
- with no connection open and no request running, :meth:`PromptServer.shutdown` closes the listening sockets and
  returns without the pause; otherwise it is uvicorn's graceful shutdown, unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

#: uvicorn's tick: the main loop's wait between two looks at its state (seconds)
TICK_S = 0.1


class PromptServer(uvicorn.Server):
    """A :class:`uvicorn.Server` whose stop takes no fixed wait (see the module docstring)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        """uvicorn's main loop (a tick every :data:`TICK_S`), woken early by :meth:`stop_soon`."""
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000  # as uvicorn counts its ticks
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)

    def stop_soon(self) -> None:
        """Ask the server to stop (callable from any thread): ``should_exit``, and its main loop woken."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed: it has stopped
                loop.call_soon_threadsafe(wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown; when no connection is open and no request runs, only the listening sockets are
        closed (there is nothing to notify or wait for: the loop turn that checks this accepts nothing)."""
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)
            return
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()
