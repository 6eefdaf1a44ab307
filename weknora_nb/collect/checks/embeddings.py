"""The knowledge base's embedding model over HTTP: an OpenAI-compatible ``POST {base}/embeddings``, with which
the vector-store trace (:mod:`weknora_nb.collect.checks.vectortrace`) embeds the test set's queries.

The key is read from ``$WEKNORA_NB_EMBEDDINGS_API_KEY`` (none is sent when it is unset) and masked in every
message. Texts go ``batch_size`` to a request, a few requests at once, each retried on connect failures,
timeouts, 429 and 5xx (:func:`~weknora_nb.collect.http.retry.with_retries`); a request that still fails raises
the :class:`~weknora_nb.core.errors.RequestFailed` kind of its failure. httpx is imported only when texts are
embedded.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weknora_nb.collect.http.redact import install_log_redaction, redact_text, redact_url
from weknora_nb.collect.http.service import ServiceSettings
from weknora_nb.core.errors import (
    AuthFailed,
    BadRequest,
    ConnectFailed,
    NotFound,
    ProtocolFailed,
    RateLimited,
    RequestFailed,
    RequestTimeout,
    ServerFailed,
    UsageError,
)

if TYPE_CHECKING:
    import httpx


EMBEDDINGS_API_KEY_ENV = "WEKNORA_NB_EMBEDDINGS_API_KEY"


@dataclass(repr=False)
class EmbeddingSettings(ServiceSettings):
    """How to reach an OpenAI-compatible embeddings endpoint serving the knowledge base's model
    (:class:`~weknora_nb.collect.http.service.ServiceSettings`; the key from ``$WEKNORA_NB_EMBEDDINGS_API_KEY`` by
    default, unset: no Authorization header); texts go ``batch_size`` to a request, with ``dimensions`` asked
    for when given."""

    api_key_env: str = EMBEDDINGS_API_KEY_ENV
    timeout_s: float = 60.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 10.0
    retry_after_max_s: float = 30.0
    max_connections: int = 4
    dimensions: int | None = None
    batch_size: int = 32

    OPTIONS: ClassVar[dict[str, tuple[str, str]]] = {
        "base_url": ("--embeddings-url", ""),
        "model": ("--embeddings-model", "the knowledge base's embedding model name"),
        "timeout_s": ("timeout_s", "> 0 (seconds)"), "max_attempts": ("max_attempts", ">= 1")}

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise UsageError(argument="batch_size", allowed=">= 1", got=self.batch_size)


def embed_texts(settings: EmbeddingSettings, texts: Sequence[str]) -> list[list[float]]:
    """The embedding of each of ``texts`` (in order), in batches of ``settings.batch_size``, a few at once,
    each retried on connect failures, timeouts, 429 and 5xx. Raises the :class:`RequestFailed` kinds."""
    from weknora_nb.collect.http.retry import run_to_end

    return run_to_end(lambda: _embed_all(settings, list(texts)), name="weknora-nb embeddings")


async def _embed_all(settings: EmbeddingSettings, texts: list[str]) -> list[list[float]]:
    import asyncio

    import httpx

    from weknora_nb.collect.http.client import split_base_url
    from weknora_nb.collect.http.retry import with_retries
    from weknora_nb.collect.http.transport import async_client  # aiohttp's import waits for a client

    install_log_redaction()
    key = os.environ.get(settings.api_key_env, "")
    base_url, auth, query = split_base_url(settings.base_url)
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    limit = asyncio.Semaphore(settings.max_connections)
    rng = random.Random()
    async with async_client(base_url=base_url, auth=httpx.BasicAuth(*auth) if auth else None,
                            params=httpx.QueryParams(query), headers=headers,
                            timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)) as http:
        async def batch(part: list[str]) -> list[list[float]]:
            async with limit:
                return await with_retries(lambda: _post(http, settings, part, key), settings, rng,
                                          what="embeddings call")
        step = settings.batch_size
        parts = await asyncio.gather(*(batch(texts[i:i + step]) for i in range(0, len(texts), step)))
    return [v for part in parts for v in part]


async def _post(http: httpx.AsyncClient, settings: EmbeddingSettings, texts: list[str], key: str) -> list[list[float]]:
    """One ``POST /embeddings``: the vectors of ``texts`` in order (by ``index`` when the server gives it)."""
    import httpx

    body: dict[str, Any] = {"model": settings.model, "input": texts, "encoding_format": "float"}
    if settings.dimensions:
        body["dimensions"] = settings.dimensions
    try:
        resp = await http.post("embeddings", json=body)
    except httpx.TimeoutException as exc:
        raise RequestTimeout(f"POST /embeddings: timed out ({type(exc).__name__})") from exc
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        raise ConnectFailed(f"POST /embeddings: {type(exc).__name__}: {_masked(str(exc), key)}") from exc
    if resp.status_code >= 400:
        raise _failure(resp, settings, key)
    return _vectors(resp, len(texts))


def _masked(text: str, key: str) -> str:
    return redact_text(text.replace(key, "***") if key else text)


def _failure(resp: httpx.Response, settings: EmbeddingSettings, key: str) -> RequestFailed:
    """The :class:`RequestFailed` kind of an error status (the server's message, the key masked)."""
    from weknora_nb.collect.http.retry import retry_after

    status = resp.status_code
    text = f"POST /embeddings: HTTP {status}: {_masked(resp.text[:300].strip(), key)}"
    if status in (401, 403):
        return AuthFailed(f"the embeddings server refused the key in ${settings.api_key_env}. {text}", status=status)
    if status == 404:
        return NotFound(f"no such model or path on the embeddings server (model {settings.model!r}, "
                        f"{redact_url(settings.base_url)}). {text}", status=status)
    if status == 408:
        return RequestTimeout(text, status=status)
    if status == 429:
        return RateLimited(text, status=status, retry_after=retry_after(resp))
    if status >= 500:
        return ServerFailed(text, status=status)
    return BadRequest(text, status=status)


def _vectors(resp: httpx.Response, n: int) -> list[list[float]]:
    """``data[].embedding`` of a 2xx body, ordered by ``index`` when every item has one (WeKnora reads the array
    order: the same for a server that writes them in order); :class:`ProtocolFailed` otherwise."""
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError):
        data = None
    ok = isinstance(data, list) and len(data) == n and all(
        isinstance(d, dict) and isinstance(d.get("embedding"), list) and d["embedding"] for d in data)
    if not ok:
        raise ProtocolFailed(f"POST /embeddings: HTTP {resp.status_code} but the body holds no data[] of {n} "
                             "embeddings", status=resp.status_code)
    if all(isinstance(d.get("index"), int) for d in data) and sorted(d["index"] for d in data) == list(range(n)):
        data = sorted(data, key=lambda d: d["index"])
    vectors = [[float(x) for x in d["embedding"]] for d in data]
    if any(not all(math.isfinite(x) for x in v) for v in vectors):
        raise ProtocolFailed("POST /embeddings: an embedding holds a value that is not a finite number")
    return vectors
