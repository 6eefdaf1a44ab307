"""WeKnora's dataset folder: ``queries.parquet`` (id, text), ``qrels.parquet`` (qid, pid, score), and optionally
``answers.parquet`` (id, text) with ``qas.parquet`` (qid, aid), which joins reference answers to queries.

Every problem names its file, row and column: a query id met twice (or equal once stripped), a qrel of an
unknown query, a (query, passage) pair labelled twice, a score that is no grade, an answer of an unknown id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import Problem, TestSetError
from weknora_nb.core.testset.builder import Builder
from weknora_nb.core.testset.model import TestSet
from weknora_nb.core.testset.parquetfile import missing_value, parquet_columns, parquet_schema
from weknora_nb.core.testset.validate import SAME_ONCE_STRIPPED, grade, same_id, show


def _id_text(v: Any) -> str | None:
    return None if missing_value(v) else str(v)


def _weknora_table(path: Path, cols: list[str], required: bool, problems: list[Problem]) -> bool:
    """Whether ``path`` exists with ``cols`` (its problems recorded)."""
    if not path.exists():
        if required:
            problems.append(Problem(str(path), None, None, "required file is missing"))
        return False
    schema = parquet_schema(path)
    missing = [c for c in cols if c not in schema.names]
    if missing:
        problems.append(Problem(str(path), None, None, f"missing column(s) {missing}; expected {cols}"))
        return False
    return True


def _weknora_rows(path: Path, cols: list[str]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    row = 0
    for batch in parquet_columns(path, cols):
        for values in zip(*(batch[c] for c in cols), strict=True):
            row += 1
            yield row, values


def load_weknora_folder(folder: Path) -> TestSet:
    """WeKnora's dataset format: queries(id, text), qrels(qid, pid, score), answers(id, text), qas(qid, aid)."""
    problems: list[Problem] = []
    paths = {name: folder / f"{name}.parquet" for name in ("queries", "qrels", "answers", "qas")}
    has_q = _weknora_table(paths["queries"], ["id", "text"], True, problems)
    has_r = _weknora_table(paths["qrels"], ["qid", "pid", "score"], True, problems)
    has_a = _weknora_table(paths["answers"], ["id", "text"], False, problems)
    has_qa = _weknora_table(paths["qas"], ["qid", "aid"], False, problems)
    if problems or not (has_q and has_r):
        raise TestSetError(folder, problems)
    qpath = str(paths["queries"])
    records: dict[str, dict[str, Any]] = {}
    order: list[tuple[int, dict[str, Any]]] = []
    first: dict[str, tuple[int, str]] = {}
    for i, (qid, text) in _weknora_rows(paths["queries"], ["id", "text"]):
        raw = _id_text(qid) or ""
        key = raw.strip()
        if key in first:
            problems.append(Problem(qpath, i, "id", same_id("query ids", first[key][1], raw, first[key][0], "row"),
                                    "row"))
            continue
        first[key] = (i, raw)
        rec: dict[str, Any] = {"query_id": raw, "query": "" if missing_value(text) else text, "relevant": {}}
        records[key] = rec
        order.append((i, rec))
    _weknora_qrels(paths["qrels"], records, problems)
    if has_a and has_qa:
        _weknora_answers(paths["answers"], paths["qas"], records, problems)
    builder = Builder(qpath, "row", problems)
    for i, rec in order:
        builder.put(i, rec, check_text=False)   # text from Arrow is valid UTF-8
    return TestSet.from_builder(builder)


def _weknora_qrels(path: Path, records: dict[str, dict[str, Any]], problems: list[Problem]) -> None:
    """Add qrels.parquet's labels to ``records``; a (query, passage) pair met twice is a problem naming both rows."""
    rpath = str(path)
    first: dict[tuple[str, str], tuple[int, str]] = {}
    for i, (qid, pid, score) in _weknora_rows(path, ["qid", "pid", "score"]):
        q = _id_text(qid)
        key = None if q is None else q.strip()
        if key is None or key not in records:
            problems.append(Problem(rpath, i, "qid", "missing" if q is None
                                    else f"query id {q!r} is not in queries.parquet", "row"))
            continue
        raw = _id_text(pid) or ""
        if not raw.strip():
            problems.append(Problem(rpath, i, "pid", "must be a non-empty passage id", "row"))
            continue
        g = grade(score)
        if g is None:
            problems.append(Problem(rpath, i, "score", f"must be an integer 0-3, got {show(score)}", "row"))
            continue
        pair = (key, raw.strip())
        if pair in first:
            row, spelled = first[pair]
            msg = (f"passage {raw!r} labelled twice for query {key!r} (first at row {row})" if spelled == raw
                   else f"passage ids {spelled!r} (row {row}) and {raw!r} {SAME_ONCE_STRIPPED} (query {key!r})")
            problems.append(Problem(rpath, i, "pid", msg, "row"))
            continue
        first[pair] = (i, raw)
        records[key]["relevant"][raw.strip()] = g


def _weknora_answers(apath: Path, qapath: Path, records: dict[str, dict[str, Any]], problems: list[Problem]) -> None:
    """Reference answers from answers.parquet, joined through qas.parquet."""
    texts = {_id_text(a): t for _, (a, t) in _weknora_rows(apath, ["id", "text"])}
    for i, (qid, aid) in _weknora_rows(qapath, ["qid", "aid"]):
        q, a = (_id_text(qid) or "").strip(), _id_text(aid)
        if q not in records:
            problems.append(Problem(str(qapath), i, "qid", f"query id {q!r} is not in queries.parquet", "row"))
        elif a not in texts:
            problems.append(Problem(str(qapath), i, "aid", f"answer id {a!r} is not in answers.parquet", "row"))
        elif not missing_value(texts[a]):
            prev = records[q].get("answer")
            records[q]["answer"] = texts[a] if not prev else f"{prev}\n{texts[a]}"
