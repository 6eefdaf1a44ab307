"""How to reach an OpenAI-compatible service (the judge's LLM, the knowledge base's embedding model): what
:class:`~weknora_nb.collect.judge.llm.LLMSettings` and :class:`~weknora_nb.collect.checks.embeddings.EmbeddingSettings`
share.

The key itself is never a setting, only the variable that holds it. Checked when made: a :class:`UsageError`
names the command-line option of the setting (each kind of service has its own, :attr:`ServiceSettings.OPTIONS`).
The ``repr`` shows the base URL redacted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from weknora_nb.collect.http.redact import check_http_url, settings_repr
from weknora_nb.core.errors import UsageError


@dataclass
class ServiceSettings:
    """``base_url`` and ``model`` of an OpenAI-compatible service, the variable holding its key, timeouts in
    seconds (``timeout_s`` > 0), the retry policy (``max_attempts`` >= 1, exponential back-off from
    ``backoff_base_s`` up to ``backoff_max_s``, a ``Retry-After`` honoured up to ``retry_after_max_s``) and the
    connections at once. Subclasses set the defaults and :attr:`OPTIONS`."""

    base_url: str
    model: str
    api_key_env: str
    timeout_s: float
    #: the longest one call may take, its retries included (each read has ``timeout_s``)
    deadline_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_attempts: int = 4
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 60.0
    max_connections: int = 16

    #: setting -> (the command-line option named in errors, what it allows): base_url, model, timeout_s,
    #: max_attempts
    OPTIONS: ClassVar[dict[str, tuple[str, str]]] = {
        "base_url": ("--base-url", ""), "model": ("--model", "a model name the server serves"),
        "timeout_s": ("--timeout", "> 0 (seconds)"), "max_attempts": ("--max-attempts", ">= 1")}

    def __repr__(self) -> str:
        return settings_repr(self)

    def __post_init__(self) -> None:
        check_http_url(self.base_url, argument=self.OPTIONS["base_url"][0])
        if not isinstance(self.model, str) or not self.model.strip():
            raise UsageError(argument=self.OPTIONS["model"][0], allowed=self.OPTIONS["model"][1], got=self.model)
        if not _positive(self.timeout_s):
            raise UsageError(argument=self.OPTIONS["timeout_s"][0], allowed=self.OPTIONS["timeout_s"][1],
                             got=self.timeout_s)
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise UsageError(argument=self.OPTIONS["max_attempts"][0], allowed=self.OPTIONS["max_attempts"][1],
                             got=self.max_attempts)


def _positive(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0
