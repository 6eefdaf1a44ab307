"""What a collection leaves when it ends: the results table and the answers, compiled from the checkpoint,
and the counts per stage and status that the manifest and :class:`RunSummary` report.

``results.parquet`` (:mod:`weknora_nb.core.results`) holds one row per result of every request, ordered by
stage, repeat, query and rank (a request without results: one row without a chunk), with the chunks each
result shows besides itself (``shown_chunk_ids``, :mod:`.shown`) and the request's ``flags`` (:mod:`.flags`);
``answers.jsonl`` one line per answer of a chat stage, with its inline citations (and the stream's non-terminal
errors, when it had any).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.collect.run.arguments import Arguments
from weknora_nb.collect.run.checkpoint import Records
from weknora_nb.collect.run.folder import RunFolder
from weknora_nb.collect.run.shown import Families
from weknora_nb.collect.run.stages import Stage
from weknora_nb.core.errors import writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.results import NOT_FAILED, SKIPPED, write_results
from weknora_nb.core.run import ANSWERS, RESULTS


@dataclass
class RunSummary:
    """The outcome of a collection."""

    run_dir: Path
    counts: dict[str, dict[str, int]]  # stage -> {"ok": n, "<kind>": n}
    n_requests: int
    n_skipped: int   # requests already done (a resumed run): not requested again
    seconds: float
    complete: bool
    failed: list[dict[str, Any]] = field(default_factory=list)
    request_seconds: float = 0.0  # the request phase alone: first request sent to last one recorded
    flags: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> {flag: requests}

    @property
    def requests_per_second(self) -> float:
        """Throughput of the request phase (requests recorded / ``request_seconds``)."""
        return self.n_requests / self.request_seconds if self.request_seconds > 0 else 0.0

    def describe(self) -> str:
        """A few lines for a person: requests made and skipped, time, counts per stage and status."""
        rate = f" ({self.requests_per_second:.1f} req/s while requesting)" if self.request_seconds > 0 else ""
        lines = [f"run {self.run_dir}: {self.n_requests} request(s) made, {self.n_skipped} already done, "
                 f"{self.seconds:.1f} s{rate}"]
        for stage, c in self.counts.items():
            parts = ", ".join(f"{k} {v}" for k, v in c.items())
            flagged = ", ".join(f"{k} {v}" for k, v in self.flags.get(stage, {}).items())
            lines.append(f"  {stage:10s} {parts}" + (f" (flagged: {flagged}; heuristic)" if flagged else ""))
        if any(c.get(SKIPPED) for c in self.counts.values()):
            lines.append("skipped: chats whose server skipped retrieval (greeting, chit-chat); not failures, not "
                         "scored")
        if not self.complete:
            lines.append(f"INCOMPLETE: {len(self.failed)} request(s) failed; run again with resume and "
                         "retry_failed (--resume --retry-failed) to retry them")
        return "\n".join(lines)


def write_run_results(args: Arguments, run: RunFolder, families: Families | None = None) -> None:
    """Compile the checkpoint's records into ``results.parquet`` (and ``answers.jsonl``); ``families``: the
    parent-child families of the run's inventory, for ``shown_chunk_ids``. Blocking."""
    results = compile_results(run.done, args.stages, [q for q, _ in run.queries], args.repeats, families)
    with writing(run.run_dir / RESULTS):
        write_results(results, run.run_dir / RESULTS)
    _write_answers(run.done, run.run_dir / ANSWERS)


#: the results columns :func:`compile_results` writes, in order
COLUMNS = ("query_id", "stage", "repeat", "rank", "chunk_id", "score", "knowledge_id", "chunk_index", "match_type",
           "latency_ms", "status", "error", "sub_chunk_ids", "base_score", "model_score", "parent_chunk_id",
           "shown_chunk_ids", "flags")
#: the fields of a checkpoint row (:mod:`.checkpoint`; an older checkpoint's rows are shorter)
_WIDTH = 11


def compile_results(done: Records, stages: list[Stage], query_order: list[str], repeats: int,
                    families: Families | None = None) -> pd.DataFrame:
    """Checkpoint records to the results table, ordered by stage, repeat, query, rank. ``shown_chunk_ids`` is
    :meth:`Families.shown` of every returned chunk (``families`` None: none known but what results carry)."""
    families = families or Families()
    cols: dict[str, list[Any]] = {k: [] for k in COLUMNS}
    empty = [[None] * _WIDTH]
    list_text: dict[tuple[Any, ...], str] = {}   # a list's JSON text, written once (repeats hold the same lists)
    for s in stages:
        for r in range(1, repeats + 1):
            for q in query_order:
                rec = done.get((q, s.name, r))
                if rec is None:
                    continue
                rows = [[*row, *[None] * (_WIDTH - len(row))] for row in rec.get("rows") or empty]  # older: shorter
                n = len(rows)
                rank, cid, score, kid, cidx, mt, subs, base, model, parent, ctype = zip(*rows, strict=True)
                cols["query_id"] += [q] * n
                cols["stage"] += [s.name] * n
                cols["repeat"] += [r] * n
                cols["rank"] += rank
                cols["chunk_id"] += cid
                cols["score"] += score
                cols["knowledge_id"] += kid
                cols["chunk_index"] += cidx
                cols["match_type"] += mt
                cols["latency_ms"] += [rec.get("latency_ms")] * n
                cols["status"] += [rec["status"]] * n
                cols["error"] += [rec.get("error")] * n
                cols["sub_chunk_ids"] += [_list_text(x, list_text) if x else None for x in subs]
                cols["base_score"] += base
                cols["model_score"] += model
                cols["parent_chunk_id"] += parent
                cols["shown_chunk_ids"] += [
                    None if c is None else _list_text(families.shown(s.endpoint, c, t, p, x or []), list_text)
                    for c, t, p, x in zip(cid, ctype, parent, subs, strict=True)]
                cols["flags"] += [",".join(rec["flags"]) if rec.get("flags") else None] * n
    return pd.DataFrame({c: _typed(c, values) for c, values in cols.items()})


def _typed(column: str, values: list[Any]) -> Any:
    """A results column of :func:`compile_results` from its values (the checkpoint's: checked numbers, strings
    and None), built with its type (pandas infers none): Int64, int64, float64 (None as NaN) or string."""
    if column in ("rank", "chunk_index", "match_type"):
        return pd.array(values, dtype="Int64")
    if column == "repeat":
        return np.array(values, dtype=np.int64)
    if column in ("score", "latency_ms", "base_score", "model_score"):
        return np.array(values, dtype=np.float64)
    return pd.array(values, dtype="string")


def _list_text(ids: list[Any], written: dict[tuple[Any, ...], str]) -> str:
    """``json.dumps(ids, ensure_ascii=False)``, each list's text kept in ``written``."""
    key = tuple(ids)
    text = written.get(key)
    if text is None:
        text = written[key] = json.dumps(ids, ensure_ascii=False)
    return text


def _write_answers(done: Records, path: Path) -> None:
    """The answers and citations of the chat requests, one JSON line each (no file when there are none); a chat
    whose server skipped retrieval says so (``retrieval_skipped``), one whose stream carried non-terminal errors
    keeps them (``stream_errors``)."""
    recs = [r for r in done.values() if "answer" in r]
    if not recs:
        return
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for r in sorted(recs, key=lambda r: (r["stage"], r["repeat"], r["query_id"])):
            line = {k: r[k] for k in ("query_id", "stage", "repeat", "answer", "citations")}
            if r["status"] == SKIPPED:
                line["retrieval_skipped"] = True
            if r.get("stream_errors"):
                line["stream_errors"] = r["stream_errors"]
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")


def flag_counts(done: Records, stages: list[Stage]) -> dict[str, dict[str, int]]:
    """Requests per stage and flag (``{"final": {"vector_path_missing": 2}}``; stages without flags left out)."""
    out: dict[str, dict[str, int]] = {}
    for (_, stage, _), rec in sorted(done.items()):
        for f in rec.get("flags") or []:
            out.setdefault(stage, {})[f] = out.get(stage, {}).get(f, 0) + 1
    return {s.name: out[s.name] for s in stages if s.name in out}


def tally(done: Records, stages: list[Stage]) -> tuple[dict[str, dict[str, int]], list[dict[str, Any]]]:
    """Requests per stage and status (``{"final": {"ok": 30, "server": 3}}``, in stage order), and the
    failed requests (query_id, stage, repeat, status, error), sorted by key; a skipped request is no failure."""
    counts: dict[str, dict[str, int]] = {}
    failed = []
    for (query_id, stage, repeat), rec in sorted(done.items()):
        c = counts.setdefault(stage, {"ok": 0})
        c[rec["status"]] = c.get(rec["status"], 0) + 1
        if rec["status"] not in NOT_FAILED:
            failed.append({"query_id": query_id, "stage": stage, "repeat": repeat, "status": rec["status"],
                           "error": rec.get("error")})
    return {s.name: counts.get(s.name, {"ok": 0}) for s in stages}, failed
