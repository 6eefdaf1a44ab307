"""The LLM judge: every answer of a run rated for correctness, faithfulness and relevance, 1-5 each.

Inputs, from a run folder (:mod:`weknora_nb.core.run`): ``answers.jsonl`` (one line per chat answer:
``query_id``, ``stage``, ``repeat``, ``answer``, ``citations``, the cited chunk ids in citation order),
``chunks.parquet`` (the cited chunks' text) and the test set the manifest names (each query's text
and reference ``answer``). Each answer is judged ``repeats`` times (judge repeats ``1..repeats``):

- **correctness** against the reference answer (None when the test set gives none), **faithfulness**
  against the cited passages only, **relevance** to the question; the prompt is Chinese or English
  by the question's script (``language="auto"``), versioned (:mod:`weknora_nb.collect.judge_prompts`).
- A reply is read strictly; an invalid one is asked again (``parse_retries`` times, the request
  then carrying the bad reply and what was wrong with it) and then recorded as failed with its kind
  (``unparseable``, ``schema``, ``out_of_range``) and raw text, never as a score. A request that fails
  records the :class:`~weknora_nb.core.errors.RequestFailed` kind (``timeout``, ``rate_limited``,
  ``connect``, ``server``, ``protocol``, ``bad_request``) after the client's retries. A key the server
  refuses, or a model it does not have, stops the run: a :class:`UsageError`.
- Seeds: judge repeat r, attempt a sends ``seed + 1000 (r - 1) + (a - 1)`` (servers that refuse
  ``seed`` get none); with ``temperature`` > 0 repeats can differ, which is what their spread measures.
- **Cache** (:class:`~weknora_nb.collect.judge_store.JudgeCache`): the key is the sha256 of the
  model, temperature, max_tokens, the judge repeat and its seed, the prompt's name and sha256, and
  the messages (question, reference, context and answer as sent): not the server's address, which
  may change (the sandbox's port) while the model stays; a server whose model changes under the
  same name needs its own ``cache``. Answers that are the same text (a deterministic system's
  repeats) share one call. A rerun makes no call.
- **Ledger**: every call's tokens as the server reported them (``usage``), or estimated by
  :func:`~weknora_nb.collect.llm.estimate_tokens` when it reported none (``"usage": "estimated"``);
  cost = prompt tokens x ``price_in`` + completion tokens x ``price_out``, prices per million tokens.
- **Cost limit** (``max_cost``): before each call its cost is reserved: the estimated prompt tokens
  times ``max(1.25, 1.1 x`` the largest reported/estimated ratio seen``)``, plus ``max_tokens`` completion
  tokens (a server never exceeds it). A call whose reservation would take spent + reserved past the
  limit is not made, and no further call is: the run stops (exit 1), what was judged is kept.
- **Dry run**: the judgements still to make, the calls they need (cached ones excluded), their
  estimated prompt tokens and, with ``max_tokens`` completion tokens each, an upper bound of the cost.
- **Resumable**: each finished judgement is one line of ``<run>/judgements.jsonl`` (flushed and
  fsync-ed, :class:`~weknora_nb.collect.judge_store.JudgementLog`); a rerun judges only what is not
  there (``retry_failed``: the failed ones too), so nothing is judged twice and no line is doubled.
  ``<run>/judge.json`` records the judge (model, server, parameters, prompts and their sha256, the
  reply schema, the token rule, prices), what the server said it was (``served_models``) and the
  counts; judgements of a different judge in the same folder are refused unless ``replace``.

Pairwise (:func:`judge_pairwise`): the same machinery over two runs, see its docstring.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from weknora_nb.collect.judge_calls import Answered, Ask, Asker, Budget, BudgetExhausted, Job, group
from weknora_nb.collect.judge_inputs import AnswerItem, load_answers, render_answer
from weknora_nb.collect.judge_prompts import (
    CRITERIA,
    NONE_TEXT,
    PAIRWISE_SCHEMA,
    PAIRWISE_VERSION,
    POINTWISE_VERSION,
    Prompt,
    detect_language,
    load_prompt,
    parse_scores,
    parse_verdict,
    pointwise_schema,
)
from weknora_nb.collect.judge_store import CACHE_FILE, JudgeCache, JudgeLock, JudgementLog, Key
from weknora_nb.collect.llm import LLMClient, LLMSettings
from weknora_nb.collect.retry import run_to_end
from weknora_nb.core.answers import JUDGE_MANIFEST, JUDGEMENTS
from weknora_nb.core.errors import (
    AuthFailed,
    NotComparableError,
    NotFound,
    RunExistsError,
    UsageError,
    reading,
    writing,
)
from weknora_nb.core.files import atomic_path
from weknora_nb.core.progress import progress_bar

__all__ = ["JUDGEMENTS", "JUDGE_MANIFEST", "PAIRWISE_DIR", "RULE_JUDGE_MODEL", "TOKEN_RULE", "JudgeOptions",
           "AnswerItem", "JudgeOutcome", "load_answers", "judge_run", "judge_pairwise", "read_judgements"]

log = logging.getLogger(__name__)

PAIRWISE_DIR = "pairwise"
#: the model name of the sandbox's deterministic rule-based judge (weknora_nb.sandbox.judge)
RULE_JUDGE_MODEL = "sandbox-rule-judge"
TOKEN_RULE = ("estimated tokens = 1 per CJK character + 1 per 4 other characters (rounded up), + 4 per message "
              "+ 3 per reply; the cost limit reserves max(1.25, 1.1 x the largest reported/estimated ratio) x the "
              "estimate plus max_tokens completion tokens per call")
_T = TypeVar("_T")


@dataclass(frozen=True)
class JudgeOptions:
    """How to judge (defaults as the command line's). Checked when made (:class:`UsageError`)."""

    repeats: int = 3
    temperature: float = 0.5
    max_tokens: int = 400
    seed: int = 0
    language: str = "auto"
    prompt_version: str | None = None  # None: the current version of the mode (v1, pairwise-v1)
    concurrency: int = 4
    parse_retries: int = 2
    price_in: float = 0.0
    price_out: float = 0.0
    max_cost: float | None = None
    stages: tuple[str, ...] | None = None
    retry_failed: bool = False
    replace: bool = False
    cache: str | Path | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        _check_int("--repeats", self.repeats, 1)
        _check_int("--max-tokens", self.max_tokens, 16)
        _check_int("--concurrency", self.concurrency, 1)
        _check_int("--parse-retries", self.parse_retries, 0)
        _check_int("--seed", self.seed, 0)
        for name, value in (("--temperature", self.temperature), ("--price-in", self.price_in),
                            ("--price-out", self.price_out)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise UsageError(argument=name, allowed="a finite number >= 0", got=value)
        if self.temperature > 2:
            raise UsageError(argument="--temperature", allowed="from 0 to 2", got=self.temperature)
        if self.max_cost is not None and (isinstance(self.max_cost, bool) or not isinstance(self.max_cost, int | float)
                                          or not math.isfinite(self.max_cost) or self.max_cost <= 0):
            raise UsageError(argument="--max-cost", allowed="a number > 0", got=self.max_cost)
        if self.language not in ("auto", "zh", "en"):
            raise UsageError(argument="--language", allowed=["auto", "zh", "en"], got=self.language)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(argument=name, allowed=f"an integer >= {minimum}", got=value)


@dataclass
class JudgeOutcome:
    """What a judge run did: the records now on disk, this invocation's calls, cache hits, tokens and cost.

    Counts are of judgements (an answer x a judge repeat): ``expected`` = answers x repeats;
    ``judged`` + ``failed`` + ``not_judged`` = ``expected``.
    """

    run_dir: Path
    mode: str
    log_path: Path
    manifest: dict[str, Any]
    records: list[dict[str, Any]]
    answers: int
    expected: int
    calls_made: int = 0
    cache_hits: int = 0
    already_done: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    stopped_by_max_cost: bool = False
    dry_run: bool = False
    estimate: dict[str, Any] | None = None

    @property
    def judged(self) -> int:
        return sum(1 for r in self.records if r.get("status") == "judged")

    @property
    def failed_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            if r.get("status") == "failed":
                out[str(r.get("kind"))] = out.get(str(r.get("kind")), 0) + 1
        return dict(sorted(out.items()))

    @property
    def failed(self) -> int:
        return sum(self.failed_by_kind.values())

    @property
    def not_judged(self) -> int:
        return self.expected - self.judged - self.failed

    @property
    def complete(self) -> bool:
        return not self.dry_run and self.failed == 0 and self.not_judged == 0

    def counts(self) -> dict[str, Any]:
        """The counts as the command line's ``--json`` prints them."""
        return {"answers": self.answers, "judgements_expected": self.expected, "judged": self.judged,
                "failed": self.failed, "failed_by_kind": self.failed_by_kind, "not_judged": self.not_judged,
                "calls_made": self.calls_made, "cache_hits": self.cache_hits, "already_judged": self.already_done,
                "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens,
                           "total": self.prompt_tokens + self.completion_tokens},
                "cost": self.cost, "stopped_by_max_cost": self.stopped_by_max_cost, "complete": self.complete}


def _cache_key(settings: LLMSettings | None, options: JudgeOptions, prompt: Prompt, judge_repeat: int, seed: int,
               messages: list[dict[str, str]]) -> str:
    blob = {"model": settings.model if settings else None,
            "temperature": options.temperature, "max_tokens": options.max_tokens, "judge_repeat": judge_repeat,
            "seed": seed, "prompt": prompt.name, "prompt_sha256": prompt.sha256, "messages": messages}
    return hashlib.sha256(json.dumps(blob, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def _seed(options: JudgeOptions, judge_repeat: int) -> int:
    return options.seed + 1000 * (judge_repeat - 1)


def _record(key: Key, body: dict[str, Any], answers: list[Answered], meta: dict[str, Any], shared: bool) -> dict:
    calls = [] if shared else [c for a in answers for c in a.calls]
    return {"query_id": key[0], "stage": key[1], "repeat": key[2], "judge_repeat": key[3], **body, **meta,
            "cached": shared or all(a.cached for a in answers), "calls": calls,
            "cost": sum(c["cost"] for c in calls), "model": next((a.model for a in answers if a.model), None),
            "at": _now()}


def _failure_body(answers: list[Answered]) -> dict[str, Any] | None:
    bad = next((a for a in answers if not a.ok), None)
    if bad is None:
        return None
    body: dict[str, Any] = {"status": "failed", "kind": bad.kind, "error": bad.error}
    if bad.raw is not None:
        body["raw"] = bad.raw
    return body


# ---------------------------------------------------------------------------------------
# pointwise
# ---------------------------------------------------------------------------------------
def _pointwise_jobs(items: list[AnswerItem], settings: LLMSettings | None, options: JudgeOptions,
                    prompts: dict[str, Prompt]) -> list[Job]:
    jobs = []
    for item in items:
        lang = _language(options, item.question, item.reference)
        prompt = prompts[lang]
        answer, context, missing = render_answer(item, lang)
        messages = prompt.render(question=item.question, reference=item.reference or NONE_TEXT[lang],
                                 context=context, answer=answer or NONE_TEXT[lang])
        given = item.reference is not None

        def parse(text: str, given: bool = given) -> Any:
            return parse_scores(text, reference_given=given)
        for r in range(1, options.repeats + 1):
            seed = _seed(options, r)
            ask = Ask(_cache_key(settings, options, prompt, r, seed, messages), messages, seed, lang, parse)
            jobs.append(Job([(*item.key, r)], [ask], _scores_body,
                            {"language": lang, "prompt": prompt.name, "missing_context": missing,
                             "reference": given}))
    return jobs


def _scores_body(answers: list[Answered]) -> dict[str, Any]:
    failed = _failure_body(answers)
    if failed is not None:
        return failed
    value = answers[0].value
    return {"status": "judged", "scores": {c: value[c]["score"] for c in CRITERIA},
            "reasons": {c: value[c]["reason"] for c in CRITERIA}}


def _language(options: JudgeOptions, *texts: str | None) -> str:
    return options.language if options.language != "auto" else detect_language(*texts)


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
    langs = sorted({_language(options, i.question, i.reference) for i in items})
    assert options.prompt_version is not None
    prompts = {lang: load_prompt(options.prompt_version, lang) for lang in langs}
    jobs = _pointwise_jobs(items, settings, options, prompts)
    run = Path(run_dir)
    spec = _JudgeSpec("pointwise", run, run / JUDGEMENTS, run / JUDGE_MANIFEST,
                      _judge_description(settings, options, prompts, pointwise_schema()), len(items))
    return run_to_end(lambda: _execute(spec, jobs, settings, options, dry_run), name="weknora-nb-judge")


# ---------------------------------------------------------------------------------------
# pairwise
# ---------------------------------------------------------------------------------------
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
    langs = sorted({_language(options, b.question, b.reference) for _, b in pairs})
    assert options.prompt_version is not None
    prompts = {lang: load_prompt(options.prompt_version, lang) for lang in langs}
    run, name = Path(run_dir), Path(baseline_dir).resolve().name
    description = _judge_description(settings, options, prompts, PAIRWISE_SCHEMA)
    description["baseline"] = {"path": str(baseline_dir), "name": name}
    spec = _JudgeSpec("pairwise", run, run / PAIRWISE_DIR / f"{name}.jsonl", run / PAIRWISE_DIR / f"{name}.json",
                      description, len(pairs))
    jobs = _pairwise_jobs(pairs, settings, options, prompts)
    return run_to_end(lambda: _execute(spec, jobs, settings, options, dry_run), name="weknora-nb-judge")


def _pairwise_jobs(pairs: list[tuple[AnswerItem, AnswerItem]], settings: LLMSettings | None, options: JudgeOptions,
                   prompts: dict[str, Prompt]) -> list[Job]:
    jobs = []
    for a, b in pairs:
        lang = _language(options, b.question, b.reference)
        prompt = prompts[lang]
        (ans_a, ctx_a, _), (ans_b, ctx_b, _) = render_answer(a, lang), render_answer(b, lang)
        orders = {}
        for order, (first, second) in (("baseline_first", ((ans_a, ctx_a), (ans_b, ctx_b))),
                                       ("run_first", ((ans_b, ctx_b), (ans_a, ctx_a)))):
            orders[order] = prompt.render(question=b.question, reference=b.reference or NONE_TEXT[lang],
                                          context_1=first[1], answer_1=first[0] or NONE_TEXT[lang],
                                          context_2=second[1], answer_2=second[0] or NONE_TEXT[lang])
        for r in range(1, options.repeats + 1):
            seed = _seed(options, r)
            asks = [Ask(_cache_key(settings, options, prompt, r, seed, m), m, seed, lang, parse_verdict)
                    for m in orders.values()]
            jobs.append(Job([(*b.key, r)], asks, _pair_body, {"language": lang, "prompt": prompt.name}))
    return jobs


def _pair_body(answers: list[Answered]) -> dict[str, Any]:
    """A pair's record: both verdicts, as who won (baseline, run, tie), and the outcome by the rule."""
    failed = _failure_body(answers)
    if failed is not None:
        return failed
    first, second = answers[0].value, answers[1].value
    said = [{"1": "baseline", "2": "run", "tie": "tie"}[first["better"]],
            {"1": "run", "2": "baseline", "tie": "tie"}[second["better"]]]
    outcome = "tie" if said[0] != said[1] or said[0] == "tie" else ("win" if said[0] == "run" else "loss")
    return {"status": "judged", "outcome": outcome,
            "verdicts": {"baseline_first": said[0], "run_first": said[1]},
            "reasons": {"baseline_first": first["reason"], "run_first": second["reason"]}}


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------
@dataclass
class _JudgeSpec:
    mode: str
    run_dir: Path
    log_path: Path
    manifest_path: Path
    description: dict[str, Any]
    answers: int


def _judge_description(settings: LLMSettings | None, options: JudgeOptions, prompts: dict[str, Prompt],
                       schema: dict[str, Any]) -> dict[str, Any]:
    """What decides the judgements (its ``identity`` is their hash) and what only describes the run."""
    identity = {"model": settings.model if settings else None,
                "temperature": options.temperature, "max_tokens": options.max_tokens, "seed": options.seed,
                "prompt_version": options.prompt_version,
                "prompts": {p.name: {"file": f"{p.name}.txt", "sha256": p.sha256} for p in prompts.values()},
                "language": options.language}
    return {**identity, "identity": "sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
            .hexdigest(), "server": settings.server if settings else None,
            "api_key_env": settings.api_key_env if settings else None, "schema": schema,
            "parse_retries": options.parse_retries, "token_rule": TOKEN_RULE,
            "prices_per_million_tokens": {"prompt": options.price_in, "completion": options.price_out},
            "max_cost": options.max_cost}


def _key_of(rec: dict[str, Any]) -> Key:
    key = (rec["query_id"], rec["stage"], rec["repeat"], rec["judge_repeat"])
    if not (isinstance(key[0], str) and isinstance(key[1], str) and all(isinstance(k, int) for k in key[2:])
            and rec.get("status") in ("judged", "failed")):
        raise TypeError("not a judgement record")
    return key


def read_judgements(path: str | Path) -> list[dict[str, Any]]:
    """The records of a judgement log (``judgements.jsonl`` or a pairwise log), one per judgement."""
    return list(JudgementLog(path, _key_of).read().values())


async def _execute(spec: _JudgeSpec, jobs: list[Job], settings: LLMSettings | None, options: JudgeOptions,
                   dry_run: bool) -> JudgeOutcome:
    expected = sum(len(j.keys) for j in jobs)
    jobs = group(jobs)
    cache_path = Path(options.cache) if options.cache else spec.run_dir.resolve().parent / CACHE_FILE
    judgement_log = JudgementLog(spec.log_path, _key_of)
    outcome = JudgeOutcome(spec.run_dir, spec.mode, spec.log_path, {}, [], spec.answers, expected, dry_run=dry_run)
    if dry_run:
        done = judgement_log.read() if spec.log_path.exists() else {}
        outcome.records = list(_in_scope(done, jobs).values())
        kept = {} if options.replace else {k: r for k, r in done.items()  # what the real run would keep
                                           if not (options.retry_failed and r["status"] == "failed")}
        outcome.estimate = _estimate(jobs, kept, options, JudgeCache(cache_path, read_only=True) if settings else None)
        return outcome
    assert settings is not None
    with JudgeLock(spec.run_dir):
        client = LLMClient(settings)  # a missing key is a UsageError before anything is written
        try:
            done = _open_log(spec, judgement_log, options)
            todo = [j for j in jobs if any(k not in done for k in j.keys)]
            for j in todo:
                j.keys = [k for k in j.keys if k not in done]
            outcome.already_done = len(_in_scope(done, jobs))
            manifest = _start_manifest(spec, options)
            cache = JudgeCache(cache_path)
            budget = Budget(options.max_cost, options.price_in, options.price_out, options.max_tokens)
            asker = Asker(client, cache, budget, temperature=options.temperature, max_tokens=options.max_tokens,
                          parse_retries=options.parse_retries)
            try:
                status = await _work(todo, asker, judgement_log, done, options, manifest, spec)
            finally:
                cache.close()
        finally:
            judgement_log.close()
            await client.aclose()
        outcome.records = list(_in_scope(done, jobs).values())
        outcome.calls_made, outcome.cache_hits = asker.calls, asker.cached_records
        outcome.prompt_tokens, outcome.completion_tokens, outcome.cost = (asker.prompt_tokens,
                                                                          asker.completion_tokens, asker.cost)
        outcome.stopped_by_max_cost = asker.budget.stopped
        _end_manifest(spec, manifest, outcome, asker, client, status)
        outcome.manifest = manifest
    return outcome


def _in_scope(done: dict[Key, dict[str, Any]], jobs: list[Job]) -> dict[Key, dict[str, Any]]:
    keys = {k for j in jobs for k in j.keys}
    return {k: r for k, r in done.items() if k in keys}


def _open_log(spec: _JudgeSpec, judgement_log: JudgementLog, options: JudgeOptions) -> dict[Key, dict[str, Any]]:
    """The records already judged (after ``replace`` or ``retry_failed``), the log open for appending.

    A log written by another judge (its manifest's identity differs) is refused unless ``replace``.
    """
    previous = _read_manifest(spec.manifest_path)
    done = judgement_log.read()
    other = previous.get("judge", {}).get("identity") not in (None, spec.description["identity"])
    if other and done and not options.replace:
        old = previous.get("judge", {})
        raise RunExistsError(f"{spec.log_path} holds judgements by another judge (model {old.get('model')!r}, prompt "
                             f"{old.get('prompt_version')}, temperature {old.get('temperature')}); pass --replace to "
                             "discard them and judge again (the cache keeps the replies of both)")
    if options.replace and done:
        done = {}
        judgement_log.rewrite([])
    elif options.retry_failed and any(r["status"] == "failed" for r in done.values()):
        done = {k: r for k, r in done.items() if r["status"] != "failed"}
        judgement_log.rewrite(done.values())
    judgement_log.open()
    return done


def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with reading(path):
        data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _start_manifest(spec: _JudgeSpec, options: JudgeOptions) -> dict[str, Any]:
    manifest = {"mode": spec.mode, "run": str(spec.run_dir), "judgements": spec.log_path.name,
                "judge": spec.description, "repeats": options.repeats, "concurrency": options.concurrency,
                "status": "running", "started_at": _now(), "command": _command()}
    _write_json(spec.manifest_path, manifest)
    return manifest


def _end_manifest(spec: _JudgeSpec, manifest: dict[str, Any], outcome: JudgeOutcome, asker: Asker,
                  client: LLMClient, status: str) -> None:
    """The manifest with what the server said it was, the parameters it refused, the counts and the ledger."""
    models = sorted(asker.models | {str(r["model"]) for r in outcome.records if r.get("model")})
    notes = []
    if RULE_JUDGE_MODEL in models:
        notes.append(f"{RULE_JUDGE_MODEL} is the weknora-nb sandbox's deterministic rule-based judge (word overlap "
                     "with the reference answer and the cited passages), not a language model")
    ledger = {"calls": sum(len(r.get("calls") or []) for r in outcome.records),
              "prompt_tokens": sum(c["prompt_tokens"] for r in outcome.records for c in r.get("calls") or []),
              "completion_tokens": sum(c["completion_tokens"] for r in outcome.records for c in r.get("calls") or []),
              "cost": sum(float(r.get("cost") or 0.0) for r in outcome.records)}
    if status == "done":
        status = "stopped_by_max_cost" if outcome.stopped_by_max_cost else \
            "complete" if outcome.complete else "incomplete"
    manifest.update(status=status, ended_at=_now(), served_models=models, rule_based=RULE_JUDGE_MODEL in models,
                    dropped_parameters=sorted(client.dropped), notes=notes, counts=outcome.counts(), ledger=ledger)
    _write_json(spec.manifest_path, manifest)


async def _work(todo: list[Job], asker: Asker, judgement_log: JudgementLog, done: dict[Key, dict[str, Any]],
                options: JudgeOptions, manifest: dict[str, Any], spec: _JudgeSpec) -> str:
    """Run the jobs with ``concurrency`` workers; each finished judgement appended. Returns the status
    (``done``); a fatal failure or Ctrl-C writes the manifest's status and is raised."""
    queue: asyncio.Queue[Job] = asyncio.Queue()
    for job in todo:
        queue.put_nowait(job)
    bar = _progress_bar(sum(len(j.keys) for j in todo), spec.mode) if options.progress else None

    async def worker() -> None:
        while not asker.budget.stopped:
            try:
                job = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                answers = await _answers(job, asker)
            except BudgetExhausted:
                return
            body = job.build(answers)
            for i, key in enumerate(job.keys):
                rec = _record(key, body, answers, job.meta, shared=i > 0)
                await judgement_log.append(rec)
                done[key] = rec
                asker.cached_records += bool(rec["cached"])
            if bar is not None:
                bar.update(len(job.keys))

    workers = [asyncio.ensure_future(worker()) for _ in range(min(options.concurrency, max(1, len(todo))))]
    try:
        await asyncio.gather(*workers)
    except (AuthFailed, NotFound) as exc:
        _stopped(spec, manifest, "failed", str(exc))
        raise UsageError(str(exc)) from None
    except (asyncio.CancelledError, KeyboardInterrupt):
        _stopped(spec, manifest, "interrupted", "interrupted (Ctrl-C)")
        raise
    except BaseException as exc:
        _stopped(spec, manifest, "failed", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if bar is not None:
            bar.close()
    return "done"


async def _answers(job: Job, asker: Asker) -> list[Answered]:
    """The job's asks in turn, stopping at the first that failed."""
    out: list[Answered] = []
    for ask in job.asks:
        got = await asker.ask(ask)
        out.append(got)
        if not got.ok:
            break
    return out


def _stopped(spec: _JudgeSpec, manifest: dict[str, Any], status: str, why: str) -> None:
    manifest.update(status=status, stopped_by=why[:500], ended_at=_now())
    _write_json(spec.manifest_path, manifest)


def _estimate(jobs: list[Job], done: dict[Key, dict[str, Any]], options: JudgeOptions,
              cache: JudgeCache | None) -> dict[str, Any]:
    """The dry run's figures: judgements and calls still to make, estimated tokens, an upper bound of the cost."""
    todo = [j for j in jobs if any(k not in done for k in j.keys)]
    asks = {a.cache_key: a for j in todo for a in j.asks}
    cached = {k for k in asks if cache is not None and cache.get(k) is not None}
    if cache is not None:
        cache.close()
    calls = [a for k, a in asks.items() if k not in cached]
    prompt = sum(a.est_prompt for a in calls)
    completion = len(calls) * options.max_tokens
    cost = (prompt * options.price_in + completion * options.price_out) / 1_000_000
    return {"judgements": sum(1 for j in todo for k in j.keys if k not in done), "calls": len(calls),
            "cached": len(cached), "prompt_tokens": prompt, "completion_tokens_at_most": completion,
            "cost_at_most": cost, "rule": TOKEN_RULE,
            "note": "retries after an invalid reply are not included; completion tokens are counted at max_tokens"}


def _progress_bar(total: int, mode: str) -> Any:
    return progress_bar(total=total, desc=f"judging ({mode})", unit="judgement")


def _command() -> list[str]:
    from weknora_nb.collect.redact import redact_command

    return redact_command(sys.argv)


def _write_json(path: Path, obj: Any) -> None:
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
