"""Shared helpers for the test suite."""

from __future__ import annotations

import pandas as pd
import pytest

from weknora_nb.core.results import _coerce


def results_frame(rows: list[tuple]) -> pd.DataFrame:
    """Build a typed results table from (query_id, stage, repeat, rank, chunk_id, score[, status]) tuples."""
    cols = ["query_id", "stage", "repeat", "rank", "chunk_id", "score", "status"]
    full = [tuple(r) + ("ok",) * (7 - len(r)) for r in rows]
    return _coerce(pd.DataFrame(full, columns=cols), "<test>", [])


def ranked(query_id: str, chunks: list[str], stage: str = "final", repeat: int = 1) -> list[tuple]:
    """Rows of one successful request returning ``chunks`` in order (scores falling)."""
    if not chunks:
        return [(query_id, stage, repeat, None, None, None, "ok")]
    return [(query_id, stage, repeat, i + 1, c, float(len(chunks) - i), "ok") for i, c in enumerate(chunks)]


def failed(query_id: str, kind: str = "timeout", stage: str = "final", repeat: int = 1) -> list[tuple]:
    return [(query_id, stage, repeat, None, None, None, kind)]


@pytest.fixture
def worked_testset():
    from weknora_nb import TestSet
    return TestSet.from_records([
        {"query_id": "q1", "query": "worked example", "relevant": {"A": 3, "B": 2, "C": 1}},
    ])
