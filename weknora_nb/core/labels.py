"""Relevance labels given by people: an append-only log that survives a crash (docs/method.md section 10).

A labels log is a JSONL file, one judgement a line::

    {"query_id": "q017", "chunk_id": "doc-3:004", "grade": 2, "assessor": "li", "at": "2026-12-01T10:31:07Z"}

``grade`` is an integer 0-3 (section 1), or ``null`` for a chunk the assessor skipped.
:meth:`LabelsLog.append` writes the line, flushes and fsyncs before it returns, so a
judgement the user saw accepted is on disk even if the kernel, the browser tab or the
machine goes away a moment later. A crash can leave at most a torn last line; reading
drops it with a warning (every other bad line is an error naming file, line and field).

When an assessor judges the same chunk again (after going back), the later line wins:
:func:`latest` keeps the last judgement per (assessor, query, chunk).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from weknora_nb.core.errors import InputError, Problem, UsageError, reading, writing

log = logging.getLogger(__name__)

#: the grades of docs/method.md section 1 (3 fully, 2 highly, 1 partly, 0 not relevant)
GRADES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Judgement:
    """One assessor's grade of one chunk for one query (``grade`` None: skipped)."""

    query_id: str
    chunk_id: str
    grade: int | None
    assessor: str
    at: str

    @property
    def key(self) -> tuple[str, str, str]:
        """(assessor, query_id, chunk_id): what a later judgement of the same chunk replaces."""
        return self.assessor, self.query_id, self.chunk_id


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_grade(grade: int | None) -> int | None:
    if grade is None or (isinstance(grade, int) and not isinstance(grade, bool) and grade in GRADES):
        return grade
    raise UsageError(argument="grade", allowed=list(GRADES) + [None], got=grade)


class LabelsLog:
    """An append-only labels log at ``path`` (created on the first judgement).

    >>> log = LabelsLog("labels.jsonl")                               # doctest: +SKIP
    >>> log.append("q1", "c7", 3, assessor="li")                       # doctest: +SKIP
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def append(self, query_id: str, chunk_id: str, grade: int | None, *, assessor: str,
               at: str | None = None) -> Judgement:
        """Write one judgement durably (flush + fsync) and return it."""
        if not str(assessor).strip():
            raise UsageError("an assessor id is needed (a name or initials), so that agreement can be measured")
        j = Judgement(str(query_id), str(chunk_id), _check_grade(grade), str(assessor).strip(), at or _now())
        line = json.dumps(asdict(j), ensure_ascii=False, separators=(",", ":")) + "\n"
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._heal_torn_tail()
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        return j

    def _heal_torn_tail(self) -> None:
        """Make the file end with a whole line before appending: a last line without its newline
        is completed when it is a whole judgement (a hand-edited file) and cut off when it is torn
        (a crash while writing it; :func:`read_labels` drops it too)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            start = data.rfind(b"\n") + 1
            try:
                json.loads(data[start:])
            except ValueError:
                log.warning("%s: cut off a torn last line (a crash while writing it)", self.path)
                f.truncate(start)
                return
            f.write(b"\n")

    def read(self) -> list[Judgement]:
        """Every judgement in file order ([] when the log does not exist yet)."""
        return read_labels(self.path) if self.path.exists() else []


def read_labels(path: str | Path) -> list[Judgement]:
    """The judgements of a labels log, in file order; a torn last line is dropped with a warning."""
    return [j for _, j in read_label_entries(path)]


def read_label_entries(path: str | Path) -> list[tuple[int, Judgement]]:
    """(line number, judgement) of every judgement of a labels log, in file order (what an error
    about one judgement, e.g. a query the test set does not hold, needs to name its line)."""
    p = Path(path)
    with reading(p):
        text = p.read_bytes().decode("utf-8")
    lines = text.split("\n")
    problems: list[Problem] = []
    out: list[tuple[int, Judgement]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        torn = lineno == len(lines) and not text.endswith("\n")
        j = _parse_line(line, str(p), lineno, problems, torn=torn)
        if j is not None:
            out.append((lineno, j))
    if problems:
        raise InputError(p, problems)
    return out


def _parse_line(line: str, path: str, lineno: int, problems: list[Problem], *, torn: bool) -> Judgement | None:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        if torn:
            log.warning("%s line %d: dropped a torn last line (a crash while writing it)", path, lineno)
        else:
            problems.append(Problem(path, lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})"))
        return None
    if not isinstance(obj, dict):
        problems.append(Problem(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}"))
        return None
    n_before = len(problems)
    for name in ("query_id", "chunk_id", "assessor", "at"):
        if not isinstance(obj.get(name), str) or not obj[name].strip():
            problems.append(Problem(path, lineno, name, "must be a non-empty string"))
    grade = obj.get("grade")
    if grade is not None and (isinstance(grade, bool) or grade not in GRADES):
        problems.append(Problem(path, lineno, "grade", f"must be an integer 0-3 or null (skipped), got {grade!r}"))
    if len(problems) > n_before:
        return None
    return Judgement(obj["query_id"], obj["chunk_id"], grade, obj["assessor"].strip(), obj["at"])


def latest(judgements: Iterable[Judgement]) -> list[Judgement]:
    """The last judgement per (assessor, query, chunk), in the order of their last occurrence."""
    last: dict[tuple[str, str, str], Judgement] = {}
    for j in judgements:
        last.pop(j.key, None)
        last[j.key] = j
    return list(last.values())


def iter_graded(judgements: Iterable[Judgement]) -> Iterator[Judgement]:
    """The judgements that carry a grade (skips left out)."""
    return (j for j in judgements if j.grade is not None)
