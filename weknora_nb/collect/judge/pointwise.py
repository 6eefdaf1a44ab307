"""Pointwise judging: every answer of a run rated for correctness, faithfulness and relevance, 1-5 each.

Each answer is judged ``repeats`` times (judge repeats ``1..repeats``): **correctness** against the test set's
reference answer (None when it gives none), **faithfulness** against the cited passages only, **relevance**
to the question. The prompt is Chinese or English by the question's script (``language="auto"``) and
versioned (:mod:`weknora_nb.collect.judge.prompts`); judge repeat r, attempt a sends the seed
``seed + 1000 (r - 1) + (a - 1)``, so that with ``temperature`` > 0 repeats can differ, which is what their
spread measures. Answers that are the same text share one call (:func:`~weknora_nb.collect.judge.calls.group`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from weknora_nb.collect.http.retry import run_to_end
from weknora_nb.collect.judge.calls import Answered, Ask, Job, cache_key, failure_body, seed_of
from weknora_nb.collect.judge.inputs import AnswerItem, load_answers, render_answer
from weknora_nb.collect.judge.llm import LLMSettings
from weknora_nb.collect.judge.manifest import JudgeSpec, describe_judge
from weknora_nb.collect.judge.options import JudgeOptions, JudgeOutcome, prompt_language
from weknora_nb.collect.judge.prompts import (
    CRITERIA,
    NONE_TEXT,
    POINTWISE_VERSION,
    Prompt,
    load_prompt,
    parse_scores,
    pointwise_schema,
)
from weknora_nb.collect.judge.runner import execute
from weknora_nb.core.answers import JUDGE_MANIFEST, JUDGEMENTS
from weknora_nb.core.errors import UsageError


def judge_run(run_dir: str | Path, settings: LLMSettings | None, options: JudgeOptions | None = None, *,
              testset: Any = None, dry_run: bool = False) -> JudgeOutcome:
    """Judge every answer of ``run_dir`` (module docstring); returns what was done.

    ``settings`` may be None only for a dry run (then the cache is not looked at). Ctrl-C stops it
    cleanly: the records written are kept, the manifest says ``interrupted``, KeyboardInterrupt is raised.
    """
    options = options or JudgeOptions()
    options = replace(options, prompt_version=options.prompt_version or POINTWISE_VERSION)
    if settings is None and not dry_run:
        raise UsageError("the judge needs --base-url and --model (only --dry-run goes without)")
    items, _ = load_answers(run_dir, testset=testset, stages=options.stages)
    langs = sorted({prompt_language(options, i.question, i.reference) for i in items})
    assert options.prompt_version is not None
    prompts = {lang: load_prompt(options.prompt_version, lang) for lang in langs}
    jobs = _pointwise_jobs(items, settings, options, prompts)
    run = Path(run_dir)
    spec = JudgeSpec("pointwise", run, run / JUDGEMENTS, run / JUDGE_MANIFEST,
                     describe_judge(settings, options, prompts, pointwise_schema()), len(items))
    return run_to_end(lambda: execute(spec, jobs, settings, options, dry_run), name="weknora-nb-judge")


def _pointwise_jobs(items: list[AnswerItem], settings: LLMSettings | None, options: JudgeOptions,
                    prompts: dict[str, Prompt]) -> list[Job]:
    jobs = []
    for item in items:
        lang = prompt_language(options, item.question, item.reference)
        prompt = prompts[lang]
        answer, context, missing = render_answer(item, lang)
        messages = prompt.render(question=item.question, reference=item.reference or NONE_TEXT[lang],
                                 context=context, answer=answer or NONE_TEXT[lang])
        given = item.reference is not None

        def parse(text: str, given: bool = given) -> Any:
            return parse_scores(text, reference_given=given)
        for r in range(1, options.repeats + 1):
            seed = seed_of(options, r)
            ask = Ask(cache_key(settings, options, prompt, r, seed, messages), messages, seed, lang, parse)
            jobs.append(Job([(*item.key, r)], [ask], _scores_body,
                            {"language": lang, "prompt": prompt.name, "missing_context": missing,
                             "reference": given}))
    return jobs


def _scores_body(answers: list[Answered]) -> dict[str, Any]:
    failed = failure_body(answers)
    if failed is not None:
        return failed
    value = answers[0].value
    return {"status": "judged", "scores": {c: value[c]["score"] for c in CRITERIA},
            "reasons": {c: value[c]["reason"] for c in CRITERIA}}
