"""Step 3 of scoring: which requests are scored, and why each other one is not.

A request is scored when its status is ``ok`` and its query is a valid query of the test set (one chunk of
grade >= 1 at least); every other request carries its reason: an unknown query id, an invalid query,
``failed: <kind>``, or :data:`SKIPPED_REASON` (a chat whose server skipped retrieval: no failure, docs/method.md
section 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from weknora_nb.core.requests import Requests
from weknora_nb.core.results import SKIPPED
from weknora_nb.core.testset import TestSet

#: the reason an invalid query is not scored
INVALID = "invalid query (no chunk of grade >= 1)"
#: the reason a skipped request is not scored
SKIPPED_REASON = "skipped: the server skipped retrieval (an intent such as a greeting or chit-chat)"


@dataclass
class Selection:
    """Which requests are scored (step 3), and why the others are not."""

    ts_query: np.ndarray  # each request's query as a row of the test set, -1 when unknown
    status: np.ndarray    # each request's status name
    known: np.ndarray     # the test set holds the query
    scored: np.ndarray    # ok, of a known and valid query
    reason: np.ndarray    # why a request is not scored (None when scored)


def select(req: Requests, testset: TestSet, q_in_ts: np.ndarray) -> Selection:
    """Step 3: a request is scored when its status is ``ok`` and its query is a valid query
    of the test set; the reason of every other request (unknown query id, invalid query,
    ``failed: <kind>``). ``q_in_ts``: :attr:`Positions.in_testset
    <weknora_nb.core.scoring.relevance.Positions>`."""
    ts_q = testset.queries
    ts_valid = ts_q["valid"].to_numpy(dtype=bool)
    r_ts = q_in_ts[req.r_query]
    r_st = req.status
    status = req.statuses[r_st] if req.n else np.zeros(0, object)
    ok_label = np.flatnonzero(req.statuses == "ok")
    ok = r_st == ok_label[0] if len(ok_label) else np.zeros(req.n, bool)
    known = r_ts >= 0
    valid = np.zeros(req.n, bool)
    valid[known] = ts_valid[r_ts[known]]
    reason = np.full(req.n, None, dtype=object)
    reason[~known] = "unknown query id (not in the test set)"
    reason[known & ~valid] = INVALID
    skipped = known & valid & (status == SKIPPED)
    failed = known & valid & ~ok & ~skipped
    if failed.any():
        reason[failed] = np.char.add("failed: ", status[failed].astype(str))
    reason[skipped] = SKIPPED_REASON
    return Selection(ts_query=r_ts, status=status, known=known, scored=ok & known & valid, reason=reason)
