"""Build the sandbox and run its server: in a thread (tests, notebooks, the demo) or as a command.

::

    with SandboxServer(version="rerank", weknora_version="v0.6.2") as sb:
        sb.base_url, sb.kb_id, sb.api_key

The index (chunks, BM25, embeddings) is built once per process and shared by every server
started from it; passage embeddings are cached on disk; each version's vectors live in a
database of the sandbox's Postgres (:mod:`.pgstore`), built once and kept between processes.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.core.errors import SandboxError, UsageError
from weknora_nb.core.files import default_cache_dir
from weknora_nb.core.progress import progress_bar
from weknora_nb.sandbox.auth import ApiKey
from weknora_nb.sandbox.chunking import corpus_chunks
from weknora_nb.sandbox.emulation import WeKnoraRelease, release
from weknora_nb.sandbox.engine import RetrievalEngine
from weknora_nb.sandbox.faults import FaultConfig
from weknora_nb.sandbox.history import demo_plan
from weknora_nb.sandbox.index import DEFAULT_KB_IDS, SandboxIndex
from weknora_nb.sandbox.listing import listing_path, load_listing
from weknora_nb.sandbox.memory import AnswerMemory
from weknora_nb.sandbox.parentchild import ParentChild, parent_child_corpus
from weknora_nb.sandbox.pgcluster import cluster
from weknora_nb.sandbox.server import SEARCH_CACHE_SIZE, SandboxApp, check_loopback
from weknora_nb.sandbox.versions import STREAM_MANAGERS, VersionConfig, load_versions

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette


log = logging.getLogger(__name__)

DEFAULT_KB_ID = DEFAULT_KB_IDS["document"]
#: the read-only Postgres role :meth:`SandboxServer.reader_dsn` hands out
READER_ROLE = "weknora_nb_reader"
#: the FAQ knowledge base's id, in versions that serve one
DEFAULT_FAQ_KB_ID = DEFAULT_KB_IDS["faq"]


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


_INDEXES: dict[tuple[str, str, ParentChild | None], SandboxIndex] = {}
_INDEX_LOCK = threading.Lock()


def build_index(data_dir: str | Path | None = None, *, cache_dir: str | Path | None = None,
                show_progress: bool = False, parent_child: ParentChild | None = None) -> SandboxIndex:
    """Chunk ``<data_dir>/docs`` (and its FAQ entries, ``faq/faq.jsonl``, when there are some) and
    return their index (one per folder, cache and chunking per process); or, when the folder's ``versions.yaml``
    names a chunk listing (``chunks:``, :mod:`.listing`), index the chunks listed. ``parent_child``: the documents
    are chunked parent-child (C110, :mod:`.parentchild`), else flat.

    Raises :class:`SandboxError` when the folder has neither a ``docs`` folder nor a chunk listing.
    """
    d = Path(data_dir or demo_dir()).resolve()
    c = Path(cache_dir or default_cache_dir()).resolve()
    key = (str(d), str(c), parent_child)
    with _INDEX_LOCK:
        if key not in _INDEXES:
            docs, listed = d / "docs", listing_path(d)
            texts: dict[str, str] = {}
            chunking = None
            if listed is not None:
                chunks, texts = load_listing(listed)
                chunking = {"chunk_size": 0, "chunk_overlap": 0, "separators": [], "strategy": f"listing {listed.name}"}
            elif docs.is_dir():
                chunks = corpus_chunks(d) if parent_child is None else parent_child_corpus(d, parent_child)
            else:
                raise SandboxError(f"the sandbox has no documents folder at {docs}")
            log.info("sandbox: %d chunks from %s", len(chunks), listed or docs)
            seed = d / "cache"
            _INDEXES[key] = SandboxIndex(chunks, cache_dir=c, seed_dir=seed if seed.is_dir() else None,
                                         progress=_progress_bars() if show_progress else None, index_texts=texts,
                                         chunking=chunking)
        return _INDEXES[key]


def _progress_bars() -> Callable[[str, int, int], None]:
    """A progress callback ``(model, done, total)`` drawing one tqdm bar per model being embedded."""
    bars: dict[str, Any] = {}

    def progress(model: str, done: int, total: int) -> None:
        if model not in bars:
            if done >= total:  # everything came from the cache: no bar
                return
            bars[model] = progress_bar(total=total, initial=done, desc=f"embedding chunks ({model})", unit="chunk")
        bars[model].update(done - bars[model].n)
        if done >= total:
            bars[model].close()
    return progress


def check_port(port: Any) -> None:
    """Refuse a port that is not an integer from 0 to 65535 (:class:`UsageError`; 0 picks a free port)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise UsageError(argument="port", allowed="an integer from 0 to 65535 (0 picks a free port)", got=port)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)``, the first address of ``host`` (port 0: a free port).

    Raises :class:`SandboxError` when the port cannot be had (in use, or not allowed):
    never a different port than the one asked for.
    """
    sock: socket.socket | None = None
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        # as uvicorn does: a port left in TIME_WAIT can be had again, one with a listener cannot
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        if sock is not None:
            sock.close()
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise SandboxError(f"the sandbox cannot serve on {host} port {port}: {reason}") from exc
    return sock


class SandboxServer:
    """Serve one system version of the sandbox on loopback, in a background thread.

    Parameters
    ----------
    version : str or VersionConfig, default "baseline"
        A name from ``versions.yaml`` or a config.
    host, port : loopback host; port 0 picks a free port (an integer from 0 to 65535).
    api_key : str, optional
        Defaults to ``$WEKNORA_API_KEY``, else a random ``sk-sandbox-...`` key.
    faults : FaultConfig or dict, optional
        Faults to inject from the start (off by default).
    allow_fault_control : bool
        Expose ``/_sandbox/faults`` and ``/_sandbox/stats`` so tests can change faults and read
        what the server was asked over HTTP.
    weknora_version : str, optional
        The WeKnora release whose API to emulate (``sandbox.emulation.RELEASES``); None: the
        latest release, ``DEFAULT_RELEASE``.
    api_keys : dict, optional
        More API keys, ``{secret: {"kind": "workspace" | "platform", "tenant_id": 1,
        "capabilities": [...] or None, "knowledge_base_ids": [...]}}``
        (:class:`~weknora_nb.sandbox.auth.ApiKey`); ``api_key`` is a full-access workspace key
        of tenant 1.
    stream_manager : str, optional
        ``memory`` (WeKnora Lite's) or ``redis`` (the default of WeKnora's ``.env.example``): how the chat's
        references reach the client (C117); None: the version's ``server.stream_manager``.
    other_model_kbs : dict, optional
        Empty document knowledge bases to serve too, indexed with another embedding model: ``{kb id: model
        name}``, so that a multi-KB search can mix embedding models (docs/weknora-contract.md C122).

    Raises :class:`UsageError` for a host that is not loopback, a port out of range, an
    unknown version or release, bad faults or a bad key; :meth:`start` raises
    :class:`SandboxError` when the server cannot serve (the port is in use, the server did not start).
    """

    def __init__(self, version: str | VersionConfig = "baseline", *, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, data_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None, kb_id: str = DEFAULT_KB_ID, faq_kb_id: str = DEFAULT_FAQ_KB_ID,
                 faults: FaultConfig | dict | None = None, allow_fault_control: bool = False,
                 show_progress: bool = False, weknora_version: str | None = None,
                 api_keys: dict[str, dict[str, Any]] | None = None, stream_manager: str | None = None,
                 other_model_kbs: dict[str, str] | None = None):
        check_loopback(host)
        check_port(port)
        if stream_manager is not None and stream_manager not in STREAM_MANAGERS:
            raise UsageError(argument="stream_manager", allowed=list(STREAM_MANAGERS), got=stream_manager)
        self.release: WeKnoraRelease = release(weknora_version)
        self.api_keys = dict(api_keys or {})
        for spec in self.api_keys.values():
            ApiKey.from_spec(spec)  # a bad key is a UsageError now, not when the server starts
        self.host = host
        self.port = port
        self.kb_id = kb_id
        self.faq_kb_id = faq_kb_id
        self.api_key = api_key or os.environ.get("WEKNORA_API_KEY") or f"sk-sandbox-{secrets.token_hex(12)}"
        self.data_dir = data_dir
        self.cache_dir = cache_dir
        self.version = version if isinstance(version, VersionConfig) else self._defined_version(version)
        if stream_manager is not None:
            self.version = replace(self.version, stream_manager=stream_manager)
        self.faults = faults if isinstance(faults, FaultConfig) else FaultConfig.from_dict(faults)
        self.allow_fault_control = allow_fault_control
        self.show_progress = show_progress
        self.other_model_kbs = dict(other_model_kbs or {})
        self.sandbox: SandboxApp | None = None
        self.app: Starlette | None = None
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._roles: list[tuple[str, str]] = []  # (database, role) of the reader roles handed out

    def _defined_version(self, name: str) -> VersionConfig:
        """The version ``name`` of the data folder's ``versions.yaml`` (:class:`UsageError` if not defined)."""
        defined = load_demo_versions(self.data_dir)
        if name not in defined:
            raise UsageError(argument="version", allowed=sorted(defined), got=name)
        return defined[name]

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> SandboxServer:
        """Bind the port, build the index (once per process) and serve; returns once the server listens."""
        import uvicorn

        self._socket = bind_socket(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        try:
            index = build_index(self.data_dir, cache_dir=self.cache_dir, show_progress=self.show_progress,
                                parent_child=self.version.parent_child)
            index.warm(self.version)
            engine = RetrievalEngine(index, self.version, release=self.release,
                                     kb_ids={"document": self.kb_id, "faq": self.faq_kb_id})
            if self.version.vector_enabled or self.version.faq_enabled:
                engine.vectors.build()  # the Postgres index is built (or found) before the first request
            data, kb_id, faq_kb_id = Path(self.data_dir or demo_dir()), self.kb_id, self.faq_kb_id
            self.sandbox = SandboxApp(engine, api_key=self.api_key, kb_id=self.kb_id, faq_kb_id=self.faq_kb_id,
                                      faults=self.faults, allow_fault_control=self.allow_fault_control,
                                      release=self.release, api_keys=self.api_keys,
                                      history=lambda: demo_plan(data, kb_id, faq_kb_id),
                                      other_model_kbs=self.other_model_kbs)
            self.app = self.sandbox.app
            config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning",
                                    access_log=False, timeout_graceful_shutdown=1, lifespan="off")
            self._server = uvicorn.Server(config)
            self._failure = None
            self._thread = threading.Thread(target=self._serve, args=(self._server, self._socket),
                                            name=f"sandbox-{self.version.name}", daemon=True)
            self._thread.start()
            self._wait_started(self._server, self._thread, timeout_s=30)
        except BaseException:
            self.stop()
            raise
        log.info("sandbox version %r serving on %s as WeKnora %s", self.version.name, self.base_url, self.release.name)
        return self

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        """The server thread: serve on ``sock`` until stopped, keeping what ended a failed start."""
        try:
            server.run(sockets=[sock])
        except (Exception, SystemExit) as exc:  # uvicorn ends a failed start-up with SystemExit
            self._failure = exc

    def _wait_started(self, server: uvicorn.Server, thread: threading.Thread, timeout_s: float) -> None:
        """Return once ``server`` listens; :class:`SandboxError` if its thread ended or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                if self._failure is not None:
                    why = f": {self._failure!r}"
                elif thread.is_alive():
                    why = f" within {timeout_s:g} s"
                else:
                    why = " (its thread ended)"
                raise SandboxError(f"the sandbox server did not start on {self.base_url}{why}")
            time.sleep(0.02)

    def set_faults(self, **settings: Any) -> None:
        """Replace the injected faults (in-process; over HTTP use ``PUT /_sandbox/faults``)."""
        self.faults = FaultConfig.from_dict(settings)
        if self.sandbox is not None:
            self.sandbox.faults.set(self.faults)

    def set_index_status(self, **statuses: str) -> None:
        """Set chunks' ``index_status`` (``ready``, ``processing``, ``failed``; C123), in-process (over HTTP: ``PUT
        /_sandbox/index-status``): ``set_index_status(**{"doc:003": "processing"})``."""
        if self.sandbox is None:
            raise SandboxError("the sandbox server is not started")
        for chunk_id, status in statuses.items():
            self.sandbox.engine.set_index_status(chunk_id, status)
        self.sandbox.answers = AnswerMemory(SEARCH_CACHE_SIZE)

    def stop(self) -> None:
        """Stop serving (waits up to 10 s for the server thread) and release the port."""
        for dbname, role in self._roles:
            cluster().drop_role(dbname, role)
        self._roles.clear()
        if self._server is not None:
            self._server.should_exit = True   # uvicorn's way to stop a server: its main loop sees it at its next tick
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()
        self._server = None
        self._thread = None
        self._socket = None

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def reader_dsn(self, password: str, role: str | None = None) -> str:
        """A connection string to this version's Postgres database for a role that can only read it, made now with
        ``password`` (default name: ``weknora_nb_reader_<8 hex>``, one per call, so that servers running at once
        do not change each other's passwords; dropped by :meth:`stop`). The password is in the string: hand it
        over, never write it down."""
        if self.sandbox is None:
            raise SandboxError("the sandbox server is not started")
        store = self.sandbox.engine.vectors
        role = role or f"{READER_ROLE}_{secrets.token_hex(4)}"
        cluster().ensure_reader(store.dbname, role, password)
        self._roles.append((store.dbname, role))
        return store.dsn(user=role, password=password)

    @property
    def embeddings_url(self) -> str:
        """The base URL of the sandbox's OpenAI-compatible embeddings endpoint (``POST {url}/embeddings``)."""
        return f"{self.base_url}/v1"

    def describe(self) -> dict[str, Any]:
        """The system description of the served version (for a run's manifest)."""
        return {"system": "weknora-nb sandbox", "version": self.version.name, "weknora_version": self.release.name,
                **self.version.to_nested(),
                "chunking": self._chunking(), "faults": asdict(self.faults)}

    def _chunking(self) -> dict[str, Any]:
        """How the served chunks were made: the sandbox's chunking (the version's parent-child settings), or the
        chunk listing it serves."""
        listed = self.sandbox.engine.index.chunking if self.sandbox is not None else None
        if listed:
            return dict(listed)
        return {"strategy": "structure-aware markdown (headings; tables, lists, code kept whole)", "max_chars": 420,
                **self.version.to_nested()["chunking"]}
