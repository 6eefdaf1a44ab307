"""The vector store as the reports show it (docs/method.md section 12): what a run folder's vector-store trace
(``vector_trace.json``, written by ``weknora-nb check --out``) says about the ANN index, one call a cell.

:func:`vector_store_table` puts runs side by side (the baseline first): whether Postgres's planner uses the
vector index for WeKnora's query, the index's own recall@K against exact search at WeKnora's ``ef_search``
(the index forced) and of the search as planned, and the share of vector misses that are index misses (as
planned, and through the index). :func:`ef_sweep` draws the index's recall@10 against ``ef_search``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from IPython.display import HTML

from weknora_nb.core.errors import ResultsError, reading
from weknora_nb.core.run import VECTOR_TRACE_SUMMARY
from weknora_nb.reports import safe
from weknora_nb.reports.figures import _done, _fig, log_scale


def read_trace_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run folder's ``vector_trace.json``, or None when no trace was written there."""
    path = Path(run_dir) / VECTOR_TRACE_SUMMARY
    if not path.is_file():
        return None
    with reading(path, ResultsError):
        return json.loads(path.read_text(encoding="utf-8"))


def _row(name: str, s: dict[str, Any]) -> dict[str, Any]:
    w = s.get("weknora") or {}
    k = str(w.get("top_k", ""))
    uses = list((s.get("planner_uses_index") or {}).values())
    return {"run": name, "planner uses the index": "yes" if uses and all(uses) else "no" if uses else "?",
            "ef_search (WeKnora)": w.get("ef_search"),
            "index recall@10": (s.get("recall") or {}).get("10"),
            f"index recall@{k}": (s.get("recall") or {}).get(k),
            "recall@10 as planned": (s.get("recall_as_planned") or {}).get("10"),
            f"index-miss share @{k} (as planned)": (s.get("index_miss_share") or {}).get(k),
            f"index-miss share @{k} (through the index)": (s.get("index_miss_share_index") or {}).get(k),
            "relevant pairs": s.get("relevant_pairs"), "queries": s.get("queries")}


def _sweep_points(summary: dict[str, Any], k: str) -> list[tuple[float, float]]:
    """(ef_search, recall@k) of each sweep row of a trace summary that has both."""
    points = [(r.get("ef_search"), (r.get("recall") or {}).get(k)) for r in summary.get("sweep") or []]
    return [(e, r) for e, r in points if e is not None and r is not None]


def vector_store_table(run_dirs: Iterable[str | Path]) -> HTML:
    """One row per run with a trace (the first is the baseline); a sentence when none of them has one."""
    rows = [_row(Path(d).name, s) for d in run_dirs if (s := read_trace_summary(d)) is not None]
    if not rows:
        return HTML(safe.text("No vector-store trace in these run folders: run weknora-nb check with --dsn, "
                              "--embeddings-url, --embeddings-model, --testset and --out RUN_DIR to add one."))
    frame = pd.DataFrame(rows)
    return HTML(safe.table(frame.round(4)))


def ef_sweep(run_dirs: Iterable[str | Path], k: str = "10") -> Any:
    """The index's recall@``k`` against exact search at each ``ef_search`` of the sweep, one line per run;
    WeKnora's ``ef_search`` marked. None when no run has a trace with a point to draw (a trace of a test set
    with no relevant pair sweeps nothing)."""
    traces = [(Path(d).name, s) for d in run_dirs if (s := read_trace_summary(d)) is not None]
    lines = [(name, s, points) for name, s in traces if (points := _sweep_points(s, k))]
    if not lines:
        return None
    fig, ax = _fig(7, 3.5)
    for name, s, points in lines:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=name)
        ef = (s.get("weknora") or {}).get("ef_search")
        if ef is not None:
            ax.axvline(ef, color="grey", linestyle=":", linewidth=1)
    log_scale(ax)
    ax.set_xlabel("hnsw.ef_search (dotted: WeKnora's for this query size)")
    ax.set_ylabel(f"index recall@{k} vs exact")
    ax.set_ylim(min(0.9, ax.get_ylim()[0]), 1.005)
    ax.legend()
    ax.set_title("The vector index's recall against exact search")
    return _done(fig)
