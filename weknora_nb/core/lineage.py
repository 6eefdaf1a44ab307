"""Versioned test sets: a new version made from judgements, with its lineage kept beside it (docs/method.md §10).

A test set's version is its content hash (:attr:`TestSet.hash`). Every command that makes a new
version from an old one (``testset merge-labels``, ``testset carry-over``) writes the new test set
``T2.jsonl`` and beside it ``T2.jsonl.lineage.json``::

    {"hash": "sha256:...",                       # T2's version
     "parent": {"hash": "sha256:...", "path": "T.jsonl"},
     "created_at": "2026-12-01T10:31:07Z", "kind": "merge-labels",
     "labels_added": 41, "labels_changed": 3, "assessors": ["li", "wang"],
     "label_files": [{"path": "labels.jsonl", "sha256": "...", "judgements": 57}],
     "resolved_by_median": 2, ...,
     "history": [<the parent's lineage>, <the grandparent's>, ...]}   # newest first

``history`` holds the parent's own lineage record (without its ``history``) and then the one
before it, so the whole chain back to the first version that had none is in one file.

Runs record the hash of the version they were scored on (``manifest["testset"]["hash"]``);
:func:`rescore_plan` decides, for two runs scored on different versions, which test set both
must be re-scored on (the newer one, when one descends from the other) or why they cannot be.

Merging judgements (:func:`merge_labels`): the latest graded judgement of every assessor (skips
are ignored); per (query, chunk), one assessor gives the grade, several agreeing give it, and
several disagreeing are resolved by the adjudicator's grade when the adjudicator judged the item,
else by the median (the lower one of an even count), and the item is listed as resolved by median.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import InputError, Problem, UsageError, reading, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.labels import Judgement, latest, read_label_entries
from weknora_nb.core.testset import TestSet, load_testset

log = logging.getLogger(__name__)

#: the lineage file of ``T2.jsonl`` is ``T2.jsonl.lineage.json``
LINEAGE_SUFFIX = ".lineage.json"


@dataclass(frozen=True)
class LabelFile:
    """The judgements of one labels file, each with the line (or worksheet row) it stands on."""

    path: str
    entries: tuple[tuple[int, Judgement], ...]
    #: what the numbers are: ``line`` (a labels log) or ``row`` (a worksheet, as a spreadsheet shows it)
    where: str = "line"

    @property
    def judgements(self) -> list[Judgement]:
        return [j for _, j in self.entries]


@dataclass(frozen=True)
class Resolved:
    """The grade a (query, chunk) gets from its judgements, and how it was reached."""

    query_id: str
    chunk_id: str
    grade: int
    #: ``single`` (one assessor), ``agreed``, ``adjudicated`` or ``median``
    how: str
    grades: dict[str, int]


@dataclass
class MergeResult:
    """What :func:`merge_labels` wrote and counted."""

    testset: TestSet
    path: Path
    lineage: dict[str, Any]
    added: int
    changed: int
    unchanged: int
    median_items: list[Resolved] = field(default_factory=list)

    def describe(self) -> str:
        """A few lines for the terminal."""
        lin = self.lineage
        lines = [f"wrote {self.path} ({self.testset.hash[:19]}..., parent {lin['parent']['hash'][:19]}...)",
                 f"labels added {self.added}, changed {self.changed}, unchanged {self.unchanged}; "
                 f"assessors: {', '.join(lin['assessors']) or '-'}",
                 f"valid queries: {lin['valid_queries']['before']} -> {lin['valid_queries']['after']} "
                 f"of {len(self.testset)}"]
        if lin.get("resolved_by_adjudicator"):
            lines.append(f"resolved by the adjudicator: {lin['resolved_by_adjudicator']}")
        if self.median_items:
            lines.append(f"resolved by median (no adjudicator's grade): {len(self.median_items)}")
            lines += [f"  {r.query_id} {r.chunk_id}: {r.grades} -> {r.grade}" for r in self.median_items[:20]]
        lines.append(f"lineage: {lineage_path(self.path)}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------
def lineage_path(testset_path: str | Path) -> Path:
    """The lineage file beside a test set: ``T2.jsonl`` -> ``T2.jsonl.lineage.json``."""
    p = Path(testset_path)
    return p.with_name(p.name + LINEAGE_SUFFIX)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex."""
    p = Path(path)
    digest = hashlib.sha256()
    with reading(p), open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_label_file(path: str | Path) -> LabelFile:
    """A labels log (JSONL, :mod:`weknora_nb.core.labels`) with the line of each judgement."""
    return LabelFile(str(path), tuple(read_label_entries(path)), "line")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------
# merging judgements
# ---------------------------------------------------------------------------------------
def resolve_judgements(judgements: Iterable[Judgement], adjudicator: str | None = None) -> list[Resolved]:
    """One grade per (query, chunk) from the latest graded judgement of each assessor (see the module
    docstring for the rule), in the order the items first appear."""
    graded = latest(j for j in judgements if j.grade is not None)
    by_item: dict[tuple[str, str], dict[str, int]] = {}
    for j in graded:
        assert j.grade is not None
        by_item.setdefault((j.query_id, j.chunk_id), {})[j.assessor] = j.grade
    out = []
    for (qid, cid), grades in by_item.items():
        values = sorted(grades.values())
        if len(grades) == 1:
            grade, how = values[0], "single"
        elif values[0] == values[-1]:
            grade, how = values[0], "agreed"
        elif adjudicator is not None and adjudicator in grades:
            grade, how = grades[adjudicator], "adjudicated"
        else:
            grade, how = values[(len(values) - 1) // 2], "median"
        out.append(Resolved(qid, cid, grade, how, dict(sorted(grades.items()))))
    return out


def _check_queries(files: Sequence[LabelFile], query_ids: set[str], testset_path: str) -> None:
    """Raise :class:`InputError` naming file and line of every judgement whose query the test set lacks."""
    problems = [Problem(f.path, line, "query_id", f"query {j.query_id!r} is not in the test set {testset_path}",
                        f.where)
                for f in files for line, j in f.entries if j.query_id not in query_ids]
    if problems:
        raise InputError(problems[0].path, problems)


def check_new_version_path(out: str | Path, inputs: Sequence[str | Path]) -> Path:
    """``out`` as the file a new test-set version may be written to, else :class:`UsageError` naming ``--out``: it
    ends in ``.jsonl`` (the canonical format it is written in), it is none of the ``inputs`` (the version would
    overwrite what it is made of), and nothing is there yet (a test set is never overwritten: an earlier version,
    labels or a run may refer to it by its content hash)."""
    p = Path(out)
    if p.suffix.lower() != ".jsonl":
        raise UsageError(argument="--out (a new test-set version, written as JSONL)", allowed="a path ending in .jsonl",
                         got=str(out))
    target = p.resolve()
    same = [str(i) for i in inputs if Path(i).resolve() == target]
    if same:
        raise UsageError(f"--out {out} is an input ({same[0]}): write the new version to a file of its own")
    if p.exists() or p.is_symlink():
        raise UsageError(f"--out {out} exists: a test set is not overwritten; name a new file (or remove it first)")
    return p


def _one_grade_per_assessor(files: Sequence[LabelFile]) -> list[Judgement]:
    """The latest graded judgement of each assessor per (query, chunk) within each file (a log's later line
    replaces an earlier one), across the files; :class:`InputError` when one assessor gave one item different
    grades in different files: which is right cannot depend on the order the files were named in."""
    seen: dict[tuple[str, str, str], tuple[LabelFile, int, Judgement]] = {}
    problems: list[Problem] = []
    for f in files:
        lines = {j.key: line for line, j in f.entries if j.grade is not None}
        for j in latest(j for j in f.judgements if j.grade is not None):
            earlier = seen.get(j.key)
            if earlier is None:
                seen[j.key] = (f, lines[j.key], j)
            elif earlier[2].grade != j.grade:
                problems.append(Problem(f.path, lines[j.key], "grade",
                                        f"assessor {j.assessor!r} graded query {j.query_id!r}, chunk {j.chunk_id!r} "
                                        f"{j.grade} here and {earlier[2].grade} in {earlier[0].path} "
                                        f"({earlier[0].where} {earlier[1]}): one assessor's grades disagree, keep "
                                        "one of them", f.where))
    if problems:
        raise InputError(problems[0].path, problems)
    return [j for _, _, j in seen.values()]


def _check_adjudicator(adjudicator: str | None, judgements: Sequence[Judgement]) -> None:
    """:class:`UsageError` when ``adjudicator`` graded nothing in the files: a grade that is never there cannot
    settle a disagreement."""
    assessors = sorted({j.assessor for j in judgements})
    if adjudicator is not None and adjudicator not in assessors:
        raise UsageError(argument="--adjudicator", allowed=f"one of the assessors of the labels files {assessors}",
                         got=adjudicator)


def merge_labels(testset: str | Path, label_files: Sequence[str | Path | LabelFile], out: str | Path, *,
                 adjudicator: str | None = None) -> MergeResult:
    """Write the test set ``testset`` + the judgements of ``label_files`` as a new version at ``out``,
    with its lineage beside it.

    ``label_files``: labels logs (paths) or :class:`LabelFile` objects (e.g. filled worksheets
    read by :func:`weknora_nb.analysis.worksheet.label_file`). A label of ``testset`` is kept
    unless a judgement changes it. Raises :class:`InputError` naming the labels file and line of
    every judgement for a query the test set does not hold (nothing is written then).
    """
    if not label_files:
        raise UsageError("at least one labels file is needed", argument="--labels", allowed="one or more files",
                         got=[])
    check_new_version_path(out, [testset, *(f.path if isinstance(f, LabelFile) else f for f in label_files)])
    parent = load_testset(testset)
    files = [f if isinstance(f, LabelFile) else read_label_file(f) for f in label_files]
    _check_queries(files, set(parent.queries["query_id"]), str(testset))
    judgements = _one_grade_per_assessor(files)
    _check_adjudicator(adjudicator, judgements)
    resolved = resolve_judgements(judgements, adjudicator)
    by_query: dict[str, list[Resolved]] = {}
    for r in sorted(resolved, key=lambda r: (r.query_id, r.chunk_id)):   # the files' order decides nothing
        by_query.setdefault(r.query_id, []).append(r)
    records = parent.records()
    added = changed = unchanged = 0
    for rec in records:
        for r in by_query.get(rec["query_id"], []):
            before = rec["relevant"].get(r.chunk_id)
            added += before is None
            changed += before is not None and before != r.grade
            unchanged += before == r.grade
            rec["relevant"][r.chunk_id] = r.grade
    median = [r for r in resolved if r.how == "median"]
    fields = {
        "kind": "merge-labels", "labels_added": added, "labels_changed": changed, "labels_unchanged": unchanged,
        "assessors": sorted({j.assessor for f in files for j in f.judgements if j.grade is not None}),
        "adjudicator": adjudicator,
        "label_files": [{"path": f.path, "sha256": file_sha256(f.path), "judgements": len(f.entries)}
                        for f in files],
        "resolved_by_adjudicator": sum(r.how == "adjudicated" for r in resolved),
        "resolved_by_median": len(median),
        "resolved_by_median_items": [{"query_id": r.query_id, "chunk_id": r.chunk_id, "grades": r.grades,
                                      "grade": r.grade} for r in median],
    }
    new, lineage = write_version(records, out, parent, testset, fields)
    log.info("%s: %d labels added, %d changed (%d by median)", out, added, changed, len(median))
    return MergeResult(new, Path(out), lineage, added, changed, unchanged, median)


def write_version(records: list[dict[str, Any]], out: str | Path, parent: TestSet, parent_path: str | Path,
                  fields: dict[str, Any]) -> tuple[TestSet, dict[str, Any]]:
    """Write ``records`` as the test set ``out`` (canonical JSONL, atomically) and its lineage file, whose
    parent is ``parent`` (loaded from ``parent_path``); ``fields`` are the kind-specific entries.

    Returns the new test set and the lineage written."""
    new = TestSet.from_records(records, source=str(out))
    out_p = Path(out)
    lineage = {"hash": new.hash, "parent": {"hash": parent.hash, "path": str(parent_path)},
               "created_at": _now(), **fields,
               "valid_queries": {"before": parent.n_valid, "after": new.n_valid},
               "history": _history(parent, parent_path)}
    with writing(out_p):
        with atomic_path(out_p) as tmp:
            new.to_jsonl(tmp)
        with atomic_path(lineage_path(out_p)) as tmp:
            tmp.write_text(json.dumps(lineage, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return new, lineage


def _history(parent: TestSet, parent_path: str | Path) -> list[dict[str, Any]]:
    """The parent's lineage chain, newest first ([] when the parent has no lineage, or one that no
    longer describes it: a test set edited by hand after it was written)."""
    lin = read_lineage(parent_path, verify=False)
    if lin is None:
        return []
    if lin.get("hash") != parent.hash:
        log.warning("%s describes version %s, but %s is now %s (edited after it was written): its history is "
                    "not carried on", lineage_path(parent_path), str(lin.get("hash"))[:19], parent_path,
                    parent.hash[:19])
        return []
    own = {k: v for k, v in lin.items() if k != "history"}
    return [own, *lin.get("history", [])]


# ---------------------------------------------------------------------------------------
# reading the chain
# ---------------------------------------------------------------------------------------
def read_lineage(testset_path: str | Path, *, verify: bool = True) -> dict[str, Any] | None:
    """The lineage recorded beside the test set ``testset_path``; None when it has none.

    ``verify``: the test set must still hash to the lineage's ``hash``; :class:`InputError` when it
    does not (the test set was edited after the lineage was written, so the lineage is stale).
    """
    lp = lineage_path(testset_path)
    if not lp.is_file():
        return None
    with reading(lp):
        lin = json.loads(lp.read_text(encoding="utf-8"))
    well_formed = isinstance(lin, dict) and isinstance(lin.get("hash"), str) \
        and isinstance((lin.get("parent") or {}).get("hash"), str) and isinstance(lin.get("history", []), list)
    if not well_formed:
        raise InputError(lp, "not a lineage file: expected an object with 'hash', 'parent.hash' and 'history'")
    if verify:
        current = load_testset(testset_path).hash
        if current != lin["hash"]:
            raise InputError(lp, f"describes version {lin['hash'][:19]}..., but {testset_path} is now "
                                 f"{current[:19]}... (edited after its lineage was written): the lineage is stale")
    return lin


def ancestors(testset_path: str | Path) -> list[str]:
    """The hashes of the versions the test set descends from, parent first ([] without a lineage)."""
    lin = read_lineage(testset_path)
    if lin is None:
        return []
    return [lin["parent"]["hash"], *(h["parent"]["hash"] for h in lin.get("history", [])
                                    if isinstance(h, dict) and isinstance((h.get("parent") or {}).get("hash"), str))]


def is_ancestor(old_hash: str, new_testset_path: str | Path) -> bool:
    """True when the version ``old_hash`` is the parent (or an earlier ancestor) of the test set at
    ``new_testset_path``, by its lineage; False for the same version or an unrelated one."""
    return old_hash in ancestors(new_testset_path)


def rescore_plan(run_a_manifest: dict[str, Any], run_b_manifest: dict[str, Any]) -> tuple[str | None, str]:
    """Which test set two runs must both be scored on, from their manifests: ``(path, reason)``.

    When the runs were scored on different versions and one run's test set (the file its manifest
    names, relative paths as the manifest holds them) descends from the other's version by its
    lineage, that newer test set is returned; otherwise ``(None, why not)``.
    """
    runs = [(_run_label(m, d), m.get("testset") or {}) for m, d in ((run_a_manifest, "A"), (run_b_manifest, "B"))]
    (name_a, ts_a), (name_b, ts_b) = runs
    for name, ts in runs:
        if not ts.get("hash"):
            return None, f"run {name} records no test-set version (manifest testset.hash)"
    if ts_a["hash"] == ts_b["hash"]:
        return None, f"both runs were scored on the same test-set version ({ts_a['hash'][:19]}...): nothing to re-score"
    notes: list[str] = []
    for (name_new, new), (name_old, old) in (((name_b, ts_b), (name_a, ts_a)), ((name_a, ts_a), (name_b, ts_b))):
        path = new.get("path")
        if not path:
            notes.append(f"run {name_new} records no test-set path")
            continue
        if not Path(path).is_file():
            notes.append(f"the test set of run {name_new} ({path}) is missing")
            continue
        try:
            lin = read_lineage(path)
        except InputError as exc:
            notes.append(str(exc).splitlines()[-1].strip(" -"))
            continue
        if lin is None:
            continue
        chain = [lin["hash"], *ancestors(path)]
        if old["hash"] in chain[1:] and new["hash"] in chain:
            later = "" if lin["hash"] == new["hash"] else f" (now at the later version {lin['hash'][:19]}...)"
            return str(path), (f"run {name_old} was scored on {old['hash'][:19]}..., an ancestor of {name_new}'s "
                               f"test set {path}{later}: both are re-scored on it")
    why = f"the test sets of runs {name_a} ({ts_a['hash'][:19]}...) and {name_b} ({ts_b['hash'][:19]}...) are not " \
          "versions of one another (no lineage links them)"
    return None, why + ("; " + "; ".join(notes) if notes else "")


def _run_label(manifest: dict[str, Any], default: str) -> str:
    return str(manifest.get("run_name") or default)
