"""The results' side of scoring (docs/method.md sections 2-3): rows grouped into requests, checked, and each
request's ranked list laid out, from integer codes (:class:`~weknora_nb.core.codes.ResultCodes`), without the
test set and without pandas.

:func:`prepare` runs steps 1, 2 and 4 of :func:`weknora_nb.core.scoring.score` and keeps what the later steps
read, one entry per request (:class:`Prepared`); the rows themselves are dropped:

1. group rows into requests (:func:`_group_rows`): runs of equal (query, stage, repeat); rows are
   sorted only when a request's rows lie apart or out of rank order;
2. check structure (:func:`_check_structure`): one status per request, no rank given twice;
4. lay every request out as a row of a grid (:func:`_distinct_lists`); rows holding a repeated
   chunk id are found by sorting each row, and every row keeps its first K_max distinct chunk
   ids (first position kept, ranks closed up, duplicates counted over the whole list). Step 3
   of scoring (what is scored) then empties the lists of requests it does not score
   (:meth:`Lists.only`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from weknora_nb.core.codes import ResultCodes, extremes, least
from weknora_nb.core.errors import Problem, ResultsError, UsageError
from weknora_nb.core.pipeline import stage_order as _stage_order

log = logging.getLogger(__name__)

#: padding cells a grid of requests x longest list may hold beyond 4 per row before the
#: long lists are cut to their first K_max distinct chunks by hashing instead
GRID_SLACK = 1_000_000


# -- what the results' side hands on ----------------------------------------------------------


@dataclass
class Requests:
    """The requests of a results table, one entry per request, in the order their rows come.

    ``queries``, ``stages``, ``chunks`` and ``statuses`` are the names the codes stand for (object arrays
    of str; ``statuses`` gains ``ok`` when an empty status needed it); ``r_query``, ``r_stage`` and
    ``status`` are each request's codes, ``r_repeat`` its repeat as a position in ``repeats`` (the
    distinct repeat numbers, ascending); ``key`` is (query * n_stages + stage) * n_repeats + repeat
    position (int64); ``latency`` the latency (ms) of each request, None when the results carry none.
    """

    queries: np.ndarray
    stages: np.ndarray
    chunks: np.ndarray
    statuses: np.ndarray
    r_query: np.ndarray
    r_stage: np.ndarray
    r_repeat: np.ndarray
    repeats: np.ndarray
    status: np.ndarray
    key: np.ndarray
    latency: np.ndarray | None

    @property
    def n(self) -> int:
        """Number of requests."""
        return len(self.key)

    @property
    def n_rep(self) -> int:
        """Number of distinct repeats (at least 1: the base of ``key``)."""
        return max(len(self.repeats), 1)


@dataclass
class Lists:
    """The requests' ranked lists after duplicate removal (step 4)."""

    top: np.ndarray           # requests x K_max: first K_max distinct chunk codes, -1 padding
    n_returned: np.ndarray    # distinct chunks returned per request (0 when not scored)
    n_duplicates: np.ndarray  # repeated chunk ids removed per request (0 when not scored)

    def only(self, scored: np.ndarray) -> Lists:
        """These lists with the requests not ``scored`` emptied: no chunk, counts 0 (in place)."""
        self.top[~scored] = -1
        self.n_returned[~scored] = 0
        self.n_duplicates[~scored] = 0
        return self


@dataclass
class Prepared:
    """What :func:`prepare` hands on: every request (:class:`Requests`) and its list laid out as if it were
    scored (:class:`Lists`), the stages kept (None: all) and the absorbed chunks unfolded on reading."""

    requests: Requests
    lists: Lists
    stages: list[str] | None
    n_expanded: int


def prepare(rc: ResultCodes, source: str, stages: Iterable[str] | None, k_max: int,
            n_expanded: int = 0, pool: Executor | None = None) -> Prepared:
    """Keep the rows of ``stages`` (every row when None), group them into requests, check their structure,
    and lay out each request's first ``k_max`` distinct chunks (``source`` names the results in errors). With a
    ``pool`` (a second thread), the lists of the second half of the requests are laid out there.

    Raises :class:`UsageError` naming the stages the results hold when one of ``stages`` has no row, and
    :class:`ResultsError` for a request whose rows carry different statuses or give a rank twice."""
    rc, row_number, kept = _keep_stages(rc, stages)
    rows = _group_rows(rc, row_number)
    _check_structure(rows, source)
    return Prepared(rows.requests(), _distinct_lists(rows, k_max, pool), kept, n_expanded)


def _keep_stages(rc: ResultCodes, stages: Iterable[str] | None
                 ) -> tuple[ResultCodes, np.ndarray | None, list[str] | None]:
    """Only the rows of ``stages`` (every row when None), the position in ``rc`` of each row
    kept (None when all are kept), and ``stages`` as a list.

    Raises UsageError naming the stages the results hold (in pipeline order) when one of
    ``stages`` has no row.
    """
    if stages is None:
        return rc, None, None
    stages = list(dict.fromkeys(stages))   # a stage named twice is that stage once
    present = np.zeros(len(rc.stages) + 1, bool)  # the last slot serves code -1
    present[rc.stage] = True
    held = _stage_order(rc.stages[present[:-1]])
    absent = [s for s in stages if s not in held]
    if absent:
        raise UsageError(argument="stage", allowed=held or "a stage of the results (they hold none)",
                         got=absent[0])
    wanted = np.append(np.isin(rc.stages, stages), False)
    keep = wanted[rc.stage]
    if keep.all():
        return rc, None, stages
    row_number = np.flatnonzero(keep)
    return rc.take(row_number), row_number, stages


# -- 1. requests: runs of rows with the same (query, stage, repeat) --------------------------


@dataclass
class _Rows:
    """The rows grouped into requests (step 1), as steps 2 and 4 read them.

    Row arrays (``query`` .. ``status``, and :attr:`has_chunk`, one entry per row) are in an order where each
    request's rows lie together, in rank order; request arrays (``starts`` .. ``key``) have
    one entry per request, in the order the requests' rows come.
    """

    codes: ResultCodes            # the rows (after the stage filter): their dictionaries, latency
    query: np.ndarray             # query code of each row
    stage: np.ndarray             # stage code of each row
    rank: np.ndarray
    chunk: np.ndarray             # chunk code, -1 where none (a failed request's row)
    status: np.ndarray            # status code; an empty status reads as ``ok``
    brk: np.ndarray               # brk[j]: row j + 1 starts a request
    ordered: bool                 # ranks strictly increase within every request
    statuses: np.ndarray          # status names (``ok`` added when an empty status needed it)
    order: np.ndarray | None      # row j here is row order[j] of ``codes`` (None: same order)
    row_number: np.ndarray | None  # row i of ``codes`` is 0-based row row_number[i] of the caller's table
    starts: np.ndarray            # first row of each request
    lengths: np.ndarray           # rows of each request
    r_query: np.ndarray           # query code of each request
    r_stage: np.ndarray           # stage code of each request
    repeats: np.ndarray           # distinct repeat numbers, ascending
    r_repeat: np.ndarray          # each request's repeat, as a position in ``repeats``
    key: np.ndarray               # (query * n_stages + stage) * n_repeats + repeat position, int64

    @cached_property
    def has_chunk(self) -> np.ndarray:
        """Whether each row returned a chunk (``chunk >= 0``): made when a step needs it (rows with no chunk are
        rare, and :attr:`all_chunks` tells without an array)."""
        return self.chunk >= 0

    @cached_property
    def all_chunks(self) -> bool:
        """Whether every row returned a chunk (one reduction)."""
        return not len(self.chunk) or least(self.chunk) >= 0

    @property
    def n(self) -> int:
        """Number of requests."""
        return len(self.starts)

    def row_of(self, j: int) -> int:
        """1-based row number in the caller's table of row ``j`` (in the order here)."""
        j = int(self.order[j]) if self.order is not None else int(j)
        return (int(self.row_number[j]) if self.row_number is not None else j) + 1

    def requests(self) -> Requests:
        """The request arrays (the rows are no longer needed once the lists are laid out)."""
        lat = self.codes.latency_ms
        if lat is not None:
            lat = lat[self.order[self.starts]] if self.order is not None else lat[self.starts]
        return Requests(queries=self.codes.queries, stages=self.codes.stages, chunks=self.codes.chunks,
                        statuses=self.statuses, r_query=self.r_query, r_stage=self.r_stage, r_repeat=self.r_repeat,
                        repeats=self.repeats, status=self.status[self.starts], key=self.key, latency=lat)


def _group_rows(rc: ResultCodes, row_number: np.ndarray | None) -> _Rows:
    """Step 1: the rows as requests, runs of equal (query, stage, repeat).

    The rows keep their order when every request's rows lie together in rank order (the
    collector's files); otherwise they are sorted by request key, then rank (stable, so
    errors still name the first offending row).
    """
    q, s, rep, rank, c = rc.query, rc.stage, rc.repeat, rc.rank, rc.chunk
    st, statuses = _empty_status_is_ok(rc.status, rc.statuses)
    starts, brk, ordered = _runs(q, s, rep, rank)
    if len(rep) and rep.strides[0] == 0:   # one repeat throughout (a broadcast view): nothing to sort
        repeats, r_repeat = rep[:1].copy(), np.zeros(len(starts), np.intp)
    else:
        repeats, r_repeat = np.unique(rep[starts], return_inverse=True)
    n_s, n_rep = max(len(rc.stages), 1), max(len(repeats), 1)
    key = (q[starts].astype(np.int64) * n_s + s[starts]) * n_rep + r_repeat
    order = None
    if not ordered or (np.any(key[1:] <= key[:-1]) and len(np.unique(key)) != len(key)):
        # rows of a request are not together, or not in rank order: sort (row order kept for errors)
        order = _request_order(key, np.diff(np.r_[starts, len(rc)]), rank)
        q, s, rep, rank, c, st = q[order], s[order], rep[order], rank[order], c[order], st[order]
        starts, brk, ordered = _runs(q, s, rep, rank)
        r_repeat = np.searchsorted(repeats, rep[starts])
        key = (q[starts].astype(np.int64) * n_s + s[starts]) * n_rep + r_repeat
    return _Rows(codes=rc, query=q, stage=s, rank=rank, chunk=c, status=st, brk=brk,
                 ordered=ordered, statuses=statuses, order=order, row_number=row_number, starts=starts,
                 lengths=np.diff(np.r_[starts, len(rc)]), r_query=q[starts], r_stage=s[starts],
                 repeats=repeats, r_repeat=r_repeat, key=key)


def _empty_status_is_ok(status: np.ndarray, statuses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Status codes and names where an empty status (code -1) reads as ``ok``."""
    if not len(status) or least(status) >= 0:
        return status, statuses
    if "ok" not in statuses:
        statuses = np.append(statuses, "ok")
    return np.where(status < 0, int(np.flatnonzero(statuses == "ok")[0]), status), statuses


def _runs(q: np.ndarray, s: np.ndarray, rep: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Where each run of equal (query, stage, repeat) starts, the break mask (``brk[j]``: row
    j + 1 starts a run), and whether ranks strictly increase within every run."""
    if not len(q):
        return np.zeros(0, np.int64), np.zeros(0, bool), True
    brk = q[1:] != q[:-1]
    for a in (s, rep):  # a constant column cannot break a run
        if (lo_hi := extremes(a))[0] != lo_hi[1]:
            brk |= a[1:] != a[:-1]
    starts = np.r_[0, np.flatnonzero(brk) + 1]
    return starts, brk, _ranks_increase(rank, brk)


def _ranks_increase(rank: np.ndarray, brk: np.ndarray, block: int = 1 << 18) -> bool:
    """Whether ``rank`` strictly increases within every run (``brk[j]``: row j + 1 starts a run): in blocks of
    rows, whose temporaries stay in the processor's cache (twice as fast as one pass over millions of rows)."""
    for i in range(0, len(brk), block):
        j = min(i + block, len(brk))
        if np.any((rank[i + 1:j + 1] <= rank[i:j]) > brk[i:j]):
            return False
    return True


def _request_order(key: np.ndarray, lengths: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The stable permutation sorting rows by (request key, rank), given the key and length
    of each run of rows: one int64 argsort when key x (max rank + 1) fits, else a lexsort."""
    row_key = np.repeat(key, lengths)
    top_rank = int(rank.max(initial=0)) + 1
    if int(key.max(initial=0)) < (1 << 62) // top_rank:
        return np.argsort(row_key * top_rank + rank, kind="stable")
    return np.lexsort((rank, row_key))


# -- 2. structure --------------------------------------------------------------------------


def _check_structure(rows: _Rows, source: str) -> None:
    """Step 2: ResultsError (up to 20 of each, by row) for a request whose rows carry
    different statuses, or a rank given twice for returned chunks of one request."""
    problems: list[Problem] = []
    st, brk, n_rows = rows.status, rows.brk, len(rows.query)
    queries, stages = rows.codes.queries, rows.codes.stages
    if n_rows > 1 and (lo_hi := extremes(st))[0] != lo_hi[1]:
        mixed = np.flatnonzero((st[1:] != st[:-1]) > brk) + 1
        for r in np.unique(np.searchsorted(rows.starts, mixed, side="right") - 1)[:20]:
            problems.append(Problem(source, rows.row_of(rows.starts[r]), "status",
                                    f"request ({queries[rows.r_query[r]]!r}, {stages[rows.r_stage[r]]!r}, "
                                    f"repeat {rows.repeats[rows.r_repeat[r]]}) has rows with different statuses",
                                    "row"))
    if n_rows > 1 and not rows.ordered:  # ranks within a request are not all increasing: a rank given twice?
        rank, has = rows.rank, rows.has_chunk
        for j in (np.flatnonzero((rank[1:] == rank[:-1]) & ~brk & has[1:] & has[:-1]) + 1)[:20]:
            problems.append(Problem(source, rows.row_of(j), "rank",
                                    f"rank {rank[j]} appears twice in request ({queries[rows.query[j]]!r}, "
                                    f"{stages[rows.stage[j]]!r})", "row"))
    if problems:
        raise ResultsError(source, problems)


# -- 4. each request as a row of a grid; duplicates out; the first K_max kept ----------------


def _distinct_lists(rows: _Rows, k_max: int, pool: Executor | None = None) -> Lists:
    """Step 4: each request's first ``k_max`` distinct chunk codes (first position kept, ranks closed up)
    and its counts of distinct and repeated chunk ids (over the whole list)."""
    lengths = rows.lengths
    if rows.n and lengths.min() == lengths.max() and rows.all_chunks:
        # the usual case: every request returned the same number of chunks, so the rows are the grid
        kept_len = lengths.copy()
        grid = rows.chunk.reshape(rows.n, int(lengths[0]))
        n_dups = np.zeros(rows.n, np.int64)
    else:
        grid, kept_len, n_dups = _ragged_grid(rows, k_max)
    top, n_dup = _first_k_distinct(grid, k_max, pool)
    n_dups += n_dup
    return Lists(top=top, n_returned=kept_len - n_dups, n_duplicates=n_dups)


def _ragged_grid(rows: _Rows, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The returned chunks of the requests as rows of a grid, when lists differ in
    length: (grid, chunks returned per request, repeats already removed per request).

    Cells past a list's end hold distinct negative values (never taken for a repeat). When
    requests x longest list exceeds 4 cells per returned chunk + GRID_SLACK (a few very long
    lists among short ones), repeats are removed first (the first of each chunk in a request
    kept) and the grid is only ``k_max`` wide.
    """
    n_req = rows.n
    at = np.flatnonzero(rows.has_chunk)
    rq = np.repeat(np.arange(n_req), rows.lengths)[at]
    chunk = rows.chunk[at]
    kept_len = np.bincount(rq, minlength=n_req)
    width = int(kept_len.max(initial=0))
    n_dups = np.zeros(n_req, np.int64)
    if n_req * width > 4 * len(at) + GRID_SLACK:
        # a few very long lists among short ones: remove repeats first, keep each request's first K_max
        cell = rq.astype(np.int64) * max(len(rows.codes.chunks), 1) + chunk
        dup = np.ones(len(cell), bool)
        dup[np.unique(cell, return_index=True)[1]] = False   # the first position of each (request, chunk)
        n_dups = np.bincount(rq[dup], minlength=n_req)
        rq, chunk = rq[~dup], chunk[~dup]
        width = k_max
    n_k = np.bincount(rq, minlength=n_req)
    col = np.arange(len(rq)) - np.repeat(np.cumsum(n_k) - n_k, n_k)
    near = col < width
    pad = -1 - np.arange(width, dtype=np.int64)  # distinct padding: never taken for a repeat
    grid = np.broadcast_to(pad, (n_req, width)).astype(np.promote_types(rows.chunk.dtype, np.int32))
    grid[rq[near], col[near]] = chunk[near]
    return grid, kept_len, n_dups


def _first_k_distinct(grid: np.ndarray, k: int, pool: Executor | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``grid`` (values >= 0, padding < 0): the first ``k`` distinct values
    in row order (padded with -1) and the number of repeated values in the row.

    A sorted copy of each row finds the rows holding a repeat; only those rows are argsorted
    to tell first occurrences from repeats, and compacted (lists are short, repeats rare). With a ``pool``,
    the second half of the rows is done there (numpy sorts without the interpreter lock).
    """
    n_rows, width = grid.shape
    top = np.maximum(grid[:, :k], -1)
    n_dup = np.zeros(n_rows, np.int64)
    if width < 2 or not n_rows:
        return top, n_dup
    mid = n_rows // 2 if pool is not None else n_rows
    other = pool.submit(_resolve_repeats, grid, mid, n_rows, k, top, n_dup) if pool is not None else None
    _resolve_repeats(grid, 0, mid, k, top, n_dup)
    if other is not None:
        other.result()
    return top, n_dup


def _resolve_repeats(grid: np.ndarray, lo: int, hi: int, k: int, top: np.ndarray, n_dup: np.ndarray) -> None:
    """:func:`_first_k_distinct` of rows ``lo`` .. ``hi`` of ``grid``: the rows holding a repeat get their first
    ``k`` distinct values in ``top`` and their number of repeats in ``n_dup`` (the other rows are left as they
    are: ``top`` holds their first ``k`` values already, ``n_dup`` their 0)."""
    width = grid.shape[1]
    # in blocks of rows: small temporaries are recycled instead of freshly mapped each time
    block = max(1, (1 << 21) // width)
    suspect = np.concatenate([
        np.flatnonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1)) + i
        for i in range(lo, hi, block)
        for srt in [np.sort(grid[i:min(i + block, hi)], axis=1)]] or [np.zeros(0, np.int64)])
    if not len(suspect):
        return
    # within a suspect row, sorting value * width + position puts equal values together, earliest first
    sub = grid[suspect]
    srt = np.sort(sub.astype(np.int64) * width + np.arange(width), axis=1)
    value, at = srt // width, srt % width
    repeat = np.zeros(sub.shape, bool)
    repeat[:, 1:] = (value[:, 1:] == value[:, :-1]) & (value[:, 1:] >= 0)
    dup = np.zeros(sub.shape, bool)
    np.put_along_axis(dup, at, repeat, axis=1)
    n_dup[suspect] = dup.sum(axis=1)
    keep = (sub >= 0) & ~dup
    at = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # kept cells first, in row order
    vals = np.take_along_axis(sub, at, axis=1)
    vals[~np.take_along_axis(keep, at, axis=1)] = -1
    top[suspect] = vals
