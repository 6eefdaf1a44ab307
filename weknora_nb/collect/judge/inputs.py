"""The judge's inputs: a run's answers with their questions, reference answers and cited passages.

From a run folder (:mod:`weknora_nb.core.run`): ``answers.jsonl`` (``query_id``, ``stage``,
``repeat``, ``answer``, ``citations``: the cited chunk ids in citation order), ``chunks.parquet``
(the cited chunks' text) and the test set its manifest names (each query's text and reference
``answer``). :func:`render_answer` shows an answer to the judge: its inline citations
(``<kb ... chunk_id="ID" />``, C65) become ``[n]``, and the cited passages are numbered ``[n]`` in
the order of first citation.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weknora_nb.collect.judge.prompts import NONE_TEXT
from weknora_nb.core.answers import read_answers
from weknora_nb.core.errors import NotComparableError, RunFolderError, UsageError, reading
from weknora_nb.core.run import ANSWERS, CHUNKS, read_manifest

#: C65: an inline citation ``<kb doc="TITLE" chunk_id="ID" kb_id="KB" />`` (attributes HTML-escaped)
_CITATION = re.compile(r"<kb\b[^>]*?chunk_id=\"([^\"]+)\"[^>]*/?>")
_MISSING_CHUNK = {"zh": "（该片段的原文不在本次运行的片段清单中）",
                  "en": "(this passage's text is not in the run's chunk listing)"}


@dataclass(frozen=True)
class AnswerItem:
    """One answer of a run with what judging it needs: the question, the reference answer (None: the test
    set gives none), the answer text and its cited chunks in citation order (content None: not listed)."""

    query_id: str
    stage: str
    repeat: int
    question: str
    reference: str | None
    answer: str
    citations: tuple[str, ...]
    context: tuple[tuple[str, str | None], ...]

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.query_id, self.stage, self.repeat)


def load_answers(run_dir: str | Path, *, testset: Any = None,
                 stages: Iterable[str] | None = None) -> tuple[list[AnswerItem], dict[str, Any]]:
    """The answers of a run folder with their questions, references and cited passages; and its manifest.

    Raises :class:`RunFolderError` without a manifest, ``answers.jsonl`` or ``chunks.parquet`` (the
    passages faithfulness is judged against), :class:`NotComparableError` for a test set that is not
    the run's, :class:`InputError` naming each bad line of ``answers.jsonl``.
    """
    from weknora_nb.core.testset import TestSet, load_testset

    p = Path(run_dir)
    manifest = read_manifest(p)
    ts = testset if isinstance(testset, TestSet) else load_testset(testset or _testset_path(p, manifest))
    recorded = (manifest.get("testset") or {}).get("hash")
    if recorded and recorded != ts.hash:
        raise NotComparableError(f"{p}: the test set given is not the one this run was collected with")
    if not (p / ANSWERS).is_file():
        raise RunFolderError(f"{p} holds no {ANSWERS}: collect with the citations stage (the chat answers) first")
    if not (p / CHUNKS).is_file():
        raise RunFolderError(f"{p} holds no {CHUNKS}: faithfulness is judged against the cited chunks' text, "
                             "which a run collected with --no-inventory lacks")
    queries = {str(r["query_id"]): r for r in ts.records()}
    lines = _answer_lines(p / ANSWERS, queries)
    wanted = set(stages) if stages is not None else None
    if wanted is not None and not wanted & {line["stage"] for line in lines}:
        raise UsageError(argument="--stage", allowed=sorted({line["stage"] for line in lines}), got=sorted(wanted))
    texts = _chunk_texts(p / CHUNKS)
    items = []
    for line in lines:
        if wanted is not None and line["stage"] not in wanted:
            continue
        q = queries[line["query_id"]]
        cited = tuple(dict.fromkeys(line["citations"]))
        items.append(AnswerItem(line["query_id"], line["stage"], line["repeat"], str(q["query"]),
                                (q.get("answer") or None), line["answer"], cited,
                                tuple((c, texts.get(c)) for c in cited)))
    return items, manifest


def _testset_path(p: Path, manifest: dict[str, Any]) -> str:
    path = (manifest.get("testset") or {}).get("path")
    if not path:
        raise RunFolderError(f"{p}: the manifest records no test-set path; pass the test set")
    return str(path)


def _answer_lines(path: Path, queries: dict[str, Any]) -> list[dict[str, Any]]:
    """The lines of ``answers.jsonl`` (:func:`weknora_nb.core.answers.read_answers`: every problem at
    once, an answer to a query the test set does not hold among them)."""
    return read_answers(path, query_ids=queries).to_dict("records")


def _chunk_texts(path: Path) -> dict[str, str]:
    import pandas as pd

    with reading(path):
        frame = pd.read_parquet(path, columns=["chunk_id", "content"])
    return {str(c): str(t) for c, t in zip(frame["chunk_id"], frame["content"], strict=True)
            if isinstance(t, str)}


def render_answer(item: AnswerItem, language: str) -> tuple[str, str, int]:
    """(the answer with its inline citations as ``[n]``, the cited passages numbered ``[n]`` in citation
    order, how many cited chunks have no text in the listing)."""
    number = {cid: i for i, cid in enumerate(item.citations, start=1)}

    def marker(m: re.Match[str]) -> str:
        n = number.get(html.unescape(m.group(1)))
        return f"[{n}]" if n else ""
    answer = _CITATION.sub(marker, item.answer).strip()
    if not item.context:
        return answer, NONE_TEXT[language], 0
    missing = sum(1 for _, text in item.context if text is None)
    passages = [f"[{i}] {text if text is not None else _MISSING_CHUNK[language]}"
                for i, (_, text) in enumerate(item.context, start=1)]
    return answer, "\n\n".join(passages), missing

