"""Exceptions raised by weknora_nb.

::

    WeknoraNbError
    ├── InputError            a file the user gave cannot be used as it is
    │   ├── TestSetError      test-set validation failed (all problems at once)
    │   └── ResultsError      results-table validation failed (all problems at once)
    └── MetricError           a metric name that cannot be parsed (also a ValueError)

Input errors carry a list of :class:`Problem`, each naming the file, the line (or
row) and the field, so that a user can fix every problem in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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


class InputError(WeknoraNbError):
    """A user-supplied file cannot be used; ``problems`` lists every reason."""

    #: how many problems are spelled out in the message (all are kept in ``problems``)
    max_shown = 50

    def __init__(self, path: str | Path, problems: list[Problem]):
        self.path = str(path)
        self.problems = list(problems)
        shown = self.problems[: self.max_shown]
        lines = [f"{self.kind} {self.path} has {len(self.problems)} problem(s):"]
        lines += [f"  - {p}" for p in shown]
        if len(self.problems) > len(shown):
            lines.append(f"  ... and {len(self.problems) - len(shown)} more")
        super().__init__("\n".join(lines))

    kind = "input file"


class TestSetError(InputError):
    """The test set failed validation."""

    __test__ = False  # not a pytest test class
    kind = "test set"


class ResultsError(InputError):
    """The results table failed validation."""

    kind = "results file"


class MetricError(WeknoraNbError, ValueError):
    """A metric name that is not in the registry or has a bad cutoff/variant."""
