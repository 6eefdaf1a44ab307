"""The collection layer's HTTP transport (weknora_nb/collect/http/transport.py): aiohttp under httpx's API; and the
event loop it runs on (uvloop, weknora_nb/collect/http/retry.run_on_new_loop).

Each failure a server can cause is caused for real on loopback, once through httpx's own transport and once
through ours: both must raise the same httpx exception, so that a request's failure kind (timeout, connect,
protocol) does not depend on the transport. TLS is checked against a real TLS server (a trustme CA), proxies
against a real HTTP proxy on loopback.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial

import httpx
import pytest
import trustme

from weknora_nb.collect.http.client import ClientSettings, WeKnoraClient
from weknora_nb.collect.http.retry import run_to_end
from weknora_nb.collect.http.transport import Transport, async_client, default_tls
from weknora_nb.core.errors import ConnectFailed, ProtocolFailed, RequestTimeout

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\": \"b\"}\n"


@contextmanager
def raw_server(handle: Callable[[socket.socket], None], *, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """A TCP server on loopback that hands every connection to ``handle`` (in a thread of its own); its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if tls is not None:
                try:
                    conn = tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    conn.close()
                    continue
            threading.Thread(target=_handled, args=(handle, conn), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        listener.close()
        thread.join(5)


def _handled(handle: Callable[[socket.socket], None], conn: socket.socket) -> None:
    try:
        handle(conn)
    except OSError:
        pass
    finally:
        conn.close()


def _read_request(conn: socket.socket) -> bytes:
    """The request's head and the body its Content-Length announces."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def _answer(reply: bytes) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(reply)
    return handle


def _close_at_once(conn: socket.socket) -> None:
    _read_request(conn)


def _reset_after_head(conn: socket.socket) -> None:
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
    time.sleep(0.2)  # the client reads the head first (a reset before that is a plain ReadError for both)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST


def _never_answer(conn: socket.socket) -> None:
    _read_request(conn)
    conn.settimeout(5)
    with suppress(OSError):
        conn.recv(1)


FAILURES = {
    "closed before the response": _close_at_once,
    "body cut short": _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"),
    "chunked body cut short": _answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"),
    "not HTTP": _answer(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
    "bad status line": _answer(b"HTTP/1.1 OK\r\n\r\n"),
    "reset after the head": _reset_after_head,
    "no answer (read timeout)": _never_answer,
}


#: where aiohttp cannot tell what httpx tells: a reset mid-body reaches aiohttp as a body cut short (the reset
#: only named in its message); both are transport failures, neither a timeout. (Should the reset overtake the
#: head on a loaded machine, both say ReadError.)
DIFFERENT = {"reset after the head": httpx.RemoteProtocolError}


def _failure_of(client: httpx.AsyncClient, url: str, *, stream: bool = False) -> type[BaseException] | None:
    async def go() -> None:
        async with client:
            if stream:
                async with client.stream("POST", url, json={"q": "x"}) as resp:
                    async for _ in resp.aiter_bytes():
                        pass
            else:
                (await client.post(url, json={"q": "x"})).read()
    try:
        asyncio.run(go())
    except Exception as exc:  # the class is what is compared
        return type(exc)
    return None


@pytest.mark.parametrize("stream", [False, True], ids=["read", "streamed"])
@pytest.mark.parametrize("name", list(FAILURES))
def test_a_failure_raises_what_httpx_own_transport_raises(name, stream):
    # the server that never answers waits for the read timeout; the others answer at once, well within it
    timeout = httpx.Timeout(0.1 if FAILURES[name] is _never_answer else 0.5)
    with raw_server(FAILURES[name]) as port:
        url = f"http://127.0.0.1:{port}/x"
        theirs = _failure_of(httpx.AsyncClient(timeout=timeout), url, stream=stream)
        ours = _failure_of(async_client(timeout=timeout), url, stream=stream)
    assert theirs is not None and issubclass(theirs, httpx.TransportError), theirs
    assert ours in {theirs, DIFFERENT.get(name, theirs)}, (name, ours, theirs)  # the same but where noted


def test_refused_and_pool_timeouts_are_httpx_errors():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x"  # nothing listens there any more
    assert _failure_of(async_client(), url) is _failure_of(httpx.AsyncClient(), url) is httpx.ConnectError

    accepted = threading.Event()

    def hold(conn: socket.socket) -> None:  # the pool's one connection, taken and never answered
        accepted.set()
        _never_answer(conn)

    async def second_waits_for_the_pool(client: httpx.AsyncClient, url: str) -> type[BaseException]:
        accepted.clear()
        async with client:
            first = asyncio.create_task(client.get(url))
            assert await asyncio.to_thread(accepted.wait, 10)  # the first request holds the connection
            try:
                await client.get(url)
            except httpx.TimeoutException as exc:
                return type(exc)
            finally:
                first.cancel()
            raise AssertionError("the second request got a connection")

    with raw_server(hold) as port:
        url = f"http://127.0.0.1:{port}/x"
        limits, timeout = httpx.Limits(max_connections=1), httpx.Timeout(3, pool=0.1)
        # httpx's pool says PoolTimeout; aiohttp's wait for a connection is its connect timeout
        assert asyncio.run(second_waits_for_the_pool(async_client(limits=limits, timeout=timeout), url)) \
            is httpx.ConnectTimeout
        assert asyncio.run(second_waits_for_the_pool(httpx.AsyncClient(limits=limits, timeout=timeout), url)) \
            is httpx.PoolTimeout


def test_a_url_that_is_not_http_is_refused_as_httpx_refuses_it():
    url = "ftp://127.0.0.1:21/x"
    assert _failure_of(async_client(), url) is _failure_of(httpx.AsyncClient(), url) is httpx.UnsupportedProtocol


def test_the_collector_records_each_failure_kind_whatever_the_transport(monkeypatch):
    """WeKnoraClient turns the transport's exceptions into failure kinds: a reset is not a timeout."""
    monkeypatch.setenv("WEKNORA_API_KEY", "sk-test")
    cases = {_close_at_once: ConnectFailed, _never_answer: RequestTimeout,
             _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n01234"): ConnectFailed}
    for handle, kind in cases.items():
        # the server that never answers waits for the timeout; the others answer at once, well within it
        settings_of = partial(ClientSettings, timeout_s=0.1 if handle is _never_answer else 0.5)
        with raw_server(handle) as port:
            async def search(settings: ClientSettings) -> None:
                async with WeKnoraClient(settings) as c:
                    await c.request("POST", "/api/v1/knowledge-search", {"query": "x"}, retry=False)
            with pytest.raises(kind):
                asyncio.run(search(settings_of(f"http://127.0.0.1:{port}")))
    with raw_server(_answer(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 200\r\n\r\n"
                            b"data:{\"response_type\":\"answer\",\"content\":\"x\"}\n\n")) as port:
        async def chat() -> None:
            async with WeKnoraClient(ClientSettings(f"http://127.0.0.1:{port}", timeout_s=0.5)) as c:
                await c._chat_stream("s1", {"query": "x"})
        with pytest.raises(ProtocolFailed, match="stream broken: RemoteProtocolError"):
            asyncio.run(chat())


def test_a_request_and_its_answer_cross_unchanged():
    """Method, path, query, body and headers reach the server as sent (header names in lower case, which HTTP
    allows); the status, headers and body come back whole, a connection serving several requests."""
    seen: list[bytes] = []

    def handle(conn: socket.socket) -> None:
        for _ in range(3):
            request = _read_request(conn)
            if not request:
                return
            seen.append(request)
            conn.sendall(b"HTTP/1.1 201 Created\r\nX-Trace: t1\r\nSet-Cookie: a=1\r\nContent-Length: 13\r\n\r\n"
                         + "{\"k\": \"值\"}\n".encode())

    async def go(port: int) -> list[httpx.Response]:
        async with async_client(base_url=f"http://localhost:{port}", headers={"X-API-Key": "sk-1"}) as c:
            responses = [await c.post("/api/v1/p", params={"q": "中 文&x"}, json={"query": "问"}) for _ in range(2)]
            c.cookies.clear()
            return [*responses, await c.post("/api/v1/p", params={"q": "中 文&x"}, json={"query": "问"})]

    with raw_server(handle) as port:
        responses = asyncio.run(go(port))
    assert [r.status_code for r in responses] == [201] * 3
    assert responses[0].headers["x-trace"] == "t1" and responses[0].json() == {"k": "值"}
    assert len(seen) == 3  # one connection, kept alive
    head, _, body = seen[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /api/v1/p?q=%E4%B8%AD+%E6%96%87%26x HTTP/1.1"
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert headers["x-api-key"] == "sk-1" and headers["content-type"] == "application/json"
    assert body == '{"query":"问"}'.encode() and "cookie" not in headers
    # the cookie the server set comes back from httpx's jar, and no more once that is cleared: aiohttp keeps none
    assert [_cookies(seen[1]), _cookies(seen[2])] == [["a=1"], []]


def _cookies(request: bytes) -> list[str]:
    lines = request.partition(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    return [line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("cookie:")]


@pytest.mark.parametrize("base", ["http://h:8080", "http://h:8080/", "http://h:8080/weknora", "https://h/a/b/?k=v",
                                  "http://[::1]:9/x%20y"])
def test_request_urls_are_httpx_own_though_kept_per_path(base):
    """The URL of a request is the one httpx's own client builds, for every kind of base and path, the first time
    and when it is kept; a new ``base_url`` is joined anew; an absolute URL or an httpx.URL passes as it is."""
    paths = ["/api/v1/knowledge-search", "api/v1/x", "/api/v1/knowledge-chat/会话 1", "/p?a=1&b=%20", "",
             "http://other:1/abs", httpx.URL("/api/v1/u")]

    async def urls(make: Callable[..., httpx.AsyncClient]) -> list[str]:
        async with make(base_url=base, params={"t": "1"}) as c:
            first = [str(c.build_request("POST", p, params={"q": "中"}).url) for p in paths]
            again = [str(c.build_request("GET", p).url) for p in paths]
            c.base_url = "http://moved:1/v2"
            moved = [str(c.build_request("GET", p).url) for p in paths]
            return first + again + moved

    ours, httpx_own = asyncio.run(urls(async_client)), asyncio.run(urls(httpx.AsyncClient))
    assert ours == httpx_own
    assert any("moved" in u for u in ours) and any("%E4%B8%AD" in u for u in ours)


def test_the_cookie_jar_is_httpx_own():
    """A response without ``Set-Cookie`` leaves the jar as it was; one with it fills the jar as httpx's does;
    cookies given to the client, or set later, are sent."""
    async def go() -> tuple[httpx.AsyncClient, list[str]]:
        c = async_client(base_url="http://h", cookies={"s": "1"})
        plain = httpx.Response(200, request=c.build_request("GET", "/a"))
        c.cookies.extract_cookies(plain)
        setting = httpx.Response(200, headers={"Set-Cookie": "a=2; Path=/"}, request=c.build_request("GET", "/a"))
        c.cookies.extract_cookies(setting)
        before = sorted(f"{k}={v}" for k, v in c.cookies.items())
        c.cookies = {"z": "9"}
        c.cookies.extract_cookies(setting)
        await c.aclose()
        return c, before + sorted(f"{k}={v}" for k, v in c.cookies.items())

    c, seen = asyncio.run(go())
    assert seen == ["a=2", "s=1", "a=2", "z=9"]
    assert c.build_request("GET", "/").headers["cookie"] in (
        "z=9; a=2", "a=2; z=9")


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[int, trustme.CA]]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    with raw_server(_answer(OK), tls=server) as port:
        yield port, ca


def test_tls_is_verified_against_the_context_given(tls_server):
    port, ca = tls_server
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)

    async def get(verify: ssl.SSLContext | bool, host: str = "127.0.0.1") -> httpx.Response:
        async with async_client(verify=verify, timeout=httpx.Timeout(5)) as c:
            return await c.get(f"https://{host}:{port}/x")

    assert asyncio.run(get(trusted)).json() == {"a": "b"}
    assert asyncio.run(get(trusted, "localhost")).json() == {"a": "b"}
    with pytest.raises(httpx.ConnectError, match="certificate"):  # the system's CAs do not know this one
        asyncio.run(get(True))


def test_clients_share_one_default_context_which_follows_ssl_cert_file(tls_server, tmp_path, monkeypatch):
    """Without ``verify``, clients share :func:`default_tls` (one CA-store load per process), and a change of
    ``SSL_CERT_FILE`` is a new context, as httpx's own default would be."""
    port, ca = tls_server
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)

    async def get() -> httpx.Response:
        async with async_client(timeout=httpx.Timeout(5)) as c:
            return await c.get(f"https://127.0.0.1:{port}/x")

    assert default_tls() is default_tls()
    with pytest.raises(httpx.ConnectError, match="certificate"):
        asyncio.run(get())
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    assert default_tls() is default_tls() and asyncio.run(get()).json() == {"a": "b"}


def test_a_proxy_from_the_environment_is_used_through_httpx_own_transport(monkeypatch):
    """HTTP_PROXY reaches httpx, which sends proxied requests through its own transport (SOCKS too)."""
    lines: list[bytes] = []

    def proxy(conn: socket.socket) -> None:
        request = _read_request(conn)
        lines.append(request.split(b"\r\n", 1)[0])
        conn.sendall(OK)

    with raw_server(proxy) as port:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)

        async def go() -> tuple[dict, type]:
            async with async_client() as c:
                r = await c.get("http://weknora.invalid:8080/api/v1/x")
                return r.json(), type(c._transport_for_url(httpx.URL("http://weknora.invalid:8080/")))
        body, transport = asyncio.run(go())
    assert body == {"a": "b"}
    assert lines == [b"GET http://weknora.invalid:8080/api/v1/x HTTP/1.1"]
    assert transport is httpx.AsyncHTTPTransport and not issubclass(transport, Transport)


def test_synchronous_callers_run_the_collection_on_uvloop():
    """run_to_end: a new uvloop loop from synchronous code, and one in a thread of its own where a loop already
    runs (Jupyter); the result and the exception of the work come back to the caller."""
    uvloop = pytest.importorskip("uvloop")

    async def loop_kind() -> type:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop())

    async def fails() -> None:
        raise ConnectFailed("refused")

    assert run_to_end(loop_kind) is uvloop.Loop

    async def inside_a_running_loop() -> tuple[type, bool]:
        return run_to_end(loop_kind), isinstance(asyncio.get_running_loop(), uvloop.Loop)
    assert asyncio.run(inside_a_running_loop()) == (uvloop.Loop, False)
    with pytest.raises(ConnectFailed, match="refused"):
        run_to_end(fails)
