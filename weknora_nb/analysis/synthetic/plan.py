"""The plan of a generated test set: which chunks write which questions, under quotas (docs/method.md section 17).

**Eligible chunks**: enabled, holding at least ``min_chars`` characters, of a chunk type a question can be written
from (not :data:`DERIVED_TYPES`: text WeKnora derives from other chunks). A document is a knowledge.

**Quotas**, so that no file and no kind of chunk dominates:

- per document: ``q`` = the smallest integer with ``sum_d min(q, cap_d) >= n``, where ``cap_d`` = the document's
  eligible chunks x ``per_chunk`` (water filling). No document gives more than ``q`` questions; ``q = ceil(n / D)``
  for D documents when each can give that many, more when small documents cannot;
- per chunk type: ``n`` shared in proportion to the eligible chunks of each type, each type first getting
  ``min(5, its size)`` (:func:`weknora_nb.analysis.sampling.allocate`, as ``testset sample`` shares its strata);
- per question type: ``n`` x its share of the mix (largest remainders).

The document quota is a bound (:mod:`.curate` never keeps more); the type targets steer the plan and the selection,
which fills up past them when the questions of a type run out.

**Rounds.** Round 1 plans ``ceil(n x oversample)`` tasks; each later round plans ``ceil(need x f)`` for the questions
still missing, ``f = min(4, max(oversample, 1 / survival))`` with ``survival`` = questions kept / tasks planned so
far (4 when none was kept). Documents are served round-robin in a seeded order, each up to ``ceil(room_d x f)``
tasks a round (``room_d``: its quota less what it has kept), from its chunks in a seeded order, a chunk sourcing
at most ``per_chunk`` tasks; the first chunk whose chunk type is below its share of the tasks planned is taken.

**Types.** A task gets, among the types its chunk suits, the one furthest below its share of the tasks planned so
far: ``procedural`` suits a chunk with steps (numbered lines, commands, 步骤/执行/点击/step/run ...:
:data:`_STEPS`), the :data:`~weknora_nb.core.synthetic.PAIRED` types a document with another eligible chunk,
``factual`` and ``vague`` every chunk. A ``multi-chunk`` question's second chunk is the next one of the document
(the previous one for the last): the answers that span two adjacent chunks. A ``comparison``'s is the chunk of the
document, not adjacent, that shares the most tokens with it (Jaccard): something alike to compare.

**Language**: ``zh`` when most eligible chunks hold a Han character (``auto``), else ``en``; the prompts and the
questions are in it.

Everything is a function of the chunks, the options, the seed and what earlier rounds kept, so a rerun plans the
same tasks and finds their outcomes in its log.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from weknora_nb.analysis.sampling import allocate
from weknora_nb.analysis.synthetic.overlap import token_set
from weknora_nb.core.synthetic import PAIRED, QUESTION_TYPES, GenerateOptions, Selection, Task, han_count

#: chunk types holding text WeKnora derives from other chunks (summaries, graph entities): no question source
DERIVED_TYPES = frozenset({"summary", "entity", "relationship"})
#: a chunk with steps: a numbered or bulleted line, a command block, or words of doing
_STEPS = re.compile(r"(?m)^\s*(?:\d+[.、)）]|[-*] |第[一二三四五六七八九十\d]+步)|```|步骤|执行|运行|点击|命令|安装|"
                    r"\b(?:step|run|click|install|configure|execute)\b", re.IGNORECASE)
#: the largest factor a round's plan is grown by to make up for what the filters drop
_MAX_FACTOR = 4.0


@dataclass(frozen=True)
class Source:
    """An eligible chunk: its id, document, type, position in the document's eligible chunks, and text."""

    chunk_id: str
    knowledge_id: str
    chunk_type: str
    position: int
    content: str


def eligible_chunks(chunks: pd.DataFrame, min_chars: int) -> tuple[list[Source], dict[str, int]]:
    """The eligible chunks (module docstring) in document order, and how many were left out and why
    (``disabled``, ``short``, ``derived_type``)."""
    skipped = Counter[str]()
    kept: list[tuple[str, str, str, int, str]] = []
    for cid, kid, ctype, index, enabled, content in chunks[
            ["chunk_id", "knowledge_id", "chunk_type", "chunk_index", "is_enabled", "content"]].itertuples(index=False):
        text = content if isinstance(content, str) else ""
        why = ("disabled" if not enabled else "derived_type" if str(ctype) in DERIVED_TYPES
               else "short" if len(text.strip()) < min_chars else None)
        if why:
            skipped[why] += 1
            continue
        kept.append((str(kid), str(cid), str(ctype), int(index) if pd.notna(index) else 0, text))
    kept.sort(key=lambda r: (r[0], r[3], r[1]))
    out, position = [], Counter[str]()
    for kid, cid, ctype, _, text in kept:
        out.append(Source(cid, kid, ctype, position[kid], text))
        position[kid] += 1
    return out, {k: skipped.get(k, 0) for k in ("disabled", "short", "derived_type")}


def water_fill(capacity: dict[str, int], n: int) -> int:
    """The smallest ``q`` with ``sum min(q, cap) >= n`` (the largest capacity when even that is short)."""
    top = max(capacity.values(), default=0)
    if top <= 0:
        return 0
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(min(mid, c) for c in capacity.values()) >= n:
            hi = mid
        else:
            lo = mid + 1
    return lo


def largest_remainders(shares: dict[str, float], n: int) -> dict[str, int]:
    """``n`` split by ``shares`` (summing to 1): floors, then one more to the largest remainders (ties: type order)."""
    raw = {k: n * s for k, s in shares.items()}
    out = {k: math.floor(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: (-(raw[k] - out[k]), list(raw).index(k)))[:n - sum(out.values())]:
        out[k] += 1
    return out


def decide_language(sources: list[Source], asked: str) -> str:
    """``asked`` unless ``auto``; then ``zh`` when most eligible chunks hold a Han character, else ``en``."""
    if asked != "auto":
        return asked
    zh = sum(1 for s in sources if han_count(s.content))
    return "zh" if sources and zh * 2 >= len(sources) else "en"


class Planner:
    """Plans the tasks of each round (module docstring) for ``chunks`` (an inventory) and ``options``."""

    def __init__(self, chunks: pd.DataFrame, options: GenerateOptions):
        self.options = options
        self.sources, self.skipped = eligible_chunks(chunks, options.min_chars)
        self.language = decide_language(self.sources, options.language)
        self.docs: dict[str, list[Source]] = {}
        for s in self.sources:
            self.docs.setdefault(s.knowledge_id, []).append(s)
        self.capacity = {d: len(cs) * options.per_chunk for d, cs in self.docs.items()}
        self.doc_quota = water_fill(self.capacity, options.n)
        self.type_targets = largest_remainders(options.shares, options.n)
        sizes = Counter(s.chunk_type for s in self.sources)
        self.chunk_type_targets = allocate(dict(sorted(sizes.items())), options.n) if sizes else {}
        self.planned: list[Task] = []
        self._uses = Counter[str]()
        self._variants = Counter[tuple[str, ...]]()
        self._doc_order = sorted(self.docs)
        random.Random(f"{options.seed}/documents").shuffle(self._doc_order)
        self._chunk_order = {d: random.Random(f"{options.seed}/{d}").sample(cs, len(cs)) for d, cs in self.docs.items()}

    @property
    def reachable(self) -> int:
        """The most questions the eligible chunks can give (each sourcing ``per_chunk``), up to ``n``."""
        return min(self.options.n, sum(self.capacity.values()))

    def plan(self, round_no: int, selection: Selection | None) -> list[Task]:
        """The tasks of round ``round_no`` given what the rounds before kept (None: the first round)."""
        kept = selection.kept if selection is not None else []
        need = self.reachable - len(kept)
        if need <= 0 or round_no > self.options.max_rounds:
            return []
        if not self.planned:
            factor = self.options.oversample
        else:
            factor = _MAX_FACTOR if not kept else min(_MAX_FACTOR, max(self.options.oversample,
                                                                        len(self.planned) / len(kept)))
        total = math.ceil(need * factor)
        kept_by_doc = Counter(c.task.knowledge_id for c in kept)
        caps = {d: math.ceil(max(0, self.doc_quota - kept_by_doc[d]) * factor) for d in self._doc_order}
        taken = Counter[str]()
        tasks: list[Task] = []
        while len(tasks) < total:
            before = len(tasks)
            for d in self._doc_order:
                if len(tasks) >= total:
                    break
                if taken[d] < caps[d]:
                    task = self._task(d, round_no)
                    if task is not None:
                        tasks.append(task)
                        taken[d] += 1
            if len(tasks) == before:   # every document is at its cap or out of chunks
                break
        return tasks

    def _task(self, doc: str, round_no: int) -> Task | None:
        """The next task of ``doc`` (its next unused chunk, the type furthest below its share), or None."""
        free = [s for s in self._chunk_order[doc] if self._uses[s.chunk_id] < self.options.per_chunk]
        if not free:
            return None
        planned_types = Counter(t.chunk_type for t in self.planned)
        total, n, targets = max(1, len(self.planned)), self.options.n, self.chunk_type_targets
        below = [s for s in free if planned_types[s.chunk_type] / total < targets.get(s.chunk_type, 0) / n]
        source = (below or free)[0]
        qtype = self._question_type(source)
        chunks = (source,) if qtype not in PAIRED else (source, self._partner(source, qtype))
        ids = tuple(c.chunk_id for c in chunks)
        variant = self._variants[(qtype, *ids)]
        self._variants[(qtype, *ids)] += 1
        self._uses[source.chunk_id] += 1
        blob = [qtype, [[c.chunk_id, hashlib.sha256(c.content.encode("utf-8")).hexdigest()] for c in chunks],
                self.language, variant]
        key = hashlib.sha256(json.dumps(blob, ensure_ascii=False).encode("utf-8")).hexdigest()[:32]
        task = Task(key, qtype, ids, doc, source.chunk_type, self.language, round_no, len(self.planned))
        self.planned.append(task)
        return task

    def _question_type(self, source: Source) -> str:
        """The type furthest below its share of the tasks planned, among those ``source`` suits."""
        counts = Counter(t.question_type for t in self.planned)
        total = len(self.planned) + 1
        shares = self.options.shares
        suits = [t for t in QUESTION_TYPES if shares[t] > 0 and self._suits(source, t)]
        if not suits:
            suits = ["factual"]
        return max(suits, key=lambda t: (shares[t] - counts[t] / total, -QUESTION_TYPES.index(t)))

    def _suits(self, source: Source, qtype: str) -> bool:
        if qtype == "procedural":
            return bool(_STEPS.search(source.content))
        if qtype in PAIRED:
            return len(self.docs[source.knowledge_id]) >= 2
        return True

    def _partner(self, source: Source, qtype: str) -> Source:
        """The second chunk of a paired question (module docstring)."""
        doc = self.docs[source.knowledge_id]
        if qtype == "multi-chunk":
            i = source.position
            return doc[i + 1] if i + 1 < len(doc) else doc[i - 1]
        others = [c for c in doc if abs(c.position - source.position) > 1] or \
            [c for c in doc if c.chunk_id != source.chunk_id]
        mine = token_set(source.content)

        def alike(c: Source) -> tuple[float, int]:
            theirs = token_set(c.content)
            union = len(mine | theirs)
            return (len(mine & theirs) / union if union else 0.0, -c.position)
        return max(others, key=alike)
