"""What :func:`~weknora_nb.core.scoring.score` is given, made ready: the options checked, and the results read
into integer codes (:class:`~weknora_nb.core.codes.ResultCodes`), merged results unfolded and rows checked,
then grouped into requests (:func:`~weknora_nb.core.requests.prepare`). None of it needs the test set.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from weknora_nb.core.codes import ResultCodes
from weknora_nb.core.errors import ResultsError, UsageError
from weknora_nb.core.metrics import Metric, parse_metrics
from weknora_nb.core.requests import Prepared, prepare
from weknora_nb.core.results import read_results_for_scoring
from weknora_nb.core.tiers import check_domain_adjustment
from weknora_nb.core.unfold import expand_sub_chunks

#: the values ``score(..., sub_chunks=...)`` accepts
SUB_CHUNKS = ("expand", "ignore")


def check_options(metrics: Iterable[str | Metric] | str | None, domain_adjustment: float,
                  sub_chunks: str) -> list[Metric]:
    """The metrics parsed, after the options are checked (MetricError, UsageError)."""
    mets = parse_metrics(metrics)
    check_domain_adjustment(domain_adjustment)
    if sub_chunks not in SUB_CHUNKS:
        raise UsageError(argument="sub_chunks", allowed=list(SUB_CHUNKS), got=sub_chunks)
    return mets


def prepare_results(results: pd.DataFrame | ResultCodes | str | os.PathLike, sub_chunks: str, source: str | None,
                    stages: Iterable[str] | None, k_max: int) -> Prepared:
    """Read ``results`` (:func:`read_codes`), then the results' side of scoring
    (:func:`~weknora_nb.core.requests.prepare`: stages kept, requests grouped and checked, each request's first
    ``k_max`` distinct chunks laid out)."""
    rc, n_expanded, source = read_codes(results, sub_chunks, source)
    return prepare(rc, source, stages, k_max, n_expanded)


def read_codes(results: pd.DataFrame | ResultCodes | str | os.PathLike, sub_chunks: str,
               source: str | None) -> tuple[ResultCodes, int, str]:
    """The results as integer codes, the number of absorbed chunks unfolded, and the name for
    error messages. A path is read (straight into codes when it can be); a table has its
    merged results unfolded (``sub_chunks="expand"``) and its rows checked."""
    if isinstance(results, (str, os.PathLike)):
        source = source or str(results)
        results = read_results_for_scoring(Path(results))
    source = source or "<results>"
    if not isinstance(results, pd.DataFrame):
        if results.unfolded is not None and sub_chunks != "expand":
            raise UsageError(argument="sub_chunks", allowed='"expand" for codes whose merged results are unfolded '
                             "(score the results table to ignore them)", got=sub_chunks)
        return results, results.unfolded or 0, source
    if sub_chunks == "expand":
        rc = result_codes(results, source=source)
        return rc, rc.unfolded or 0, source
    return _checked_codes(results, source), 0, source


#: the columns of a results table its codes are made of (:meth:`ResultCodes.from_frame`), and the one unfolding reads
_CODE_COLUMNS = frozenset({"query_id", "stage", "repeat", "rank", "chunk_id", "status", "latency_ms", "sub_chunk_ids",
                           "shown_chunk_ids"})


def result_codes(results: pd.DataFrame, *, source: str = "<results>") -> ResultCodes:
    """A results table as the codes :func:`~weknora_nb.core.scoring.score` scores: merged results unfolded
    (:func:`expand_sub_chunks`, their number in :attr:`ResultCodes.unfolded`), rows checked (a
    :class:`ResultsError` naming ``source``). Scoring the codes again and again skips both steps: what a
    :class:`~weknora_nb.core.run.Run` keeps. Only the columns the codes are made of are unfolded (the other
    columns' rows are not made)."""
    expanded, n_expanded = expand_sub_chunks(results[[c for c in results.columns if c in _CODE_COLUMNS]])
    rc = _checked_codes(expanded, source)
    rc.unfolded = n_expanded
    return rc


def _checked_codes(results: pd.DataFrame, source: str) -> ResultCodes:
    rc = ResultCodes.from_frame(results)
    bad = rc.check(source)  # a table built by hand gets read_results's row checks too (reductions: cheap)
    if bad:
        raise ResultsError(source, bad)
    return rc
