"""``testset generate``, end to end: questions generated from a knowledge base's chunks, filtered, and written as a
test set (docs/method.md section 17).

:func:`generate_testset`:

1. reads the knowledge base's chunks through the run's inventory
   (:func:`~weknora_nb.collect.run.inventory.list_inventory`: every knowledge, every chunk, HTML unescaped where the
   server escaped it);
2. hands them to a :class:`Curator` (``weknora_nb.analysis.synthetic``), which plans the tasks of each round and
   decides what is kept;
3. round after round: writes each task's question and checks it is answerable (:class:`~.work.Worker`,
   ``concurrency`` at a time), searches the questions the curator names (the round trip), and lets the curator
   select; a round replaces what the filters dropped, until ``n`` questions are kept, the plan runs out or
   ``max_rounds`` is reached;
4. writes the test set and its closing note (the curator's) and the manifest.

As the judge: cached (a reply read once is never asked for again), **resumable** (every finished call a record of
``<out>.generation/log.jsonl``; a rerun plans the same tasks from the same records and makes no call for what is
there; ``retry_failed`` retries the failed ones), **costed** (every call's tokens and cost; ``max_cost`` stops the
run before a call would pass it, what was done is kept), with a **dry run** (the first round's calls, those in the
cache left out, their estimated tokens and an upper bound of their cost; nothing is written, no model is called).
Records of another generator (model, temperature, max_tokens, seed, prompts: its ``identity``) are refused unless
``replace``. A key the model server refuses, or a model it does not have, stops the run (:class:`UsageError`), as
does a knowledge base that cannot be listed.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pandas as pd

from weknora_nb.collect.generate.prompts import load_prompts
from weknora_nb.collect.generate.store import (
    CACHE_FILE,
    LOCK_FILE,
    LOG_FILE,
    MANIFEST_FILE,
    record_key,
    work_folder,
)
from weknora_nb.collect.generate.work import Worker
from weknora_nb.collect.http.client import ClientSettings, WeKnoraClient, server_address
from weknora_nb.collect.http.retry import run_to_end
from weknora_nb.collect.judge.calls import TOKEN_RULE, Asker, Budget, BudgetExhausted
from weknora_nb.collect.judge.llm import LLMClient, LLMSettings
from weknora_nb.collect.judge.manifest import command_line, now, read_manifest, stops_recorded, write_manifest
from weknora_nb.collect.judge.options import JudgeOptions
from weknora_nb.collect.judge.prompts import Prompt
from weknora_nb.collect.judge.store import JudgeCache, JudgeLock, JudgementLog, Key, reopen_log
from weknora_nb.collect.run.inventory import list_inventory
from weknora_nb.core.errors import AuthFailed, RequestFailed, RunExistsError, UsageError
from weknora_nb.core.progress import progress_bar
from weknora_nb.core.synthetic import Candidate, GenerateOptions, Selection, Task

log = logging.getLogger(__name__)
#: the model name of the sandbox's deterministic rule-based generator (weknora_nb.sandbox.generator)
RULE_GENERATOR_MODEL = "sandbox-rule-generator"
_T = TypeVar("_T")


class Curator(Protocol):
    """What decides what to ask and what to keep (``weknora_nb.analysis.synthetic.curate.SyntheticCurator``)."""

    @property
    def language(self) -> str: ...

    @property
    def texts(self) -> dict[str, str]: ...

    def plan(self, round_no: int, selection: Selection | None) -> list[Task]: ...

    def to_search(self, candidates: list[Candidate]) -> list[Candidate]: ...

    def select(self, candidates: list[Candidate]) -> Selection: ...

    def write(self, path: Path, selection: Selection, run: dict[str, Any]) -> Path: ...


#: what makes the curator of a knowledge base's chunks
MakeCurator = Callable[[pd.DataFrame, GenerateOptions], Curator]


@dataclass
class GenerationOutcome:
    """What a generation did: the test set and its closing note (``note``, written to ``summary_path``), the tasks,
    the candidates and the selection; for a dry run only ``estimate``."""

    out: Path
    dry_run: bool
    note: dict[str, Any] = field(default_factory=dict)
    summary_path: Path | None = None
    tasks: list[Task] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    selection: Selection | None = None
    estimate: dict[str, Any] | None = None

    @property
    def reached(self) -> bool:
        return self.selection is not None and self.selection.reached


def generate_testset(settings: ClientSettings, kb_id: str, llm: LLMSettings | None, calls: JudgeOptions,
                     options: GenerateOptions, out: str | Path, curator_for: MakeCurator, *,
                     dry_run: bool = False, prefetch: Callable[[list[str]], Any] | None = None) -> GenerationOutcome:
    """Generate the test set ``out`` from knowledge base ``kb_id`` (module docstring). ``calls`` holds how the model
    is called (temperature, max_tokens, seed, concurrency, parse retries, prices, max_cost, cache, retry_failed,
    replace, progress), as for the judge. ``llm`` may be None only for a dry run. ``prefetch``, when given, is
    called with each round's questions before they are searched back (the demo embeds them in one batch on its
    sandbox, which embeds one query at a time slowly). Ctrl-C keeps what was done (the manifest says
    ``interrupted``) and raises KeyboardInterrupt."""
    if llm is None and not dry_run:
        raise UsageError("testset generate needs --llm-base-url and --model (only --dry-run goes without)")
    return run_to_end(lambda: _generate(settings, kb_id, llm, calls, options, Path(out), curator_for, dry_run,
                                        prefetch), name="weknora-nb-generate")


async def _generate(settings: ClientSettings, kb_id: str, llm: LLMSettings | None, calls: JudgeOptions,
                    options: GenerateOptions, out: Path, curator_for: MakeCurator, dry_run: bool,
                    prefetch: Callable[[list[str]], Any] | None) -> GenerationOutcome:
    async with WeKnoraClient(settings) as weknora:
        chunks, inventory = await _chunks(weknora, kb_id)
        curator = curator_for(chunks, options)
        prompts = load_prompts(curator.language)
        description = _describe(llm, calls, prompts, curator.language)
        folder = work_folder(out)
        journal = JudgementLog(folder / LOG_FILE, record_key)
        cache_path = Path(calls.cache) if calls.cache else out.resolve().parent / CACHE_FILE
        if dry_run:
            done = journal.read() if journal.path.exists() else {}
            worker = Worker(llm, calls, prompts, curator.texts, kb_id, options.depth, None, done)
            cache = JudgeCache(cache_path, read_only=True) if llm is not None else None
            return GenerationOutcome(out, True, estimate=_estimate(curator.plan(1, None), worker, calls, cache))
        assert llm is not None
        with JudgeLock(folder, lock_file=LOCK_FILE, doing="written", again="the command"):
            client = LLMClient(llm)   # a missing key is a UsageError before anything is written
            cache = JudgeCache(cache_path)
            try:
                done = _open_log(folder, journal, description, calls)
                manifest = _start(folder, settings, kb_id, description, options, inventory)
                budget = Budget(calls.max_cost, calls.price_in, calls.price_out, calls.max_tokens)
                worker = Worker(llm, calls, prompts, curator.texts, kb_id, options.depth, journal, done)
                worker.weknora = weknora
                worker.writer = Asker(client, cache, budget, temperature=calls.temperature,
                                      max_tokens=calls.max_tokens, parse_retries=calls.parse_retries)
                worker.checker = Asker(client, cache, budget, temperature=0.0, max_tokens=calls.max_tokens,
                                       parse_retries=calls.parse_retries)
                already = len(done)
                outcome = await _rounds(curator, worker, budget, calls, manifest, folder, out, prefetch)
            finally:
                journal.close()
                cache.close()
                await client.aclose()
            run = _run_counts(outcome, worker, budget, description, client, kb_id, settings, inventory, already)
            outcome.summary_path = curator.write(out, outcome.selection or Selection([], False), run)
            outcome.note = json.loads(outcome.summary_path.read_text(encoding="utf-8"))
            manifest.update(status=run["status"], ended_at=now(), counts=outcome.note.get("filters"),
                            kept=outcome.note.get("kept"), ledger=run["ledger"], generator=run["generator"])
            write_manifest(folder / MANIFEST_FILE, manifest)
            return outcome


async def _chunks(weknora: WeKnoraClient, kb_id: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The knowledge base's chunks (the inventory's frame) and the inventory's entry; a :class:`UsageError` when the
    knowledge base cannot be listed or holds no chunk."""
    try:
        info = await weknora.system_info()
        version = info.get("version") if isinstance(info.get("version"), str) else None
    except AuthFailed as exc:
        raise UsageError(f"WeKnora refused the API key: {exc}") from None
    except RequestFailed:
        version = None
    inventory = await list_inventory(weknora, [kb_id], server_version=version)
    if inventory.unavailable:
        raise UsageError(f"cannot list the knowledge base {kb_id!r}: {inventory.unavailable[kb_id]}")
    if inventory.chunks.empty:
        raise UsageError(f"the knowledge base {kb_id!r} holds no chunk: nothing to generate questions from")
    if not inventory.complete:
        log.warning("the chunk listing of %s is incomplete (%s): questions come from the chunks listed", kb_id,
                    {k: v for k, v in inventory.entry.items() if k in ("incomplete", "failed")})
    return inventory.chunks, inventory.entry


def _describe(llm: LLMSettings | None, calls: JudgeOptions, prompts: dict[str, Prompt], language: str) -> dict:
    """The generator: what decides its replies (``identity`` is their hash) and what only describes it."""
    identity = {"model": llm.model if llm else None, "temperature": calls.temperature, "max_tokens": calls.max_tokens,
                "seed": calls.seed, "language": language,
                "prompts": {p.name: {"file": f"{p.name}.txt", "sha256": p.sha256} for p in prompts.values()}}
    return {**identity, "identity": "sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
            .hexdigest(), "server": llm.server if llm else None, "api_key_env": llm.api_key_env if llm else None,
            "parse_retries": calls.parse_retries, "token_rule": TOKEN_RULE,
            "prices_per_million_tokens": {"prompt": calls.price_in, "completion": calls.price_out},
            "max_cost": calls.max_cost}


def _open_log(folder: Path, journal: JudgementLog, description: dict[str, Any],
              calls: JudgeOptions) -> dict[Key, dict[str, Any]]:
    """The records of the log (after ``replace`` or ``retry_failed``), the log open for appending."""
    previous = read_manifest(folder / MANIFEST_FILE).get("generator") or {}
    done = journal.read()
    if previous.get("identity") not in (None, description["identity"]) and done and not calls.replace:
        raise RunExistsError(f"{journal.path} holds the work of another generator (model {previous.get('model')!r}, "
                             f"temperature {previous.get('temperature')}, prompts "
                             f"{sorted(previous.get('prompts', {}))}); pass --replace to discard it and generate "
                             "again (the cache keeps the replies)")
    return reopen_log(journal, done, replace=calls.replace, retry_failed=calls.retry_failed)


def _start(folder: Path, settings: ClientSettings, kb_id: str, description: dict[str, Any], options: GenerateOptions,
           inventory: dict[str, Any]) -> dict[str, Any]:
    manifest = {"knowledge_base": kb_id, "weknora": server_address(settings.base_url), "generator": description,
                "options": options.to_dict(), "inventory": inventory, "status": "running", "started_at": now(),
                "command": command_line()}
    write_manifest(folder / MANIFEST_FILE, manifest)
    return manifest


async def _rounds(curator: Curator, worker: Worker, budget: Budget, calls: JudgeOptions, manifest: dict[str, Any],
                  folder: Path, out: Path, prefetch: Callable[[list[str]], Any] | None) -> GenerationOutcome:
    """Round after round (module docstring); the outcome with every task, candidate and the last selection."""
    outcome = GenerationOutcome(out, False)
    with stops_recorded(folder / MANIFEST_FILE, manifest):
        for round_no in itertools.count(1):
            tasks = curator.plan(round_no, outcome.selection)
            if not tasks:
                break
            outcome.tasks += tasks
            await _each(tasks, worker.write, calls, budget, f"writing questions (round {round_no})")
            outcome.candidates = _candidates(outcome.tasks, worker)
            searches = curator.to_search(outcome.candidates)
            todo = [c.question for c in searches if ("search", worker.search_key(c.task, c.question), 0, 0)
                    not in worker.done]
            if prefetch is not None and todo:
                await asyncio.to_thread(prefetch, todo)
            await _each(searches, lambda c: worker.search(c.task, c.question), calls, budget,
                        f"round trips (round {round_no})")
            outcome.candidates = _candidates(outcome.tasks, worker)
            outcome.selection = curator.select(outcome.candidates)
            if outcome.selection.reached or budget.stopped:
                break
    return outcome


async def _each(items: list[_T], work: Callable[[_T], Awaitable[None]], calls: JudgeOptions, budget: Budget,
                desc: str) -> None:
    """``work(item)`` for every item, ``concurrency`` at a time, until done or the cost limit stops the calls."""
    if not items:
        return
    queue: asyncio.Queue[_T] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    bar = progress_bar(total=len(items), desc=desc, unit="call") if calls.progress else None

    async def one() -> None:
        while not budget.stopped:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                await work(item)
            except BudgetExhausted:
                return
            if bar is not None:
                bar.update(1)
    workers = [asyncio.ensure_future(one()) for _ in range(min(calls.concurrency, len(items)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if bar is not None:
            bar.close()


def _candidates(tasks: Iterable[Task], worker: Worker) -> list[Candidate]:
    """A candidate per task whose question was written, with its check and round trip as the log holds them."""
    out = []
    for task in tasks:
        gen = worker.done.get(("generate", task.key, 0, 0))
        if gen is None or gen["status"] != "ok":
            continue
        c = Candidate(task, gen["question"], gen["answer"])
        check = worker.done.get(("check", worker.check_ask(task, c.question).cache_key, 0, 0))
        c.answerable = check["answerable"] if check is not None and check["status"] == "ok" else None
        trip = worker.done.get(("search", worker.search_key(task, c.question), 0, 0))
        if trip is not None:
            c.round_trip = ("hit" if trip["hit"] else "miss") if trip["status"] == "ok" else "failed"
            c.rank = trip.get("rank")
        out.append(c)
    return out


def _run_counts(outcome: GenerationOutcome, worker: Worker, budget: Budget, description: dict[str, Any],
                client: LLMClient, kb_id: str, settings: ClientSettings, inventory: dict[str, Any],
                already: int) -> dict[str, Any]:
    """What the collector's side adds to the closing note: the calls, their failures, the generator, the ledger."""
    gens = [r for t in outcome.tasks if (r := worker.done.get(("generate", t.key, 0, 0))) is not None]
    checks = [r for t in outcome.tasks for r in [_check_of(worker, t)] if r is not None]
    searches = [r for r in worker.done.values() if r["kind"] == "search"]
    records = gens + checks
    models = sorted({str(r["model"]) for r in records if r.get("model")})
    rule = RULE_GENERATOR_MODEL in models
    asked = [worker.writer, worker.checker]
    status = "stopped_by_max_cost" if budget.stopped else \
        "complete" if outcome.selection is not None and outcome.selection.reached else "short"
    return {
        "tasks": len(outcome.tasks), "rounds": max((t.round for t in outcome.tasks), default=0),
        "generated": sum(1 for r in gens if r["status"] == "ok"),
        "generation_failed": dict(sorted(Counter(r["failure"] for r in gens if r["status"] == "failed").items())),
        "check_failed_by_kind": dict(sorted(Counter(r["failure"] for r in checks
                                                    if r["status"] == "failed").items())),
        "searches_failed": dict(sorted(Counter(r["failure"] for r in searches if r["status"] == "failed").items())),
        "not_made": sum(1 for t in outcome.tasks if ("generate", t.key, 0, 0) not in worker.done),
        "status": status, "stopped_by_max_cost": budget.stopped,
        "knowledge_base": {"id": kb_id, "server": server_address(settings.base_url), "inventory": inventory},
        "generator": {"model": description["model"], "server": description["server"], "served_models": models,
                      "rule_based": rule, "prompts": description["prompts"], "temperature": description["temperature"],
                      "note": (f"{RULE_GENERATOR_MODEL} is the weknora-nb sandbox's deterministic rule-based generator "
                               "(questions built from the chunks' headings and words by fixed templates), not a "
                               "language model") if rule else None,
                      "dropped_parameters": sorted(client.dropped)},
        "calls": {"made": sum(a.calls for a in asked if a is not None),
                  "served_by_cache": sum(a.hits for a in asked if a is not None),
                  "records_already_in_the_log": already},
        "ledger": {"calls": sum(len(r.get("calls") or []) for r in records),
                   "prompt_tokens": sum(c["prompt_tokens"] for r in records for c in r.get("calls") or []),
                   "completion_tokens": sum(c["completion_tokens"] for r in records for c in r.get("calls") or []),
                   "cost": sum(float(r.get("cost") or 0.0) for r in records)},
    }


def _check_of(worker: Worker, task: Task) -> dict[str, Any] | None:
    gen = worker.done.get(("generate", task.key, 0, 0))
    if gen is None or gen["status"] != "ok":
        return None
    return worker.done.get(("check", worker.check_ask(task, gen["question"]).cache_key, 0, 0))


def _estimate(tasks: list[Task], worker: Worker, calls: JudgeOptions, cache: JudgeCache | None) -> dict[str, Any]:
    """The dry run's figures for the first round: the questions to write and check, the calls they need (those of
    the log and the cache left out), their estimated prompt tokens, an upper bound of their cost. A check whose
    question is not known yet is estimated with a question of 40 characters."""
    todo = [t for t in tasks if ("generate", t.key, 0, 0) not in worker.done]
    n_calls = cached = prompt = 0
    for task in todo:
        ask = worker.write_ask(task)
        kept = cache.get(ask.cache_key) if cache is not None else None
        question = "?" * 40
        if kept is None:
            n_calls, prompt = n_calls + 1, prompt + ask.est_prompt
        else:
            cached += 1
            question = ask.parse(kept["text"])[0]["question"]
        check = worker.check_ask(task, question)
        if cache is None or cache.get(check.cache_key) is None:
            n_calls, prompt = n_calls + 1, prompt + check.est_prompt
        else:
            cached += 1
    if cache is not None:
        cache.close()
    completion = n_calls * calls.max_tokens
    return {"tasks": len(tasks), "to_write": len(todo), "calls": n_calls, "cached": cached, "prompt_tokens": prompt,
            "completion_tokens_at_most": completion,
            "cost_at_most": (prompt * calls.price_in + completion * calls.price_out) / 1_000_000, "rule": TOKEN_RULE,
            "note": "the first round only (later rounds replace what the filters drop); one check per question; "
                    "retries after an invalid reply are not included; completion tokens are counted at max_tokens"}
