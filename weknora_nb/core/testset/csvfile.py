"""A CSV test set: a header line naming the columns (``query_id``, ``query``, ``relevant`` at least), then a
record a row.

``relevant`` is JSON text (``{"a": 3}``) or ``id:grade;id:grade``; ``tags`` a JSON list or names
separated by ``;`` or ``,``; ``overlap`` a decimal number (:mod:`weknora_nb.core.testset.parsing`). Quoting is
strict: a malformed record is a problem and ends the file, and a quote opened and never closed is named at the
line where its field starts. A column named twice in the header is a problem (the last would silently win).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import Problem, TestSetError
from weknora_nb.core.testset.builder import Builder
from weknora_nb.core.testset.model import TestSet
from weknora_nb.core.testset.parsing import parse_number_text, parse_relevant_text, parse_tags_text
from weknora_nb.core.testset.textfile import read_lines
from weknora_nb.core.testset.validate import KNOWN_FIELDS, REQUIRED


def load_csv(path: Path) -> TestSet:
    """A CSV test set: a header line naming the columns, then a record a row."""
    builder = Builder(str(path), "line")
    rows = _csv_rows(path, builder.problems)
    first = next(rows, None)
    if first is None or not first[1]:
        if not builder.problems:
            builder.problems.append(Problem(str(path), 1, None, "the file is empty (no header line)"))
        raise TestSetError(path, builder.problems)
    header = first[1]
    if builder.problems:   # the header line is not UTF-8
        raise TestSetError(path, builder.problems)
    missing = set(REQUIRED) - set(header)
    if missing:
        raise TestSetError(path, [Problem(str(path), first[0], None,
                                          f"missing column(s) {sorted(missing)} in the header")])
    seen: dict[str, int] = {}
    for i, name in enumerate(header, start=1):
        if name in seen and name in KNOWN_FIELDS:
            builder.problems.append(Problem(str(path), first[0], name, f"column appears twice in the header "
                                            f"(columns {seen[name]} and {i}); the last would silently win"))
        seen.setdefault(name, i)
    for lineno, row in rows:
        if not row:
            continue
        obj: dict[str, Any] = {k: v for k, v in zip(header, row, strict=False) if v != ""}
        obj.setdefault("query_id", "")
        obj.setdefault("query", "")
        rel = parse_relevant_text(obj.get("relevant", ""), builder.complaint(lineno))
        if rel is None:
            continue
        obj["relevant"] = rel
        if "tags" in obj:
            obj["tags"] = parse_tags_text(obj["tags"])
        if "overlap" in obj:
            obj["overlap"] = parse_number_text(obj["overlap"])
        builder.put(lineno, obj, check_text=any("\\u" in v for v in row))
    return TestSet.from_builder(builder)


class _CsvLines:
    """The decoded lines of a CSV file for :mod:`csv` (line ends kept), remembering the current record's."""

    def __init__(self, path: Path, problems: list[Problem]):
        self._problems = problems
        self._it = read_lines(path, problems, keepends=True, stop_at_bad=True)
        self.record: list[tuple[int, str]] = []   # the lines of the record being read (at most 10,000)
        self.at_end = False                       # the lines ran out
        self.broken = False                       # ... at a line that is not UTF-8 (a problem says so)

    def __iter__(self) -> Iterator[str]:
        n_problems = len(self._problems)
        for lineno, text in self._it:
            if len(self.record) < 10_000:
                self.record.append((lineno, text))
            yield text
        self.at_end, self.broken = True, len(self._problems) > n_problems


def _csv_rows(path: Path, problems: list[Problem]) -> Iterator[tuple[int, list[str]]]:
    """Yield (first line, fields) of each CSV record (strict quoting); a malformed record is a problem and ends
    the file (a quote opened and never closed is named at the line where its field starts)."""
    lines = _CsvLines(path, problems)
    reader = csv.reader(iter(lines), strict=True)
    last = 0
    while True:
        lines.record = []
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if not lines.broken:   # else the file stopped at a line that is not UTF-8: that is the problem
                problems.append(_csv_problem(path, exc, lines, reader.line_num))
            return
        yield last + 1, row
        last = reader.line_num


def _csv_problem(path: Path, exc: csv.Error, lines: _CsvLines, line_num: int) -> Problem:
    """What :mod:`csv` found wrong; a quote that is never closed is named at the line where its field starts."""
    opened = _open_quote(lines.record)
    if opened and (lines.at_end or "field limit" in str(exc)):
        line, column = opened
        end = ("every later line would be read into it" if lines.at_end else
               f"the field grew past {csv.field_size_limit():,} characters before it")
        return Problem(str(path), line, None, f"a quoted field (column {column}) starts here and its closing quote "
                                              f"never comes: {end}")
    return Problem(str(path), line_num, None, f"malformed CSV: {exc}")


def _open_quote(record: list[tuple[int, str]]) -> tuple[int, int] | None:
    """Line and (1-based) column of the quoted field a CSV record leaves open (None: every quote closes)."""
    opened = (record[0][0], 1) if record else (0, 1)
    state, column = "start", 1   # start (of a field) | plain | quoted | quote (a quote seen inside quotes)
    for line, text in record:
        for ch in text:
            if state == "quoted":
                state = "quote" if ch == '"' else "quoted"
                continue
            if state == "quote":
                if ch == '"':       # a doubled quote: a literal one, still inside
                    state = "quoted"
                    continue
                state = "plain"     # the field closed; ``ch`` follows it
            if ch == ",":
                state, column = "start", column + 1
            elif ch in "\r\n":
                state, column = "start", 1
            elif ch == '"' and state == "start":
                state, opened = "quoted", (line, column)
            else:
                state = "plain"
    return opened if state == "quoted" and record else None
