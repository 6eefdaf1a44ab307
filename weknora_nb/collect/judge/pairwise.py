"""Pairwise judging: which of two runs answered each question better, asked in both orders (:func:`judge_pairwise`).
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
    NONE_TEXT,
    PAIRWISE_SCHEMA,
    PAIRWISE_VERSION,
    Prompt,
    load_prompt,
    parse_verdict,
)
from weknora_nb.collect.judge.runner import execute
from weknora_nb.core.errors import NotComparableError, UsageError

PAIRWISE_DIR = "pairwise"


def judge_pairwise(run_dir: str | Path, baseline_dir: str | Path, settings: LLMSettings | None,
                   options: JudgeOptions | None = None, *, dry_run: bool = False) -> JudgeOutcome:
    """Which of two runs answered each question better, asked in both orders.

    Answers are paired by (query, stage, repeat) present in both runs (same test set, else
    :class:`NotComparableError`). For each pair and judge repeat the judge sees the baseline's answer
    first, then the run's answer first. **Rule**: the pair is a win for the run when both orders
    say the run's answer is better, a loss when both say the baseline's, and a tie otherwise (both
    say tie, or the orders disagree: a preference that follows the position is no preference).
    Records go to ``<run>/pairwise/<baseline folder name>.jsonl`` with the manifest beside it
    (``.json``): ``outcome`` ``"win"``, ``"tie"`` or ``"loss"`` (for the run), and both ``verdicts``.
    """
    options = options or JudgeOptions()
    options = replace(options, prompt_version=options.prompt_version or PAIRWISE_VERSION)
    if settings is None and not dry_run:
        raise UsageError("the judge needs --base-url and --model (only --dry-run goes without)")
    b_items, b_manifest = load_answers(run_dir, stages=options.stages)
    a_items, a_manifest = load_answers(baseline_dir, stages=options.stages)
    hashes = {(m.get("testset") or {}).get("hash") for m in (a_manifest, b_manifest)}
    if len(hashes) != 1:
        raise NotComparableError(f"{run_dir} and {baseline_dir} were collected on different test sets")
    baseline = {i.key: i for i in a_items}
    pairs = [(baseline[b.key], b) for b in b_items if b.key in baseline]
    if not pairs:
        raise NotComparableError(f"{run_dir} and {baseline_dir} have no answer to the same (query, stage, repeat)")
    langs = sorted({prompt_language(options, b.question, b.reference) for _, b in pairs})
    assert options.prompt_version is not None
    prompts = {lang: load_prompt(options.prompt_version, lang) for lang in langs}
    run, name = Path(run_dir), Path(baseline_dir).resolve().name
    description = describe_judge(settings, options, prompts, PAIRWISE_SCHEMA)
    description["baseline"] = {"path": str(baseline_dir), "name": name}
    spec = JudgeSpec("pairwise", run, run / PAIRWISE_DIR / f"{name}.jsonl", run / PAIRWISE_DIR / f"{name}.json",
                     description, len(pairs))
    jobs = _pairwise_jobs(pairs, settings, options, prompts)
    return run_to_end(lambda: execute(spec, jobs, settings, options, dry_run), name="weknora-nb-judge")


def _pairwise_jobs(pairs: list[tuple[AnswerItem, AnswerItem]], settings: LLMSettings | None, options: JudgeOptions,
                   prompts: dict[str, Prompt]) -> list[Job]:
    jobs = []
    for a, b in pairs:
        lang = prompt_language(options, b.question, b.reference)
        prompt = prompts[lang]
        (ans_a, ctx_a, _), (ans_b, ctx_b, _) = render_answer(a, lang), render_answer(b, lang)
        orders = {}
        for order, (first, second) in (("baseline_first", ((ans_a, ctx_a), (ans_b, ctx_b))),
                                       ("run_first", ((ans_b, ctx_b), (ans_a, ctx_a)))):
            orders[order] = prompt.render(question=b.question, reference=b.reference or NONE_TEXT[lang],
                                          context_1=first[1], answer_1=first[0] or NONE_TEXT[lang],
                                          context_2=second[1], answer_2=second[0] or NONE_TEXT[lang])
        for r in range(1, options.repeats + 1):
            seed = seed_of(options, r)
            asks = [Ask(cache_key(settings, options, prompt, r, seed, m), m, seed, lang, parse_verdict)
                    for m in orders.values()]
            jobs.append(Job([(*b.key, r)], asks, _pair_body, {"language": lang, "prompt": prompt.name}))
    return jobs


def _pair_body(answers: list[Answered]) -> dict[str, Any]:
    """A pair's record: both verdicts, as who won (baseline, run, tie), and the outcome by the rule."""
    failed = failure_body(answers)
    if failed is not None:
        return failed
    first, second = answers[0].value, answers[1].value
    said = [{"1": "baseline", "2": "run", "tie": "tie"}[first["better"]],
            {"1": "run", "2": "baseline", "tie": "tie"}[second["better"]]]
    outcome = "tie" if said[0] != said[1] or said[0] == "tie" else ("win" if said[0] == "run" else "loss")
    return {"status": "judged", "outcome": outcome,
            "verdicts": {"baseline_first": said[0], "run_first": said[1]},
            "reasons": {"baseline_first": first["reason"], "run_first": second["reason"]}}
