"""An OpenAI-compatible chat-completions client (async, httpx): what the LLM judge talks to.

``POST {base_url}/chat/completions`` with ``model``, ``messages``, ``temperature``, ``max_tokens``
and, when the server takes them, ``seed`` and ``response_format: {"type": "json_object"}``. The base
URL ends where the API's paths start: ``http://127.0.0.1:8080/v1`` (the sandbox, vLLM, Ollama),
``https://dashscope.aliyuncs.com/compatible-mode/v1`` (DashScope's compatible mode, the Qwen models),
``https://api.openai.com/v1``.

- The key is read from the environment (``WEKNORA_NB_JUDGE_API_KEY`` by default) and sent as
  ``Authorization: Bearer``; it is never stored, logged, or shown in an error message (a server that
  echoes it in an error body has it masked).
- Optional parameters: a 400 or 422 whose message names ``response_format`` or ``seed`` drops that
  parameter for the rest of the client's life (:attr:`LLMClient.dropped`) and sends the request
  again at once. Nothing relies on ``response_format``: the judge parses every reply strictly.
- Failures raise the :class:`~weknora_nb.core.errors.RequestFailed` kinds the collector uses:
  connect (refused, reset, a connection cut mid-answer), timeout (and HTTP 408), auth (401, 403),
  not_found (404: a wrong path or an unknown model), bad_request (other 4xx), rate_limited (429),
  server (5xx), protocol (a 2xx body that is not a chat completion).
- Retries follow the policy of :meth:`weknora_nb.collect.http.client.WeKnoraClient._with_retries`
  (mirrored here): up to ``max_attempts`` on connect, timeout, 429 and 5xx, waiting the server's
  ``Retry-After`` (or ``retry-after-ms``; at most ``retry_after_max_s``) or else an exponential
  backoff with full jitter.

:func:`estimate_tokens` states the rule the judge's dry run and cost limit estimate tokens by.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from weknora_nb.collect.http.client import server_address, split_base_url
from weknora_nb.collect.http.redact import install_log_redaction, redact_text
from weknora_nb.collect.http.retry import retry_after, with_retries
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

log = logging.getLogger(__name__)

JUDGE_API_KEY_ENV = "WEKNORA_NB_JUDGE_API_KEY"
#: parameters a server may refuse; the client then drops them (``response_format``: JSON mode; ``seed``)
OPTIONAL_PARAMETERS = ("response_format", "seed")
_CJK = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\U00020000-\U0003134f]")
#: tokens a chat message costs beyond its text (role and separators), and the reply's priming
_PER_MESSAGE, _PER_REPLY = 4, 3
_T = TypeVar("_T")


def estimate_tokens(text: str) -> int:
    """Tokens ``text`` is estimated to cost: one per CJK character (Han, kana, hangul, full-width
    forms) plus one per 4 other characters, rounded up.

    Tokenizers differ (Qwen's and OpenAI's count Chinese at about 0.7-1.5 characters a token,
    English at about 4); this rule errs high for Chinese and is close for English. The
    judge's cost limit corrects it by what servers report (see ``weknora_nb.collect.judge``).
    """
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


def estimate_message_tokens(messages: Sequence[dict[str, str]]) -> int:
    """Prompt tokens of a chat request: :func:`estimate_tokens` of each message's content, plus 4 a
    message and 3 for the reply's priming."""
    return sum(estimate_tokens(m.get("content", "")) + _PER_MESSAGE for m in messages) + _PER_REPLY


@dataclass(repr=False)
class LLMSettings(ServiceSettings):
    """How to reach an OpenAI-compatible server (:class:`~weknora_nb.collect.http.service.ServiceSettings`): the key
    from ``$WEKNORA_NB_JUDGE_API_KEY`` by default; errors name ``--base-url``, ``--model``, ``--timeout`` and
    ``--max-attempts``."""

    api_key_env: str = JUDGE_API_KEY_ENV
    timeout_s: float = 120.0

    @property
    def server(self) -> str:
        """The server as a manifest records it: no user info, no query string."""
        return server_address(self.base_url)

    def api_key(self) -> str:
        """The key from ``api_key_env``; a :class:`UsageError` (exit 2) when it is unset or empty."""
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise UsageError(f"no API key for the judge: set the environment variable {self.api_key_env} "
                             "(the sandbox accepts its own API key, the value of $WEKNORA_API_KEY)")
        return key


@dataclass(frozen=True)
class Completion:
    """One reply: its text, the model the server says answered, the usage it reported (None when it
    reported none), why it stopped."""

    text: str
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None


class LLMClient:
    """Async client: ``async with LLMClient(settings) as c: await c.complete(messages, ...)``."""

    def __init__(self, settings: LLMSettings, *, rng: random.Random | None = None):
        self.settings = settings
        self._rng = rng or random.Random()
        self._key = settings.api_key()
        #: optional parameters the server refused (never sent again by this client)
        self.dropped: set[str] = set()
        install_log_redaction()
        base_url, auth, query = split_base_url(settings.base_url)
        from weknora_nb.collect.http.transport import async_client  # aiohttp's import waits for a client

        self._http = async_client(
            base_url=base_url, auth=httpx.BasicAuth(*auth) if auth else None, params=httpx.QueryParams(query),
            headers={"Authorization": f"Bearer {self._key}", "Accept": "application/json"},
            timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(max_connections=settings.max_connections,
                                max_keepalive_connections=settings.max_connections))

    def __repr__(self) -> str:
        return f"LLMClient({self.settings!r})"

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def complete(self, messages: Sequence[dict[str, str]], *, temperature: float, max_tokens: int,
                       seed: int | None = None, json_mode: bool = True) -> Completion:
        """One chat completion, with retries (module docstring); the reply's text and usage."""
        async def once() -> Completion:
            while True:
                body = self._body(messages, temperature, max_tokens, seed, json_mode)
                try:
                    return await self._post(body)
                except BadRequest as exc:
                    refused = self._refused_parameter(exc, body)
                    if refused is None:
                        raise
                    log.info("the judge server refuses %r: sending requests without it", refused)
                    self.dropped.add(refused)
        try:
            async with asyncio.timeout(self.settings.deadline_s):   # each read has its timeout; this, the call
                return await self._with_retries(once)
        except TimeoutError:
            raise RequestTimeout(f"POST /chat/completions: no whole answer within {self.settings.deadline_s:g} s"
                                 ) from None

    def _body(self, messages: Sequence[dict[str, str]], temperature: float, max_tokens: int, seed: int | None,
              json_mode: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.settings.model, "messages": list(messages),
                                "temperature": temperature, "max_tokens": max_tokens, "stream": False}
        if seed is not None and "seed" not in self.dropped:
            body["seed"] = seed
        if json_mode and "response_format" not in self.dropped:
            body["response_format"] = {"type": "json_object"}
        return body

    @staticmethod
    def _refused_parameter(exc: BadRequest, body: dict[str, Any]) -> str | None:
        """The optional parameter a 400/422 names, when it was sent (else None: a real bad request)."""
        text = str(exc).lower()
        return next((p for p in OPTIONAL_PARAMETERS if p in body and p in text), None)

    async def _post(self, body: dict[str, Any]) -> Completion:
        path = "/chat/completions"
        try:
            resp = await self._http.post(path, json=body)
        except httpx.TimeoutException as exc:
            raise RequestTimeout(f"POST {path}: timed out ({type(exc).__name__})") from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise ConnectFailed(f"POST {path}: {type(exc).__name__}: {self._masked(str(exc))}") from exc
        if resp.status_code >= 400:
            raise self._failure(resp)
        return _completion(resp, path)

    def _masked(self, text: str) -> str:
        """``text`` as an error message may show it: the key masked, URLs' secrets redacted."""
        return redact_text(text.replace(self._key, "***"))

    def _failure(self, resp: httpx.Response) -> RequestFailed:
        """The :class:`RequestFailed` kind of an error status, its message the server's (key masked)."""
        status = resp.status_code
        code, message = _error_of(resp)
        text = f"POST {resp.request.url.path}: HTTP {status}" + (f" code {code}" if code else "") + \
            f": {self._masked(message)[:300]}"
        if status in (401, 403):
            return AuthFailed(f"the judge server refused the key in ${self.settings.api_key_env}. {text}",
                              status=status, code=code)
        if status == 404:
            return NotFound(f"no such model or path on the judge server (model {self.settings.model!r}, base URL "
                            f"{self.settings.server}). {text}", status=status, code=code)
        if status == 408:
            return RequestTimeout(text, status=status, code=code)
        if status == 429:
            return RateLimited(text, status=status, code=code, retry_after=retry_after(resp))
        if status >= 500:
            return ServerFailed(text, status=status, code=code)
        return BadRequest(text, status=status, code=code)

    async def _with_retries(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()`` with the collector's retry policy (:func:`weknora_nb.collect.http.retry.with_retries`)."""
        return await with_retries(call, self.settings, self._rng, what="judge call")


def _completion(resp: httpx.Response, path: str) -> Completion:
    """The :class:`Completion` of a 2xx body; :class:`ProtocolFailed` when it is not a chat completion."""
    try:
        body = resp.json()
    except ValueError:
        raise ProtocolFailed(f"POST {path}: HTTP {resp.status_code} but the body is not JSON "
                             f"({len(resp.content)} bytes)", status=resp.status_code) from None
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    message = first.get("message") if first else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise ProtocolFailed(f"POST {path}: HTTP {resp.status_code} but the body holds no "
                             "choices[0].message.content", status=resp.status_code)
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    model = body.get("model")
    return Completion(content, str(model) if model else None, _count(usage.get("prompt_tokens")),
                      _count(usage.get("completion_tokens")), first.get("finish_reason") if first else None)


def _count(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def _error_of(resp: httpx.Response) -> tuple[Any, str]:
    """The error's code and message: OpenAI's ``{"error": {"message", "type", "code"}}`` (DashScope and
    vLLM write the same), a bare ``{"error": "..."}``, WeKnora's envelope, or the start of the body."""
    try:
        body = resp.json()
    except ValueError:
        return None, resp.text[:200].strip()
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return err.get("code") or err.get("type"), str(err.get("message", ""))
    if err is not None:
        return body.get("code"), str(err)
    return None, json.dumps(body, ensure_ascii=False)[:200]
