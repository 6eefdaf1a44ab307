r"""Where to label next: the graded queries whose pools people should complete, as a worksheet (section 16).

A graded query joins the human-labelled sample of the corrected figures (:mod:`weknora_nb.analysis.corrected`)
once every chunk of it that the LLM graded to fill a label has a person's grade; each further query shrinks the
corrected interval of a delta by a computable amount,

.. math:: h(k) = z_{0.975} \, w \sqrt{\hat\sigma^2_f / N + \hat\sigma^2_{y-f} / (n + k)}

(:func:`weknora_nb.analysis.ppi.projected_half_width`: the half-width once k more queries are labelled, the spreads
as estimated now, w the graded queries' share). The correction stays unbiased only while the labelled queries are a
**random** sample of the graded ones: a query chosen because its LLM grades look doubtful, or because it is cheap,
would bias it. So the order is random and fixed: the graded queries sorted by sha256(seed, query id), a permutation
that does not change as labels arrive or runs are added. Labelling them in this order keeps every prefix a random
sample; :func:`label_next` lists the next ``queries`` of them not yet complete, their chunks that still lack a
person's grade (never the LLM's grade: people label blind), and after each query the delta's projected half-width,
so that a team sees what its next hour of labelling buys and where to stop.

The worksheet has the columns of ``weknora-nb testset pool`` (notebook 07_label reads it; ``testset merge-labels``
or ``--labels`` takes the labels log back), plus ``sample_order`` (the query's place in the random order),
``chunks_left`` (the query's chunks to label) and ``half_width_after`` (the delta's projected half-width once this
query and those before it are complete).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import pandas as pd

from weknora_nb.analysis.corrected import Corrected, strata_of
from weknora_nb.analysis.ppi import projected_half_width
from weknora_nb.analysis.worksheet import WORKSHEET_COLUMNS
from weknora_nb.core.errors import UsageError
from weknora_nb.core.grades import Grades
from weknora_nb.core.run import Run
from weknora_nb.core.testset import TestSet


@dataclass
class NextLabels:
    """The worksheet rows (:data:`WORKSHEET_COLUMNS` + ``sample_order``, ``chunks_left``, ``half_width_after``)
    and what they buy: the delta's half-width now and after each query (``steps``: ``queries``, ``chunks``,
    ``half_width``)."""

    rows: pd.DataFrame
    steps: pd.DataFrame
    what: str
    now: float
    seed: int

    def describe(self) -> str:
        if self.rows.empty:
            return f"{self.what}: every graded query is fully labelled; nothing left to label"
        lines = [f"{self.what}: corrected interval half-width now {_f(self.now)}",
                 f"the next {self.rows['query_id'].nunique()} queries of the random order (seed {self.seed}) hold "
                 f"{len(self.rows)} chunks to label; label them in this order:"]
        for s in self.steps.itertuples():
            after = "" if math.isnan(s.half_width) else f": half-width {s.half_width:.4f}"
            lines.append(f"  after {s.queries:>3} queries ({s.chunks:>4} chunks){after}")
        return "\n".join(lines)


def _f(x: float) -> str:
    return "n/a (fewer than 2 labelled queries yet)" if math.isnan(x) else f"{x:.4f}"


def sample_order(query_ids: list[str], seed: int) -> list[str]:
    """``query_ids`` in the fixed random order of the module docstring."""
    return sorted(query_ids, key=lambda q: hashlib.sha256(f"{seed}\x00{q}".encode()).hexdigest())


def label_next(out: Corrected, grades: Grades, human: TestSet, *, run: str | None = None,
               metric: str = "ndcg@5", queries: int = 20, seed: int = 0) -> NextLabels:
    """The worksheet of the next ``queries`` graded queries to complete, in the random order (module docstring),
    for the delta of ``run`` (default the last) against the first run in ``out`` (its mean with one run)."""
    if isinstance(queries, bool) or not isinstance(queries, int) or queries < 1:
        raise UsageError(argument="--queries", allowed="an integer >= 1", got=queries)
    name = run or out.runs[-1]
    if name not in out.values:
        raise UsageError(argument="--run", allowed=out.runs, got=name)
    if metric not in out.values[name].f.columns:
        raise UsageError(argument="--metric", allowed=list(out.values[name].f.columns), got=metric)
    f, y = out.paired(name, metric)
    labelled = set(human.qrels["query_id"].astype(str) + "\x00" + human.qrels["chunk_id"].astype(str))
    left: dict[str, list[str]] = {}
    for q, c in sorted(grades.fill_keys()):
        if f"{q}\x00{c}" not in labelled and q in f.index:
            left.setdefault(q, []).append(c)
    order = [q for q in sample_order(sorted(out.strata.index[out.strata["graded"]]), seed) if q in left][:queries]
    sampled = strata_of(f, y, out.strata)[1]
    share = sampled.size / len(f) if len(f) else math.nan
    now = projected_half_width(sampled.y, sampled.f_labelled, sampled.f_all, 0, share=share)
    texts = _texts(out.loaded)
    query_text = dict(zip(human.queries["query_id"], human.queries["query"], strict=True))
    rows, steps, chunks = [], [], 0
    for i, q in enumerate(order, start=1):
        chunks += len(left[q])
        after = projected_half_width(sampled.y, sampled.f_labelled, sampled.f_all, i, share=share)
        steps.append({"queries": i, "chunks": chunks, "half_width": after})
        for c in left[q]:
            title, content = texts.get(c, ("", ""))
            rows.append({"query_id": q, "query": query_text.get(q, ""), "chunk_id": c, "knowledge_title": title,
                         "content": content, "found_in": "graded pool", "best_rank": None, "grade": None,
                         "assessor": "", "note": f"random sample (seed {seed}), query {i}",
                         "sample_order": i, "chunks_left": len(left[q]), "half_width_after": after})
    frame = pd.DataFrame(rows, columns=[*WORKSHEET_COLUMNS, "sample_order", "chunks_left", "half_width_after"])
    what = (f"{metric} delta {name} - {out.runs[0]}" if name != out.runs[0] else f"{metric} of {name}") + \
        f" at stage {out.stage}"
    return NextLabels(frame.astype({"best_rank": "Int64", "grade": "Int64"}), pd.DataFrame(steps), what, now, seed)


def _texts(runs: list[Run]) -> dict[str, tuple[str, str]]:
    """chunk id -> (knowledge title, content) from the runs' chunk inventories."""
    out: dict[str, tuple[str, str]] = {}
    for r in runs:
        inv = r.inventory()
        if inv is None:
            continue
        titles = inv["knowledge_title"] if "knowledge_title" in inv.columns else pd.Series([""] * len(inv))
        for c, t, x in zip(inv["chunk_id"], titles, inv["content"], strict=True):
            out.setdefault(str(c), ("" if t is None or t != t else str(t), "" if x is None or x != x else str(x)))
    return out

