"""A replay server: what a running WeKnora Lite v0.7.2 answered, served again over HTTP on loopback.

The recordings are in ``tests/fixtures/weknora-v0.7.2/`` (its README.md says how they were made and what was
trimmed): one JSON per interaction, the request (method, path, query, body, which credentials were sent) and
the response (status, headers, JSON body, a text body, or an SSE stream in a ``.sse`` file beside it); a recording
whose ``also_requests`` lists other requests answers those too (each was recorded with the very same answer).
:class:`ReplayServer` is a real HTTP/1.1 server (the standard library's, in a thread) that answers each
request with the recording of the same request: its status, content type and request id, and its body, the
JSON written as Go's ``encoding/json`` writes it (compact, ``<`` ``>`` ``&`` escaped) and an SSE stream byte
for byte, one event at a time, in chunked encoding as gin sends it. A stream WeKnora had not closed when the
recording client gave up (``stays_open``: it never closes after a terminal error, docs/weknora-contract.md
C61) is held open after its last byte until the client goes away or the server stops, and then cut without the
closing chunk.

Matching is exact: the method, the path, the query parameters (as a multiset: a repeated ``chunk_type``'s order
does not matter to WeKnora), the JSON body (as a value) and which of ``X-API-Key`` / ``Authorization`` were
sent. A request recorded several times (``POST /api/v1/sessions``: a new session id each time) is answered by
its recordings in order, the last one again for every later request. A request with no recording gets a 418
whose ``error`` names it, and is kept in :attr:`ReplayServer.unmatched`: tests assert it stays empty, so a
client that sends something new fails loudly instead of being answered with the wrong recording.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "weknora-v0.7.2"
INTERACTIONS = FIXTURES / "interactions"
#: the WeKnora every fixture was recorded from
VERSION, COMMIT = "v0.7.2", "3d5d8bfcdfeeea266b292b71cea616847af28d0f"


def go_json(value: Any) -> str:
    """``value`` as Go's ``encoding/json`` writes it (what gin's ``c.JSON`` sends): compact, key order kept,
    non-ASCII as is, ``<`` ``>`` ``&`` U+2028 U+2029 escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


@dataclass(frozen=True)
class Recording:
    """One recorded interaction (see the module docstring)."""

    name: str
    folder: Path
    weknora: dict[str, Any]
    request: dict[str, Any]
    response: dict[str, Any]
    also_requests: tuple[dict[str, Any], ...] = ()

    @classmethod
    def load(cls, path: Path) -> Recording:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(data["name"], path.parent, data["weknora"], data["request"], data["response"],
                   tuple(data.get("also_requests", ())))

    @property
    def status(self) -> int:
        return int(self.response["status"])

    @property
    def body(self) -> Any:
        """The recorded JSON body (None for a text body or a stream)."""
        return self.response.get("body")

    @property
    def sse(self) -> bytes | None:
        """The recorded stream's bytes, or None."""
        name = self.response.get("sse")
        return (self.folder / name).read_bytes() if name else None

    def events(self) -> list[dict[str, Any]]:
        """The JSON objects of the stream's ``data:`` lines, in order."""
        raw = (self.sse or b"").decode("utf-8")
        return [json.loads(line[5:]) for line in raw.split("\n") if line.startswith("data:")]

    def request_keys(self) -> list[tuple]:
        """The requests this recording answers: its own, and ``also_requests`` (other requests recorded with the
        very same answer)."""
        return [_request_key(r) for r in (self.request, *self.also_requests)]

    def payload(self) -> bytes:
        """The body bytes of a JSON or text answer."""
        if "body" in self.response:
            return go_json(self.response["body"]).encode("utf-8")
        return str(self.response.get("body_text", "")).encode("utf-8")


def _request_key(req: dict[str, Any]) -> tuple:
    body = _canonical(req["body_text"]) if "body_text" in req else _canonical_value(req.get("body"))
    return _key(req["method"], req["path"], [tuple(p) for p in req.get("query") or []], body,
                tuple(sorted(req.get("auth") or [])))


def _canonical_value(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _canonical(text: str) -> str | None:
    """A request body as matched: its JSON value when it is JSON, else the text itself."""
    if not text:
        return None
    try:
        return _canonical_value(json.loads(text))
    except ValueError:
        return "text:" + text


def _body(text: str) -> Any:
    """A request body as logged: its JSON value, the text when it is not JSON, None when empty."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def _key(method: str, path: str, query: Iterable[tuple[str, str]], body: str | None, auth: tuple) -> tuple:
    return method.upper(), path, tuple(sorted(query)), body, auth


def interaction(name: str) -> Recording:
    """The recording ``interactions/<name>.json``."""
    return Recording.load(INTERACTIONS / f"{name}.json")


def scenario(folder: str) -> list[Recording]:
    """Every recording of a collection folder (``collect-pc``, ...), in the order they were made."""
    return [Recording.load(p) for p in sorted((FIXTURES / folder).glob("[0-9]*.json"))]


@dataclass
class Served:
    """One request the server answered: its method and path, and the recording's name (None: unmatched)."""

    method: str
    path: str
    recording: str | None
    body: Any = None


@dataclass
class _State:
    queues: dict[tuple, deque[Recording]]
    log: list[Served] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)


class ReplayServer:
    """The recordings served on ``127.0.0.1`` (a free port); use as ``with ReplayServer(recs) as url: ...``.

    :attr:`log` lists every request answered, in order; :attr:`unmatched` those that had no recording.
    ``hold_s``: how long a stream that stays open is held after its last byte (the client goes away first).
    """

    def __init__(self, recordings: Iterable[Recording], *, hold_s: float = 30.0):
        queues: dict[tuple, deque[Recording]] = {}
        for rec in recordings:
            for key in rec.request_keys():
                queues.setdefault(key, deque()).append(rec)
        self._state = _State(queues)
        self.hold_s = hold_s
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    @property
    def log(self) -> list[Served]:
        return self._state.log

    @property
    def unmatched(self) -> list[Served]:
        return [s for s in self._state.log if s.recording is None]

    def hits(self, name: str) -> int:
        """How many requests the recording ``name`` answered."""
        return sum(1 for s in self._state.log if s.recording == name)

    def __enter__(self) -> str:
        state, hold = self._state, self.hold_s

        class Handler(_Handler):
            pass
        Handler.state, Handler.hold_s = state, hold
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        return self.url

    def __exit__(self, *exc: Any) -> None:
        self._state.stopping.set()
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State
    hold_s: float

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass

    def _answer(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8") if length else ""
        auth = tuple(sorted(n for n, h in (("api_key", "X-API-Key"), ("bearer", "Authorization"))
                            if self.headers.get(h)))
        key = _key(self.command, parts.path, parse_qsl(parts.query, keep_blank_values=True), _canonical(raw), auth)
        with self.state.lock:
            queue = self.state.queues.get(key)
            rec = (queue.popleft() if len(queue) > 1 else queue[0]) if queue else None
            self.state.log.append(Served(self.command, parts.path, rec.name if rec else None, _body(raw)))
        if rec is None:
            self._send(418, {"content-type": "application/json; charset=utf-8"},
                       go_json({"error": f"replay: no recording for {self.command} {self.path} body={raw[:300]!r} "
                                         f"auth={list(auth)}"}).encode("utf-8"))
        elif rec.response.get("sse"):
            self._stream(rec)
        else:
            self._send(rec.status, rec.response.get("headers", {}), rec.payload())

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

    def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, rec: Recording) -> None:
        """The recorded SSE bytes, one event (up to its blank line) per chunk; held open if WeKnora held it."""
        self.send_response(rec.status)
        for k, v in rec.response.get("headers", {}).items():
            self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        data = rec.sse or b""
        try:
            for block in _blocks(data):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                self.wfile.flush()
            if rec.response.get("stays_open"):
                self._hold()
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:   # the client went away
            self.close_connection = True

    def _hold(self) -> None:
        """Wait, sending nothing, until the client closes the connection, the server stops or ``hold_s`` pass."""
        sock = self.connection
        waited = 0.0
        while waited < self.hold_s and not self.state.stopping.is_set():
            readable, _, _ = select.select([sock], [], [], 0.05)
            waited += 0.05
            if readable:
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        return
                except OSError:
                    return


def _blocks(data: bytes) -> list[bytes]:
    """The stream cut after each blank line (an event), the rest as a last block."""
    out, start = [], 0
    while (end := data.find(b"\n\n", start)) != -1:
        out.append(data[start:end + 2])
        start = end + 2
    if start < len(data):
        out.append(data[start:])
    return out


@dataclass
class Collected:
    """A collection replayed: the command's exit code, its run folder, the server that answered it."""

    code: int
    run: Path
    server: ReplayServer

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.run / "manifest.json").read_text(encoding="utf-8"))

    def records(self) -> list[dict[str, Any]]:
        """The checkpoint's records, in the order they were written."""
        lines = (self.run / "checkpoint.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def replay_collection(folder: str, where: Path, *, extra: Iterable[Recording] = (), hold_s: float = 5.0) -> Collected:
    """Run ``weknora-nb collect`` as it was run against WeKnora Lite (``<folder>/run.json``: the same knowledge
    bases, test set, stages and options, a run folder of the same name, so the same session titles) against the
    replay server of the folder's recordings (and ``extra`` ones: other requests of the same server state a
    client may make). The API key is the caller's ``WEKNORA_API_KEY``."""
    from weknora_nb import cli

    spec = json.loads((FIXTURES / folder / "run.json").read_text(encoding="utf-8"))["command"][2:]
    args = []
    for i, arg in enumerate(spec):
        previous = spec[i - 1] if i else ""
        if previous in ("--testset", "--stages-file"):
            arg = str((FIXTURES / folder / arg).resolve())
        elif previous == "--out":
            arg = str(where / arg)
        args.append(arg)
    server = ReplayServer([*scenario(folder), *extra], hold_s=hold_s)
    with server as url:
        code = cli.main(["collect", "--base-url", url, *args])
    return Collected(code, where / folder, server)
