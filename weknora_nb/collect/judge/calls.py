"""The judge's calls: one request through the cache, the cost limit and the strict reading of its reply.

- :class:`Ask`: one request (messages, cache key, first seed, how to read the reply).
- :class:`Asker`: the cache first (a kept reply is read again: it must still pass); else calls,
  attempt a sending ``seed + a - 1``; an invalid reply is asked again ``parse_retries`` times with
  the bad reply and what was wrong with it, then an :class:`Answered` failure of its kind with the
  raw text. A failed request is an :class:`Answered` of the :class:`RequestFailed` kind, except
  :class:`AuthFailed` and :class:`NotFound` (a refused key, an unknown model), which are raised:
  no other request would fare better. Every call's tokens go to its ledger entry.
- :class:`Budget`: the cost limit (:data:`TOKEN_RULE`, ``weknora_nb.collect.judge``): a reservation per call in flight,
  settled with what the call cost; past the limit :class:`BudgetExhausted`, and no call after.
- :class:`Job`: the asks of one judgement, shared by the judgements of the same texts (:func:`group`);
  :func:`cache_key` and :func:`seed_of` make an ask's key and seed, :func:`failure_body` a failed record's body.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weknora_nb.collect.judge.llm import Completion, LLMClient, LLMSettings, estimate_message_tokens, estimate_tokens
from weknora_nb.collect.judge.options import JudgeOptions
from weknora_nb.collect.judge.prompts import InvalidReply, Prompt, correction
from weknora_nb.collect.judge.store import JudgeCache, Key
from weknora_nb.core.errors import AuthFailed, NotFound, RequestFailed

#: how tokens are estimated and what the cost limit reserves (recorded in a judge manifest and a dry run's estimate)
TOKEN_RULE = ("estimated tokens = 1 per CJK character + 1 per 4 other characters (rounded up), + 4 per message "
              "+ 3 per reply; the cost limit reserves max(1.25, 1.1 x the largest reported/estimated ratio) x the "
              "estimate plus max_tokens completion tokens per call")


@dataclass
class Ask:
    """One request to make: its messages, cache key, first seed and how to read its reply."""

    cache_key: str
    messages: list[dict[str, str]]
    seed: int
    language: str
    parse: Callable[[str], Any]

    @property
    def est_prompt(self) -> int:
        return estimate_message_tokens(self.messages)


@dataclass
class Answered:
    """What an :class:`Ask` gave: a value read from a reply, or a failure's kind; and its calls."""

    value: Any = None
    kind: str | None = None
    error: str | None = None
    raw: str | None = None
    cached: bool = False
    model: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.kind is None


class BudgetExhausted(Exception):
    """The next call would take the cost past ``max_cost``: no further call is made."""


class Budget:
    """The cost limit: reservations for calls in flight, what calls cost, and how far estimates err."""

    def __init__(self, limit: float | None, price_in: float, price_out: float, max_tokens: int):
        """``limit``: the most to spend (None: no limit); prices per million tokens; the longest reply."""
        self.limit = limit
        self.price_in, self.price_out = price_in, price_out
        self.max_tokens = max_tokens
        self.spent = self.reserved = 0.0
        self.ratio = 1.0  # largest reported / estimated prompt tokens seen
        self.stopped = False

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        return (prompt_tokens * self.price_in + completion_tokens * self.price_out) / 1_000_000

    def reserve(self, est_prompt: int) -> float:
        """Reserve a call's largest likely cost; :class:`BudgetExhausted` (and no more calls) past the limit."""
        if self.stopped:
            raise BudgetExhausted
        need = self.cost(est_prompt * max(1.25, 1.1 * self.ratio), self.max_tokens)
        if self.limit is not None and self.spent + self.reserved + need > self.limit:
            self.stopped = True
            raise BudgetExhausted
        self.reserved += need
        return need

    def settle(self, reservation: float, cost: float, est_prompt: int, prompt_tokens: int | None) -> None:
        self.reserved -= reservation
        self.spent += cost
        if prompt_tokens:
            self.ratio = max(self.ratio, prompt_tokens / max(1, est_prompt))


class Asker:
    """Makes :class:`Ask` requests through the cache, the budget and the strict reading (module docstring)."""

    def __init__(self, client: LLMClient, cache: JudgeCache, budget: Budget, *, temperature: float, max_tokens: int,
                 parse_retries: int):
        self.client, self.cache, self.budget = client, cache, budget
        self.temperature, self.max_tokens, self.parse_retries = temperature, max_tokens, parse_retries
        #: completions received (re-asks included), asks served by the cache, records written without a call
        self.calls = self.hits = self.cached_records = self.prompt_tokens = self.completion_tokens = 0
        self.cost = 0.0
        self.models: set[str] = set()

    async def ask(self, ask: Ask) -> Answered:
        """The value of ``ask``'s reply: from the cache, or from calls (asked again after an invalid reply)."""
        kept = self.cache.get(ask.cache_key)
        if kept is not None:
            try:
                value = ask.parse(kept["text"])
            except InvalidReply:
                pass  # kept under another reading of replies: ask again
            else:
                self.hits += 1
                return Answered(value, cached=True, model=kept.get("model"))
        messages, calls = list(ask.messages), list[dict[str, Any]]()
        for attempt in range(1, self.parse_retries + 2):
            completion = await self._call(messages, ask, attempt, calls)
            if isinstance(completion, Answered):
                return completion
            try:
                value = ask.parse(completion.text)
            except InvalidReply as bad:
                if attempt > self.parse_retries:
                    return Answered(kind=bad.kind, error=str(bad), raw=completion.text, model=completion.model,
                                    calls=calls)
                messages = [*ask.messages, {"role": "assistant", "content": completion.text},
                            {"role": "user", "content": correction(bad, ask.language)}]
                continue
            self.cache.put(ask.cache_key, {"text": completion.text, "model": completion.model})
            return Answered(value, model=completion.model, calls=calls)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call(self, messages: list[dict[str, str]], ask: Ask, attempt: int,
                    calls: list[dict[str, Any]]) -> Completion | Answered:
        """One completion (its ledger entry appended to ``calls``), or the failure's :class:`Answered`."""
        est = estimate_message_tokens(messages)
        reservation = self.budget.reserve(est)
        try:
            completion = await self.client.complete(messages, temperature=self.temperature,
                                                    max_tokens=self.max_tokens, seed=ask.seed + attempt - 1)
        except (AuthFailed, NotFound):
            self.budget.settle(reservation, 0.0, est, None)
            raise
        except RequestFailed as exc:
            self.budget.settle(reservation, 0.0, est, None)
            return Answered(kind=exc.kind, error=str(exc)[:500], calls=calls)
        reported = completion.prompt_tokens is not None and completion.completion_tokens is not None
        pt = completion.prompt_tokens if reported else est
        ct = completion.completion_tokens if reported else estimate_tokens(completion.text)
        assert pt is not None and ct is not None
        cost = self.budget.cost(pt, ct)
        self.budget.settle(reservation, cost, est, completion.prompt_tokens if reported else None)
        calls.append({"attempt": attempt, "prompt_tokens": pt, "completion_tokens": ct,
                      "usage": "reported" if reported else "estimated", "cost": cost})
        self.calls += 1
        self.prompt_tokens += pt
        self.completion_tokens += ct
        self.cost += cost
        if completion.model:
            self.models.add(completion.model)
        return completion


# ---------------------------------------------------------------------------------------
# jobs: the asks of a judgement, shared by judgements of the same texts
# ---------------------------------------------------------------------------------------
@dataclass
class Job:
    """The asks one judgement needs (pointwise 1, pairwise 2), the judgements that share them (the first
    pays, the others are served by its replies), and how a record's body is built from the answers."""

    keys: list[Key]
    asks: list[Ask]
    build: Callable[[list[Answered]], dict[str, Any]]
    meta: dict[str, Any]


def group(jobs: list[Job]) -> list[Job]:
    """Jobs whose asks are the same requests merged into one (their judgement keys together)."""
    merged: dict[tuple[str, ...], Job] = {}
    for job in jobs:
        sig = tuple(a.cache_key for a in job.asks)
        if sig in merged:
            merged[sig].keys.extend(job.keys)
        else:
            merged[sig] = job
    return list(merged.values())


def cache_key(settings: LLMSettings | None, options: JudgeOptions, prompt: Prompt, judge_repeat: int, seed: int,
              messages: list[dict[str, str]]) -> str:
    """An ask's cache key: the sha256 of everything that decides its reply (the model, temperature, max_tokens,
    the judge repeat and its seed, the prompt's name and sha256, the messages as sent); not the server's address,
    which may change (the sandbox's port) while the model stays."""
    blob = {"model": settings.model if settings else None,
            "temperature": options.temperature, "max_tokens": options.max_tokens, "judge_repeat": judge_repeat,
            "seed": seed, "prompt": prompt.name, "prompt_sha256": prompt.sha256, "messages": messages}
    return hashlib.sha256(json.dumps(blob, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def seed_of(options: JudgeOptions, judge_repeat: int) -> int:
    """The first seed of judge repeat ``judge_repeat`` (its attempt a sends this + a - 1)."""
    return options.seed + 1000 * (judge_repeat - 1)


def failure_body(answers: list[Answered]) -> dict[str, Any] | None:
    """The body of a failed judgement's record (the first failed answer's kind, error and raw reply); None when
    every answer is ok."""
    bad = next((a for a in answers if not a.ok), None)
    if bad is None:
        return None
    body: dict[str, Any] = {"status": "failed", "kind": bad.kind, "error": bad.error}
    if bad.raw is not None:
        body["raw"] = bad.raw
    return body
