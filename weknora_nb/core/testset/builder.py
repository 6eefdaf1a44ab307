"""Validated records gathered as columns (:class:`Builder`): what every loader fills, record by record or a
batch at a time, and what a :class:`~weknora_nb.core.testset.model.TestSet` is made of.

Records are checked as they arrive (:mod:`weknora_nb.core.testset.validate`), gathered as Python values a
batch (:data:`BATCH` records) at a time, then kept as Arrow arrays, so that a large file never exists as
one Python object per record. Query ids met twice (or equal once stripped) are found over the whole
column at the end (:meth:`Builder.frames`), which raises :class:`~weknora_nb.core.errors.TestSetError`
with every problem, or gives the two frames of the test set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from itertools import chain, repeat
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from weknora_nb.core.arrowtext import TEXT
from weknora_nb.core.errors import Problem, TestSetError
from weknora_nb.core.testset import validate
from weknora_nb.core.testset.parsing import Bad

log = logging.getLogger(__name__)

#: records gathered as Python values before they become Arrow arrays
BATCH = 16_384


class Builder:
    """Validated records gathered as columns: Python lists for one batch, then Arrow arrays.

    ``path``: the file named by every problem; ``where``: what a position in it is (``line``, ``row``,
    ``record``).
    """

    #: column -> Arrow type (the query columns, then the label columns)
    _TYPES = {"line": pa.int64(), "query_id": TEXT, "query": TEXT, "query_type": TEXT, "answer": TEXT,
              "weight": pa.int64(), "source": TEXT, "overlap": pa.float64(), "tags": pa.list_(TEXT),
              "n_labelled": pa.int64(), "n_relevant": pa.int64(),
              "label_query": TEXT, "chunk_id": TEXT, "grade": pa.int8()}

    def __init__(self, path: str, where: str, problems: list[Problem] | None = None):
        self.path, self.where = path, where
        self.problems: list[Problem] = problems if problems is not None else []
        self._rows: list[tuple] = []          # this batch's checked records
        self._arrays: dict[str, list[pa.Array]] = {c: [] for c in self._TYPES}
        self._spelled: dict[int, str] = {}   # record index -> query id as written, where stripping changed it
        self.n = 0      # records kept
        self.seen = 0   # records checked
        self._queue: list[tuple[int, Any, bool]] = []   # records put, not yet checked

    def complaint(self, line: int) -> Bad:
        """A ``bad(field, message)`` that records a problem at ``line``."""
        def bad(field: str | None, message: str) -> None:
            self.problems.append(Problem(self.path, line, field, message, self.where))
        return bad

    def put(self, line: int, obj: Any, *, check_text: bool = True) -> None:
        """:meth:`add` a record, later: records put are checked :data:`BATCH` at a time (:meth:`add_batch`)."""
        self._queue.append((line, obj, check_text))
        if len(self._queue) >= BATCH:
            self._drain()

    def _drain(self) -> None:
        if self._queue:
            lines, objs, check_text = zip(*self._queue, strict=True)
            self._queue = []
            self.add_batch(lines, list(objs), check_text)

    def add_batch(self, lines: Iterable[int], objs: list[Any], check_text: Iterable[bool] | None = None) -> None:
        """Check many records and keep the sound ones: at once when every one is plainly
        sound (:func:`~weknora_nb.core.testset.validate.bulk_columns`), else one at a time (:meth:`add`, with
        ``check_text``), each problem named."""
        lines = list(lines)
        cols = validate.bulk_columns(objs)
        if cols is not None:
            self.add_columns(np.asarray(lines, dtype=np.int64), cols)
            return
        for line, obj, text in zip(lines, objs, check_text or repeat(True), strict=False):
            self.add(line, obj, check_text=text)

    def add_columns(self, lines: np.ndarray, cols: dict[str, Any]) -> None:
        """Keep records already checked (the columns of :func:`~weknora_nb.core.testset.validate.bulk_columns`),
        after those added before."""
        self._drain()
        self._flush()
        self.seen += len(lines)
        self._spelled.update({self.n + i: w for i, w in cols["spelled"].items()})
        for c, t in self._TYPES.items():
            self._arrays[c].append(pa.array(lines) if c == "line" else pa.array(cols[c], t))
        self.n += len(lines)

    def add(self, line: int, obj: Any, *, check_text: bool = True) -> None:
        """Check one record and, when it is sound, keep it (``check_text``: see
        :func:`~weknora_nb.core.testset.validate.check_record`)."""
        self._drain()
        self.seen += 1
        rec = validate.check_record(obj, self.complaint(line), check_text)
        if rec is None:
            return
        validate.log_ignored_fields(obj, self.path, self.where, line)
        if rec[1] != rec[0]:
            self._spelled[self.n] = rec[1]
        self._rows.append((line, *rec))
        self.n += 1
        if len(self._rows) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        """This batch's records, column by column, into Arrow arrays."""
        if not self._rows:
            return
        line, qid, _, text, cids, grades, qtype, tags, answer, weight, source, overlap = zip(*self._rows, strict=True)
        self._rows = []
        n_lab = np.fromiter(map(len, grades), np.int64, len(grades))
        grade = np.fromiter(chain.from_iterable(grades), np.int8, int(n_lab.sum()))
        label_q = np.repeat(np.arange(len(grades), dtype=np.int64), n_lab)   # each label's query in the batch
        columns = {"line": line, "query_id": qid, "query": text, "query_type": qtype, "answer": answer,
                   "weight": weight, "source": source, "overlap": overlap, "tags": tags,
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
                   f"query ids {a!r} ({self.where} {lines[f]}) and {b!r} {validate.SAME_ONCE_STRIPPED}; "
                   "keep one spelling")
            self.problems.append(Problem(self.path, int(lines[i]), "query_id", msg, self.where))

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
        """The test set's ``queries`` and ``qrels`` frames and each label's query as a row of ``queries``
        (read-only: each query's labels follow in query order), or :class:`TestSetError` with every problem
        (ordered by file, then line)."""
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
            "source": _series(self._column("source")),
            "overlap": self._column("overlap").to_numpy(zero_copy_only=False).astype(float),
            "n_labelled": self._column("n_labelled").to_numpy(),
            "n_relevant": n_rel, "valid": n_rel > 0,
        })
        qrels = pd.DataFrame({
            "query_id": _series(self._column("label_query")),
            "chunk_id": _series(self._column("chunk_id")),
            "grade": self._column("grade").to_numpy().astype(np.int8),
        })
        rows = np.repeat(np.arange(len(queries), dtype=np.int64), queries["n_labelled"].to_numpy())
        rows.setflags(write=False)
        n_invalid = int((~queries["valid"]).sum())
        if n_invalid:
            invalid = queries.loc[~queries["valid"], "query_id"].tolist()
            log.info("%s: %d of %d queries have no chunk of grade >= 1 and are invalid: %s",
                     self.path, n_invalid, len(queries), ", ".join(invalid[:20]))
        return queries, qrels, rows


def _series(arr: pa.ChunkedArray) -> pd.Series:
    """A text column as pandas stores text by default (Arrow-backed ``str`` on pandas 3); one with
    no value at all as an object column of None, as pandas builds it from a list of None."""
    if not len(arr) or arr.null_count == len(arr):
        return pd.Series(np.full(len(arr), None, dtype=object), dtype=object)
    return arr.to_pandas()
