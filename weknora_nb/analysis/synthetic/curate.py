"""What is kept of the generated questions, the test-set records made of them, and the closing note that counts the
rest (docs/method.md section 17).

:class:`SyntheticCurator` is the pure side of ``weknora-nb testset generate``: it plans the tasks of each round
(:class:`~.plan.Planner`) and decides what is kept; the collector's side (``weknora_nb.collect.generate``) makes the
calls. The filters, in this order, each counted:

1. **failed**: a generation or a check whose call or reply failed is never a question (counted by kind);
2. **unanswerable**: the model, asked again with the question and its chunks, says they do not answer it;
3. **near-duplicates**: questions equal once normalised as ``testset sample`` normalises
   (:func:`weknora_nb.analysis.sampling.normalise`: NFKC, whitespace, trailing punctuation, case) or grouped by
   its near-duplicate rule (:func:`weknora_nb.analysis.sampling.cluster`: Indel similarity >= 0.9 and the same
   numbers); the question of the earliest task of each group is kept;
4. **round trip**: hybrid-search of the question at depth K finds its source chunk (``hit``) or not (``miss``);
   ``keep`` keeps every question, ``flag`` keeps them and tags a miss ``round-trip-miss`` (a failed search
   ``round-trip-unchecked``), ``drop`` keeps hits only. Dropping misses keeps only what the system already finds:
   it flatters retrieval further, which is why ``flag`` is the default;
5. **quotas**: in task order, a question is taken while its document is under its quota and its question type
   and chunk type under their targets; a second pass fills up to ``n`` under the document quota alone. No
   document ever exceeds its quota (``over_quota`` counts the questions left for that, or because ``n`` was met).

A record: ``query_id`` ``g-`` + 12 hex digits of the SHA-256 of the normalised question, ``query``, ``relevant``
(the source chunk at grade 3, the other chunk of a paired question at grade 2), ``query_type`` (the generation
type), ``tags`` (``synthetic``; ``vague``; ``multi-answer`` for paired types; the round-trip tag), ``answer`` (the
model's reference answer), ``source: synthetic`` and ``overlap`` (:func:`~.overlap.lexical_overlap` with the
source chunk, 4 decimals).
"""

from __future__ import annotations

import hashlib
import statistics
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from weknora_nb.analysis.sampling import Cluster, Sample, cluster, normalise, write_candidates
from weknora_nb.analysis.synthetic.overlap import lexical_overlap
from weknora_nb.analysis.synthetic.plan import Planner
from weknora_nb.core.synthetic import (
    MISS_TAG,
    OTHER_GRADE,
    PAIRED,
    QUESTION_TYPES,
    SOURCE_GRADE,
    SYNTHETIC,
    UNCHECKED_TAG,
    Candidate,
    GenerateOptions,
    Selection,
    Task,
)

#: the Indel similarity (0-1) above which two questions are one (``testset sample``'s default)
SIMILARITY = 0.9


class SyntheticCurator:
    """Plans, filters and selects the questions generated from ``chunks`` (module docstring)."""

    def __init__(self, chunks: pd.DataFrame, options: GenerateOptions):
        self.options = options
        self.planner = Planner(chunks, options)
        self.texts = {s.chunk_id: s.content for s in self.planner.sources}
        self.titles = {str(k): (str(t) if isinstance(t, str) else None)
                       for k, t in zip(chunks["knowledge_id"], chunks["knowledge_title"], strict=True)}

    @property
    def language(self) -> str:
        return self.planner.language

    def plan(self, round_no: int, selection: Selection | None) -> list[Task]:
        """The tasks of round ``round_no`` (:meth:`.plan.Planner.plan`)."""
        return self.planner.plan(round_no, selection)

    def to_search(self, candidates: list[Candidate]) -> list[Candidate]:
        """The questions whose round trip decides whether they are kept: the answerable ones, one per group of
        near-duplicates."""
        return _unique([c for c in _ordered(candidates) if c.answerable])[0]

    def select(self, candidates: list[Candidate]) -> Selection:
        """The questions kept, in task order, and the counts of each filter (module docstring)."""
        counts: Counter[str] = Counter()
        answerable = []
        for c in _ordered(candidates):
            if c.answerable is None:
                counts["check_failed"] += 1
            elif not c.answerable:
                counts["unanswerable"] += 1
            else:
                answerable.append(c)
        unique, duplicates = _unique(answerable)
        counts["near_duplicates"] = duplicates
        pool = []
        for c in unique:
            trip = c.round_trip if c.round_trip in ("hit", "miss") else "failed"
            counts[f"round_trip_{trip}"] += 1
            if self.options.round_trip == "drop" and trip != "hit":
                counts["round_trip_dropped"] += 1
                continue
            pool.append(c)
        kept = self._quota_pass(pool)
        counts["over_quota"] = len(pool) - len(kept)
        return Selection(kept, len(kept) >= self.options.n, dict(counts))

    def _quota_pass(self, pool: list[Candidate]) -> list[Candidate]:
        """Up to ``n`` of ``pool`` (in order) under the document quota, first within the type targets too."""
        n, quota = self.options.n, self.planner.doc_quota
        types, chunk_types = self.planner.type_targets, self.planner.chunk_type_targets
        by_doc, by_type, by_chunk_type = Counter[str](), Counter[str](), Counter[str]()
        taken: set[int] = set()
        for strict in (True, False):
            for i, c in enumerate(pool):
                t = c.task
                if len(taken) >= n or i in taken or by_doc[t.knowledge_id] >= quota:
                    continue
                if strict and (by_type[t.question_type] >= types.get(t.question_type, 0)
                               or by_chunk_type[t.chunk_type] >= chunk_types.get(t.chunk_type, 0)):
                    continue
                taken.add(i)
                by_doc[t.knowledge_id] += 1
                by_type[t.question_type] += 1
                by_chunk_type[t.chunk_type] += 1
        return [pool[i] for i in sorted(taken)]

    # -- what is written ----------------------------------------------------------------------
    def records(self, selection: Selection) -> list[dict[str, Any]]:
        """The test-set records of the kept questions (module docstring), in task order."""
        return [self.record(c) for c in selection.kept]

    def record(self, c: Candidate) -> dict[str, Any]:
        t = c.task
        relevant = {t.source: SOURCE_GRADE, **{other: OTHER_GRADE for other in t.chunk_ids[1:]}}
        tags = [SYNTHETIC] + (["vague"] if t.question_type == "vague" else []) + \
            (["multi-answer"] if t.question_type in PAIRED else [])
        if c.round_trip != "hit" and self.options.round_trip == "flag":
            tags.append(MISS_TAG if c.round_trip == "miss" else UNCHECKED_TAG)
        overlap = lexical_overlap(c.question, self.texts.get(t.source, ""))
        rec: dict[str, Any] = {"query_id": question_id(c.question), "query": c.question, "relevant": relevant,
                               "query_type": t.question_type, "tags": tags, "answer": c.answer or None,
                               "source": SYNTHETIC}
        if overlap is not None:
            rec["overlap"] = round(overlap, 4)
        return {k: v for k, v in rec.items() if v is not None}

    def closing_note(self, selection: Selection, run: Mapping[str, Any]) -> dict[str, Any]:
        """The summary written beside the test set: what was asked, kept, filtered (each count), the quotas and
        what each document gave, the types, the overlap, and what the collector's side reports (``run``: the
        generator, the calls and their failures, the round trips, the ledger)."""
        p, kept, n = self.planner, selection.kept, self.options.n
        by_doc = Counter(c.task.knowledge_id for c in kept)
        overlaps = [r["overlap"] for r in self.records(selection) if "overlap" in r]
        documents = {d: {"title": self.titles.get(d), "kept": by_doc.get(d, 0), "quota": p.doc_quota,
                         "eligible_chunks": len(cs)} for d, cs in sorted(p.docs.items())}
        note: dict[str, Any] = {
            "requested": n, "kept": len(kept), "reached": selection.reached, "language": self.language,
            "reachable": p.reachable,
            "eligible": {"chunks": len(p.sources), "documents": len(p.docs), "left_out": p.skipped},
            "filters": {**{k: run.get(k) for k in ("tasks", "rounds", "generated", "generation_failed",
                                                   "check_failed_by_kind")},
                        "unanswerable": selection.counts.get("unanswerable", 0),
                        "check_failed": selection.counts.get("check_failed", 0),
                        "near_duplicates": selection.counts.get("near_duplicates", 0),
                        "round_trip": {"mode": self.options.round_trip, "depth": self.options.depth,
                                       **{k: selection.counts.get(f"round_trip_{k}", 0)
                                          for k in ("hit", "miss", "failed", "dropped")},
                                       "searches_failed_by_kind": run.get("searches_failed", {})},
                        "over_quota": selection.counts.get("over_quota", 0)},
            "quota": {"per_document": p.doc_quota, "most_kept_by_a_document": max(by_doc.values(), default=0),
                      "documents_over_quota": sorted(d for d, k in by_doc.items() if k > p.doc_quota),
                      "documents_without_question": sum(1 for d in p.docs if not by_doc.get(d))},
            "by_question_type": {t: {"target": p.type_targets.get(t, 0),
                                     "kept": sum(1 for c in kept if c.task.question_type == t)}
                                 for t in QUESTION_TYPES},
            "by_chunk_type": {t: {"target": v, "kept": sum(1 for c in kept if c.task.chunk_type == t)}
                              for t, v in p.chunk_type_targets.items()},
            "overlap": {"mean": round(statistics.fmean(overlaps), 4) if overlaps else None,
                        "median": round(statistics.median(overlaps), 4) if overlaps else None},
            "by_document": documents, "options": self.options.to_dict()}
        note.update({k: v for k, v in run.items() if k not in note["filters"] and k != "searches_failed"})
        if not selection.reached:
            note["why_short"] = (f"the eligible chunks can give at most {p.reachable} question(s) "
                                 f"({len(p.sources)} chunk(s) x --per-chunk {self.options.per_chunk})"
                                 if p.reachable < n else
                                 "the filters dropped more than the rounds could replace (see filters; raise "
                                 "--max-rounds or --per-chunk, or lower --n)")
        return note


    def write(self, path: str | Path, selection: Selection, run: Mapping[str, Any]) -> Path:
        """The records as a test set (JSONL) at ``path`` and the closing note beside it (``<path>.summary.json``,
        as ``testset sample`` writes its candidates, :func:`weknora_nb.analysis.sampling.write_candidates`); the
        note's path."""
        return write_candidates(path, Sample(self.records(selection), self.closing_note(selection, run)))


def question_id(question: str) -> str:
    """``g-`` + 12 hex digits of the SHA-256 of the normalised question (stable across runs)."""
    return "g-" + hashlib.sha256(normalise(question).encode("utf-8")).hexdigest()[:12]


def _ordered(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: c.task.order)


def _unique(candidates: list[Candidate]) -> tuple[list[Candidate], int]:
    """One question per group of near-duplicates, the earliest in ``candidates``' order; and how many were left."""
    groups: dict[str, Cluster] = {}
    for c in candidates:
        key = normalise(c.question)
        g = groups.setdefault(key, Cluster(key, exact_keys={key}))
        g.spellings[c.question] += 1
    leader_of = {k: lead.key for lead in cluster(groups.values(), SIMILARITY) for k in lead.exact_keys}
    seen: set[str] = set()
    out = []
    for c in candidates:
        lead = leader_of.get(normalise(c.question))
        if lead is None or lead in seen:
            continue
        seen.add(lead)
        out.append(c)
    return out, len(candidates) - len(out)
