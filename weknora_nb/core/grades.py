"""Relevance grades by an LLM, kept apart from people's labels (docs/method.md section 16).

``weknora-nb testset grade`` (:mod:`weknora_nb.collect.judge.relevance`) writes them to a file of their own,
``relevance-grades.jsonl`` (by default in the runs folder, beside the runs whose pools were graded), one line
per grade::

    {"query_id": "q017", "chunk_id": "doc-3:004", "judge_repeat": 1, "status": "judged", "grade": 2,
     "reason": "...", "purpose": "fill", "language": "zh", "prompt": "relevance-v1.zh", "model": "qwen-plus",
     "cached": false, "calls": [...], "cost": 0.00012, "at": "..."}

and ``relevance-grades.json`` beside it: the grader (model, server, prompts and their sha256, reply schema,
prices), what the server said it was (``served_models``, ``rule_based``), the ledger, and the pool graded (the
test set's path and hash, the runs, depth and stages). A failed grade (``"status": "failed"`` with its kind) is
never a grade.

- ``purpose`` ``fill``: the chunk had no label when it was graded; its grade fills the gap in the **LLM-filled**
  figures (:meth:`Grades.filled`). ``calibration``: a labelled chunk graded again to measure the grader; it is
  never used in a figure. A fill grade keeps standing in the filled figures after a person labels the chunk: the
  LLM-filled figure ``f`` of a query is then the same function of the query whether or not people labelled it,
  which prediction-powered inference needs (:mod:`weknora_nb.analysis.ppi`).
- With several judge repeats a chunk's grade is the lower median of its judged repeats.
- :meth:`Grades.marker` is the line every figure made with the grades carries: ``grades: LLM (model ..., prompt
  relevance-v1 sha256:...)``, or, for the sandbox's rule-based grader, says that it is not a language model.

:func:`with_labels` lays further labels (labels logs, filled worksheets, already read as judgements) over a test
set without writing a new version: the human labels of the corrected figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.core.errors import UsageError, reading

if TYPE_CHECKING:
    import pandas as pd

    from weknora_nb.core.labels import Judgement
    from weknora_nb.core.testset import TestSet

GRADES_FILE = "relevance-grades.jsonl"
#: the fields of a grade's key in the grades file
GRADE_KEYS = ("query_id", "chunk_id", "judge_repeat")
#: why a chunk was graded: to fill a missing label, or to measure the grader on a labelled one
PURPOSES = ("fill", "calibration")
#: what a figure made with LLM grades carries (the start of :meth:`Grades.marker`)
MARKER = "grades: LLM"


def manifest_path(grades_path: str | Path) -> Path:
    """The manifest beside a grades file: ``relevance-grades.jsonl`` -> ``relevance-grades.json``."""
    return Path(grades_path).with_suffix(".json")


@dataclass
class Grades:
    """The grades of a grades file: ``frame`` (one row per graded (query, chunk): ``query_id``, ``chunk_id``,
    ``grade``, ``purpose``, ``repeats``), the failed ones (``failed``: ``query_id``, ``chunk_id``, ``kind``,
    ``purpose``) and the manifest."""

    path: Path
    frame: pd.DataFrame
    failed: pd.DataFrame
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def grader(self) -> dict[str, Any]:
        return self.manifest.get("judge") or {}

    @property
    def model(self) -> str:
        served = self.manifest.get("served_models") or []
        return ", ".join(served) if served else str(self.grader.get("model") or "unknown model")

    @property
    def rule_based(self) -> bool:
        return bool(self.manifest.get("rule_based"))

    @property
    def prompt(self) -> str:
        """``relevance-v1 sha256:1a2b3c4d`` (the first prompt's hash, shortened; every language's is in the
        manifest)."""
        prompts = self.grader.get("prompts") or {}
        version = self.grader.get("prompt_version") or "?"
        first: str = next((str(p.get("sha256", "")) for p in prompts.values() if isinstance(p, dict)), "")
        return f"{version} {first[:15]}" if first else str(version)

    def marker(self) -> str:
        """What every figure made with these grades says (module docstring)."""
        what = f"{self.model}, a rule-based grader, not a language model" if self.rule_based else f"model {self.model}"
        return f"{MARKER} ({what}; prompt {self.prompt}; {self.path.name})"

    @property
    def pool(self) -> dict[str, Any]:
        """The pool the grades were made for (test set, runs, depth, stages), as the manifest records it."""
        return self.grader.get("pool") or {}

    def fill(self) -> pd.DataFrame:
        """The fill grades: ``query_id``, ``chunk_id``, ``grade``."""
        f = self.frame[self.frame["purpose"] == "fill"]
        return f[["query_id", "chunk_id", "grade"]].reset_index(drop=True)

    def fill_keys(self) -> set[tuple[str, str]]:
        """Every (query, chunk) graded to fill a label, whether its grade was given or failed: the chunks that had
        no label in the graded pool."""
        keys = set(zip(self.frame.loc[self.frame["purpose"] == "fill", "query_id"],
                       self.frame.loc[self.frame["purpose"] == "fill", "chunk_id"], strict=True))
        bad = self.failed[self.failed["purpose"] == "fill"]
        return keys | set(zip(bad["query_id"], bad["chunk_id"], strict=True))

    def filled(self, testset: TestSet) -> TestSet:
        """``testset`` with every fill grade in place of the chunk's label (docs/method.md section 16): what the
        LLM-filled figures score with. Its source names the grades; its hash is its own."""
        from weknora_nb.core.testset import TestSet

        grades: dict[str, dict[str, int]] = {}
        for q, c, g in self.fill().itertuples(index=False):
            grades.setdefault(str(q), {})[str(c)] = int(g)
        records = testset.records()
        for r in records:
            r["relevant"] = {**r["relevant"], **grades.get(str(r["query_id"]), {})}
        return TestSet.from_records(records, source=f"{testset.source} + {self.marker()}")

    def describe(self) -> str:
        """A line for the terminal: how many grades of each purpose, failed ones by kind."""
        counts = self.frame["purpose"].value_counts()
        failed = self.failed["kind"].value_counts()
        kinds = ", ".join(f"{k} {n}" for k, n in failed.items())
        return (f"{len(self.frame)} chunks graded ({int(counts.get('fill', 0))} to fill a missing label, "
                f"{int(counts.get('calibration', 0))} to calibrate), {len(self.failed)} failed"
                + (f" ({kinds})" if kinds else "") + f"; {self.marker()}")


def read_grades(path: str | Path) -> Grades:
    """The grades of a grades file and its manifest. Every bad line is named (:class:`InputError`); a torn last
    line (a grader killed while writing) is left out; the last record of a key wins."""
    import pandas as pd

    from weknora_nb.core.answers import read_judgement_records

    p = Path(path)
    if p.is_dir():
        p = p / GRADES_FILE
    records = read_judgement_records(p, keys=GRADE_KEYS, check=_problem)
    judged: dict[tuple[str, str], list[int]] = {}
    purpose: dict[tuple[str, str], str] = {}
    failed: dict[tuple[str, str], str] = {}
    for rec in records:
        key = (rec["query_id"], rec["chunk_id"])
        purpose.setdefault(key, rec.get("purpose") or "fill")
        if rec["status"] == "judged":
            judged.setdefault(key, []).append(int(rec["grade"]))
        else:
            failed.setdefault(key, str(rec.get("kind")))
    rows = [{"query_id": q, "chunk_id": c, "grade": sorted(g)[(len(g) - 1) // 2], "purpose": purpose[(q, c)],
             "repeats": len(g)} for (q, c), g in judged.items()]
    frame = pd.DataFrame(rows, columns=["query_id", "chunk_id", "grade", "purpose", "repeats"])
    bad_rows = [{"query_id": q, "chunk_id": c, "kind": k, "purpose": purpose[(q, c)]}
                for (q, c), k in failed.items() if (q, c) not in judged]
    failed_frame = pd.DataFrame(bad_rows, columns=["query_id", "chunk_id", "kind", "purpose"])
    manifest: dict[str, Any] = {}
    mp = manifest_path(p)
    if mp.is_file():
        with reading(mp):
            loaded = json.loads(mp.read_text(encoding="utf-8"))
        manifest = loaded if isinstance(loaded, dict) else {}
    return Grades(p, frame.astype({"grade": int, "repeats": int}), failed_frame, manifest)


def _problem(rec: dict[str, Any]) -> tuple[str | None, str] | None:
    for name in ("query_id", "chunk_id"):
        if not isinstance(rec.get(name), str) or not rec[name]:
            return name, "missing or not a non-empty string"
    if isinstance(rec.get("judge_repeat"), bool) or not isinstance(rec.get("judge_repeat"), int):
        return "judge_repeat", "missing or not an integer"
    if rec.get("status") not in ("judged", "failed"):
        return "status", f"must be 'judged' or 'failed', got {rec.get('status')!r}"
    if (rec.get("purpose") or "fill") not in PURPOSES:
        return "purpose", f"must be one of {list(PURPOSES)}, got {rec.get('purpose')!r}"
    grade = rec.get("grade")
    if rec["status"] == "judged" and (isinstance(grade, bool) or grade not in (0, 1, 2, 3)):
        return "grade", f"must be an integer 0-3 in a judged record, got {grade!r}"
    return None


def with_labels(testset: TestSet, judgements: Iterable[Judgement], *, adjudicator: str | None = None) -> TestSet:
    """``testset`` with the labels of ``judgements`` laid over its own (one grade per chunk by the rule of
    ``testset merge-labels``, :func:`weknora_nb.core.lineage.resolve_judgements`): a judgement of a query the test
    set lacks is a :class:`UsageError`. No file is written; the result's hash is its own."""
    from weknora_nb.core.lineage import resolve_judgements
    from weknora_nb.core.testset import TestSet

    resolved = resolve_judgements(judgements, adjudicator)
    if not resolved:
        return testset
    known = set(testset.queries["query_id"])
    unknown = sorted({r.query_id for r in resolved} - known)
    if unknown:
        raise UsageError(f"--labels: judgements of queries the test set does not hold: {unknown[:5]}")
    added: dict[str, dict[str, int]] = {}
    for r in resolved:
        added.setdefault(r.query_id, {})[r.chunk_id] = r.grade
    records = testset.records()
    for rec in records:
        rec["relevant"] = {**rec["relevant"], **added.get(str(rec["query_id"]), {})}
    return TestSet.from_records(records, source=f"{testset.source} + labels")
