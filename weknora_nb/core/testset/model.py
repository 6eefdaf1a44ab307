"""The test set (:class:`TestSet`): its two frames, the views of them, its content hash, and its export.

A test set is held as two DataFrames only (Arrow-backed strings): ``queries``, one row per query, and
``qrels``, one row per label; :meth:`TestSet.records` rebuilds the plain dicts on demand. It is made by
the loaders of :mod:`weknora_nb.core.testset` (or :meth:`TestSet.from_records`), which validate every
record first.

The content hash (:attr:`TestSet.hash`) is the SHA-256 of a canonical JSON text of the test set; the text
is built by Arrow and numpy a slice of queries at a time (:func:`content_hash`), never as one Python
string.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from weknora_nb.core.arrowtext import TEXT, escape_mask, json_inner, json_strings, string_bytes
from weknora_nb.core.errors import UsageError, writing
from weknora_nb.core.pipeline import MIN_VALID_QUERIES
from weknora_nb.core.testset.builder import BATCH, Builder
from weknora_nb.core.testset.validate import GRADES


@dataclass(frozen=True, eq=False)
class TestSet:
    """A validated test set.

    Attributes
    ----------
    queries : DataFrame
        One row per query: ``query_id``, ``query``, ``query_type`` (or missing),
        ``tags`` (a list of str per query, held as an Arrow list column), ``answer`` (or
        missing), ``weight`` (nullable Int64: the traffic weight, or missing), ``source`` (where the query
        came from, or missing) and ``overlap`` (float, NaN when missing: a generated query's lexical
        overlap with its source chunk, docs/method.md section 17), ``n_labelled``
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
        builder = Builder(source, "record")
        it = iter(records)
        while batch := list(islice(it, BATCH)):
            builder.add_batch(range(builder.seen + 1, builder.seen + 1 + len(batch)), batch)
        return cls.from_builder(builder)

    @classmethod
    def from_builder(cls, builder: Builder) -> TestSet:
        """The test set of the records ``builder`` gathered (:meth:`Builder.frames
        <weknora_nb.core.testset.builder.Builder.frames>`: TestSetError with every problem)."""
        queries, qrels, label_rows = builder.frames()
        ts = cls(queries=queries, qrels=qrels, source=builder.path)
        ts.__dict__["label_rows"] = label_rows   # known here: each query's labels follow in query order (no lookup)
        return ts

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
        answers, traffic weights, sources and overlaps are not covered: editing one does not
        change what retrieval is scored against, so runs stay comparable.

        The digest is SHA-256 of the UTF-8 JSON text (``ensure_ascii=False``, separators
        ``,`` and ``:``) of the list, sorted by query id, of ``[query_id, query,
        sorted([chunk_id, grade] pairs), query_type or null, sorted(tags)]``; it is fed
        to the digest in slices, built with Arrow, never as one text.
        """
        return content_hash(self.queries, self.qrels, self.label_rows)

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
        q = q.assign(**{c: None for c in ("source", "overlap") if c not in q})   # frames given by hand may lack them
        cols = q[["query_id", "query", "query_type", "tags", "answer", "weight", "source", "overlap"]].itertuples(
            index=False, name=None)
        for (qid, text, qtype, tags, answer, weight, source, overlap), rel in zip(cols, relevant, strict=True):
            out.append({"query_id": qid, "query": text, "relevant": rel,
                        "query_type": qtype if isinstance(qtype, str) else None,
                        "tags": list(tags) if isinstance(tags, (list, tuple, np.ndarray)) else [],
                        "answer": answer if isinstance(answer, str) else None,
                        "weight": None if pd.isna(weight) else int(weight),
                        "source": source if isinstance(source, str) else None,
                        "overlap": None if overlap is None or pd.isna(overlap) else float(overlap)})
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


# -- the content hash and the records, from the two frames ---------------------------------
def _arrow_text(col: pd.Series) -> pa.ChunkedArray:
    """A column of strings (missing values null) as Arrow large_string, without copying Arrow-backed text."""
    arr = pa.array(col.to_numpy(), from_pandas=True) if isinstance(col.dtype, np.dtype) else pa.array(col.array)
    arr = arr if isinstance(arr, pa.ChunkedArray) else pa.chunked_array([arr])
    return pa.chunked_array([], TEXT) if not len(arr) else pc.cast(arr, TEXT) if arr.type != TEXT else arr


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


def _tag_column(col: pd.Series) -> pa.ChunkedArray:
    """The tags column as an Arrow list of large_string (a list per query; an object column of lists too)."""
    arr = pa.array(col.to_numpy(dtype=object), pa.list_(TEXT)) if isinstance(col.dtype, np.dtype) \
        else pa.array(col.array)
    arr = arr if isinstance(arr, pa.ChunkedArray) else pa.chunked_array([arr])
    return arr if arr.type == pa.list_(TEXT) else arr.cast(pa.list_(TEXT))


def _tags_json(tags: pa.Array) -> pa.Array:
    """Per query, the JSON text of its sorted tags (``json.dumps(sorted(tags))``, compact)."""
    tags = tags.fill_null(pa.scalar([], tags.type)) if tags.null_count else tags
    offsets = np.asarray(tags.offsets, dtype=np.int64)
    offsets -= offsets[0]
    values = tags.flatten()
    if not len(values):
        return pa.repeat(pa.scalar("[]", TEXT), len(tags))
    if np.diff(offsets).max() > 1:   # within each list, in code point order (UTF-8 byte order)
        parent = np.repeat(np.arange(len(tags)), np.diff(offsets))
        values = values.take(pc.sort_indices(pa.table({"p": parent, "v": values}),
                                             sort_keys=[("p", "ascending"), ("v", "ascending")]))
    joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets), json_inner(values)),
                            pa.scalar('","', TEXT))   # '"a","b"' without its outer quotes
    listed = pc.binary_join_element_wise(pa.scalar('["', TEXT), joined, pa.scalar('"]', TEXT), pa.scalar("", TEXT))
    empty = pa.array(np.diff(offsets) == 0)
    return pc.if_else(empty, pa.scalar("[]", TEXT), listed) if pc.any(empty).as_py() else listed


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
        pa.scalar('["', TEXT), json_inner(chunk.take(by), None if escape is None else escape[by.to_numpy()]),
        pa.scalar('",', TEXT), _grade_text(grade.take(by)), pa.scalar("]", TEXT), pa.scalar("", TEXT))
    return pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pairs), pa.scalar(",", TEXT))


_GRADE_TEXTS = pa.array([str(g) for g in GRADES], TEXT)


def _grade_text(grade: pa.Array) -> pa.Array:
    """Integer grades as their decimal text."""
    if len(grade) and pc.min(grade).as_py() >= 0 and pc.max(grade).as_py() < len(GRADES):
        return _GRADE_TEXTS.take(grade)   # the usual 0-3: a lookup, no formatting
    return pc.cast(grade, TEXT)


def content_hash(queries: pd.DataFrame, qrels: pd.DataFrame, label_rows: np.ndarray,
                 slice_size: int = 16_384) -> str:
    """:attr:`TestSet.hash` of the two frames (see there for the canonical form; ``label_rows``: each label's
    query as a row of ``queries``, :attr:`TestSet.label_rows`), a slice of queries at a time, every step an
    Arrow or numpy operation over the slice."""
    qid = _arrow_text(queries["query_id"])
    n = len(qid)
    order = _hash_order(qid)
    labels_of = _label_rows(label_rows, n)
    chunk, grade = _arrow_text(qrels["chunk_id"]), pa.array(qrels["grade"].to_numpy().astype(np.int8))
    chunk_escape = escape_mask(chunk)
    texts, types, tags = _arrow_text(queries["query"]), _arrow_text(queries["query_type"]), _tag_column(queries["tags"])
    escape = {"id": escape_mask(qid), "text": escape_mask(texts), "type": escape_mask(types)}
    rows = _Rows(order)
    h = hashlib.sha256(b"[")
    for start in range(0, n, slice_size):
        stop = min(start + slice_size, n)
        at, offsets = labels_of(slice(start, stop) if order is None else order[start:stop])
        labels = _labels_json(_take(chunk, at), grade.take(pa.array(at)),
                              None if chunk_escape is None else chunk_escape[at], offsets)
        parts = [',["', json_inner(rows.pick(qid, start, stop), rows.mask(escape["id"], start, stop)), '","',
                 json_inner(rows.pick(texts, start, stop), rows.mask(escape["text"], start, stop)), '",[', labels,
                 "],", json_strings(rows.pick(types, start, stop), rows.mask(escape["type"], start, stop))
                 .fill_null("null"), ",", _tags_json(rows.pick(tags, start, stop)), "]"]
        elements = pc.binary_join_element_wise(*[pa.scalar(p, TEXT) if isinstance(p, str) else p for p in parts],
                                               pa.scalar("", TEXT))
        data = string_bytes(elements)
        h.update(data[1:] if start == 0 else data)   # no comma before the first element
    h.update(b"]")
    return "sha256:" + h.hexdigest()


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
