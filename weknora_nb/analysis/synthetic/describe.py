"""The closing note of a generated test set, in lines a person reads (what ``testset generate`` prints): the count
reached or not, each filter's count, the quota and the busiest document, the types, the overlap, the generator
(and that it is not a language model when the sandbox's rule-based generator wrote the questions), the cost."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def describe_note(note: Mapping[str, Any]) -> str:
    """The closing note (:meth:`~.curate.SyntheticCurator.closing_note`) as lines."""
    f = note.get("filters") or {}
    trip = f.get("round_trip") or {}
    quota = note.get("quota") or {}
    gen = note.get("generator") or {}
    ledger = note.get("ledger") or {}
    calls = note.get("calls") or {}
    lines = [f"{note.get('kept')} of {note.get('requested')} questions kept"
             + ("" if note.get("reached") else f" (short: {note.get('why_short', 'see the counts')})")
             + f", language {note.get('language')}, {f.get('tasks')} tasks in {f.get('rounds')} round(s)",
             f"written: {f.get('generated')}; generation failed: {_kinds(f.get('generation_failed'))}; "
             f"unanswerable: {f.get('unanswerable')}; check failed: {f.get('check_failed')} "
             f"({_kinds(f.get('check_failed_by_kind'))}); near-duplicates: {f.get('near_duplicates')}",
             f"round trip at depth {trip.get('depth')} ({trip.get('mode')}): {trip.get('hit')} found their source "
             f"chunk, {trip.get('miss')} did not, {trip.get('failed')} unchecked (search failed: "
             f"{_kinds(trip.get('searches_failed_by_kind'))}), {trip.get('dropped')} dropped",
             f"quota: at most {quota.get('per_document')} per document; the busiest gave "
             f"{quota.get('most_kept_by_a_document')}; over quota: {len(quota.get('documents_over_quota') or [])} "
             f"document(s); left for the quotas or n: {f.get('over_quota')}",
             "types: " + ", ".join(f"{t} {v.get('kept')}/{v.get('target')}"
                                   for t, v in (note.get("by_question_type") or {}).items()),
             f"overlap with the source chunk: mean {_num((note.get('overlap') or {}).get('mean'))}, median "
             f"{_num((note.get('overlap') or {}).get('median'))}",
             f"generator: {gen.get('model')} at {gen.get('server')}; {calls.get('made', 0)} call(s) made, "
             f"{calls.get('served_by_cache', 0)} from the cache, {calls.get('records_already_in_the_log', 0)} "
             f"record(s) already done; tokens {ledger.get('prompt_tokens', 0)} + {ledger.get('completion_tokens', 0)},"
             f" cost {ledger.get('cost', 0.0):.4f}"]
    if gen.get("note"):
        lines.append(f"note: {gen['note']}")
    if note.get("stopped_by_max_cost"):
        lines.append("stopped by --max-cost: what was done is kept; run again with a higher limit to go on")
    return "\n".join(lines)


def _kinds(counts: Any) -> str:
    if not counts:
        return "0"
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"
