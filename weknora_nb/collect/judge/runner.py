"""A judge run's machinery, the same for pointwise and pairwise judging: the jobs still to do made by a
bounded pool of workers, each finished judgement appended to the judgement log; or, for a dry run, what the
judgements still to make would cost.

- **Resumable**: each finished judgement is one line of the log (``<run>/judgements.jsonl``, flushed and
  fsync-ed, :class:`~weknora_nb.collect.judge.store.JudgementLog`); a rerun judges only what is not there
  (``retry_failed``: the failed ones too), so nothing is judged twice and no line is doubled. Judgements of a
  different judge in the same log are refused unless ``replace``.
- **Dry run**: the judgements still to make, the calls they need (cached ones excluded), their estimated
  prompt tokens and, with ``max_tokens`` completion tokens each, an upper bound of the cost.
- A key the server refuses or a model it does not have stops the run (a :class:`UsageError`), as does the
  cost limit (what was judged is kept); the manifest (:mod:`weknora_nb.collect.judge.manifest`) says how the
  run ended.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from weknora_nb.collect.judge.calls import TOKEN_RULE, Answered, Asker, Budget, BudgetExhausted, Job, group
from weknora_nb.collect.judge.llm import LLMClient, LLMSettings
from weknora_nb.collect.judge.manifest import (
    JudgeSpec,
    end_manifest,
    now,
    read_manifest,
    start_manifest,
    stops_recorded,
)
from weknora_nb.collect.judge.options import JudgeOptions, JudgeOutcome
from weknora_nb.collect.judge.store import (
    CACHE_FILE,
    JudgeCache,
    JudgeLock,
    JudgementLog,
    Key,
    record_key,
    reopen_log,
)
from weknora_nb.core.errors import RunExistsError
from weknora_nb.core.progress import progress_bar


async def execute(spec: JudgeSpec, jobs: list[Job], settings: LLMSettings | None, options: JudgeOptions,
                  dry_run: bool) -> JudgeOutcome:
    """Make the judgements of ``jobs`` not yet in ``spec``'s log, under the run folder's judge lock, and write the
    manifest; with ``dry_run`` only estimate them (nothing is written, the cache is only read). The outcome holds
    the log's records within ``jobs``."""
    expected = sum(len(j.keys) for j in jobs)
    jobs = group(jobs)
    cache_path = Path(options.cache) if options.cache else spec.run_dir.resolve().parent / CACHE_FILE
    judgement_log = JudgementLog(spec.log_path, lambda rec: record_key(rec, spec.keys))
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
            manifest = start_manifest(spec, options)
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
        end_manifest(spec, manifest, outcome, asker, client, status)
        outcome.manifest = manifest
    return outcome


def _in_scope(done: dict[Key, dict[str, Any]], jobs: list[Job]) -> dict[Key, dict[str, Any]]:
    keys = {k for j in jobs for k in j.keys}
    return {k: r for k, r in done.items() if k in keys}


def _open_log(spec: JudgeSpec, judgement_log: JudgementLog, options: JudgeOptions) -> dict[Key, dict[str, Any]]:
    """The records already judged (after ``replace`` or ``retry_failed``), the log open for appending.

    A log written by another judge (its manifest's identity differs) is refused unless ``replace``.
    """
    previous = read_manifest(spec.manifest_path)
    done = judgement_log.read()
    other = previous.get("judge", {}).get("identity") not in (None, spec.description["identity"])
    if other and done and not options.replace:
        old = previous.get("judge", {})
        raise RunExistsError(f"{spec.log_path} holds judgements by another judge (model {old.get('model')!r}, prompt "
                             f"{old.get('prompt_version')}, temperature {old.get('temperature')}); pass --replace to "
                             "discard them and judge again (the cache keeps the replies of both)")
    return reopen_log(judgement_log, done, replace=options.replace, retry_failed=options.retry_failed)


async def _work(todo: list[Job], asker: Asker, judgement_log: JudgementLog, done: dict[Key, dict[str, Any]],
                options: JudgeOptions, manifest: dict[str, Any], spec: JudgeSpec) -> str:
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
                rec = _record(spec.keys, key, body, answers, job.meta, shared=i > 0)
                await judgement_log.append(rec)
                done[key] = rec
                asker.cached_records += bool(rec["cached"])
            if bar is not None:
                bar.update(len(job.keys))

    workers = [asyncio.ensure_future(worker()) for _ in range(min(options.concurrency, max(1, len(todo))))]
    try:
        with stops_recorded(spec.manifest_path, manifest):
            await asyncio.gather(*workers)
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


def _record(names: tuple[str, ...], key: Key, body: dict[str, Any], answers: list[Answered], meta: dict[str, Any],
            shared: bool) -> dict:
    calls = [] if shared else [c for a in answers for c in a.calls]
    return {**dict(zip(names, key, strict=True)), **body, **meta,
            "cached": shared or all(a.cached for a in answers), "calls": calls,
            "cost": sum(c["cost"] for c in calls), "model": next((a.model for a in answers if a.model), None),
            "at": now()}


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
