"""TREC qrels (``qid iter chunk_id grade``, whitespace-separated) with a topics TSV (``qid<TAB>text``).

Every problem names its file and line: a topic line without a tab, a query id met twice in the topics, a
qrels line without four fields, a query the topics do not hold, a grade that is none, a chunk labelled
twice. Writing: :meth:`TestSet.to_trec_qrels <weknora_nb.core.testset.model.TestSet.to_trec_qrels>`.
"""

from __future__ import annotations

from pathlib import Path

from weknora_nb.core.errors import Problem, TestSetError
from weknora_nb.core.testset.builder import Builder
from weknora_nb.core.testset.model import TestSet
from weknora_nb.core.testset.parsing import GRADE_TEXT
from weknora_nb.core.testset.textfile import read_lines
from weknora_nb.core.testset.validate import grade, same_id, show


def load_trec_qrels(qrels_path: str | Path, topics_path: str | Path) -> TestSet:
    """Load TREC qrels (``qid iter chunk_id grade``) with a topics TSV (``qid<TAB>text``)."""
    qp, tp = Path(qrels_path), Path(topics_path)
    problems: list[Problem] = []
    texts: dict[str, tuple[int, str, str]] = {}
    for lineno, line in read_lines(tp, problems):
        if not line.strip():
            continue
        parts = line.split("\t", 1)
        if len(parts) != 2:
            problems.append(Problem(str(tp), lineno, "query", "expected 'query_id<TAB>query text'"))
            continue
        qid = parts[0].strip()
        if qid in texts:
            first_line, _, first_raw = texts[qid]
            problems.append(Problem(str(tp), lineno, "query_id",
                                    same_id("query ids", first_raw, parts[0], first_line, "line")))
            continue
        texts[qid] = (lineno, parts[1].strip(), parts[0])
    relevant: dict[str, dict[str, int]] = {qid: {} for qid in texts}
    for lineno, line in read_lines(qp, problems):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 4:
            problems.append(Problem(str(qp), lineno, None, "expected 4 whitespace-separated fields "
                                    f"'qid iter chunk_id grade', got {len(parts)}"))
            continue
        qid, _, cid, value = parts
        if qid not in relevant:
            problems.append(Problem(str(qp), lineno, "query_id", f"query id {qid!r} is not in the topics file {tp}"))
            continue
        g = grade(int(value)) if GRADE_TEXT.fullmatch(value) else None
        if g is None:
            problems.append(Problem(str(qp), lineno, "relevant", f"grade must be an integer 0-3, got {show(value)}"))
            continue
        if cid in relevant[qid]:
            problems.append(Problem(str(qp), lineno, "relevant", f"chunk {cid!r} labelled twice for query {qid!r}"))
            continue
        relevant[qid][cid] = g
    if problems:
        raise TestSetError(qp, problems)
    builder = Builder(str(tp), "line")
    for qid, (ln, text, _) in texts.items():
        builder.put(ln, {"query_id": qid, "query": text, "relevant": relevant[qid]})
    return TestSet.from_builder(builder)
