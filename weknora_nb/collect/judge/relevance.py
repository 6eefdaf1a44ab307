"""Relevance grades by an LLM: every pooled chunk graded 0-3 for its query (docs/method.md section 16).

The items are the rows of a pool (:func:`weknora_nb.analysis.pooling.pool`: ``query_id``, ``query``,
``chunk_id``, ``knowledge_title``, ``content``), each with a ``purpose``: ``fill`` (a chunk no person has
graded: its grade stands in for the missing label in the LLM-filled figures) or ``calibration`` (a chunk a person
has graded, graded again to measure the grader against people; never used in a figure). The command line's
``weknora-nb testset grade`` pools, then calls :func:`grade_items`.

Everything else is the answer judge's machinery (:mod:`weknora_nb.collect.judge`), reused, not copied:

- the prompt is versioned (``weknora_nb/data/judge_prompts/relevance-v1.<zh|en>.txt``, :func:`load_prompt`), in
  Chinese or English by the question's script, the chunk's title and text in a ``<passage>`` section;
- the reply is read strictly (:func:`parse_grade`): one JSON object ``{"grade": 0-3, "reason": "..."}``, a fence
  around it tolerated; anything else is asked again ``parse_retries`` times, then recorded as ``failed`` with its
  kind (``unparseable``, ``schema``, ``out_of_range``) and raw text, never as a grade. A chunk whose text no run
  listed is recorded as failed (``no_text``) without a call: there is nothing to grade;
- cache (:class:`~weknora_nb.collect.judge.store.JudgeCache`, by default in the grades file's folder), cost limit
  and ledger (:class:`~weknora_nb.collect.judge.calls.Budget`), dry run, resumption and ``--retry-failed`` /
  ``--replace`` (:func:`~weknora_nb.collect.judge.runner.execute`): one line per grade in the grades file
  (``relevance-grades.jsonl``), keyed by (query_id, chunk_id, judge_repeat), and its manifest beside it
  (``relevance-grades.json``: the grader's model, server, prompts and their sha256, what the server said it was,
  the ledger, and the pool the grades were made for). A rerun makes no call for what is done.

A grade is kept apart from people's labels: it lives only in the grades file, which
:mod:`weknora_nb.core.grades` reads; a figure that uses it says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from weknora_nb.collect.http.retry import run_to_end
from weknora_nb.collect.judge.calls import Answered, Ask, Job, cache_key, failure_body, seed_of
from weknora_nb.collect.judge.llm import LLMSettings
from weknora_nb.collect.judge.manifest import JudgeSpec, describe_judge
from weknora_nb.collect.judge.options import JudgeOptions, JudgeOutcome, prompt_language
from weknora_nb.collect.judge.prompts import InvalidReply, Prompt, exact_keys, json_object, load_prompt
from weknora_nb.collect.judge.runner import execute
from weknora_nb.core.errors import UsageError
from weknora_nb.core.grades import GRADE_KEYS, GRADES_FILE, PURPOSES, manifest_path

RELEVANCE_VERSION = "relevance-v1"
#: what a reply must be (JSON Schema, draft 2020-12)
RELEVANCE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["grade", "reason"],
    "additionalProperties": False,
    "properties": {"grade": {"type": "integer", "minimum": 0, "maximum": 3}, "reason": {"type": "string"}}}
#: the options a grader runs with unless told otherwise: one grade a chunk, at temperature 0
GRADE_DEFAULTS: dict[str, Any] = {"repeats": 1, "temperature": 0.0, "max_tokens": 200}


def parse_grade(text: str) -> dict[str, Any]:
    """``{"grade": 0-3, "reason": "..."}`` read from a reply, or :class:`InvalidReply` (an integral float such as
    2.0 counts, as in JSON Schema; 4, -1, 2.5 are ``out_of_range``; a grade that is no number is ``schema``)."""
    obj = json_object(text)
    exact_keys(obj, ("grade", "reason"), "the reply")
    grade = obj["grade"]
    if isinstance(grade, bool) or not isinstance(grade, int | float):
        raise InvalidReply("schema", f"grade is {json.dumps(grade, ensure_ascii=False)[:40]}, not a number")
    if grade != grade or grade % 1 != 0 or not 0 <= grade <= 3:
        raise InvalidReply("out_of_range", f"grade is {grade!r}, not an integer from 0 to 3")
    if not isinstance(obj["reason"], str):
        raise InvalidReply("schema", "reason is not a string")
    return {"grade": int(grade), "reason": obj["reason"]}


def grade_items(items: Any, out: str | Path, settings: LLMSettings | None, options: JudgeOptions | None = None, *,
                pool: dict[str, Any] | None = None, dry_run: bool = False) -> JudgeOutcome:
    """Grade every item of ``items`` (a DataFrame or records: ``query_id``, ``query``, ``chunk_id``,
    ``knowledge_title``, ``content``, ``purpose``) into the grades file ``out`` (module docstring).

    ``pool`` describes what was pooled (test set path and hash, runs, depth, stages), recorded in the manifest.
    ``settings`` may be None only for a dry run. Returns what was done (:class:`JudgeOutcome`, ``answers`` = items).
    """
    options = options or JudgeOptions(**GRADE_DEFAULTS)
    options = replace(options, prompt_version=options.prompt_version or RELEVANCE_VERSION)
    if settings is None and not dry_run:
        raise UsageError("grading needs --base-url and --model (only --dry-run goes without)")
    rows = _records(items)
    out = Path(out)
    if out.suffix != ".jsonl":
        raise UsageError(argument="--out", allowed=f"a path ending in .jsonl (default {GRADES_FILE})", got=str(out))
    langs = sorted({prompt_language(options, r["query"]) for r in rows}) or ["zh"]
    assert options.prompt_version is not None
    prompts = {lang: load_prompt(options.prompt_version, lang) for lang in langs}
    if options.cache is None:
        options = replace(options, cache=out.resolve().parent / ".judge-cache.sqlite")
    description = describe_judge(settings, options, prompts, RELEVANCE_SCHEMA)
    description["pool"] = pool or {}
    spec = JudgeSpec("relevance", out.parent, out, manifest_path(out), description, len(rows), keys=GRADE_KEYS)
    jobs = _grade_jobs(rows, settings, options, prompts)
    return run_to_end(lambda: execute(spec, jobs, settings, options, dry_run), name="weknora-nb-grade")


def _records(items: Any) -> list[dict[str, Any]]:
    """The items as dicts, checked: each names a query and a chunk once, with a known purpose."""
    records = items.to_dict("records") if hasattr(items, "to_dict") else list(items)
    seen: set[tuple[str, str]] = set()
    out = []
    for r in records:
        purpose = r.get("purpose") or "fill"
        if purpose not in PURPOSES:
            raise UsageError(argument="purpose", allowed=list(PURPOSES), got=purpose)
        key = (str(r["query_id"]), str(r["chunk_id"]))
        if key in seen:
            raise UsageError(f"the chunk {key[1]!r} is to be graded twice for the query {key[0]!r}")
        seen.add(key)
        out.append({"query_id": key[0], "chunk_id": key[1], "query": str(r["query"]),
                    "title": _text(r.get("knowledge_title")), "content": _text(r.get("content")), "purpose": purpose})
    return out


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _grade_jobs(rows: Iterable[dict[str, Any]], settings: LLMSettings | None, options: JudgeOptions,
                prompts: dict[str, Prompt]) -> list[Job]:
    jobs = []
    for r in rows:
        lang = prompt_language(options, r["query"])
        prompt = prompts[lang]
        messages = prompt.render(question=r["query"], title=r["title"], passage=r["content"])
        meta = {"purpose": r["purpose"], "language": lang, "prompt": prompt.name}
        for rep in range(1, options.repeats + 1):
            key = (r["query_id"], r["chunk_id"], rep)
            if not r["content"].strip():
                jobs.append(Job([key], [], _no_text, meta))
                continue
            seed = seed_of(options, rep)
            ask = Ask(cache_key(settings, options, prompt, rep, seed, messages), messages, seed, lang, parse_grade)
            jobs.append(Job([key], [ask], _grade_body, meta))
    return jobs


def _grade_body(answers: list[Answered]) -> dict[str, Any]:
    failed = failure_body(answers)
    if failed is not None:
        return failed
    value = answers[0].value
    return {"status": "judged", "grade": value["grade"], "reason": value["reason"]}


def _no_text(answers: list[Answered]) -> dict[str, Any]:
    return {"status": "failed", "kind": "no_text",
            "error": "the chunk's text is in no run's chunk inventory (chunks.parquet): nothing to grade"}
