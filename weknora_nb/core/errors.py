"""Every error weknora_nb raises on purpose, in one tree.

::

    WeknoraNbError                    base of every deliberate error
    ├── UsageError (ValueError)       an argument or option whose value is not allowed:
    │   │                             names the argument, the allowed values, what arrived
    │   └── MetricError               a metric name not in the registry, or a bad cutoff/variant
    ├── InputError                    a file the user gave cannot be used; ``problems`` names
    │   │                             the file, the line (or row) and the field of each
    │   ├── TestSetError              test-set validation failed (all problems at once)
    │   ├── ResultsError              results-table validation failed (all problems at once)
    │   └── ConfigError               a system description, stages, versions or rules file
    ├── RunFolderError                a folder that is not a usable run (no or a damaged
    │                                 manifest or checkpoint)
    ├── RunExistsError                the run folder holds a run and resume was not asked for,
    │                                 or it holds a different run
    ├── NotComparableError            runs that cannot be compared (different test sets,
    │                                 no common stage, a missing baseline)
    ├── RequestFailed                 a request to WeKnora failed; ``kind`` is the status the
    │   │                             results table records
    │   ├── no response arrived
    │   │   ├── ConnectFailed         "connect"      connection refused / reset / DNS
    │   │   └── RequestTimeout        "timeout"      connect, read or write timeout
    │   ├── a response arrived with an error status
    │   │   ├── AuthFailed            "auth"         401 / 403 (also the auth layer's bare {"error": ...})
    │   │   ├── NotFound              "not_found"    404
    │   │   ├── BadRequest            "bad_request"  other 4xx
    │   │   ├── RateLimited           "rate_limited" 429 (Retry-After honoured)
    │   │   └── ServerFailed          "server"       5xx
    │   └── ProtocolFailed            "protocol"     a 2xx body that is not what WeKnora sends
    ├── ReportError                   a notebook failed; its partial notebook and HTML were saved
    └── SandboxError                  the sandbox cannot serve (unknown version, a model that
                                      is not installed, a server that did not start)

Only :func:`weknora_nb.cli.main` turns these into exit codes (0 ok, 1 a bound broken, a
run incomplete or work that failed, 2 unusable input).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Problem", "WeknoraNbError", "UsageError", "MetricError", "InputError", "TestSetError",
           "ResultsError", "ConfigError", "RunFolderError", "RunExistsError", "NotComparableError",
           "RequestFailed", "ConnectFailed", "RequestTimeout", "AuthFailed", "NotFound", "BadRequest",
           "RateLimited", "ServerFailed", "ProtocolFailed", "ReportError", "SandboxError"]


@dataclass(frozen=True)
class Problem:
    """One validation problem: where it is and what is wrong.

    ``line`` is 1-based: a line number for text files, a row number (first data
    row = 1) for tables; ``None`` when the problem concerns the whole file.
    """

    path: str
    line: int | None
    field: str | None
    message: str
    where: str = "line"

    def __str__(self) -> str:
        place = self.path
        if self.line is not None:
            place += f", {self.where} {self.line}"
        if self.field:
            place += f", field '{self.field}'"
        return f"{place}: {self.message}"


class WeknoraNbError(Exception):
    """Base class of every error weknora_nb raises on purpose."""


class UsageError(WeknoraNbError, ValueError):
    """An argument whose value is not allowed.

    Built from its parts, the message reads ``--repeats must be >= 1. Got 0 instead.``;
    a plain message is kept as it is.
    """

    def __init__(self, message: str | None = None, *, argument: str | None = None, allowed: Any = None,
                 got: Any = None):
        self.argument, self.allowed, self.got = argument, allowed, got
        if message is None:
            if isinstance(allowed, (list, tuple, set, frozenset)):
                allowed = "one of " + ", ".join(str(a) for a in allowed)
            message = f"{argument} must be {allowed}. Got {got!r} instead."
        super().__init__(message)


class MetricError(UsageError):
    """A metric name that is not in the registry or has a bad cutoff/variant."""


class InputError(WeknoraNbError):
    """A user-supplied file cannot be used; ``problems`` lists every reason."""

    #: how many problems are spelled out in the message (all are kept in ``problems``)
    max_shown = 50
    kind = "input file"

    def __init__(self, path: str | Path, problems: Iterable[Problem] | str):
        self.path = str(path)
        if isinstance(problems, str):
            problems = [Problem(self.path, None, None, problems)]
        self.problems = list(problems)
        shown = self.problems[: self.max_shown]
        lines = [f"{self.kind} {self.path} has {len(self.problems)} problem(s):"]
        lines += [f"  - {p}" for p in shown]
        if len(self.problems) > len(shown):
            lines.append(f"  ... and {len(self.problems) - len(shown)} more")
        super().__init__("\n".join(lines))


class TestSetError(InputError):
    """The test set failed validation."""

    __test__ = False  # not a pytest test class
    kind = "test set"


class ResultsError(InputError):
    """The results table failed validation."""

    kind = "results file"


class ConfigError(InputError):
    """A configuration file (system description, stages, versions, rules) cannot be used."""

    kind = "configuration file"


class RunFolderError(WeknoraNbError):
    """A folder that is not a usable run folder."""


class RunExistsError(WeknoraNbError):
    """The run folder already holds a run and ``resume`` was not asked for, or it holds a different run."""


class NotComparableError(WeknoraNbError):
    """The runs were not made on the same test set (or lack what a comparison needs)."""


class RequestFailed(WeknoraNbError):
    """A request to WeKnora failed; ``kind`` is the status recorded in the results table."""

    kind = "error"
    retryable = False

    def __init__(self, message: str, *, status: int | None = None, code: Any = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class ConnectFailed(RequestFailed):
    kind, retryable = "connect", True


class RequestTimeout(RequestFailed):
    kind, retryable = "timeout", True


class AuthFailed(RequestFailed):
    kind = "auth"


class NotFound(RequestFailed):
    kind = "not_found"


class BadRequest(RequestFailed):
    kind = "bad_request"


class RateLimited(RequestFailed):
    kind, retryable = "rate_limited", True


class ServerFailed(RequestFailed):
    kind, retryable = "server", True


class ProtocolFailed(RequestFailed):
    kind = "protocol"


class ReportError(WeknoraNbError):
    """A notebook failed; its partial notebook and HTML were saved first."""

    def __init__(self, notebook: str, cell: int | None, source: str, ename: str, evalue: str, partial_html: Path):
        self.notebook, self.cell, self.source = notebook, cell, source
        self.ename, self.evalue, self.partial_html = ename, evalue, partial_html
        where = f"cell {cell} ({source!r})" if cell is not None else "an unknown cell"
        super().__init__(f"notebook {notebook} failed in {where}: {ename}: {evalue} (partial report: {partial_html})")


class SandboxError(WeknoraNbError):
    """The sandbox cannot serve: an unknown version, a model that is not installed, a server that did not start."""
