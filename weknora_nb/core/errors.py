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
    ├── RunLockedError (RunExistsError) another live process holds the run folder's lock
    ├── ReportError                   a notebook failed; its partial notebook and HTML were saved
    ├── StorageError                  a file could not be written (read-only folder, full disk);
    │                                 what was written before is kept
    ├── Interrupted                   Ctrl-C: the work stopped, what was done is kept; the message
    │                                 says how to resume
    └── SandboxError                  the sandbox cannot serve (unknown version, a model that
                                      is not installed, a server that did not start)

Foreign errors (OSError, Unicode, JSON, CSV, YAML, pyarrow, pandas) meet the user only through
:func:`translate_foreign`, :func:`reading` and :func:`writing`: one translation, the file named.

Only :func:`weknora_nb.cli.main` turns these into exit codes (0 ok, 1 a bound broken, a
run incomplete or work that failed, 2 unusable input).
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    """Base class of every error weknora_nb raises on purpose.

    Pickled as what it is (class, message, attributes) without calling its ``__init__`` again, so that an
    error raised in a worker process reaches the parent whole, whatever arguments its class takes.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


def _rebuilt(cls: type[WeknoraNbError], args: tuple[Any, ...], state: dict[str, Any]) -> WeknoraNbError:
    """The error of :meth:`WeknoraNbError.__reduce__`: ``cls`` with ``args`` and the attributes of ``state``."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


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


class RunLockedError(RunExistsError):
    """Another live process holds the run folder's lock (``holder`` says who: pid, host, command, since)."""

    def __init__(self, message: str, holder: dict[str, Any] | None = None):
        super().__init__(message)
        self.holder = holder or {}


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


class NothingScored(WeknoraNbError):
    """A verdict asked of figures that do not exist: no request at all was scored (no valid query, every request
    failed...), or every request of the stage asked for failed; the message says which and why."""


class ReportError(WeknoraNbError):
    """A notebook failed; its partial notebook and HTML were saved first."""

    def __init__(self, notebook: str, cell: int | None, source: str, ename: str, evalue: str, partial_html: Path):
        self.notebook, self.cell, self.source = notebook, cell, source
        self.ename, self.evalue, self.partial_html = ename, evalue, partial_html
        where = f"cell {cell} ({source!r})" if cell is not None else "an unknown cell"
        super().__init__(f"notebook {notebook} failed in {where}: {ename}: {evalue} (partial report: {partial_html})")


class StorageError(WeknoraNbError):
    """A file could not be written: a read-only folder, a full disk, a quota. Earlier writes are kept."""

    def __init__(self, path: str | Path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"cannot write {self.path}: {reason}")


class Interrupted(WeknoraNbError):
    """The user pressed Ctrl-C; the message says what was kept and how to resume."""


class SandboxError(WeknoraNbError):
    """The sandbox cannot serve: an unknown version, a model that is not installed, a server that did not start."""


# ---------------------------------------------------------------------------------------
# foreign errors: one translation
# ---------------------------------------------------------------------------------------
#: modules whose exceptions describe bad data, not a bug in weknora_nb
_FOREIGN_MODULES = ("pyarrow", "pandas", "yaml", "json", "csv", "zipfile", "gzip", "openpyxl")


def is_foreign(exc: BaseException) -> bool:
    """True for an exception a library raised about the data it was given (not one of ours, not a bug)."""
    if isinstance(exc, WeknoraNbError):
        return False
    if isinstance(exc, (OSError, UnicodeError, EOFError)):
        return True
    module = type(exc).__module__ or ""
    return module.split(".")[0] in _FOREIGN_MODULES


def _describe(exc: BaseException) -> str:
    """A one-line description of a foreign error, without the file name it may repeat."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not valid {exc.encoding.upper()} (byte offset {exc.start})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def translate_foreign(exc: BaseException, path: str | Path, *, kind: type[InputError] = InputError,
                      action: str = "read") -> WeknoraNbError | None:
    """The package's error for a foreign ``exc`` met while using ``path``, or None when it is not foreign.

    Reading: an :class:`InputError` of ``kind`` naming the file (a missing file, a directory,
    a permission, bad bytes, a truncated Parquet file, a malformed CSV, YAML or JSON).
    Writing (``action="write"``): a :class:`StorageError` ("No space left on device",
    "Read-only file system", "Permission denied").
    """
    if not is_foreign(exc):
        return None
    if action == "write" and isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            reason += " (free some space; what was written before is kept)"
        return StorageError(getattr(exc, "filename", None) or path, reason)
    return kind(path, _describe(exc))


@contextmanager
def reading(path: str | Path, kind: type[InputError] = InputError) -> Iterator[None]:
    """Within the block, a foreign error becomes ``kind(path, ...)`` (ours and bugs pass through)."""
    try:
        yield
    except Exception as exc:
        ours = translate_foreign(exc, path, kind=kind)
        if ours is None:
            raise
        raise ours from exc


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Within the block, an OS error while writing becomes a :class:`StorageError` naming the file."""
    try:
        yield
    except OSError as exc:
        ours = translate_foreign(exc, path, action="write")
        if ours is None:
            raise
        raise ours from exc
