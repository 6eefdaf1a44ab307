"""Test sets: load, validate, hash and export labelled queries.

A test set is a list of records (docs/method.md section 1)::

    {"query_id": "q001", "query": "...", "relevant": {"chunk-id": 3, "other-id": 1},
     "query_type": "procedural", "tags": ["long-tail"], "answer": "..."}

``query_type``, ``tags``, ``answer`` and ``weight`` (how often the query was asked in real
traffic, an integer >= 1, docs/method.md section 10) are optional. Grades are integers 0-3
(3 fully relevant, 2 highly relevant, 1 partly relevant, 0 not relevant); a chunk
absent from ``relevant`` has grade 0. A query with no grade >= 1 is *invalid*: it
stays in the test set, is excluded from every mean, and is counted and listed.

Formats read by :func:`load_testset`: canonical JSONL, CSV (``relevant`` as JSON text
or ``id:grade;id:grade``), Parquet, a WeKnora dataset folder (``queries.parquet``,
``qrels.parquet``, optional ``answers.parquet`` + ``qas.parquet``), and TREC qrels with
a topics file (:func:`load_trec_qrels`). Every problem is reported at once, with
file, line (or row) and field; nothing is half-loaded. Nothing collapses silently: a
key written twice in one JSON object, a chunk labelled twice, two ids that are equal once
surrounding whitespace is removed, a CSV quote that is never closed are all problems.

Memory: a loaded test set is held as its two DataFrames only (Arrow-backed strings);
:meth:`TestSet.records` rebuilds the plain dicts on demand. Files are read as a stream,
and validated records are gathered in column batches, so loading 1,000,000 queries stays
under 1 GB (``benchmarks/testset_memory.py``).

Speed: records are checked a batch at a time (:func:`_bulk_columns`: a few passes over each
field of the batch, no Python function per record), and JSONL is parsed by orjson a block
of lines at a time. A batch holding anything unusual (a problem to name, an odd type, a key
written twice, a lone ``\r``) is checked record by record instead, as before, so every
message still names its file, line and field; the fast path only accepts what that check
accepts, with the same result. The hash is built by Arrow and numpy over slices of queries.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from weknora_nb.core.errors import Problem, TestSetError, UsageError, reading, writing
from weknora_nb.core.pipeline import MIN_VALID_QUERIES

__all__ = ["TestSet", "load_testset", "load_trec_qrels"]

log = logging.getLogger(__name__)

GRADES = (0, 1, 2, 3)
KNOWN_FIELDS = {"query_id", "query", "relevant", "query_type", "tags", "answer", "weight"}
_REQUIRED = ("query_id", "query", "relevant")
#: records gathered as Python values before they become Arrow arrays
_BATCH = 16_384
_TEXT = pa.large_string()
_SURROGATE = re.compile("[\ud800-\udfff]")
_GRADE_TEXT = re.compile(r"[+-]?[0-9]{1,18}")
_SAME_ONCE_STRIPPED = "are the same id once surrounding whitespace is removed"
_BOM = b"\xef\xbb\xbf"
#: bytes of lines read at a time
_BLOCK_BYTES = 1 << 21
_ESCAPE_PAIR = re.compile(rb"\\.", re.DOTALL)
#: bytes JSON escapes in a string (``"``, ``\\``, control characters), and the others
_JSON_ESCAPED = np.zeros(256, bool)
_JSON_ESCAPED[[*range(32), 34, 92]] = True
_JSON_PLAIN = bytes(np.flatnonzero(~_JSON_ESCAPED).astype(np.uint8))
_NONE = type(None)
#: ``bad(field, message)``: records a problem at the line (or row) being checked
_Bad = Callable[[str | None, str], None]


@dataclass(frozen=True, eq=False)
class TestSet:
    """A validated test set.

    Attributes
    ----------
    queries : DataFrame
        One row per query: ``query_id``, ``query``, ``query_type`` (or missing),
        ``tags`` (a list of str per query, held as an Arrow list column), ``answer`` (or
        missing), ``weight`` (nullable Int64: the traffic weight, or missing), ``n_labelled``
        (chunks with a grade, 0 included), ``n_relevant`` (chunks with grade >= 1), ``valid``.
        Text columns are pandas' default string dtype.
    qrels : DataFrame
        One row per label: ``query_id``, ``chunk_id``, ``grade`` (int8, 0-3), the labels
        of each query together and in file order.
    source : str
        Where it was loaded from.
    """

    __test__ = False  # not a pytest test class

    queries: pd.DataFrame
    qrels: pd.DataFrame
    source: str = "<memory>"

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], source: str = "<records>") -> TestSet:
        """Validate plain dicts (the JSONL schema) and build a test set."""
        builder = _Builder(source, "record")
        it = iter(records)
        while batch := list(islice(it, _BATCH)):
            builder.add_batch(range(builder.seen + 1, builder.seen + 1 + len(batch)), batch)
        return builder.build()

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

        The digest is SHA-256 of the UTF-8 JSON text (``ensure_ascii=False``, separators
        ``,`` and ``:``) of the list, sorted by query id, of ``[query_id, query,
        sorted([chunk_id, grade] pairs), query_type or null, sorted(tags)]``; it is fed
        to the digest in slices, built with Arrow, never as one text.
        """
        return _content_hash(self.queries, self.qrels, self.label_rows)

    @cached_property
    def label_rows(self) -> np.ndarray:
        """Each label's query as a row of :attr:`queries` (int64, read-only; -1 for a label of no query).
        Known when the test set is built (each query's labels follow in query order); looked up by id for
        frames given by hand."""
        rows = _positions(self.qrels["query_id"], self.queries["query_id"]).astype(np.int64)
        rows.setflags(write=False)
        return rows

    def records(self) -> list[dict[str, Any]]:
        """The records as plain dicts (canonical JSONL schema), in file order; fresh objects each call."""
        q = self.queries
        relevant = _relevant_dicts(q, self.qrels, self.label_rows)
        out = []
        cols = q[["query_id", "query", "query_type", "tags", "answer", "weight"]].itertuples(index=False, name=None)
        for (qid, text, qtype, tags, answer, weight), rel in zip(cols, relevant, strict=True):
            out.append({"query_id": qid, "query": text, "relevant": rel,
                        "query_type": qtype if isinstance(qtype, str) else None,
                        "tags": list(tags) if isinstance(tags, (list, tuple, np.ndarray)) else [],
                        "answer": answer if isinstance(answer, str) else None,
                        "weight": None if pd.isna(weight) else int(weight)})
        return out

    def subset(self, query_ids: Iterable[str]) -> TestSet:
        """A test set holding only ``query_ids`` (file order kept)."""
        keep = set(query_ids)
        return TestSet.from_records([r for r in self.records() if r["query_id"] in keep],
                                    source=f"{self.source} (subset)")

    # -- export -------------------------------------------------------------------------
    def to_jsonl(self, path: str | Path) -> None:
        """Write the canonical JSONL (UTF-8, one record a line)."""
        with writing(path), open(path, "w", encoding="utf-8", newline="\n") as fh:
            for rec in self.records():
                out = {k: v for k, v in rec.items() if v not in (None, [])}
                out.setdefault("relevant", {})
                fh.write(json.dumps(out, ensure_ascii=False) + "\n")

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
        with writing(path):
            Path(path).write_text("\n".join(rows) + ("\n" if rows else ""), encoding="utf-8")
        if topics_path is not None:
            with writing(topics_path), open(topics_path, "w", encoding="utf-8") as fh:
                for qid, text in self.queries[["query_id", "query"]].itertuples(index=False):
                    fh.write(f"{qid}\t{' '.join(text.split())}\n")


# ---------------------------------------------------------------------------------------
# the content hash and the records, from the two frames
# ---------------------------------------------------------------------------------------
def _arrow_text(col: pd.Series) -> pa.ChunkedArray:
    """A column of strings (missing values null) as Arrow large_string, without copying Arrow-backed text."""
    arr = pa.array(col.to_numpy(), from_pandas=True) if isinstance(col.dtype, np.dtype) else pa.array(col.array)
    arr = arr if isinstance(arr, pa.ChunkedArray) else pa.chunked_array([arr])
    return pa.chunked_array([], _TEXT) if not len(arr) else pc.cast(arr, _TEXT) if arr.type != _TEXT else arr


def _positions(values: pd.Series, value_set: pd.Series) -> np.ndarray:
    """Position (int32) of each of ``values`` in ``value_set`` (distinct strings), -1 where absent."""
    if not len(values):
        return np.zeros(0, np.int32)
    found = pc.index_in(_arrow_text(values), value_set=_arrow_text(value_set).combine_chunks())
    return found.fill_null(-1).to_numpy().astype(np.int32, copy=False)


def _take(arr: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """``arr.take(rows)``, chunk by chunk: Arrow's own take on a chunked array first joins every chunk into one."""
    rows = np.asarray(rows, dtype=np.int64)
    if arr.num_chunks <= 1:
        return (arr.chunk(0) if arr.num_chunks else pa.array([], arr.type)).take(pa.array(rows))
    starts = np.cumsum([0] + [len(c) for c in arr.chunks])
    which = np.searchsorted(starts, rows, side="right") - 1
    by = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[by], np.arange(arr.num_chunks + 1))
    parts = [arr.chunk(k).take(pa.array(rows[by[lo:hi]] - starts[k]))
             for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)) if hi > lo]
    merged = pa.concat_arrays(parts) if parts else pa.array([], arr.type)
    inverse = np.empty_like(by)
    inverse[by] = np.arange(len(by))
    return merged.take(pa.array(inverse))


def _escape_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """Which strings of ``arr`` (large_string) hold a character JSON escapes (``"``, ``\\``, a control
    character); None when none does (the usual case, found by one pass over the bytes)."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    masks: list[np.ndarray | None] = []
    for ch in chunks:
        offsets = _text_offsets(ch) if len(ch) else np.zeros(1)
        lo, hi = int(offsets[0]), int(offsets[-1])
        data = bytes(memoryview(ch.buffers()[2])[lo:hi]) if hi > lo else b""
        if not data.translate(None, _JSON_PLAIN):
            masks.append(None)
            continue
        mask = np.zeros(len(ch), bool)
        mask[np.searchsorted(offsets, np.flatnonzero(_JSON_ESCAPED[np.frombuffer(data, np.uint8)]) + lo,
                             side="right") - 1] = True
        masks.append(mask)
    if all(m is None for m in masks):
        return None
    return np.concatenate([np.zeros(len(ch), bool) if m is None else m for ch, m in zip(chunks, masks, strict=True)])


def _json_strings(arr: pa.Array, escape: np.ndarray | None | bool = True) -> pa.Array:
    """Each string as JSON text (``json.dumps(s, ensure_ascii=False)``); nulls stay null. ``escape``: which
    strings need escapes (from :func:`_escape_mask`; True: find out here)."""
    quote = pa.scalar('"', _TEXT)
    return pc.binary_join_element_wise(quote, _json_inner(arr, escape), quote, pa.scalar("", _TEXT))


def _json_inner(arr: pa.Array, escape: np.ndarray | None | bool = True) -> pa.Array:
    """:func:`_json_strings` without the quotes around each: ``arr`` itself when no string needs an escape."""
    needs = _escape_mask(arr) if escape is True else escape
    if needs is None or needs is False or not needs.any():
        return arr
    escaped = [json.encoder.encode_basestring(s)[1:-1] for s in arr.filter(pa.array(needs)).to_pylist()]
    return pc.replace_with_mask(arr, pa.array(needs), pa.array(escaped, arr.type))


def _tag_column(col: pd.Series) -> pa.ChunkedArray:
    """The tags column as an Arrow list of large_string (a list per query; an object column of lists too)."""
    arr = pa.array(col.to_numpy(dtype=object), pa.list_(_TEXT)) if isinstance(col.dtype, np.dtype) \
        else pa.array(col.array)
    arr = arr if isinstance(arr, pa.ChunkedArray) else pa.chunked_array([arr])
    return arr if arr.type == pa.list_(_TEXT) else arr.cast(pa.list_(_TEXT))


def _tags_json(tags: pa.Array) -> pa.Array:
    """Per query, the JSON text of its sorted tags (``json.dumps(sorted(tags))``, compact)."""
    tags = tags.fill_null(pa.scalar([], tags.type)) if tags.null_count else tags
    offsets = np.asarray(tags.offsets, dtype=np.int64)
    offsets -= offsets[0]
    values = tags.flatten()
    if not len(values):
        return pa.repeat(pa.scalar("[]", _TEXT), len(tags))
    if np.diff(offsets).max() > 1:   # within each list, in code point order (UTF-8 byte order)
        parent = np.repeat(np.arange(len(tags)), np.diff(offsets))
        values = values.take(pc.sort_indices(pa.table({"p": parent, "v": values}),
                                             sort_keys=[("p", "ascending"), ("v", "ascending")]))
    joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets), _json_inner(values)),
                            pa.scalar('","', _TEXT))   # '"a","b"' without its outer quotes
    listed = pc.binary_join_element_wise(pa.scalar('["', _TEXT), joined, pa.scalar('"]', _TEXT), pa.scalar("", _TEXT))
    empty = pa.array(np.diff(offsets) == 0)
    return pc.if_else(empty, pa.scalar("[]", _TEXT), listed) if pc.any(empty).as_py() else listed


class _Rows:
    """Slices of a column in hash order: ``order`` (None: the rows are in order already)."""

    def __init__(self, order: np.ndarray | None):
        self.order = order

    def pick(self, arr: pa.ChunkedArray, start: int, stop: int) -> pa.Array:
        if self.order is None:
            return arr.slice(start, stop - start).combine_chunks()
        return _take(arr, self.order[start:stop])

    def mask(self, mask: np.ndarray | None, start: int, stop: int) -> np.ndarray | None:
        if mask is None:
            return None
        return mask[start:stop] if self.order is None else mask[self.order[start:stop]]


def _hash_order(qid: pa.ChunkedArray) -> np.ndarray | None:
    """The queries' order by id (UTF-8 byte order = code point order, as Python sorts); None when in order."""
    if len(qid) < 2 or pc.all(pc.less_equal(qid.slice(0, len(qid) - 1), qid.slice(1))).as_py():
        return None
    return pc.sort_indices(qid).to_numpy().astype(np.int64)


def _label_rows(pos: np.ndarray, n: int) -> Callable[[np.ndarray | slice], tuple[np.ndarray, np.ndarray]]:
    """``queries -> (their label rows, query by query; offsets of each query's labels in them)``, from each
    label's query position ``pos`` (-1: a label of no query, left out)."""
    counts = np.bincount(pos[pos >= 0], minlength=n)
    if len(pos) and not (pos[1:] >= pos[:-1]).all() or (len(pos) and pos[0] < 0):   # labels not grouped by query
        grouped = np.argsort(np.where(pos >= 0, pos, n), kind="stable")
    else:                                                  # as loaded: each query's labels together, in order
        grouped = None
    first = np.concatenate([[0], np.cumsum(counts)])[:-1]   # where each query's labels start in ``grouped`` order

    def rows(at: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        lens = counts[at]
        offsets = np.concatenate([[0], np.cumsum(lens)])
        picked = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lens) + np.repeat(first[at], lens)
        return (picked if grouped is None else grouped[picked]), offsets
    return rows


def _labels_json(chunk: pa.Array, grade: pa.Array, escape: np.ndarray | None, offsets: np.ndarray) -> pa.Array:
    """Per query (``offsets`` into the labels, grouped by query): its ``["chunk",grade]`` pairs sorted by chunk
    id and joined by commas (``escape``: which chunk ids need JSON escapes)."""
    group = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    by = pc.sort_indices(pa.table({"r": group, "c": chunk}), sort_keys=[("r", "ascending"), ("c", "ascending")])
    pairs = pc.binary_join_element_wise(
        pa.scalar('["', _TEXT), _json_inner(chunk.take(by), None if escape is None else escape[by.to_numpy()]),
        pa.scalar('",', _TEXT), _grade_text(grade.take(by)), pa.scalar("]", _TEXT), pa.scalar("", _TEXT))
    return pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pairs), pa.scalar(",", _TEXT))


_GRADE_TEXTS = pa.array([str(g) for g in GRADES], _TEXT)


def _grade_text(grade: pa.Array) -> pa.Array:
    """Integer grades as their decimal text."""
    if len(grade) and pc.min(grade).as_py() >= 0 and pc.max(grade).as_py() < len(GRADES):
        return _GRADE_TEXTS.take(grade)   # the usual 0-3: a lookup, no formatting
    return pc.cast(grade, _TEXT)


def _content_hash(queries: pd.DataFrame, qrels: pd.DataFrame, label_rows: np.ndarray,
                  slice_size: int = 16_384) -> str:
    """:attr:`TestSet.hash` of the two frames (see there for the canonical form; ``label_rows``: each label's
    query as a row of ``queries``, :attr:`TestSet.label_rows`), a slice of queries at a time, every step an
    Arrow or numpy operation over the slice."""
    qid = _arrow_text(queries["query_id"])
    n = len(qid)
    order = _hash_order(qid)
    labels_of = _label_rows(label_rows, n)
    chunk, grade = _arrow_text(qrels["chunk_id"]), pa.array(qrels["grade"].to_numpy().astype(np.int8))
    chunk_escape = _escape_mask(chunk)
    texts, types, tags = _arrow_text(queries["query"]), _arrow_text(queries["query_type"]), _tag_column(queries["tags"])
    escape = {"id": _escape_mask(qid), "text": _escape_mask(texts), "type": _escape_mask(types)}
    rows = _Rows(order)
    h = hashlib.sha256(b"[")
    for start in range(0, n, slice_size):
        stop = min(start + slice_size, n)
        at, offsets = labels_of(slice(start, stop) if order is None else order[start:stop])
        labels = _labels_json(_take(chunk, at), grade.take(pa.array(at)),
                              None if chunk_escape is None else chunk_escape[at], offsets)
        parts = [',["', _json_inner(rows.pick(qid, start, stop), rows.mask(escape["id"], start, stop)), '","',
                 _json_inner(rows.pick(texts, start, stop), rows.mask(escape["text"], start, stop)), '",[', labels,
                 "],", _json_strings(rows.pick(types, start, stop), rows.mask(escape["type"], start, stop))
                 .fill_null("null"), ",", _tags_json(rows.pick(tags, start, stop)), "]"]
        elements = pc.binary_join_element_wise(*[pa.scalar(p, _TEXT) if isinstance(p, str) else p for p in parts],
                                               pa.scalar("", _TEXT))
        data = _string_bytes(elements)
        h.update(data[1:] if start == 0 else data)   # no comma before the first element
    h.update(b"]")
    return "sha256:" + h.hexdigest()


def _text_offsets(arr: pa.Array) -> np.ndarray:
    """The offsets of a large_string array's values into its data buffer (``len(arr) + 1`` of them, int64): a view,
    not to be written to."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)


def _string_bytes(arr: pa.Array) -> memoryview:
    """The UTF-8 bytes of a large_string array's values, end to end."""
    offsets = _text_offsets(arr)
    data = arr.buffers()[2]
    return memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else memoryview(b"")


def _relevant_dicts(queries: pd.DataFrame, qrels: pd.DataFrame, pos: np.ndarray) -> list[dict[str, int]]:
    """Each query's labels as a fresh ``{chunk_id: grade}`` (file order), aligned with ``queries``; ``pos``: each
    label's query as a row of ``queries`` (:attr:`TestSet.label_rows`)."""
    out: list[dict[str, int]] = [{} for _ in range(len(queries))]
    by = np.argsort(pos, kind="stable")
    chunks = qrels["chunk_id"].to_numpy(dtype=object)[by].tolist()
    for p, c, g in zip(pos[by].tolist(), chunks, qrels["grade"].to_numpy()[by].tolist(), strict=True):
        if p >= 0:
            out[p][c] = g
    return out


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
        A file that cannot be read (a permission, bad bytes, a damaged Parquet file) is
        one too.
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
    texts: dict[str, tuple[int, str, str]] = {}
    for lineno, line in _lines(tp, problems):
        if not line.strip():
            continue
        parts = line.split("\t", 1)
        if len(parts) != 2:
            problems.append(Problem(str(tp), lineno, "query", "expected 'query_id<TAB>query text'"))
            continue
        qid = parts[0].strip()
        if qid in texts:
            first_line, _, first_raw = texts[qid]
            problems.append(Problem(str(tp), lineno, "query_id",
                                    _same_id("query ids", first_raw, parts[0], first_line, "line")))
            continue
        texts[qid] = (lineno, parts[1].strip(), parts[0])
    relevant: dict[str, dict[str, int]] = {qid: {} for qid in texts}
    for lineno, line in _lines(qp, problems):
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
        g = _grade(int(grade)) if _GRADE_TEXT.fullmatch(grade) else None
        if g is None:
            problems.append(Problem(str(qp), lineno, "relevant", f"grade must be an integer 0-3, got {_show(grade)}"))
            continue
        if cid in relevant[qid]:
            problems.append(Problem(str(qp), lineno, "relevant", f"chunk {cid!r} labelled twice for query {qid!r}"))
            continue
        relevant[qid][cid] = g
    if problems:
        raise TestSetError(qp, problems)
    builder = _Builder(str(tp), "line")
    for qid, (ln, text, _) in texts.items():
        builder.put(ln, {"query_id": qid, "query": text, "relevant": relevant[qid]})
    return builder.build()


def _same_id(what: str, first: str, later: str, first_at: int, where: str) -> str:
    """The message for an id met twice: the same spelling, or two that differ only by surrounding whitespace."""
    if first == later:
        return f"duplicate {what[:-1]} {later.strip()!r} (first on {where} {first_at})"
    return f"{what} {first!r} ({where} {first_at}) and {later!r} {_SAME_ONCE_STRIPPED}; keep one spelling"


def _raw_blocks(path: Path) -> Iterator[list[bytes]]:
    """The binary lines of a file (each ending at ``\\n``), about :data:`_BLOCK_BYTES` at a time."""
    with reading(path, TestSetError), open(path, "rb") as fh:
        while block := fh.readlines(_BLOCK_BYTES):
            yield block


class _Decoder:
    """Binary lines to (1-based line number, text), numbering lines and counting bytes across calls.

    Lines end at ``\\n``, ``\\r\\n`` or ``\\r`` (nothing else: a U+2028 inside a JSON string
    is text); a BOM opening the file is tolerated. A line that is not valid UTF-8 becomes a
    problem naming it and is skipped (``stop_at_bad``: ends the file, :attr:`stopped`).
    """

    def __init__(self, path: Path, problems: list[Problem]):
        self.path, self.problems = str(path), problems
        self.lineno = self.offset = 0   # lines and bytes read so far
        self.stopped = False

    def skip(self, block: list[bytes]) -> None:
        """Count ``block`` as read elsewhere (its lines hold no lone ``\\r``: one line per item)."""
        self.lineno += len(block)
        self.offset += sum(map(len, block))

    def lines(self, block: Iterable[bytes], *, keepends: bool = False,
              stop_at_bad: bool = False) -> Iterator[tuple[int, str]]:
        for raw in block:
            single = b"\r" not in raw or (raw.endswith(b"\r\n") and raw.count(b"\r") == 1)
            for piece in [raw] if single else _split_cr(raw):
                self.lineno += 1
                start = 3 if self.lineno == 1 and piece.startswith(_BOM) else 0
                try:
                    text = piece[start:].decode("utf-8")
                except UnicodeDecodeError as exc:
                    self.problems.append(Problem(self.path, self.lineno, None,
                                                 f"not valid UTF-8 (byte offset {self.offset + start + exc.start})"))
                    if stop_at_bad:
                        self.stopped = True
                        return
                    self.offset += len(piece)
                    continue
                self.offset += len(piece)
                yield self.lineno, (text if keepends else text.rstrip("\r\n"))


def _lines(path: Path, problems: list[Problem], *, keepends: bool = False,
           stop_at_bad: bool = False) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line) of a UTF-8 file, read as a stream (see :class:`_Decoder`)."""
    decoder = _Decoder(path, problems)
    for block in _raw_blocks(path):
        yield from decoder.lines(block, keepends=keepends, stop_at_bad=stop_at_bad)
        if decoder.stopped:
            return


def _split_cr(raw: bytes) -> list[bytes]:
    """A binary line cut after every ``\\r`` that no ``\\n`` follows (old Mac line ends)."""
    return [p for p in re.split(rb"(?<=\r)(?!\n)", raw) if p]


# -- JSON --------------------------------------------------------------------------------
class _Repeated(dict):
    """A JSON object whose text repeats a key; ``pairs`` keeps every (key, value) as written."""

    __slots__ = ("pairs",)
    pairs: list[tuple[Any, Any]]


def _object_pairs(pairs: list[tuple[Any, Any]]) -> dict:
    """``object_pairs_hook``: a dict, or a :class:`_Repeated` one when a key is repeated."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    rep = _Repeated(obj)
    rep.pairs = list(pairs)
    return rep


_DECODER = json.JSONDecoder(object_pairs_hook=_object_pairs)
_NOT_JSON = object()


def _parse_json(text: str, bad: _Bad, field: str | None, *, column: bool = True) -> Any:
    """The value of JSON ``text``, or :data:`_NOT_JSON` with the reason given to ``bad(field, message)``."""
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        bad(field, f"not valid JSON: {exc.msg}" + (f" (column {exc.colno})" if column else ""))
    except RecursionError:
        bad(field, "not valid JSON: nested too deeply")
    except ValueError as exc:  # an integer of more than 4300 digits
        bad(field, f"not valid JSON: {exc}")
    return _NOT_JSON


def _load_jsonl(path: Path) -> TestSet:
    """A block of lines at a time: parsed and checked at once (:func:`_jsonl_block`) when every record
    in it is plainly sound, else line by line, each problem named."""
    builder = _Builder(str(path), "line")
    decoder = _Decoder(path, builder.problems)
    for block in _raw_blocks(path):
        first = decoder.lineno
        bom = first == 0 and block[0].startswith(_BOM)   # tolerated before the first line
        if _jsonl_block(builder, [block[0][3:], *block[1:]] if bom else block, first):
            decoder.skip(block)
            continue
        for lineno, line in decoder.lines(block):
            if not line.strip():
                continue
            obj = _parse_json(line, builder.complaint(lineno), None)
            if obj is not _NOT_JSON:   # only a JSON escape (\\ud800) can put a surrogate in a decoded line
                builder.add(lineno, obj, check_text="\\u" in line)
    return builder.build()


def _jsonl_block(builder: _Builder, block: list[bytes], first: int) -> bool:
    """Parse (orjson) and check (:func:`_bulk_columns`) the lines after line ``first`` at once and give
    them to ``builder``; False, with nothing given, when any line needs the line-by-line reading: a lone
    ``\\r``, text that is not one JSON object, a key written twice, nesting Python's parser refuses."""
    import orjson

    data = b"".join(block)
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):   # a lone \r ends a line too: the numbering moves
        return False
    blank = list(map(bytes.isspace, block))
    at = np.flatnonzero(~np.array(blank, dtype=bool)) if any(blank) else None
    lines = block if at is None else [block[i] for i in at]
    if not lines:
        return True
    try:
        objs = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:   # the line-by-line reading names the problem
        return False
    cols = _bulk_columns(objs)
    if cols is None or _key_twice(data, sum(map(len, objs)) + len(cols["chunk_id"])):
        return False   # a record to check alone, or a key written twice (orjson keeps the last silently)
    if any(set(map(type, _field(objs, name))) & {list, dict} for name in set().union(*objs) - KNOWN_FIELDS):
        return False   # an ignored field holding a list: Python's parser may find it nested too deeply
    del objs   # freed before the collector resumes
    numbers = np.arange(first + 1, first + 1 + len(block), dtype=np.int64)
    builder.add_columns(numbers if at is None else numbers[at], cols)
    return True


def _key_twice(data: bytes, n_keys: int) -> bool:
    """Whether the JSON text ``data`` (valid JSON values, one a line), parsed into objects holding
    ``n_keys`` keys in all, writes a key twice: it then has more colons outside strings (one a key)."""
    colons = data.count(b":")
    if colons == n_keys:   # no colon in a string, and none more than the keys
        return False
    if b"\\" in data:
        data = _ESCAPE_PAIR.sub(b"", data)   # an escape pair never opens or closes a string
    b = np.frombuffer(data, np.uint8)
    quotes, at = np.flatnonzero(b == 34), np.flatnonzero(b == 58)
    return len(at) - int(np.count_nonzero(np.searchsorted(quotes, at) & 1)) != n_keys   # odd quotes: in a string


# -- CSV ---------------------------------------------------------------------------------
def _load_csv(path: Path) -> TestSet:
    builder = _Builder(str(path), "line")
    rows = _csv_rows(path, builder.problems)
    first = next(rows, None)
    if first is None or not first[1]:
        if not builder.problems:
            builder.problems.append(Problem(str(path), 1, None, "the file is empty (no header line)"))
        raise TestSetError(path, builder.problems)
    header = first[1]
    if builder.problems:   # the header line is not UTF-8
        raise TestSetError(path, builder.problems)
    missing = {"query_id", "query", "relevant"} - set(header)
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
        rel = _parse_relevant_text(obj.get("relevant", ""), builder.complaint(lineno))
        if rel is None:
            continue
        obj["relevant"] = rel
        if "tags" in obj:
            obj["tags"] = _parse_tags_text(obj["tags"])
        builder.put(lineno, obj, check_text=any("\\u" in v for v in row))
    return builder.build()


class _CsvLines:
    """The decoded lines of a CSV file for :mod:`csv` (line ends kept), remembering the current record's."""

    def __init__(self, path: Path, problems: list[Problem]):
        self._problems = problems
        self._it = _lines(path, problems, keepends=True, stop_at_bad=True)
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


def _parse_relevant_text(text: str, bad: _Bad) -> dict | None:
    """``{"a": 3}`` (JSON) or ``a:3;b:1``; None (with a problem recorded) when malformed."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        plain = _plain_labels(text)
        if plain is not None:
            return plain
        val = _parse_json(text, bad, "relevant", column=False)
        return None if val is _NOT_JSON else val
    pairs: list[tuple[str, Any]] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        cid, sep, grade = part.rpartition(":")
        if not sep:
            bad("relevant", f"expected 'chunk_id:grade', got {part!r}")
            return None
        g: Any = int(grade) if _GRADE_TEXT.fullmatch(grade.strip()) else grade.strip()
        pairs.append((cid.strip(), g))
    return _object_pairs(pairs)   # a chunk written twice is reported by the record's check


def _plain_labels(text: str) -> dict | None:
    """The JSON object ``text`` read by orjson when it plainly maps chunk ids to integers, each written once;
    None when Python's parser must read it (it names what is wrong, and reads what orjson reads otherwise:
    numbers past 64 bits, ``NaN``...). Without escapes, the text's colons are one per key written plus those
    inside the keys: one more means a key written twice (orjson keeps the last silently)."""
    import orjson

    if "\\" in text:
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict or set(map(type, obj.values())) - {int} \
            or text.count(":") != len(obj) + sum(map(str.count, obj, repeat(":"))):
        return None
    return obj


def _parse_tags_text(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    t = text.strip()
    if t.startswith("["):
        val = _parse_json(t, lambda *_: None, "tags")
        return t if val is _NOT_JSON else val  # validation reports it
    return [x.strip() for x in t.replace(",", ";").split(";") if x.strip()]


# -- Parquet -----------------------------------------------------------------------------
def _parquet_schema(path: Path) -> pa.Schema:
    with reading(path, TestSetError):
        return pq.read_schema(path)


def _parquet_columns(path: Path, columns: list[str]) -> Iterator[dict[str, list[Any]]]:
    """Yield the ``columns`` of a Parquet file as Python lists, a batch of rows at a time."""
    with reading(path, TestSetError), pq.ParquetFile(path) as pf:
        for batch in pf.iter_batches(batch_size=_BATCH, columns=columns):
            cols = {name: batch.column(name).to_pylist() for name in columns}
            yield cols


def _relevant_type_problem(t: pa.DataType) -> str | None:
    """Why a Parquet ``relevant`` column of Arrow type ``t`` cannot hold labels (None: it can)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    text = (pa.types.is_string(t) or pa.types.is_large_string(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t))
    if text or pa.types.is_null(t):
        return None
    if pa.types.is_map(t) and (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
        return None
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        twice = sorted({n for n in names if names.count(n) > 1})
        return f"has a struct type that names chunk(s) {twice} twice" if twice else None
    return (f"has Arrow type {t}; expected text (JSON or 'id:grade;id:grade'), a map from chunk id (string) "
            "to grade, or a struct with one integer field per chunk")


def _load_parquet(path: Path) -> TestSet:
    schema = _parquet_schema(path)
    names = list(schema.names)
    missing = {"query_id", "query", "relevant"} - set(names)
    if missing:
        raise TestSetError(path, [Problem(str(path), None, None, f"missing column(s) {sorted(missing)}")])
    twice = sorted({n for n in names if names.count(n) > 1 and n in KNOWN_FIELDS})
    why = _relevant_type_problem(schema.field("relevant").type) if not twice else None
    if twice or why:
        msg = f"column(s) {twice} appear twice" if twice else f"the column {why}"
        raise TestSetError(path, [Problem(str(path), None, "relevant" if why else None, msg)])
    unknown = sorted(set(names) - KNOWN_FIELDS)
    if unknown:
        log.debug("%s: ignoring unknown column(s) %s", path, unknown)
    columns = [n for n in names if n in KNOWN_FIELDS]
    builder = _Builder(str(path), "row")
    as_map = pa.types.is_map(schema.field("relevant").type) or pa.types.is_null(schema.field("relevant").type)
    row = 0
    for cols in _parquet_columns(path, columns):
        if as_map and _parquet_batch(builder, cols, row):
            row += len(cols["query_id"])
            continue
        for values in zip(*(cols[n] for n in columns), strict=True):
            row += 1
            obj = {k: v for k, v in zip(columns, values, strict=True) if not _missing(v) or k in _REQUIRED}
            texts = [obj[k] for k in ("relevant", "tags") if isinstance(obj.get(k), str)]
            if _parquet_record(obj, builder.complaint(row)):   # JSON text may spell a surrogate (\\ud800)
                builder.put(row, obj, check_text=any("\\u" in t for t in texts))
    return builder.build()


def _parquet_batch(builder: _Builder, cols: dict[str, list[Any]], first: int) -> bool:
    """Check a batch of rows whose ``relevant`` is a map column at once (:func:`_bulk_fields`) and give them
    to ``builder``; False, with nothing given, when a row needs its own look (a chunk twice in its map...)."""
    n = len(cols["query_id"])
    pairs = [p if p is not None else [] for p in cols["relevant"]]   # a null map: no label
    rel = list(map(dict, pairs))
    if list(map(len, rel)) != list(map(len, pairs)):   # a chunk twice: the row-by-row check names it
        return False
    fields = _bulk_fields(_column_field({**cols, "relevant": rel}, n), n)
    del rel, pairs   # freed before the collector resumes
    if fields is None:
        return False
    builder.add_columns(np.arange(first + 1, first + 1 + n, dtype=np.int64), fields)
    return True


def _column_field(cols: dict[str, list[Any]], n: int) -> Callable[[str], list[Any]]:
    """``name -> its column`` (``n`` Nones for a column the file does not have)."""
    absent = [None] * n
    return lambda name: cols.get(name, absent)


def _parquet_record(obj: dict[str, Any], bad: _Bad) -> bool:
    """Turn a Parquet row's ``relevant`` (text, map or struct) and ``tags`` (text or list) into the JSONL
    schema, in place; False when ``relevant`` is malformed text (the problem recorded)."""
    rel = obj.get("relevant")
    if isinstance(rel, str):
        rel = _parse_relevant_text(rel, bad)
        if rel is None:
            return False
    elif isinstance(rel, list):   # a map column arrives as [(key, value), ...]
        rel = _object_pairs(rel)
    elif isinstance(rel, dict):   # a struct column: absent chunks are null
        rel = {k: v for k, v in rel.items() if not _missing(v)}
    obj["relevant"] = {} if rel is None else rel
    if isinstance(obj.get("tags"), str):
        obj["tags"] = _parse_tags_text(obj["tags"])
    return True


def _missing(v: Any) -> bool:
    """None or a float NaN (how a table says "no value")."""
    return v is None or (isinstance(v, float) and math.isnan(v))


# -- the WeKnora dataset folder ----------------------------------------------------------
def _id_text(v: Any) -> str | None:
    return None if _missing(v) else str(v)


def _weknora_table(path: Path, cols: list[str], required: bool, problems: list[Problem]) -> bool:
    """Whether ``path`` exists with ``cols`` (its problems recorded)."""
    if not path.exists():
        if required:
            problems.append(Problem(str(path), None, None, "required file is missing"))
        return False
    schema = _parquet_schema(path)
    missing = [c for c in cols if c not in schema.names]
    if missing:
        problems.append(Problem(str(path), None, None, f"missing column(s) {missing}; expected {cols}"))
        return False
    return True


def _weknora_rows(path: Path, cols: list[str]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    row = 0
    for batch in _parquet_columns(path, cols):
        for values in zip(*(batch[c] for c in cols), strict=True):
            row += 1
            yield row, values


def _load_weknora_folder(folder: Path) -> TestSet:
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
            problems.append(Problem(qpath, i, "id", _same_id("query ids", first[key][1], raw, first[key][0], "row"),
                                    "row"))
            continue
        first[key] = (i, raw)
        rec: dict[str, Any] = {"query_id": raw, "query": "" if _missing(text) else text, "relevant": {}}
        records[key] = rec
        order.append((i, rec))
    _weknora_qrels(paths["qrels"], records, problems)
    if has_a and has_qa:
        _weknora_answers(paths["answers"], paths["qas"], records, problems)
    builder = _Builder(qpath, "row", problems)
    for i, rec in order:
        builder.put(i, rec, check_text=False)   # text from Arrow is valid UTF-8
    return builder.build()


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
        g = _grade(score)
        if g is None:
            problems.append(Problem(rpath, i, "score", f"must be an integer 0-3, got {_show(score)}", "row"))
            continue
        pair = (key, raw.strip())
        if pair in first:
            row, spelled = first[pair]
            msg = (f"passage {raw!r} labelled twice for query {key!r} (first at row {row})" if spelled == raw
                   else f"passage ids {spelled!r} (row {row}) and {raw!r} {_SAME_ONCE_STRIPPED} (query {key!r})")
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
        elif not _missing(texts[a]):
            prev = records[q].get("answer")
            records[q]["answer"] = texts[a] if not prev else f"{prev}\n{texts[a]}"


# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------
def _show(v: Any) -> str:
    """``repr(v)`` for a problem message: at most 80 characters; an integer too long to print says so."""
    try:
        text = repr(v)
    except ValueError:   # an integer of more digits than Python prints (sys.get_int_max_str_digits)
        return "an integer too long to print"
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(v: Any) -> str:
    return "dict" if isinstance(v, _Repeated) else type(v).__name__


def _bad_text(s: str) -> bool:
    """True when ``s`` holds an unpaired surrogate (JSON's ``\\ud800``): it is not text and has no UTF-8 form."""
    return not s.isascii() and _SURROGATE.search(s) is not None


def _surrogate_message(s: str) -> str:
    ch = _SURROGATE.search(s).group()  # type: ignore[union-attr]
    return f"contains an unpaired surrogate {ch!r} (not valid Unicode text)"


def _check_repeats(obj: _Repeated, bad: _Bad) -> None:
    """A problem for each key a JSON record writes twice (the last value would silently win)."""
    seen: dict[Any, Any] = {}
    for key, value in obj.pairs:
        if key in seen:
            bad(str(key), f"appears twice in the record (values {_show(seen[key])} and {_show(value)}); "
                          "a JSON object's keys must be unique")
        else:
            seen[key] = value


def _check_id(value: Any, field: str, bad: _Bad, check_text: bool) -> tuple[str, str] | None:
    """(stripped id, id as written) of a query id (a string or an integer), or None (problem recorded)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        bad(field, "missing" if value is None else f"must be a string, got {_type_name(value)}")
        return None
    if isinstance(value, int):
        try:
            value = str(value)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            bad(field, "must be a string, got an integer too long to be an id")
            return None
    key = value.strip()
    if not key:
        bad(field, "must not be empty")
        return None
    if check_text and _bad_text(key):
        bad(field, _surrogate_message(key))
        return None
    return key, value


_INT, _STR = {int}, {str}


def _check_relevant(rel: Any, bad: _Bad, check_text: bool) -> tuple[list[str], list[int]] | None:
    """(chunk ids, grades) of a ``relevant`` mapping, or None (problems recorded)."""
    if type(rel) is dict:   # the common case, checked in bulk: str ids already stripped, int grades 0-3
        if not rel:
            return [], []
        cids, grades = list(rel), list(rel.values())
        if (set(map(type, grades)) == _INT and min(grades) >= 0 and max(grades) <= 3 and set(map(type, cids)) == _STR
                and "" not in cids and cids == [c.strip() for c in cids]
                and not (check_text and any(map(_bad_text, cids)))):
            return cids, grades
    if not isinstance(rel, dict):
        bad("relevant", "missing (use {} for a query with no relevant chunk)" if rel is None
            else f"must be an object mapping chunk id to grade, got {_type_name(rel)}")
        return None
    return _check_labels(rel.pairs if isinstance(rel, _Repeated) else rel.items(), bad)


def _check_labels(items: Iterable[tuple[Any, Any]], bad: _Bad) -> tuple[list[str], list[int]] | None:
    """:func:`_check_relevant` one label at a time, naming each problem (a chunk twice, a bad grade...)."""
    ok = True
    cids: list[str] = []
    grades: list[int] = []
    first: dict[str, tuple[str, int]] = {}
    for cid, grade in items:
        if not isinstance(cid, str) or not cid.strip():
            bad("relevant", f"chunk id must be a non-empty string, got {_show(cid)}")
            ok = False
            continue
        key = cid.strip()
        g = _grade(grade)
        if g is None:
            bad("relevant", f"grade of chunk {cid!r} must be an integer 0-3, got {_show(grade)}")
            ok = False
            continue
        if _bad_text(key):
            bad("relevant", f"chunk id {key!r} {_surrogate_message(key)}")
            ok = False
            continue
        if key in first:
            spelled, g0 = first[key]
            bad("relevant", f"chunk {cid!r} is labelled twice (grades {g0} and {g}); give each chunk one grade"
                if spelled == cid else
                f"chunk ids {spelled!r} and {cid!r} {_SAME_ONCE_STRIPPED} (grades {g0} and {g}); keep one spelling")
            ok = False
            continue
        first[key] = (cid, g)
        cids.append(key)
        grades.append(g)
    return (cids, grades) if ok else None


def _check_text(obj: dict, name: str, bad: _Bad, check_text: bool, required: bool) -> tuple[bool, str | None]:
    """(sound, stripped value) of an optional (or ``required``) non-empty text field."""
    v = obj.get(name)
    if v is None:
        if required:
            bad(name, "missing")
        return not required, None
    if not isinstance(v, str):
        bad(name, f"must be a string, got {_type_name(v)}" if required
            else f"must be a non-empty string, got {_show(v)}")
        return False, None
    t = v.strip()
    if not t:
        bad(name, "must not be empty" if required else f"must be a non-empty string, got {_show(v)}")
        return False, None
    if check_text and _bad_text(t):
        bad(name, _surrogate_message(t))
        return False, None
    return True, t


def _check_record(obj: Any, bad: _Bad, check_text: bool = True) -> tuple | None:
    """Check one raw record: ``(query_id, id as written, query, chunk ids, grades, query_type, tags, answer)``,
    or None (problems given to ``bad(field, message)``). ``check_text=False``: the strings cannot hold an
    unpaired surrogate (they were decoded from UTF-8 or come from Arrow)."""
    if not isinstance(obj, dict):
        bad(None, f"expected a JSON object, got {type(obj).__name__}")
        return None
    ok = not isinstance(obj, _Repeated)
    if not ok:
        _check_repeats(obj, bad)  # type: ignore[arg-type]
    qid = _check_id(obj.get("query_id"), "query_id", bad, check_text)
    ok_text, text = _check_text(obj, "query", bad, check_text, True)
    labels = _check_relevant(obj.get("relevant"), bad, check_text)
    ok_type, qtype = _check_text(obj, "query_type", bad, check_text, False)
    tags = obj.get("tags")
    if tags is None:
        tags = []
    elif not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags) or (
            check_text and any(map(_bad_text, tags))):
        bad("tags", f"must be a list of non-empty strings, got {_show(tags)}")
        ok = False
    answer = obj.get("answer")
    if answer is not None and (not isinstance(answer, str) or (check_text and _bad_text(answer))):
        bad("answer", f"must be a string, got {_type_name(answer)}" if not isinstance(answer, str)
            else _surrogate_message(answer))
        ok = False
    weight = _weight(obj.get("weight"))
    if weight is False:
        bad("weight", f"must be an integer >= 1 (how often the query was asked), got {_show(obj.get('weight'))}")
        ok = False
    if not (ok and ok_text and ok_type) or qid is None or labels is None:
        return None
    tags = [t.strip() for t in tags] if tags else tags
    return qid[0], qid[1], text, labels[0], labels[1], qtype, tags, answer, weight


def _weight(value: Any) -> int | None | bool:
    """A traffic weight: None when absent, an integer >= 1 (integral floats accepted), False when bad."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and value < 2**63:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        return False
    return value


def _grade(value: Any) -> int | None:
    """An integer grade 0-3 (integral floats accepted, bools and strings not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value in GRADES:
        return value
    return None


# -- many records at once ---------------------------------------------------------------
def _field(objs: list[dict], name: str, present: set[str] | None = None) -> list[Any]:
    """``obj.get(name)`` of each record; ``present``: every key any record holds (a field none holds is all
    None at once, and one every record holds is read without a default)."""
    if present is not None and name not in present:
        return [None] * len(objs)
    try:
        return list(map(itemgetter(name), objs))
    except KeyError:   # a record without it
        return list(map(dict.get, objs, repeat(name)))


def _bulk_text(values: list[Any], *, optional: bool) -> list[Any] | None:
    """The stripped values of a text field when each is a non-empty string (or None, when ``optional``),
    else None."""
    types = set(map(type, values))
    out: list[Any]
    if types == {str}:
        out = list(map(str.strip, values))
    elif optional and types == {_NONE}:
        return values
    elif optional and types == {str, _NONE}:
        out = [v if v is None else v.strip() for v in values]
    else:
        return None
    return None if "" in out else out


def _bulk_ids(values: list[Any]) -> tuple[list[str], list[str]] | None:
    """(stripped ids, ids as written) of the query ids when each is a string or an integer that strips to
    something, else None."""
    types = set(map(type, values))
    if types == {str}:
        spelled = values
    elif types <= {str, int}:
        spelled = [v if type(v) is str else str(v) for v in values]   # ValueError: too many digits
    else:
        return None
    key = list(map(str.strip, spelled))
    return None if "" in key else (key, spelled)


def _bulk_labels(rel: list[Any]) -> tuple[np.ndarray, pa.Array, np.ndarray] | None:
    """(labels per record, chunk ids as Arrow text, grades) when each ``relevant`` is a plain dict of stripped,
    non-empty string ids to integer grades 0-3, else None. A chunk id with a lone surrogate raises
    UnicodeEncodeError."""
    if set(map(type, rel)) != {dict}:
        return None
    n_lab = np.array(list(map(len, rel)), np.int64)
    cids = list(chain.from_iterable(rel))
    grades = list(chain.from_iterable(map(dict.values, rel)))
    if set(map(type, cids)) - {str} or set(map(type, grades)) - {int}:
        return None
    ids = pa.array(cids, _TEXT)
    if _blank_or_padded(ids, cids):
        return None
    g = np.fromiter(grades, np.int64, len(grades))   # OverflowError: an integer past int64
    return (n_lab, ids, g.astype(np.int8)) if not len(g) or (g.min() >= 0 and g.max() <= 3) else None


#: the first and the last byte of a string that ends in whitespace as Python strips it: an ASCII space or control
#: character, or the lead or last byte of a character written in more than one byte (U+0085, U+00A0, U+2000...)
_MAY_PAD = np.zeros(256, bool)
_MAY_PAD[[*range(0x21), 0x7F, *range(0x80, 0x100)]] = True


def _blank_or_padded(ids: pa.Array, values: list[str]) -> bool:
    """Whether any of ``values`` (``ids``: the same, as Arrow text) is empty or not stripped (``str.strip``
    would change it). Only the strings whose first or last byte may belong to whitespace are stripped in
    Python; the bytes of the others are looked at once."""
    if not len(ids):
        return False
    offsets = _text_offsets(ids)
    if (offsets[1:] == offsets[:-1]).any():
        return True
    data = np.frombuffer(ids.buffers()[2], np.uint8)
    maybe = np.flatnonzero(_MAY_PAD[data[offsets[:-1]]] | _MAY_PAD[data[offsets[1:] - 1]])
    return any(values[i].strip() != values[i] for i in maybe.tolist())


def _bulk_tags(tags: list[Any]) -> pa.Array | None:
    """The tags column (stripped lists; none given: an empty list) when each record's ``tags`` is missing or
    a list of strings that strip to something, else None."""
    types = set(map(type, tags))
    if types == {_NONE}:
        return pa.ListArray.from_arrays(pa.array(np.zeros(len(tags) + 1, np.int32)), pa.array([], _TEXT))
    if not types <= {list, _NONE}:
        return None
    lists = tags if _NONE not in types else [t or [] for t in tags]
    flat = list(chain.from_iterable(lists))
    if flat and set(map(type, flat)) != {str}:
        return None
    flat = list(map(str.strip, flat))
    if "" in flat:
        return None
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, lists), np.int64, len(lists)), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, _TEXT))


def _bulk_columns(objs: list[Any]) -> dict[str, Any] | None:
    """The builder's columns (Arrow arrays) of many records checked at once, when every record is plainly
    sound: exactly what :func:`_check_record` keeps of each, with no problem to report. None when any
    record needs its own look (a problem to name, an unusual type, an unpaired surrogate...):
    nothing here reports a problem, so this path only ever accepts what the record-by-record one accepts."""
    if not objs or set(map(type, objs)) != {dict}:   # a _Repeated (a key written twice), or not an object
        return None
    present: set[str] = set().union(*objs)
    if not KNOWN_FIELDS.issuperset(present) and log.isEnabledFor(logging.DEBUG):
        return None   # each record logs the fields it ignores
    return _bulk_fields(lambda name: _field(objs, name, present), len(objs))


def _bulk_fields(field: Callable[[str], list[Any]], n: int) -> dict[str, Any] | None:
    """:func:`_bulk_columns` of ``n`` records given field by field: ``field(name)`` is each record's value
    (None where it has none)."""
    try:
        ids, text = _bulk_ids(field("query_id")), _bulk_text(field("query"), optional=False)
        labels = _bulk_labels(field("relevant"))
        qtype = _bulk_text(field("query_type"), optional=True)
        answer, weight = field("answer"), field("weight")
        if ids is None or text is None or labels is None or qtype is None or not set(map(type, answer)) <= {
                str, _NONE} or not set(map(type, weight)) <= {int, _NONE}:
            return None
        tags = _bulk_tags(field("tags"))
        if tags is None:
            return None
        # text becomes UTF-8 here: an unpaired surrogate raises (UnicodeEncodeError), as a weight past int64
        weights = pa.array(weight, pa.int64())
        cols = {"query_id": pa.array(ids[0], _TEXT), "query": pa.array(text, _TEXT),
                "query_type": pa.array(qtype, _TEXT), "answer": pa.array(answer, _TEXT), "weight": weights,
                "tags": tags, "chunk_id": labels[1]}
    except (UnicodeEncodeError, ValueError, OverflowError, pa.ArrowException):
        return None
    if weights.null_count < len(weights) and pc.min(weights).as_py() < 1:
        return None
    n_lab, _, grade = labels
    label_q = np.repeat(np.arange(n, dtype=np.int64), n_lab)
    cols.update(n_labelled=n_lab, grade=grade, label_query=cols["query_id"].take(pa.array(label_q)),
                n_relevant=np.bincount(label_q, weights=grade > 0, minlength=n).astype(np.int64),
                spelled={i: w for i, (k, w) in enumerate(zip(*ids, strict=True)) if k != w}
                if ids[0] != ids[1] else {})
    return cols


# ---------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------
class _Builder:
    """Validated records gathered as columns: Python lists for one batch, then Arrow arrays.

    Every record is checked as it arrives; query ids met twice (or equal once stripped)
    are found over the whole column at :meth:`build`, which raises :class:`TestSetError`
    with every problem, or returns the test set.
    """

    #: column -> Arrow type (the query columns, then the label columns)
    _TYPES = {"line": pa.int64(), "query_id": _TEXT, "query": _TEXT, "query_type": _TEXT, "answer": _TEXT,
              "weight": pa.int64(), "tags": pa.list_(_TEXT), "n_labelled": pa.int64(), "n_relevant": pa.int64(),
              "label_query": _TEXT, "chunk_id": _TEXT, "grade": pa.int8()}

    def __init__(self, path: str, where: str, problems: list[Problem] | None = None):
        self.path, self.where = path, where
        self.problems: list[Problem] = problems if problems is not None else []
        self._rows: list[tuple] = []          # this batch's checked records
        self._arrays: dict[str, list[pa.Array]] = {c: [] for c in self._TYPES}
        self._spelled: dict[int, str] = {}   # record index -> query id as written, where stripping changed it
        self.n = 0      # records kept
        self.seen = 0   # records checked
        self._queue: list[tuple[int, Any, bool]] = []   # records put, not yet checked

    def complaint(self, line: int) -> _Bad:
        """A ``bad(field, message)`` that records a problem at ``line``."""
        def bad(field: str | None, message: str) -> None:
            self.problems.append(Problem(self.path, line, field, message, self.where))
        return bad

    def put(self, line: int, obj: Any, *, check_text: bool = True) -> None:
        """:meth:`add` a record, later: records put are checked :data:`_BATCH` at a time (:meth:`add_batch`)."""
        self._queue.append((line, obj, check_text))
        if len(self._queue) >= _BATCH:
            self._drain()

    def _drain(self) -> None:
        if self._queue:
            lines, objs, check_text = zip(*self._queue, strict=True)
            self._queue = []
            self.add_batch(lines, list(objs), check_text)

    def add_batch(self, lines: Iterable[int], objs: list[Any], check_text: Iterable[bool] | None = None) -> None:
        """Check many records and keep the sound ones: at once when every one is plainly
        sound (:func:`_bulk_columns`), else one at a time (:meth:`add`, with ``check_text``), each
        problem named."""
        lines = list(lines)
        cols = _bulk_columns(objs)
        if cols is not None:
            self.add_columns(np.asarray(lines, dtype=np.int64), cols)
            return
        for line, obj, text in zip(lines, objs, check_text or repeat(True), strict=False):
            self.add(line, obj, check_text=text)

    def add_columns(self, lines: np.ndarray, cols: dict[str, Any]) -> None:
        """Keep records already checked (the columns of :func:`_bulk_columns`), after those added before."""
        self._drain()
        self._flush()
        self.seen += len(lines)
        self._spelled.update({self.n + i: w for i, w in cols["spelled"].items()})
        for c, t in self._TYPES.items():
            self._arrays[c].append(pa.array(lines) if c == "line" else pa.array(cols[c], t))
        self.n += len(lines)

    def add(self, line: int, obj: Any, *, check_text: bool = True) -> None:
        """Check one record and, when it is sound, keep it (``check_text``: see :func:`_check_record`)."""
        self._drain()
        self.seen += 1
        rec = _check_record(obj, self.complaint(line), check_text)
        if rec is None:
            return
        if not KNOWN_FIELDS.issuperset(obj):
            log.debug("%s %s %d: ignoring unknown field(s) %s", self.path, self.where, line,
                      sorted(map(str, set(obj) - KNOWN_FIELDS)))
        if rec[1] != rec[0]:
            self._spelled[self.n] = rec[1]
        self._rows.append((line, *rec))
        self.n += 1
        if len(self._rows) >= _BATCH:
            self._flush()

    def _flush(self) -> None:
        """This batch's records, column by column, into Arrow arrays."""
        if not self._rows:
            return
        line, qid, _, text, cids, grades, qtype, tags, answer, weight = zip(*self._rows, strict=True)
        self._rows = []
        n_lab = np.fromiter(map(len, grades), np.int64, len(grades))
        grade = np.fromiter(chain.from_iterable(grades), np.int8, int(n_lab.sum()))
        label_q = np.repeat(np.arange(len(grades), dtype=np.int64), n_lab)   # each label's query in the batch
        columns = {"line": line, "query_id": qid, "query": text, "query_type": qtype, "answer": answer,
                   "weight": weight, "tags": tags,
                   "n_labelled": n_lab, "n_relevant": np.bincount(label_q, weights=grade > 0,
                                                                  minlength=len(grades)).astype(np.int64),
                   "chunk_id": list(chain.from_iterable(cids)), "grade": grade}
        for c, t in self._TYPES.items():
            if c != "label_query":
                self._arrays[c].append(pa.array(columns[c], t))
        self._arrays["label_query"].append(self._arrays["query_id"][-1].take(pa.array(label_q)))

    def _column(self, name: str) -> pa.ChunkedArray:
        return pa.chunked_array(self._arrays[name], self._TYPES[name])

    def _check_duplicates(self, qid: pa.ChunkedArray, lines: np.ndarray) -> None:
        """A problem for every query id met before (as written, or equal once surrounding whitespace is removed)."""
        distinct = pc.unique(qid)
        if len(distinct) == len(qid):
            return
        codes = pc.index_in(qid, value_set=distinct).to_numpy()
        _, first_of = np.unique(codes, return_index=True)
        first = first_of[codes]
        for i in np.flatnonzero(first != np.arange(len(codes))).tolist():
            f = int(first[i])
            a, b = self._spelled.get(f, qid[f].as_py()), self._spelled.get(i, qid[i].as_py())
            msg = (f"duplicate query id {b!r} (first at {self.where} {lines[f]})" if a == b else
                   f"query ids {a!r} ({self.where} {lines[f]}) and {b!r} {_SAME_ONCE_STRIPPED}; keep one spelling")
            self.problems.append(Problem(self.path, int(lines[i]), "query_id", msg, self.where))

    def build(self) -> TestSet:
        """The test set, or :class:`TestSetError` with every problem (ordered by file, then line)."""
        self._drain()
        self._flush()
        self._check_duplicates(self._column("query_id"), self._column("line").to_numpy())
        if not self.n and not self.problems:
            self.problems.append(Problem(self.path, None, None, "the test set holds no query"))
        if self.problems:
            files = {path: i for i, path in enumerate(dict.fromkeys(p.path for p in self.problems))}
            raise TestSetError(self.path, sorted(self.problems, key=lambda p: (files[p.path], p.line or 0)))
        n_rel = self._column("n_relevant").to_numpy()
        queries = pd.DataFrame({
            "query_id": _series(self._column("query_id")), "query": _series(self._column("query")),
            "query_type": _series(self._column("query_type")),
            "tags": pd.Series(pd.arrays.ArrowExtensionArray(self._column("tags"))),
            "answer": _series(self._column("answer")),
            "weight": self._column("weight").to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get),
            "n_labelled": self._column("n_labelled").to_numpy(),
            "n_relevant": n_rel, "valid": n_rel > 0,
        })
        qrels = pd.DataFrame({
            "query_id": _series(self._column("label_query")),
            "chunk_id": _series(self._column("chunk_id")),
            "grade": self._column("grade").to_numpy().astype(np.int8),
        })
        ts = TestSet(queries=queries, qrels=qrels, source=self.path)
        rows = np.repeat(np.arange(len(queries), dtype=np.int64), queries["n_labelled"].to_numpy())
        rows.setflags(write=False)
        ts.__dict__["label_rows"] = rows   # known here: each query's labels follow in query order (no lookup)
        n_invalid = int((~queries["valid"]).sum())
        if n_invalid:
            log.info("%s: %d of %d queries have no chunk of grade >= 1 and are invalid: %s",
                     self.path, n_invalid, len(ts), ", ".join(ts.invalid_ids[:20]))
        return ts


def _series(arr: pa.ChunkedArray) -> pd.Series:
    """A text column as pandas stores text by default (Arrow-backed ``str`` on pandas 3); one with
    no value at all as an object column of None, as pandas builds it from a list of None."""
    if not len(arr) or arr.null_count == len(arr):
        return pd.Series(np.full(len(arr), None, dtype=object), dtype=object)
    return arr.to_pandas()
