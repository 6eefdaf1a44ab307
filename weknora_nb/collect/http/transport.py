"""The httpx client every HTTP call of the collection layer goes through, on aiohttp's connection pool.

httpx stays the API: requests, responses, timeouts, limits and exceptions are httpx's. Under it,
direct connections go through httpx-aiohttp's transport, that is aiohttp's connection pool and
its C HTTP parser, in place of httpcore on anyio: collecting is CPU-bound on the client's side on
small machines. Where the environment names a proxy (``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY``)
the client is httpx's own, with its transport, so that proxies, ``NO_PROXY`` and SOCKS work as httpx
documents them.

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
RFC 9110 section 5.1). aiohttp is slow to import: the clients import this module only when they are built.
"""

from __future__ import annotations

import functools
import os
import ssl
import urllib.request
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

#: what a transport failure can surface as, before :func:`httpx_error` maps it
_FAILURES = (aiohttp.ClientError, httpx.TransportError, TimeoutError)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    """An :class:`httpx.AsyncClient` (``kwargs``: its arguments) whose direct connections go through aiohttp: at most
    ``limits.max_connections`` of them open, idle ones closed after ``limits.keepalive_expiry`` s, TLS verified with
    ``verify``; httpx's default (``verify=True``) is :func:`default_tls`, shared by the clients of the process.

    When the environment names a proxy (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, read as
    :func:`urllib.request.getproxies` reads them) and ``trust_env`` is left on, the client is httpx's own, with its
    own transport: httpx then applies the proxies, ``NO_PROXY`` and SOCKS as it always does."""
    trust_env = kwargs.get("trust_env", True)
    if trust_env and _environment_proxies():
        return httpx.AsyncClient(**kwargs)
    verify = kwargs.get("verify", True)
    if verify is True and trust_env and not kwargs.get("cert"):
        verify = kwargs["verify"] = default_tls()
    transport = Transport(verify=verify, cert=kwargs.get("cert"), trust_env=trust_env,
                          limits=kwargs.get("limits", httpx.Limits(max_connections=100, max_keepalive_connections=20)))
    return httpx.AsyncClient(transport=transport, **kwargs)


def _environment_proxies() -> dict[str, str]:
    """The proxies the environment names for http, https or every scheme (``all``)."""
    return {k: v for k, v in urllib.request.getproxies().items() if k in ("http", "https", "all") and v}


def default_tls() -> ssl.SSLContext:
    """The SSL context of httpx's default verification (certifi's CA store, or ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` when set), built once per process for each value of those variables: building one loads
    the CA store, which every client would otherwise pay for (a context is safe to share)."""
    return _tls(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.lru_cache(maxsize=4)
def _tls(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """httpx's default context while the variables hold these values (the key of the cache)."""
    return httpx.create_ssl_context()


class Transport(AiohttpTransport):
    """httpx-aiohttp's transport with httpx's exceptions, one aiohttp session per client, no cookie jar of its own
    (httpx keeps the cookies) and no proxy from the environment (:func:`async_client` leaves proxied clients to
    httpx's own transport); its arguments are httpx-aiohttp's (``verify``, ``limits``...)."""

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
    """A response body read through httpx-aiohttp's stream, its failures raised as httpx's (:func:`httpx_error`)."""

    def __init__(self, stream: Any, request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
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
