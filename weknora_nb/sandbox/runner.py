"""Build the sandbox and run its server: in a thread (tests, notebooks, the demo) or as a command.

::

    with SandboxServer(version="rerank") as sb:
        sb.base_url, sb.kb_id, sb.api_key

The index (chunks, BM25, embeddings, HNSW) is built once per process and shared by
every server started from it; passage embeddings are cached on disk.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from weknora_nb.sandbox.chunking import chunk_corpus
from weknora_nb.sandbox.engine import RetrievalEngine, SandboxIndex, VersionConfig, default_cache_dir, load_versions
from weknora_nb.sandbox.server import FaultConfig, check_loopback, create_app

__all__ = ["SandboxServer", "demo_dir", "build_index", "load_demo_versions", "DEFAULT_KB_ID"]

log = logging.getLogger(__name__)

DEFAULT_KB_ID = "kb-demo"


def demo_dir() -> Path:
    """The demo knowledge base folder: ``$WEKNORA_NB_DEMO``, else the one shipped with the package
    (``weknora_nb/sandbox/demo``; ``data/demo`` of a checkout links to it)."""
    env = os.environ.get("WEKNORA_NB_DEMO")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "demo"


def load_demo_versions(data_dir: str | Path | None = None) -> dict[str, VersionConfig]:
    """The system versions of ``versions.yaml`` in the demo folder."""
    return load_versions(Path(data_dir or demo_dir()) / "versions.yaml")


_INDEXES: dict[tuple[str, str], SandboxIndex] = {}
_INDEX_LOCK = threading.Lock()


def build_index(data_dir: str | Path | None = None, *, cache_dir: str | Path | None = None,
                show_progress: bool = False) -> SandboxIndex:
    """Chunk ``<data_dir>/docs`` and return its index (one per folder and cache per process)."""
    d = Path(data_dir or demo_dir()).resolve()
    c = Path(cache_dir or default_cache_dir()).resolve()
    key = (str(d), str(c))
    with _INDEX_LOCK:
        if key not in _INDEXES:
            docs = d / "docs"
            if not docs.is_dir():
                raise FileNotFoundError(f"no documents folder at {docs}")
            chunks = chunk_corpus(docs)
            log.info("sandbox: %d chunks from %s", len(chunks), docs)
            bars: dict[str, Any] = {}

            def progress(model: str, done: int, total: int) -> None:
                if not show_progress:
                    return
                from tqdm.auto import tqdm

                if model not in bars:
                    if done >= total:  # everything came from the cache: no bar
                        return
                    bars[model] = tqdm(total=total, initial=done, desc=f"embedding chunks ({model})", unit="chunk")
                bars[model].update(done - bars[model].n)
                if done >= total:
                    bars[model].close()
            seed = d / "cache"
            _INDEXES[key] = SandboxIndex(chunks, cache_dir=c, seed_dir=seed if seed.is_dir() else None,
                                         progress=progress)
        return _INDEXES[key]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class SandboxServer:
    """Serve one system version of the sandbox on loopback, in a background thread.

    Parameters
    ----------
    version : str or VersionConfig, default "baseline"
        A name from ``versions.yaml`` or a config.
    host, port : loopback host; port 0 picks a free port.
    api_key : str, optional
        Defaults to ``$WEKNORA_API_KEY``, else a random ``sk-sandbox-...`` key.
    faults : FaultConfig or dict, optional
        Faults to inject from the start (off by default).
    allow_fault_control : bool
        Expose ``/_sandbox/faults`` so tests can change faults over HTTP.
    """

    def __init__(self, version: str | VersionConfig = "baseline", *, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, data_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None, kb_id: str = DEFAULT_KB_ID,
                 faults: FaultConfig | dict | None = None, allow_fault_control: bool = False,
                 show_progress: bool = False):
        check_loopback(host)
        self.host = host
        self.port = port
        self.kb_id = kb_id
        self.api_key = api_key or os.environ.get("WEKNORA_API_KEY") or f"sk-sandbox-{secrets.token_hex(12)}"
        self.data_dir = data_dir
        self.cache_dir = cache_dir
        if isinstance(version, VersionConfig):
            self.version = version
        else:
            defined = load_demo_versions(data_dir)
            if version not in defined:
                raise KeyError(f"unknown sandbox version {version!r}; defined: {sorted(defined)}")
            self.version = defined[version]
        self.faults = faults if isinstance(faults, FaultConfig) else FaultConfig.from_dict(faults)
        self.allow_fault_control = allow_fault_control
        self.show_progress = show_progress
        self._server = None
        self._thread: threading.Thread | None = None
        self.app = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> SandboxServer:
        import uvicorn

        index = build_index(self.data_dir, cache_dir=self.cache_dir, show_progress=self.show_progress)
        index.warm(self.version)
        engine = RetrievalEngine(index, self.version)
        self.app = create_app(engine, api_key=self.api_key, kb_id=self.kb_id, faults=self.faults,
                              allow_fault_control=self.allow_fault_control)
        if not self.port:
            self.port = _free_port(self.host)
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=1, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"sandbox-{self.version.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the sandbox server did not start on {self.base_url}")
            time.sleep(0.02)
        log.info("sandbox version %r serving on %s", self.version.name, self.base_url)
        return self

    def set_faults(self, **settings: Any) -> None:
        """Replace the injected faults (in-process; over HTTP use ``PUT /_sandbox/faults``)."""
        self.faults = FaultConfig.from_dict(settings)
        if self.app is not None:
            self.app.state.faults.set(self.faults)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def describe(self) -> dict[str, Any]:
        """The system description of the served version (for a run's manifest)."""
        return {"system": "weknora-nb sandbox", "version": self.version.name, **self.version.to_nested(),
                "chunking": {"strategy": "structure-aware markdown (headings; tables, lists, code kept whole)",
                             "max_chars": 420}, "faults": asdict(self.faults)}
