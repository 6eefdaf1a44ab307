"""A run's answers: ``answers.jsonl``, one line per chat request that succeeded.

Each line::

    {"query_id": "q0001", "stage": "citations", "repeat": 1, "answer": "... <kb chunk_id=\\"c7\\" /> ...",
     "citations": ["c7", "c2"]}

``citations`` lists the chunk ids the answer cites, in the order the answer cites them (the
inline ``<kb ... chunk_id=...>`` marks, docs/weknora-contract.md); the stage's results rows hold
the chat's final references in their own order. A failed chat request has no line here: its
results row records the failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.core.errors import InputError, Problem, reading

if TYPE_CHECKING:
    import pandas as pd


ANSWER_COLUMNS = ("query_id", "stage", "repeat", "answer", "citations")


def read_answers(path: str | Path, *, query_ids: Container[str] | None = None) -> pd.DataFrame:
    """The answers as a table (columns :data:`ANSWER_COLUMNS`; ``citations`` a list of str).

    Raises :class:`InputError` naming the file, line and field of every bad line, of a repeated
    (query_id, stage, repeat), and (with ``query_ids``, the run's test set) of an answer to a
    query the test set does not hold.
    """
    import pandas as pd

    p = Path(path)
    with reading(p):
        text = p.read_text(encoding="utf-8")
    problems: list[Problem] = []
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, int], int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        rec = _parse(line, str(p), lineno, problems)
        if rec is None:
            continue
        if query_ids is not None and rec["query_id"] not in query_ids:
            problems.append(Problem(str(p), lineno, "query_id",
                                    f"{rec['query_id']!r} is not a query of the run's test set"))
            continue
        key = (rec["query_id"], rec["stage"], rec["repeat"])
        if key in seen:
            problems.append(Problem(str(p), lineno, "query_id", f"answer {key} repeated (first at line {seen[key]})"))
            continue
        seen[key] = lineno
        rows.append(rec)
    if problems:
        raise InputError(p, problems)
    return pd.DataFrame(rows, columns=list(ANSWER_COLUMNS))


def _parse(line: str, path: str, lineno: int, problems: list[Problem]) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        problems.append(Problem(path, lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})"))
        return None
    if not isinstance(obj, dict):
        problems.append(Problem(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}"))
        return None
    n = len(problems)
    for name in ("query_id", "stage"):
        if not isinstance(obj.get(name), str) or not obj[name]:
            problems.append(Problem(path, lineno, name, "must be a non-empty string"))
    rep = obj.get("repeat")
    if isinstance(rep, bool) or not isinstance(rep, int) or rep < 1:
        problems.append(Problem(path, lineno, "repeat", f"must be an integer >= 1, got {rep!r}"))
    if not isinstance(obj.get("answer"), str):
        problems.append(Problem(path, lineno, "answer", "must be a string"))
    cites = obj.get("citations", [])
    if not isinstance(cites, list) or not all(isinstance(c, str) and c for c in cites):
        problems.append(Problem(path, lineno, "citations", f"must be a list of chunk ids, got {cites!r}"))
    if len(problems) > n:
        return None
    return {"query_id": obj["query_id"], "stage": obj["stage"], "repeat": rep, "answer": obj["answer"],
            "citations": list(cites)}


#: the judge's files in a run folder (written by ``weknora_nb.collect.judge``)
JUDGEMENTS = "judgements.jsonl"
JUDGE_MANIFEST = "judge.json"


def read_judgement_records(path: str | Path, *,
                           keys: tuple[str, ...] = ("query_id", "stage", "repeat", "judge_repeat", "baseline"),
                           check: Callable[[dict[str, Any]], tuple[str | None, str] | None] | None = None,
                           ) -> list[dict[str, Any]]:
    """The records of a judgement log, read only: the last record per (query, stage, repeat, judge
    repeat) wins (per ``keys``), a torn last line (a judge killed while writing) is left out, and any
    other line that is not a JSON object, or that ``check`` finds a problem with (``(field, message)``),
    is an :class:`InputError` naming the file, line and field."""
    p = Path(path)
    with reading(p):
        text = p.read_text(encoding="utf-8")
    lines = text.split("\n")
    records: dict[tuple[Any, ...], dict[str, Any]] = {}
    problems: list[Problem] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno < len(lines):  # a whole line (the torn one has no newline after it)
                problems.append(Problem(str(p), lineno, None, f"not valid JSON: {exc.msg}"))
            continue
        if not isinstance(rec, dict):
            problems.append(Problem(str(p), lineno, None, "expected a JSON object"))
            continue
        bad = check(rec) if check is not None else None
        if bad:
            problems.append(Problem(str(p), lineno, bad[0], bad[1]))
            continue
        records[tuple(rec.get(k) for k in keys)] = rec
    if problems:
        raise InputError(p, problems)
    return list(records.values())
