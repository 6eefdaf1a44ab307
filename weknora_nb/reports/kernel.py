"""One notebook executed in a kernel of its own (papermill), the kernel's sockets in a private folder.

Kernels talk to the rendering process over local IPC sockets: nothing listens on TCP. Each kernel's sockets and
connection file are made in a private temporary folder (mode 0700, given by absolute path, removed afterwards): a
relative socket path would be made in the kernel's working folder (the runs folder), where two reports rendered at
the same time would pick the same names and talk to each other's kernels. The folder, the transport and the
connection file are jupyter_client's public traits of :class:`~jupyter_client.manager.AsyncKernelManager`.

When the notebook has run the kernel is killed (``signal_kernel(SIGKILL)``): it keeps nothing worth saving (no
history), and a shutdown that interrupts it first would now and then land in a message handler, where ipykernel
logs the interrupt as an error after a successful run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: how long a killed kernel may take to be gone before its resources are cleaned up anyway (s)
KILL_WAIT_S = 10.0


def _manager_class() -> type:
    """jupyter_client's async kernel manager, which also stops the channels of every client made from it (papermill
    leaves those of a kernel it was given open)."""
    from jupyter_client.manager import AsyncKernelManager

    class Manager(AsyncKernelManager):
        def client(self, **kw: Any) -> Any:
            kc = super().client(**kw)
            self.made_clients = [*getattr(self, "made_clients", []), kc]
            return kc

    return Manager


def execute(source: Any, executed: Path, parameters: Mapping[str, Any], *, kernel_name: str, cwd: Path,
            env: Mapping[str, str] | None = None, started: Callable[[Any], None] | None = None) -> Any:
    """Execute the notebook ``source`` (a NotebookNode) with ``parameters`` injected, in a new kernel started in
    ``cwd`` with the environment ``env`` (None: this process's); the executed notebook is written to ``executed``
    (once, at its end or at its failing cell) and returned. papermill's :class:`PapermillExecutionError` when a
    cell fails. ``started`` is given the kernel manager once the kernel runs (so that another thread may
    :func:`kill` it)."""
    import papermill as pm
    from jupyter_core.utils import run_sync

    with tempfile.TemporaryDirectory(prefix="weknora-nb-kernel-") as private:
        km = _manager_class()(kernel_name=kernel_name, transport="ipc", ip=str(Path(private) / "ipc"),
                              connection_file=str(Path(private) / "kernel.json"))
        run_sync(km.start_kernel)(cwd=str(cwd), env=dict(os.environ if env is None else env),
                                  extra_arguments=["--HistoryManager.enabled=False"])
        if started is not None:
            started(km)
        try:
            return pm.execute_notebook(source, _literal(executed), parameters=dict(parameters),
                                       kernel_name=kernel_name, progress_bar=False, log_output=False,
                                       request_save_on_cell_execute=False, km=km)
        finally:
            run_sync(_stop)(km)


async def _stop(km: Any) -> None:
    """Kill ``km``'s kernel, wait (at most :data:`KILL_WAIT_S`) until it is gone, then close every client's
    channels and clean its resources up."""
    if km.has_kernel:
        await km.signal_kernel(signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while await km.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    for kc in getattr(km, "made_clients", []):
        kc.stop_channels()
    await km.cleanup_resources()


def kill(km: Any) -> None:
    """Kill ``km``'s kernel now (from another thread: Ctrl-C)."""
    from jupyter_core.utils import run_sync

    if km is not None and km.has_kernel:
        run_sync(km.signal_kernel)(signal.SIGKILL)


def _literal(path: Path) -> str:
    """``path`` as papermill takes it literally (papermill ``str.format``s output paths: ``{`` would be a field)."""
    return str(path).replace("{", "{{").replace("}", "}}")
