"""Step 5 of scoring: the grade of every cell of the scored lists, and what the metric kernels read of them.

The test set's labels are turned into integer keys once (:class:`Relevance`: grade >= 1 only, since a
grade-0 cell adds nothing to any metric), the results' queries and chunks are placed on the test set's side
(:class:`Positions`), and each cell's grade is looked up (:func:`cell_grades`) through a :class:`KeyTable`.
:func:`ranked_lists` then gives the relevant cells to :func:`~weknora_nb.core.metrics.compute`.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weknora_nb.core.arrowtext import large_text
from weknora_nb.core.metrics import NEEDS_ALL_LABELS, Metric, RankedLists
from weknora_nb.core.requests import Requests
from weknora_nb.core.scoring.selection import Selection
from weknora_nb.core.testset import TestSet


class KeyTable:
    """Integer keys (sorted, unique) and their values, to look many keys up at once (:meth:`get`).

    Most keys looked up are usually absent, so a hashed byte filter (one multiply and one gather per key),
    built once with the table, sets them aside before the exact binary search runs on the few candidates.
    """

    _MULT = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, keys: np.ndarray, values: np.ndarray):
        self.keys, self.values = keys, values
        bits = int(min(26, max(16, np.ceil(np.log2(max(len(keys), 1) * 16)))))
        self.shift = np.uint64(64 - bits)
        self.filter = np.zeros(1 << bits, dtype=np.bool_)
        self.filter[self._slots(keys)] = True

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Each key's slot in the filter: its 64 bits times an odd constant, the top bits kept (one temporary)."""
        h = (keys.view(np.uint64) if keys.dtype == np.int64 else keys.astype(np.uint64)) * self._MULT
        h >>= self.shift
        return h

    def get(self, keys: np.ndarray, default: int = 0) -> np.ndarray:
        """The value of each of ``keys`` in the table, else ``default``."""
        out = np.full(len(keys), default, dtype=self.values.dtype)
        if not len(self.keys) or not len(keys):
            return out
        cand = np.flatnonzero(self.filter[self._slots(keys)])
        wanted = keys[cand]
        at = np.minimum(np.searchsorted(self.keys, wanted), len(self.keys) - 1)
        found = self.keys[at] == wanted
        out[cand[found]] = self.values[at[found]]
        return out


def _lookup(keys: np.ndarray, table_keys: np.ndarray, table_values: np.ndarray, default: int = 0) -> np.ndarray:
    """``table_values`` at the position of each of ``keys`` in ``table_keys`` (sorted, unique), else ``default``
    (:class:`KeyTable`)."""
    return KeyTable(table_keys, table_values).get(keys, default)


@dataclass
class Relevance:
    """The labels scoring needs, as integer keys: grade >= 1 only (grade 0 adds nothing anywhere)."""

    chunks: np.ndarray      # distinct chunk ids with a grade >= 1 somewhere
    grades: KeyTable        # query_index * len(chunks) + chunk_index -> grade (int8)
    n_rel: np.ndarray       # per test-set query: chunks of grade >= 1
    ideal_q: np.ndarray     # the ideal rankings (grades descending), flattened
    ideal_pos: np.ndarray
    ideal_grade: np.ndarray

    @classmethod
    def of(cls, testset: TestSet) -> Relevance:
        """The labels of ``testset``, with each query's ideal ranking."""
        qrels = testset.qrels
        g = qrels["grade"].to_numpy()
        rel = g >= 1
        q = testset.label_rows[rel]
        g = g[rel].astype(np.int8)
        enc = pc.dictionary_encode(large_text(qrels["chunk_id"]).filter(pa.array(rel)))
        c_code, chunks = enc.indices.to_numpy().astype(np.int64), enc.dictionary.to_numpy(zero_copy_only=False)
        keys = q * max(len(chunks), 1) + c_code
        order = np.argsort(keys, kind="stable")
        ideal = np.argsort(q * 4 + (3 - g), kind="stable")
        ideal_q = q[ideal]
        n_rel = np.bincount(q, minlength=len(testset.queries))
        first = np.cumsum(n_rel) - n_rel
        return cls(chunks, KeyTable(keys[order], g[order]), n_rel, ideal_q,
                   np.arange(len(ideal_q)) - first[ideal_q] + 1, g[ideal])


def _index_in(values, value_set) -> np.ndarray:
    """Position (int64) of each of ``values`` in ``value_set`` (distinct strings), -1 where absent."""
    if not len(values):
        return np.zeros(0, np.int64)
    if not len(value_set):
        return np.full(len(values), -1, np.int64)
    found = pc.index_in(large_text(values), value_set=large_text(value_set))
    return found.fill_null(-1).to_numpy().astype(np.int64)


@dataclass
class Positions:
    """Where the results' distinct queries and chunks stand on the test set's side, each array with a last slot
    -1 that code -1 (none) reads: ``in_testset``, each query's row in the test set (-1: unknown);
    ``in_labels``, each chunk's position among the labels' chunks (:attr:`Relevance.chunks`; -1: no label of
    grade >= 1). ``queries`` and ``chunks``: the arrays they were found for; ``query_text``: ``queries`` as
    Arrow text (what the requests table is built from)."""

    queries: np.ndarray
    chunks: np.ndarray
    in_testset: np.ndarray
    in_labels: Future[np.ndarray]
    query_text: pa.Array

    @classmethod
    def find(cls, queries: np.ndarray, chunks: np.ndarray, testset: TestSet, labels: Future[Relevance],
             pool: Executor | None) -> Positions:
        """The queries' positions found in this thread; the chunks' (which wait for the labels) in ``pool``, or
        here when None."""
        text = large_text(queries)
        in_testset = np.append(_index_in(text, testset.queries["query_id"]), -1)

        def in_labels() -> np.ndarray:
            return np.append(_index_in(chunks, labels.result().chunks), -1)

        found: Future[np.ndarray] = pool.submit(in_labels) if pool is not None else Future()
        if pool is None:
            found.set_result(in_labels())
        return cls(queries, chunks, in_testset, found, text)

    def serves(self, req: Requests) -> bool:
        """Whether these are the positions of ``req``'s queries and chunks (the same arrays)."""
        return self.queries is req.queries and self.chunks is req.chunks


def cell_grades(top: np.ndarray, ts_query: np.ndarray, labelled: np.ndarray, lab: Relevance) -> np.ndarray:
    """The grade (>= 1, else 0) of every cell of ``top`` (rows of chunk codes, -1 past a list's end), each row a
    request of test-set query ``ts_query`` (-1: not in the test set); ``labelled``: what
    :attr:`Positions.in_labels` gives."""
    top_lab = labelled[top]
    key = ts_query[:, None].astype(np.int64) * max(len(lab.chunks), 1) + top_lab
    key[top_lab < 0] = -1  # never a label key
    return lab.grades.get(key.ravel()).reshape(top.shape)


def ranked_lists(req: Requests, sel: Selection, top: np.ndarray, grade: np.ndarray, testset: TestSet,
                 mets: list[Metric], lab: Relevance) -> RankedLists:
    """Step 5: what the metric kernels (:func:`~weknora_nb.core.metrics.compute`) read of every scored request
    (in request order), given the grade of every cell of ``top`` (:func:`cell_grades`) and the test set's
    :class:`Relevance`; with the labelled cells when one of ``mets`` needs them.

    Every metric sums over relevant cells only (a grade-0 cell adds nothing), so only they
    go on to the kernels, each with its 1-based position among its request's distinct chunks.
    """
    cell_req, cell_col = np.nonzero(grade >= 1)  # row-major: by request, then position
    sc = np.flatnonzero(sel.scored)  # scored requests, renumbered 0..n_sc-1
    new_id = np.full(req.n, -1)
    new_id[sc] = np.arange(len(sc))
    rl = RankedLists(req=new_id[cell_req], pos=cell_col + 1, grade=grade[cell_req, cell_col], n_req=len(sc),
                     req_query=sel.ts_query[sc], n_q=len(testset.queries), n_rel=lab.n_rel, ideal_q=lab.ideal_q,
                     ideal_pos=lab.ideal_pos, ideal_grade=lab.ideal_grade)
    if any(m.family in NEEDS_ALL_LABELS for m in mets):
        judged_req, judged_pos = _labelled_cells(req, sel, top, testset)
        rl = replace(rl, judged_req=new_id[judged_req], judged_pos=judged_pos,
                     n_distinct=(top[sc] >= 0).sum(axis=1))
    return rl


def _labelled_cells(req: Requests, sel: Selection, top: np.ndarray, testset: TestSet
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The cells of ``top`` whose chunk carries a label for its query, grade 0 included, as
    (request, 1-based position), row-major: what label coverage (``judged@K``) counts."""
    qrels = testset.qrels
    q = testset.label_rows
    enc = pc.dictionary_encode(large_text(qrels["chunk_id"]))
    chunks = enc.dictionary.to_numpy(zero_copy_only=False)
    width = max(len(chunks), 1)
    labelled = np.unique(q * width + enc.indices.to_numpy().astype(np.int64))
    top_lab = np.append(_index_in(req.chunks, chunks), -1)[top]
    key = sel.ts_query[:, None].astype(np.int64) * width + top_lab
    key[top_lab < 0] = -1  # never a label key
    found = _lookup(key.ravel(), labelled, np.ones(len(labelled), np.int8)).reshape(top.shape)
    cell_req, cell_col = np.nonzero(found)
    return cell_req, cell_col + 1
