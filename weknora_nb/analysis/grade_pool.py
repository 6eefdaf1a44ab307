"""What an LLM grades (docs/method.md section 16): the pool of runs, every unlabelled chunk and a calibration sample.

:func:`grading_items` pools the runs (:func:`weknora_nb.analysis.pooling.pool`, depth K, every stage or the ones
named) and returns one item per chunk to grade: every pooled chunk **without** a label (``purpose`` ``fill``), and
``calibration`` chunks drawn at random among the pooled chunks **with** a label (the first ``calibration`` of them
sorted by sha256(seed, query id, chunk id)), graded so that the grader can be measured against people before any
new labelling. :mod:`weknora_nb.collect.judge.relevance` grades them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.analysis.pooling import Pool, pool
from weknora_nb.core.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

    from weknora_nb.core.testset import TestSet

#: the columns of an item to grade
ITEM_COLUMNS = ("query_id", "query", "chunk_id", "knowledge_title", "content", "purpose")


def grading_items(testset: TestSet | str | Path, runs: Sequence[str | Path], *, depth: int = 10,
                  stages: Sequence[str] | None = None, calibration: int = 0,
                  seed: int = 0) -> tuple[pd.DataFrame, dict[str, Any], Pool]:
    """``(items, pool description, pool)``: the chunks to grade (module docstring; :data:`ITEM_COLUMNS`), what
    was pooled (test set path and hash, runs by name, depth, stages, calibration size, seed: recorded in the
    grades' manifest) and the pool itself (its coverage per run and stage)."""
    import pandas as pd

    from weknora_nb.analysis.pooling import _run_names
    from weknora_nb.core.testset import load_testset

    if isinstance(calibration, bool) or not isinstance(calibration, int) or calibration < 0:
        raise UsageError(argument="--calibration", allowed="an integer >= 0", got=calibration)
    ts = testset if not isinstance(testset, (str, Path)) else load_testset(testset)
    p = pool(ts, runs, depth=depth, stages=stages, with_labelled=True)
    rows = p.rows
    fill = rows[~rows["labelled"]].assign(purpose="fill")
    labelled = rows[rows["labelled"]]
    order = sorted(range(len(labelled)), key=lambda i: hashlib.sha256(
        f"{seed}\x00{labelled['query_id'].iat[i]}\x00{labelled['chunk_id'].iat[i]}".encode()).hexdigest())
    calib = labelled.iloc[order[:calibration]].assign(purpose="calibration")
    items = pd.concat([fill, calib], ignore_index=True)[list(ITEM_COLUMNS)]
    described = {"testset": {"path": str(testset) if isinstance(testset, (str, Path)) else ts.source,
                             "hash": ts.hash},
                 "runs": {name: str(Path(folder).resolve()) for name, folder in _run_names(runs)},
                 "depth": depth, "stages": list(stages) if stages else None, "calibration": calibration,
                 "seed": seed, "fill": len(fill), "labelled_in_pool": len(labelled)}
    return items, described, p
