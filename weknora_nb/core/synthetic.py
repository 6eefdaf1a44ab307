"""Generated test sets as data (docs/method.md section 17): what ``weknora-nb testset generate`` is asked for, what it
plans, what a language model gave back, and what was kept.

- :class:`GenerateOptions`: the set asked for: ``n`` questions, the mix of question types, how many questions a
  chunk may source, the language, the round-trip check (depth and what to do with a question that does not find its
  source chunk), how many rounds may replace what the filters drop. Checked when made (:class:`UsageError`).
- :class:`Task`: one request to write a question: its type, its chunks (the source first; a second one for the
  types of :data:`PAIRED`), the document and chunk type it counts against, the language, the round it was planned
  in. Its ``key`` is a hash of what decides the reply (type, chunk ids and contents, language, variant), so that a
  rerun finds its outcome again.
- :class:`Candidate`: a question written for a task, with what the filters found: answerable from its chunks or
  not (None: the check failed), its round trip (``hit``, ``miss``, ``failed``, None: not searched) and the rank of
  its source chunk.
- :class:`Selection`: the questions kept and why the others were not.

A generated query's test-set record carries ``source: synthetic`` (:data:`SYNTHETIC`), its source chunk at grade
:data:`SOURCE_GRADE` and the other chunk of a paired question at :data:`OTHER_GRADE`, and its lexical overlap with
the source chunk.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from weknora_nb.core.errors import UsageError
from weknora_nb.core.testset.validate import SYNTHETIC as SYNTHETIC

#: the question types: a fact, steps, two things compared, an answer spread over two chunks, a vague request
QUESTION_TYPES = ("factual", "procedural", "comparison", "multi-chunk", "vague")
#: the types written from two chunks of one document (the source and one other)
PAIRED = frozenset({"comparison", "multi-chunk"})
#: the default share of each type
DEFAULT_MIX: dict[str, float] = {"factual": 0.3, "procedural": 0.2, "comparison": 0.15, "multi-chunk": 0.15,
                                 "vague": 0.2}
#: what to do with a question whose source chunk is not among the top ``depth`` of hybrid-search: keep it as it is,
#: keep it tagged ``round-trip-miss``, or drop it
ROUND_TRIP_MODES = ("keep", "flag", "drop")
#: grade of a question's source chunk (it answers the question), and of the other chunk of a paired question
SOURCE_GRADE, OTHER_GRADE = 3, 2
#: tags of a kept question that did not find its source chunk, or whose search failed
MISS_TAG, UNCHECKED_TAG = "round-trip-miss", "round-trip-unchecked"
#: a Han character (CJK unified ideographs, extension A, compatibility ideographs)
_HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def han_count(text: str) -> int:
    """How many Han characters ``text`` holds: what tells Chinese text (a question, a chunk) from English."""
    return len(_HAN.findall(text))


def parse_mix(text: str) -> dict[str, float]:
    """``"factual=0.3,vague=0.2"`` as a mix (types left out get 0); a :class:`UsageError` names what is wrong."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, value = part.partition("=")
        name = name.strip()
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not sep or name not in QUESTION_TYPES or not math.isfinite(share) or share < 0 or name in mix:
            raise UsageError(argument="--types", allowed=f"TYPE=SHARE,... with TYPE one of {list(QUESTION_TYPES)} "
                             "(each once) and SHARE a number >= 0", got=text)
        mix[name] = share
    return mix


@dataclass(frozen=True)
class GenerateOptions:
    """What to generate (defaults as the command line's); checked when made (:class:`UsageError`)."""

    n: int = 300
    mix: tuple[tuple[str, float], ...] = tuple(DEFAULT_MIX.items())
    per_chunk: int = 1
    seed: int = 0
    language: str = "auto"
    round_trip: str = "flag"
    depth: int = 10
    max_rounds: int = 4
    oversample: float = 1.5
    min_chars: int = 40

    def __post_init__(self) -> None:
        for name, value, low in (("--n", self.n, 1), ("--per-chunk", self.per_chunk, 1), ("--seed", self.seed, 0),
                                 ("--depth", self.depth, 1), ("--max-rounds", self.max_rounds, 1),
                                 ("--min-chars", self.min_chars, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UsageError(argument=name, allowed=f"an integer >= {low}", got=value)
        if self.language not in ("auto", "zh", "en"):
            raise UsageError(argument="--language", allowed=["auto", "zh", "en"], got=self.language)
        if self.round_trip not in ROUND_TRIP_MODES:
            raise UsageError(argument="--round-trip", allowed=list(ROUND_TRIP_MODES), got=self.round_trip)
        if isinstance(self.oversample, bool) or not isinstance(self.oversample, (int, float)) \
                or not 1 <= self.oversample <= 10:
            raise UsageError(argument="oversample", allowed="a number from 1 to 10", got=self.oversample)
        shares = dict(self.mix)
        if set(shares) - set(QUESTION_TYPES) or len(shares) != len(self.mix) or not all(
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in shares.values()) \
                or sum(shares.values()) <= 0:
            raise UsageError(argument="--types", allowed=f"shares >= 0 of {list(QUESTION_TYPES)}, not all 0",
                             got=dict(self.mix))

    @property
    def shares(self) -> dict[str, float]:
        """Each type's share of the questions, summing to 1 (types left out: 0)."""
        given = dict(self.mix)
        total = sum(given.values())
        return {t: given.get(t, 0.0) / total for t in QUESTION_TYPES}

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "types": self.shares, "per_chunk": self.per_chunk, "seed": self.seed,
                "language": self.language, "round_trip": self.round_trip, "depth": self.depth,
                "max_rounds": self.max_rounds, "oversample": self.oversample, "min_chars": self.min_chars}


@dataclass(frozen=True)
class Task:
    """One question to write (module docstring); ``order`` ranks it among every task planned (earlier first)."""

    key: str
    question_type: str
    chunk_ids: tuple[str, ...]
    knowledge_id: str
    chunk_type: str
    language: str
    round: int
    order: int

    @property
    def source(self) -> str:
        return self.chunk_ids[0]

    def to_dict(self) -> dict[str, Any]:
        return {"question_type": self.question_type, "chunk_ids": list(self.chunk_ids),
                "knowledge_id": self.knowledge_id, "chunk_type": self.chunk_type, "language": self.language,
                "round": self.round, "order": self.order}


@dataclass
class Candidate:
    """A question written for ``task`` and what the filters found (module docstring)."""

    task: Task
    question: str
    answer: str
    answerable: bool | None = None
    round_trip: str | None = None
    rank: int | None = None


@dataclass
class Selection:
    """The questions kept (in task order), whether they reach ``n``, and the counts of what was not kept."""

    kept: list[Candidate]
    reached: bool
    counts: dict[str, Any] = field(default_factory=dict)
