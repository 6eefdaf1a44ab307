"""How to judge (:class:`JudgeOptions`, the command line's options as data) and what a judge run did
(:class:`JudgeOutcome`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weknora_nb.collect.judge.prompts import detect_language
from weknora_nb.core.errors import UsageError


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


def prompt_language(options: JudgeOptions, *texts: str | None) -> str:
    return options.language if options.language != "auto" else detect_language(*texts)


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
