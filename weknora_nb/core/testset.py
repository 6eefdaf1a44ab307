"""Test sets: load, validate, hash and export labelled queries.

A test set is a list of records (docs/method.md section 1)::

    {"query_id": "q001", "query": "...", "relevant": {"chunk-id": 3, "other-id": 1},
     "query_type": "procedural", "tags": ["long-tail"], "answer": "..."}

``query_type``, ``tags`` and ``answer`` are optional. Grades are integers 0-3
(3 fully relevant, 2 highly relevant, 1 partly relevant, 0 not relevant); a chunk
absent from ``relevant`` has grade 0. A query with no grade >= 1 is *invalid*: it
stays in the test set, is excluded from every mean, and is counted and listed.

Formats read by :func:`load_testset`: canonical JSONL, CSV (``relevant`` as JSON text
or ``id:grade;id:grade``), Parquet, a WeKnora dataset folder (``queries.parquet``,
``qrels.parquet``, optional ``answers.parquet`` + ``qas.parquet``), and TREC qrels with
a topics file (:func:`load_trec_qrels`). Every problem is reported at once, with
file, line (or row) and field; nothing is half-loaded.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from weknora_nb.core.errors import Problem, TestSetError, UsageError
from weknora_nb.core.pipeline import MIN_VALID_QUERIES

__all__ = ["TestSet", "load_testset", "load_trec_qrels"]

log = logging.getLogger(__name__)

GRADES = (0, 1, 2, 3)
KNOWN_FIELDS = {"query_id", "query", "relevant", "query_type", "tags", "answer"}


@dataclass(frozen=True, eq=False)
class TestSet:
    """A validated test set.

    Attributes
    ----------
    queries : DataFrame
        One row per query: ``query_id``, ``query``, ``query_type`` (or None),
        ``tags`` (list of str), ``answer`` (or None), ``n_labelled`` (chunks with a
        grade, 0 included), ``n_relevant`` (chunks with grade >= 1), ``valid``.
    qrels : DataFrame
        One row per label: ``query_id``, ``chunk_id``, ``grade`` (int8, 0-3).
    source : str
        Where it was loaded from.
    """

    __test__ = False  # not a pytest test class

    queries: pd.DataFrame
    qrels: pd.DataFrame
    source: str = "<memory>"
    _records: tuple = field(default=(), repr=False)

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], source: str = "<records>") -> TestSet:
        """Validate plain dicts (the JSONL schema) and build a test set."""
        return _build(((i, r) for i, r in enumerate(records, start=1)), source, where="record")

    # -- views ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.queries)

    @property
    def valid_ids(self) -> list[str]:
        """Ids of queries with at least one chunk of grade >= 1."""
        return self.queries.loc[self.queries["valid"], "query_id"].tolist()

    @property
    def invalid_ids(self) -> list[str]:
        """Ids of queries with no chunk of grade >= 1 (excluded from every mean)."""
        return self.queries.loc[~self.queries["valid"], "query_id"].tolist()

    @property
    def n_valid(self) -> int:
        return int(self.queries["valid"].sum())

    @property
    def significant(self) -> bool:
        """True when at least :data:`MIN_VALID_QUERIES` valid queries back the figures."""
        return self.n_valid >= MIN_VALID_QUERIES

    @cached_property
    def hash(self) -> str:
        """Stable content hash, ``sha256:<hex>``.

        Covers query ids, query texts, every label (grade 0 included), query types and
        tags; independent of file format, record order and key order. Reference
        answers are not covered: editing one does not change what retrieval is scored
        against, so runs stay comparable.
        """
        canon = []
        for rec in sorted(self._records, key=lambda r: r["query_id"]):
            canon.append([
                rec["query_id"], rec["query"],
                sorted(rec["relevant"].items()),
                rec.get("query_type"), sorted(rec.get("tags") or []),
            ])
        blob = json.dumps(canon, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return "sha256:" + hashlib.sha256(blob).hexdigest()

    def records(self) -> list[dict[str, Any]]:
        """The records as plain dicts (canonical JSONL schema), in file order."""
        return [dict(r, relevant=dict(r["relevant"]), tags=list(r.get("tags") or [])) for r in self._records]

    def subset(self, query_ids: Iterable[str]) -> TestSet:
        """A test set holding only ``query_ids`` (file order kept)."""
        keep = set(query_ids)
        return TestSet.from_records([r for r in self.records() if r["query_id"] in keep],
                                    source=f"{self.source} (subset)")

    # -- export -------------------------------------------------------------------------
    def to_jsonl(self, path: str | Path) -> None:
        """Write the canonical JSONL (UTF-8, one record a line)."""
        lines = []
        for rec in self.records():
            out = {k: v for k, v in rec.items() if v not in (None, [])}
            out.setdefault("relevant", {})
            lines.append(json.dumps(out, ensure_ascii=False))
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")

    def to_trec_qrels(self, path: str | Path, topics_path: str | Path | None = None) -> None:
        """Write TREC qrels (``qid 0 chunk_id grade``), and optionally a topics TSV.

        Query and chunk ids must not contain whitespace (TREC files are
        whitespace-separated); a :class:`UsageError` names the offending id otherwise.
        """
        rows = []
        for q, c, g in self.qrels[["query_id", "chunk_id", "grade"]].itertuples(index=False):
            for kind, ident in (("query id", q), ("chunk id", c)):
                if any(ch.isspace() for ch in ident):
                    raise UsageError(f"{kind} {ident!r} contains whitespace and cannot be written as TREC qrels "
                                     "(its fields are whitespace-separated); rename it first", argument=kind,
                                     allowed="an id without whitespace", got=ident)
            rows.append(f"{q} 0 {c} {int(g)}")
        Path(path).write_text("\n".join(rows) + ("\n" if rows else ""), encoding="utf-8")
        if topics_path is not None:
            with open(topics_path, "w", encoding="utf-8") as fh:
                for qid, text in self.queries[["query_id", "query"]].itertuples(index=False):
                    fh.write(f"{qid}\t{' '.join(text.split())}\n")


# ---------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------
def load_testset(path: str | Path) -> TestSet:
    """Load and validate a test set; the format follows the path.

    - a folder: WeKnora dataset (``queries.parquet``, ``qrels.parquet``, optional
      ``answers.parquet`` and ``qas.parquet``);
    - ``.jsonl`` / ``.json``: canonical JSONL; ``.csv``; ``.parquet``.

    Raises
    ------
    FileNotFoundError
        The path does not exist.
    TestSetError
        Any validation problem; ``.problems`` lists every one with file, line and field.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"test set not found: {p}")
    if p.is_dir():
        return _load_weknora_folder(p)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _load_jsonl(p)
    if suffix == ".csv":
        return _load_csv(p)
    if suffix in (".parquet", ".pq"):
        return _load_parquet(p)
    raise TestSetError(p, [Problem(str(p), None, None,
                                   f"unsupported test-set format {suffix!r}; expected .jsonl, .csv, "
                                   ".parquet or a WeKnora dataset folder (TREC qrels: load_trec_qrels)")])


def load_trec_qrels(qrels_path: str | Path, topics_path: str | Path) -> TestSet:
    """Load TREC qrels (``qid iter chunk_id grade``) with a topics TSV (``qid<TAB>text``)."""
    qp, tp = Path(qrels_path), Path(topics_path)
    problems: list[Problem] = []
    texts: dict[str, tuple[int, str]] = {}
    for lineno, line in _text_lines(tp, problems):
        if not line.strip():
            continue
        parts = line.rstrip("\n").split("\t", 1)
        if len(parts) != 2:
            problems.append(Problem(str(tp), lineno, "query", "expected 'query_id<TAB>query text'"))
            continue
        qid = parts[0].strip()
        if qid in texts:
            problems.append(Problem(str(tp), lineno, "query_id",
                                    f"duplicate query id {qid!r} (first on line {texts[qid][0]})"))
            continue
        texts[qid] = (lineno, parts[1].strip())
    relevant: dict[str, dict[str, Any]] = {qid: {} for qid in texts}
    for lineno, line in _text_lines(qp, problems):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 4:
            problems.append(Problem(str(qp), lineno, None, "expected 4 whitespace-separated fields "
                                    f"'qid iter chunk_id grade', got {len(parts)}"))
            continue
        qid, _, cid, grade = parts
        if qid not in relevant:
            problems.append(Problem(str(qp), lineno, "query_id", f"query id {qid!r} is not in the topics file {tp}"))
            continue
        g = _grade(int(grade)) if grade.lstrip("-").isdigit() else None
        if g is None:
            problems.append(Problem(str(qp), lineno, "relevant", f"grade must be an integer 0-3, got {grade!r}"))
            continue
        if cid in relevant[qid]:
            problems.append(Problem(str(qp), lineno, "relevant", f"chunk {cid!r} labelled twice for query {qid!r}"))
            continue
        relevant[qid][cid] = g
    if problems:
        raise TestSetError(qp, problems)
    rows = ((ln, {"query_id": qid, "query": text, "relevant": relevant[qid]}) for qid, (ln, text) in texts.items())
    return _build(rows, str(tp), where="line")


def _text_lines(path: Path, problems: list[Problem]) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line) of a UTF-8 file, BOM tolerated."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad_line = raw[: exc.start].count(b"\n") + 1
        problems.append(Problem(str(path), bad_line, None, f"not valid UTF-8 (byte offset {exc.start})"))
        return
    yield from enumerate(text.splitlines(), start=1)


def _load_jsonl(path: Path) -> TestSet:
    problems: list[Problem] = []
    rows: list[tuple[int, Any]] = []
    for lineno, line in _text_lines(path, problems):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(Problem(str(path), lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})"))
            continue
        rows.append((lineno, obj))
    return _build(rows, str(path), where="line", problems=problems)


def _load_csv(path: Path) -> TestSet:
    problems: list[Problem] = []
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TestSetError(path, [Problem(str(path), line, None, f"not valid UTF-8 (byte offset {exc.start})")]) \
            from exc
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = {"query_id", "query", "relevant"} - set(reader.fieldnames or [])
    if missing:
        raise TestSetError(path, [Problem(str(path), 1, None, f"missing column(s) {sorted(missing)} in the header")])
    rows: list[tuple[int, Any]] = []
    for rec in reader:
        lineno = reader.line_num
        obj: dict[str, Any] = {k: v for k, v in rec.items() if k is not None and v not in (None, "")}
        obj.setdefault("query_id", "")
        obj.setdefault("query", "")
        rel = _parse_relevant_text(rec.get("relevant") or "", str(path), lineno, problems)
        if rel is None:
            continue
        obj["relevant"] = rel
        if "tags" in obj:
            obj["tags"] = _parse_tags_text(obj["tags"])
        rows.append((lineno, obj))
    return _build(rows, str(path), where="line", problems=problems)


def _parse_relevant_text(text: str, path: str, lineno: int, problems: list[Problem]) -> dict | None:
    """``{"a": 3}`` (JSON) or ``a:3;b:1``; None (with a problem recorded) when malformed."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            val = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(Problem(path, lineno, "relevant", f"not valid JSON: {exc.msg}"))
            return None
        return val
    out: dict[str, Any] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        cid, sep, grade = part.rpartition(":")
        if not sep:
            problems.append(Problem(path, lineno, "relevant", f"expected 'chunk_id:grade', got {part!r}"))
            return None
        try:
            g: Any = int(grade.strip())
        except ValueError:
            g = grade.strip()
        cid = cid.strip()
        if cid in out:
            problems.append(Problem(path, lineno, "relevant", f"chunk {cid!r} labelled twice"))
            return None
        out[cid] = g
    return out


def _parse_tags_text(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    t = text.strip()
    if t.startswith("["):
        try:
            return json.loads(t)
        except json.JSONDecodeError:
            return t  # validation reports it
    return [x.strip() for x in t.replace(",", ";").split(";") if x.strip()]


def _load_parquet(path: Path) -> TestSet:
    df = pd.read_parquet(path)
    missing = {"query_id", "query", "relevant"} - set(df.columns)
    if missing:
        raise TestSetError(path, [Problem(str(path), None, None, f"missing column(s) {sorted(missing)}")])
    problems: list[Problem] = []
    rows: list[tuple[int, Any]] = []
    for i, rec in enumerate(df.to_dict("records"), start=1):
        obj = {k: _py(v) for k, v in rec.items()}
        obj = {k: v for k, v in obj.items() if v is not None or k in ("query_id", "query", "relevant")}
        rel = obj.get("relevant")
        if isinstance(rel, str):
            rel = _parse_relevant_text(rel, str(path), i, problems)
            if rel is None:
                continue
        elif isinstance(rel, list):  # a pyarrow map column arrives as [(key, value), ...]
            rel = {k: v for k, v in rel}
        elif rel is None:
            rel = {}
        obj["relevant"] = rel
        if isinstance(obj.get("tags"), str):
            obj["tags"] = _parse_tags_text(obj["tags"])
        rows.append((i, obj))
    return _build(rows, str(path), where="row", problems=problems)


def _py(v: Any) -> Any:
    """numpy/pandas scalars and arrays to plain Python values."""
    if v is None:
        return None
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _py(x) for k, x in v.items() if _py(x) is not None}
    return v


def _load_weknora_folder(folder: Path) -> TestSet:
    """WeKnora's dataset format: queries(id, text), qrels(qid, pid, score), answers(id, text), qas(qid, aid)."""
    problems: list[Problem] = []

    def table(name: str, cols: list[str], required: bool) -> pd.DataFrame | None:
        p = folder / f"{name}.parquet"
        if not p.exists():
            if required:
                problems.append(Problem(str(p), None, None, "required file is missing"))
            return None
        df = pd.read_parquet(p)
        missing = [c for c in cols if c not in df.columns]
        if missing:
            problems.append(Problem(str(p), None, None, f"missing column(s) {missing}; expected {cols}"))
            return None
        return df

    queries = table("queries", ["id", "text"], True)
    qrels = table("qrels", ["qid", "pid", "score"], True)
    answers = table("answers", ["id", "text"], False)
    qas = table("qas", ["qid", "aid"], False)
    if problems:
        raise TestSetError(folder, problems)
    assert queries is not None and qrels is not None
    qpath, rpath = str(folder / "queries.parquet"), str(folder / "qrels.parquet")

    records: dict[str, dict[str, Any]] = {}
    order: list[tuple[int, dict[str, Any]]] = []
    for i, (qid, text) in enumerate(queries[["id", "text"]].itertuples(index=False), start=1):
        qid = _py(qid)
        rec: dict[str, Any] = {"query_id": "" if qid is None else str(qid), "query": _py(text) or "",
                               "relevant": {}}
        if rec["query_id"] in records:
            problems.append(Problem(qpath, i, "id", f"duplicate query id {rec['query_id']!r}", "row"))
            continue
        records[rec["query_id"]] = rec
        order.append((i, rec))
    for i, (qid, pid, score) in enumerate(qrels[["qid", "pid", "score"]].itertuples(index=False), start=1):
        qid, pid, score = str(_py(qid)), _py(pid), _py(score)
        if qid not in records:
            problems.append(Problem(rpath, i, "qid", f"query id {qid!r} is not in queries.parquet", "row"))
            continue
        pid = "" if pid is None else str(pid)
        if pid in records[qid]["relevant"]:
            problems.append(Problem(rpath, i, "pid", f"passage {pid!r} labelled twice for query {qid!r}", "row"))
            continue
        records[qid]["relevant"][pid] = score
    if answers is not None and qas is not None:
        texts = {str(_py(a)): _py(t) for a, t in answers[["id", "text"]].itertuples(index=False)}
        apath = str(folder / "qas.parquet")
        for i, (qid, aid) in enumerate(qas[["qid", "aid"]].itertuples(index=False), start=1):
            qid, aid = str(_py(qid)), str(_py(aid))
            if qid not in records:
                problems.append(Problem(apath, i, "qid", f"query id {qid!r} is not in queries.parquet", "row"))
            elif aid not in texts:
                problems.append(Problem(apath, i, "aid", f"answer id {aid!r} is not in answers.parquet", "row"))
            else:
                prev = records[qid].get("answer")
                records[qid]["answer"] = texts[aid] if not prev else f"{prev}\n{texts[aid]}"
    return _build(order, qpath, where="row", problems=problems)


# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------
def _validate(obj: Any, path: str, line: int, where: str, problems: list[Problem]) -> dict[str, Any] | None:
    """Check one raw record; return the clean record or None (problems appended)."""
    def bad(field: str | None, msg: str) -> None:
        problems.append(Problem(path, line, field, msg, where))

    if not isinstance(obj, dict):
        bad(None, f"expected a JSON object, got {type(obj).__name__}")
        return None
    n_before = len(problems)
    qid = obj.get("query_id")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        bad("query_id", "missing" if qid is None else f"must be a string, got {type(qid).__name__}")
    else:
        qid = str(qid).strip()
        if not qid:
            bad("query_id", "must not be empty")
    text = obj.get("query")
    if not isinstance(text, str):
        bad("query", "missing" if text is None else f"must be a string, got {type(text).__name__}")
    elif not text.strip():
        bad("query", "must not be empty")
    rel = obj.get("relevant")
    clean_rel: dict[str, int] = {}
    if not isinstance(rel, dict):
        bad("relevant", "missing (use {} for a query with no relevant chunk)" if rel is None
            else f"must be an object mapping chunk id to grade, got {type(rel).__name__}")
    else:
        for cid, grade in rel.items():
            if not isinstance(cid, str) or not cid.strip():
                bad("relevant", f"chunk id must be a non-empty string, got {cid!r}")
                continue
            g = _grade(grade)
            if g is None:
                bad("relevant", f"grade of chunk {cid!r} must be an integer 0-3, got {grade!r}")
                continue
            clean_rel[cid.strip()] = g
    qtype = obj.get("query_type")
    if qtype is not None and (not isinstance(qtype, str) or not qtype.strip()):
        bad("query_type", f"must be a non-empty string, got {qtype!r}")
    tags = obj.get("tags")
    if tags is None:
        tags = []
    elif not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags):
        bad("tags", f"must be a list of non-empty strings, got {tags!r}")
    answer = obj.get("answer")
    if answer is not None and not isinstance(answer, str):
        bad("answer", f"must be a string, got {type(answer).__name__}")
    unknown = set(obj) - KNOWN_FIELDS
    if unknown:
        log.debug("%s %s %d: ignoring unknown field(s) %s", path, where, line, sorted(unknown))
    if len(problems) > n_before:
        return None
    return {
        "query_id": qid, "query": str(text).strip(), "relevant": clean_rel,
        "query_type": qtype.strip() if isinstance(qtype, str) else None,
        "tags": [t.strip() for t in tags], "answer": answer,
    }


def _grade(value: Any) -> int | None:
    """An integer grade 0-3 (integral floats accepted, bools and strings not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value in GRADES:
        return value
    return None


def _build(rows: Iterable[tuple[int, Any]], path: str, *, where: str,
           problems: list[Problem] | None = None) -> TestSet:
    problems = list(problems or [])
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for line, obj in rows:
        rec = _validate(obj, path, line, where, problems)
        if rec is None:
            continue
        if rec["query_id"] in seen:
            first = seen[rec["query_id"]]
            problems.append(Problem(path, line, "query_id",
                                    f"duplicate query id {rec['query_id']!r} (first at {where} {first})", where))
            continue
        seen[rec["query_id"]] = line
        records.append(rec)
    if not records and not problems:
        problems.append(Problem(path, None, None, "the test set holds no query"))
    if problems:
        raise TestSetError(path, problems)

    queries = pd.DataFrame({
        "query_id": [r["query_id"] for r in records],
        "query": [r["query"] for r in records],
        "query_type": [r["query_type"] for r in records],
        "tags": [r["tags"] for r in records],
        "answer": [r["answer"] for r in records],
        "n_labelled": [len(r["relevant"]) for r in records],
        "n_relevant": [sum(g >= 1 for g in r["relevant"].values()) for r in records],
    })
    queries["valid"] = queries["n_relevant"] > 0
    qrels = pd.DataFrame(
        [(r["query_id"], c, g) for r in records for c, g in r["relevant"].items()],
        columns=["query_id", "chunk_id", "grade"],
    ).astype({"query_id": str, "chunk_id": str, "grade": "int8"})
    ts = TestSet(queries=queries, qrels=qrels, source=path, _records=tuple(records))
    n_invalid = len(ts.invalid_ids)
    if n_invalid:
        log.info("%s: %d of %d queries have no chunk of grade >= 1 and are invalid: %s",
                 path, n_invalid, len(ts), ", ".join(ts.invalid_ids[:20]))
    return ts
