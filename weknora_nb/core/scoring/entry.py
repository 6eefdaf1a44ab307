"""The entry points of scoring: :func:`score` (a test set and results) and :func:`score_files` (two files),
each running the steps of :mod:`weknora_nb.core.scoring` in order, two threads side by side.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from weknora_nb.core.background import in_background
from weknora_nb.core.codes import ResultCodes
from weknora_nb.core.metrics import Metric, compute
from weknora_nb.core.pipeline import stage_order as _stage_order
from weknora_nb.core.requests import Prepared, prepare
from weknora_nb.core.scoring.inputs import check_options, prepare_results, read_codes
from weknora_nb.core.scoring.relevance import Positions, Relevance, cell_grades, ranked_lists
from weknora_nb.core.scoring.scores import Scores
from weknora_nb.core.scoring.selection import select
from weknora_nb.core.scoring.tables import (
    by_repeat_table,
    excluded_table,
    make_counts,
    make_warnings,
    per_query_table,
    queries_per_stage,
    requests_table,
    scored_rows,
    summary_table,
)
from weknora_nb.core.testset import TestSet, load_testset


def score(testset: TestSet, results: pd.DataFrame | ResultCodes | str | os.PathLike,
          metrics: Iterable[str | Metric] | str | None = None, *,
          stages: Iterable[str] | None = None, domain_adjustment: float = 0.0, sub_chunks: str = "expand",
          source: str | None = None) -> Scores:
    """Score ``results`` (the results-table format) against ``testset``.

    Parameters
    ----------
    testset : TestSet
    results : DataFrame, or path
        A results table as read by :func:`weknora_nb.read_results`, or the path of a
        results file (a Parquet file is then read straight into integer codes, without
        a pandas table: the fast path for large runs). Rows are checked either way.
    metrics : list of str, optional
        Metric names (default :data:`weknora_nb.core.metrics.DEFAULT_METRICS`).
    stages : list of str, optional
        Keep only these stages (in this order); each must be in the results.
    domain_adjustment : float, default 0
        Lower every acceptance threshold by this fraction (0, or 0.05-0.10).
    sub_chunks : {"expand", "ignore"}, default "expand"
        Merged results that absorbed neighbouring chunks (``sub_chunk_ids``): ``expand``
        places each absorbed chunk right after its result (what the user sees);
        ``ignore`` scores only the result's own chunk id.
    source : str, optional
        Name used in error messages (default: the path, or ``<results>``).

    Returns
    -------
    Scores

    Raises
    ------
    ResultsError
        A bad row (named by row and field), a request with two statuses, or a rank
        given twice within a request.
    MetricError
        An unknown metric name.
    UsageError
        A stage asked for that the results do not hold, a bad ``sub_chunks`` or
        ``domain_adjustment``.
    """
    mets = check_options(metrics, domain_adjustment, sub_chunks)
    with ThreadPoolExecutor(1, thread_name_prefix="weknora-nb-scoring") as pool:
        labels = pool.submit(Relevance.of, testset)   # the test set's side, beside the results' (Arrow, numpy)
        rc, n_expanded, source = read_codes(results, sub_chunks, source)
        positions = pool.submit(lambda: Positions.find(rc.queries, rc.chunks, testset, labels, None))
        prepared = prepare(rc, source, stages, _k_max(mets), n_expanded, pool)   # beside the positions
        return _score_prepared(testset, prepared, mets, labels, domain_adjustment, pool, positions)


def _score_prepared(testset: TestSet, prepared: Prepared, mets: list[Metric], labels: Future[Relevance],
                    domain_adjustment: float, pool: Executor, positions: Future[Positions] | None = None) -> Scores:
    """Steps 3, 5 and 6 of :func:`score`: what needs the test set, given the results' side
    (:func:`~weknora_nb.core.scoring.inputs.prepare_results`) and the labels being prepared by ``pool`` (step 3
    runs beside them). Two threads share step 5 with step 6: the
    grades of the first half of the requests are looked up in ``pool`` while this thread builds the requests
    table (pandas) and then looks up the second half's; the metrics are computed in ``pool`` while this thread
    builds the tables and counts that need no metric. ``pool`` runs its tasks in turn, the labels' first.
    ``positions``: :class:`Positions` of the results' queries and chunks, begun earlier (beside
    :func:`~weknora_nb.core.requests.prepare`), else found here."""
    req, stages = prepared.requests, prepared.stages
    pos = positions.result() if positions is not None else None
    if pos is None or not pos.serves(req):
        pos = Positions.find(req.queries, req.chunks, testset, labels, pool)
    sel = select(req, testset, pos.in_testset)
    lists = prepared.lists.only(sel.scored)
    top, half = lists.top, len(lists.top) // 2
    first = pool.submit(lambda: cell_grades(top[:half], sel.ts_query[:half], pos.in_labels.result(), labels.result()))
    requests, at_scored = requests_table(req, sel, lists, testset.queries, pos.query_text)
    second = cell_grades(top[half:], sel.ts_query[half:], pos.in_labels.result(), labels.result())
    grade = np.concatenate([first.result(), second])
    ranked = pool.submit(lambda: ranked_lists(req, sel, top, grade, testset, mets, labels.result()))
    computed = pool.submit(lambda: {m.name: compute(ranked.result(), m) for m in mets[::2]})
    excluded = excluded_table(testset.queries, requests)
    stage_order = stages if stages is not None else _stage_order(_stages_seen(req.stages, req.r_stage))
    counts = make_counts(testset.queries, requests, sel, lists, prepared.n_expanded, stage_order, req.repeats)
    warnings = make_warnings(counts, domain_adjustment)
    scored = scored_rows(requests, has_latency=req.latency is not None)
    values = {m.name: compute(ranked.result(), m) for m in mets[1::2]} | computed.result()
    values = values if at_scored is None else {k: v[at_scored] for k, v in values.items()}
    names = [m.name for m in mets]
    per_query = per_query_table(scored, values, names)
    by_repeat = by_repeat_table(per_query, names, stage_order)
    summary = summary_table(per_query, by_repeat, queries_per_stage(req, sel.scored), names, stage_order,
                            domain_adjustment)
    return Scores(metrics=mets, per_query=per_query, requests=requests, excluded=excluded, by_repeat=by_repeat,
                  summary=summary, counts=counts, testset=testset, warnings=warnings,
                  domain_adjustment=domain_adjustment)


def _stages_seen(stages: np.ndarray, codes: np.ndarray) -> list[str]:
    """The names of the stages ``codes`` refers to, in the order they first appear: a pass per distinct stage,
    not a Python loop over the requests."""
    present = np.flatnonzero(np.bincount(codes, minlength=len(stages))) if len(codes) else np.zeros(0, np.intp)
    first = [int(np.argmax(codes == c)) for c in present]
    return [str(stages[c]) for _, c in sorted(zip(first, present, strict=True))]


def _k_max(mets: list[Metric]) -> int:
    """The longest prefix of a list any of ``mets`` reads."""
    return max(m.k for m in mets)


def score_files(testset: str | os.PathLike, results: str | os.PathLike,
                metrics: Iterable[str | Metric] | str | None = None, *, stages: Iterable[str] | None = None,
                domain_adjustment: float = 0.0, sub_chunks: str = "expand") -> Scores:
    """:func:`score` of a results file against a test-set file (:func:`~weknora_nb.load_testset`), with the
    same checks and errors in the same order, using a second core: the results file is read, grouped into
    requests and checked, and each request's distinct list laid out, in a second thread while the test set
    loads (none of it needs the test set, and it is Arrow and numpy work, which leaves the first thread free);
    the test set's hash (:attr:`Scores.testset_hash`) is computed beside the scoring."""
    mets = check_options(metrics, domain_adjustment, sub_chunks)
    stages = None if stages is None else list(stages)
    path = Path(results)
    with ThreadPoolExecutor(2, thread_name_prefix="weknora-nb-files") as pool:
        prepared = in_background(lambda: prepare_results(path, sub_chunks, str(path), stages, _k_max(mets)),
                                 "weknora-nb-results")   # while the test set loads
        ts = load_testset(Path(testset))
        digest = pool.submit(lambda: ts.hash)
        labels = pool.submit(Relevance.of, ts)
        sc = _score_prepared(ts, prepared.result(), mets, labels, domain_adjustment, pool)
        digest.result()
    return sc
