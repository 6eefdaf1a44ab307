"""The httpx client every HTTP call of the collection layer goes through, on aiohttp's connection pool.

httpx stays the API: requests, responses, timeouts, limits and exceptions are httpx's. Under it,
direct connections go through httpx-aiohttp's transport, that is aiohttp's connection pool and
its C HTTP parser, in place of httpcore on anyio. Connections through a proxy
(``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY``, ``NO_PROXY`` honoured, read by httpx as before)
keep httpx's own transport, SOCKS included. Why: collecting is CPU-bound on the client's side on
small machines; one demo version measured in one process took 0.80 of the wall time and 0.78 of
the CPU time with this transport (README, "Correctness and speed").

A failure raises the httpx exception httpx's own transport raises for the same event, as far as
aiohttp can tell them apart, so that a request's failure kind does not depend on the transport
(:func:`httpx_error`):

==================================================  ============================================
aiohttp                                             httpx
==================================================  ============================================
connection timeout (``sock_connect``)               ``ConnectTimeout``
no free connection in time (``pool`` timeout)       ``ConnectTimeout`` (httpx's own: ``PoolTimeout``)
read timeout (``sock_read``)                        ``ReadTimeout``
refused, unreachable, TLS handshake or certificate  ``ConnectError``
server closed the connection before its response    ``RemoteProtocolError``
body cut short, malformed status line or headers    ``RemoteProtocolError``
reset after the response's head                     ``RemoteProtocolError`` (httpx's own: ``ReadError``)
other resets, a connection closed under a request   ``ReadError``
a URL that is not http(s)                           ``UnsupportedProtocol``
==================================================  ============================================

In the two rows that differ aiohttp reports one event for two (its pool wait is part of its connect
timeout; a reset mid-body reaches it as a body cut short); both stay in the same class of failure
(a timeout; a broken transfer), which is what the collector records.

Header names go out in lower case, as httpx's ``Headers`` hands them on (names are case-insensitive,
RFC 9110 section 5.1). httpx's client does three things per request that a collection pays for thousands of
times without need; the client here skips them and gives the same requests and responses (tests/test_transport.py):
it parses the request's URL again (kept per path here), reads every response through :mod:`http.cookiejar`
(only those that set a cookie here), and reads a body in 16 KiB pieces through one generator more (in the pieces
that arrived here). Measured on a 2-core VM at 32 requests in flight: 0.63 ms of client CPU per request, from
0.80 (README, "Requests, retries, failures"). aiohttp takes about 0.17 s to import: the clients import this module
when they are built.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

__all__ = ["async_client", "default_tls", "httpx_error", "Transport"]

#: what a transport failure can surface as, before :func:`httpx_error` maps it
_FAILURES = (aiohttp.ClientError, httpx.TransportError, TimeoutError)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    """An :class:`httpx.AsyncClient` (``kwargs``: its arguments) whose direct connections go through aiohttp: at most
    ``limits.max_connections`` of them open, idle ones closed after ``limits.keepalive_expiry`` s, TLS verified with
    ``verify``; httpx's default (``verify=True``) is :func:`default_tls`, shared by the clients of the process."""
    shareable = not kwargs.get("cert") and not kwargs.get("http2")
    if kwargs.get("verify", True) is True and kwargs.get("trust_env", True) and shareable:
        # (httpx loads a client certificate into the context, and httpcore sets the context's ALPN protocols to
        # HTTP/1.1 alone, or with h2 when http2: a client that does either keeps a context of its own)
        kwargs["verify"] = default_tls()
    return _Client(**kwargs)


def default_tls() -> ssl.SSLContext:
    """The SSL context of httpx's default verification (certifi's CA store, or ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` when set), built once per process for each value of those variables: building one loads
    the CA store, about 20 ms of CPU, which every client would otherwise pay (a context is safe to share)."""
    return _tls(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.lru_cache(maxsize=4)
def _tls(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """httpx's default context while the variables hold these values (the key of the cache)."""
    return httpx.create_ssl_context()


class _Client(httpx.AsyncClient):
    """httpx's client with :class:`Transport` for direct connections. httpx builds it through ``_init_transport``,
    the hook httpx-aiohttp's own client uses, so that proxies from the environment still apply (httpx ignores them
    when given a ``transport``); proxied requests keep httpx's transport (``_init_proxy_transport``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cookies = _Cookies(self._cookies)
        self._urls: dict[str, httpx.URL] = {}

    @property
    def cookies(self) -> httpx.Cookies:
        """The client's cookies (httpx's), read from responses that set some (:class:`_Cookies`)."""
        return self._cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        self._cookies = _Cookies(cookies)

    def _merge_url(self, url: httpx.URL | str) -> httpx.URL:
        """httpx's URL of a request (``base_url`` joined with ``url``), kept per path: parsing it is half of what
        httpx's client spends building a request, and a collection asks for the same few paths thousands of times.
        Setting ``base_url`` empties the cache (:attr:`base_url`); at most :data:`_URLS_KEPT` paths are kept (chat
        paths name their session)."""
        if not isinstance(url, str):
            return super()._merge_url(url)
        merged = self._urls.get(url)
        if merged is None:
            if len(self._urls) >= _URLS_KEPT:
                self._urls.clear()
            merged = self._urls[url] = super()._merge_url(url)
        return merged

    @property
    def base_url(self) -> httpx.URL:
        """httpx's ``base_url``; setting it also forgets the URLs :meth:`_merge_url` kept."""
        return super().base_url

    @base_url.setter
    def base_url(self, url: httpx.URL | str) -> None:
        httpx.AsyncClient.base_url.fset(self, url)  # type: ignore[attr-defined]
        self._urls = {}

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        """``transport`` when given, else :class:`Transport` built from what httpx passes (``verify``, ``cert``,
        ``trust_env``, ``http1``, ``http2``, ``limits``)."""
        transport: httpx.AsyncBaseTransport | None = kwargs.pop("transport", None)
        return transport if transport is not None else Transport(*args, **kwargs)


#: paths whose URL :meth:`_Client._merge_url` keeps
_URLS_KEPT = 1024


class _Cookies(httpx.Cookies):
    """httpx's cookie jar, which reads a response's cookies only when it sets some: httpx reads every response
    through :mod:`http.cookiejar`, wrapping request and response in ``urllib`` objects first (about a fifth of
    the time httpx's own layer takes per request), and the jar finds nothing in a response without ``Set-Cookie``."""

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class Transport(AiohttpTransport):
    """httpx-aiohttp's transport with httpx's exceptions, one aiohttp session per client, no cookie jar of its own
    (httpx keeps the cookies) and no proxy from the environment (httpx sends proxied requests to its own
    transport); its arguments are httpx-aiohttp's (``verify``, ``limits``...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "client": self._session})

    def _session(self) -> aiohttp.ClientSession:
        """The session, made on the first request (aiohttp wants a running event loop): ``max_connections`` open at
        most (None: no limit, aiohttp's 0), idle ones kept ``keepalive_expiry`` s (None, httpx's "for ever": an
        hour); aiohttp has no separate cap on idle connections (``max_keepalive_connections``)."""
        expiry = self.limits.keepalive_expiry
        connector = aiohttp.TCPConnector(limit=self.limits.max_connections or 0, ssl=self.ssl_context,
                                         keepalive_timeout=3600.0 if expiry is None else expiry)
        return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except _FAILURES as exc:
            _raise_as_httpx(exc, request)
        response.stream = _Body(response.stream, request)
        return response


class _Body(httpx.AsyncByteStream):
    """A response body read through aiohttp, its failures raised as httpx's (:func:`httpx_error`).

    Read from aiohttp's response straight (when httpx-aiohttp's stream holds one), a piece whenever bytes arrive
    (``iter_any``): a body that came in one piece, as most answers do, passes httpx's layers once, in place of
    httpx-aiohttp's 16 KiB pieces each passing one more generator; an event stream still reads each event as it
    comes."""

    def __init__(self, stream: Any, request: httpx.Request) -> None:
        self._stream, self._request = stream, request
        response = getattr(stream, "_aiohttp_response", None)
        self._pieces = response.content.iter_any() if isinstance(response, aiohttp.ClientResponse) else stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._pieces:
                yield chunk
        except _FAILURES as exc:
            _raise_as_httpx(exc, self._request)

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        except _FAILURES as exc:
            _raise_as_httpx(exc, self._request)


def _raise_as_httpx(exc: BaseException, request: httpx.Request) -> NoReturn:
    """Raise :func:`httpx_error` of ``exc``, chained to the aiohttp exception behind it (``exc`` itself when it is
    httpx's already)."""
    error = httpx_error(exc, request)
    if error is exc:
        raise exc
    raise error from _cause(exc)


def _cause(exc: BaseException) -> BaseException:
    """The aiohttp exception behind ``exc`` (httpx-aiohttp raises its own mapping ``from`` it), else ``exc``."""
    return exc.__cause__ if isinstance(exc, httpx.TransportError) and exc.__cause__ is not None else exc


def httpx_error(exc: BaseException, request: httpx.Request | None = None) -> httpx.TransportError:
    """The httpx exception for the transport failure ``exc`` (an aiohttp one, or httpx-aiohttp's mapping of one):
    the one httpx's own transport raises for the same event (the table of the module's docstring)."""
    cause = _cause(exc)
    kind: type[httpx.TransportError]
    if isinstance(cause, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(cause, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
        kind = httpx.ReadTimeout
    elif isinstance(cause, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(cause, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        kind = httpx.RemoteProtocolError
    elif isinstance(cause, aiohttp.ClientConnectionError):  # a reset; a connection closed under a request
        kind = httpx.ReadError
    elif isinstance(cause, httpx.TransportError):  # httpx's own, raised before aiohttp was reached
        return cause
    elif isinstance(exc, httpx.TransportError):  # httpx-aiohttp's mapping of the rest (a URL it cannot take)
        kind = type(exc)
    else:
        kind = httpx.TransportError
    message = str(cause) or type(cause).__name__
    return kind(message, request=request) if request is not None else kind(message)
