"""Findings of a knowledge-base integrity check (docs/method.md section 1: verify the vector data
before measuring), whatever found them: the API inventory or the Postgres tables.

A :class:`Finding` is one problem (or one fact a reader must know) about one subject: a chunk, a
knowledge, an embeddings row, an index. ``check`` names the rule (see :data:`CHECKS`); ``severity``
is ``problem`` (the check fails: exit 1) or ``info`` (shown, not failing). Findings go to JSON as
plain dicts (:meth:`Finding.to_json`) in the run's manifest (``integrity``) and in ``check --json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PROBLEM, INFO = "problem", "info"

#: every rule a check applies -> what it means, one line (shown in reports next to the count)
CHECKS: dict[str, str] = {
    # through the API (the chunk inventory and the test set's labels)
    "label_chunk_missing": "a labelled chunk id is not in the knowledge base",
    "label_chunk_disabled": "a labelled chunk is disabled (WeKnora does not retrieve it)",
    "label_chunk_failed_parse": "a labelled chunk belongs to a knowledge whose parsing failed or was cancelled",
    "label_chunk_unsearchable": "a labelled chunk search can never return: its index_status is processing or "
                                "failed, or it is a parent_text chunk (search returns its children)",
    "knowledge_without_chunks": "a knowledge has no chunks",
    "knowledge_failed_parse": "a knowledge's parsing failed or was cancelled",
    "knowledge_not_ready": "a knowledge is still being parsed or deleted: its chunks may change",
    "duplicate_content": "chunks with identical content in one knowledge base",
    "inventory_incomplete": "the chunk listing fell short of the total the server announced",
    # through Postgres (read-only)
    "chunk_without_embedding": "an enabled chunk has no embeddings row: the vector path cannot find it",
    "embedding_orphan": "an embeddings row whose chunk is gone or soft-deleted",
    "embedding_of_disabled_chunk": "an enabled embeddings row whose chunk is disabled",
    "duplicate_vector": "identical vectors for different chunks in one knowledge base",
    "near_duplicate_vector": "near-identical vectors (cosine above the threshold) for different chunks",
    "dimension_mismatch": "embeddings rows whose dimension differs from the knowledge base's model",
    "no_vector_index": "no ANN index covers the knowledge base's dimension: every search is exact",
    "index_not_used": "the planner does not use the vector index for a typical query",
    # found during a run
    "changed_during_run": "the knowledge base's content or retrieval config changed during the run",
}


@dataclass(frozen=True)
class Finding:
    """One finding: ``check`` (a key of :data:`CHECKS`), ``severity`` (``problem`` / ``info``), ``subject``
    (the chunk, knowledge, row or index id), its ``knowledge_base_id`` (None when not one KB's), a one-line
    ``detail``, and ``data`` (JSON-able facts behind it, e.g. the other chunk of a duplicate pair)."""

    check: str
    subject: str
    detail: str
    severity: str = PROBLEM
    knowledge_base_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"unknown check {self.check!r}; known: {sorted(CHECKS)}")
        if self.severity not in (PROBLEM, INFO):
            raise ValueError(f"severity must be {PROBLEM!r} or {INFO!r}, got {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON object (every field)."""
        return asdict(self)


def findings_from_json(items: list[dict[str, Any]] | None) -> list[Finding]:
    """Findings back from :meth:`Finding.to_json` objects (a manifest's, a ``check --json``'s)."""
    return [Finding(**item) for item in items or []]


#: the checks through the API, in report order (the label checks need a test set)
LABEL_CHECKS: tuple[str, ...] = ("label_chunk_missing", "label_chunk_disabled", "label_chunk_failed_parse",
                                 "label_chunk_unsearchable")
API_CHECKS: tuple[str, ...] = (*LABEL_CHECKS, "knowledge_without_chunks", "knowledge_failed_parse",
                               "knowledge_not_ready", "duplicate_content", "inventory_incomplete")
#: the checks through a read-only Postgres DSN
DATABASE_CHECKS: tuple[str, ...] = ("chunk_without_embedding", "embedding_orphan", "embedding_of_disabled_chunk",
                                    "duplicate_vector", "near_duplicate_vector", "dimension_mismatch",
                                    "no_vector_index", "index_not_used")
#: the checks of a collection (start and end of the run compared)
RUN_CHECKS: tuple[str, ...] = ("changed_during_run",)

#: the checks that make a labelled chunk unfindable or ambiguous -> the marker a drill-down shows beside the label
BROKEN_CHUNK: dict[str, str] = {"label_chunk_missing": "missing", "label_chunk_disabled": "disabled",
                                "label_chunk_failed_parse": "parse failed", "label_chunk_unsearchable": "unsearchable",
                                "chunk_without_embedding": "no embedding", "duplicate_content": "duplicated"}


def merge_findings(*groups: list[Finding]) -> list[Finding]:
    """The findings of several sources (the manifest's, a ``check.json``'s) with each (check, subject,
    knowledge base) once: the first source's finding wins."""
    seen: set[tuple[str, str, str | None]] = set()
    out: list[Finding] = []
    for group in groups:
        for f in group:
            key = (f.check, f.subject, f.knowledge_base_id)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def summary_rows(findings: list[Finding], *, first: int = 5) -> list[dict[str, Any]]:
    """One row per check that found something, in :data:`CHECKS` order: ``check``, ``meaning``, ``severity``
    (``problem`` when any of its findings is one), ``count`` (findings), ``problems`` (of them, problems) and
    ``first subjects`` (the first ``first`` subjects, comma-joined, then ``... (+n)``)."""
    by_check: dict[str, list[Finding]] = {}
    for f in findings:
        by_check.setdefault(f.check, []).append(f)
    rows = []
    for check in (c for c in CHECKS if c in by_check):
        group = by_check[check]
        subjects = [f.subject for f in group]
        shown = ", ".join(subjects[:first]) + (f" ... (+{len(subjects) - first})" if len(subjects) > first else "")
        n_problems = sum(f.severity == PROBLEM for f in group)
        rows.append({"check": check, "meaning": CHECKS[check], "severity": PROBLEM if n_problems else INFO,
                     "count": len(group), "problems": n_problems, "first subjects": shown})
    return rows


def describe_findings(findings: list[Finding], *, checks: list[str] | tuple[str, ...], first: int = 5) -> str:
    """A few lines for a person: each check that found something (problems first) with its count, meaning and
    first subjects, then the verdict: ``N problem(s) found by M checks`` or ``no problems found by M checks``."""
    rows = sorted(summary_rows(findings, first=first), key=lambda r: r["severity"] != PROBLEM)
    lines = []
    for r in rows:
        tag = "PROBLEM" if r["severity"] == PROBLEM else "info"
        mixed = f", {r['problems']} of them problems" if 0 < r["problems"] < r["count"] else ""
        lines.append(f"{tag:7s} {r['check']}: {r['count']}{mixed} ({r['meaning']})")
        lines.append(f"        {r['first subjects']}")
        lines += [f"        - {f.detail}" for f in [f for f in findings if f.check == r["check"]][:min(first, 3)]]
    n_problems = sum(f.severity == PROBLEM for f in findings)
    verdict = (f"{n_problems} problem(s) found by {len(checks)} checks" if n_problems
               else f"no problems found by {len(checks)} checks")
    return "\n".join([*lines, verdict])


def broken_chunks(findings: list[Finding]) -> dict[str, list[str]]:
    """Chunk id -> the markers of :data:`BROKEN_CHUNK` that apply to it (``missing``, ``disabled``, ``parse
    failed``, ``no embedding``, ``duplicated``), for a drill-down to show beside a label. A duplicate group
    marks every chunk of ``data["chunk_ids"]``; the other checks mark their subject."""
    out: dict[str, list[str]] = {}
    for f in findings:
        marker = BROKEN_CHUNK.get(f.check)
        if marker is None:
            continue
        ids = f.data.get("chunk_ids") if f.check == "duplicate_content" else None
        for chunk_id in ids if isinstance(ids, list) else [f.subject]:
            marks = out.setdefault(str(chunk_id), [])
            if marker not in marks:
                marks.append(marker)
    return out
