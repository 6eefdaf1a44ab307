"""A test set sampled from real traffic: the user queries of WeKnora's history, cleaned, grouped, stratified.

:func:`sample_candidates` takes the user queries (text, session, time) and, in this order:

1. **masks** personal data in each text (:func:`weknora_nb.analysis.privacy.mask`) before anything
   else sees it: no unmasked text goes further, into a file or a log;
2. **normalises** it (:func:`normalise`): NFKC (full-width letters, digits and punctuation become
   half-width), whitespace collapsed, trailing punctuation stripped, Latin case folded. Texts equal
   after that are the same question (exact duplicates); one that is empty after it is dropped;
3. **clusters** near duplicates (typos, small edits): a text joins the most similar cluster whose
   leading text it matches with a normalised Indel similarity (rapidfuzz ``fuzz.ratio``) of at least
   ``similarity`` (default 0.9: one character changed in a 10-character question), provided both
   hold the same numbers (``DG-1003`` and ``DG-1004`` are two questions). Leaders are taken from
   the most asked down, so a typo joins the spelling most people typed;
4. **counts** each cluster: ``weight`` = how often it was asked (its traffic weight), ``n_sessions``
   = in how many sessions, ``first_seen`` / ``last_seen``; its **representative** is its most asked
   spelling (masked, as typed but for whitespace); its ``query_id`` is ``q-`` and the first 12 hex
   digits of the SHA-256 of the representative's normalised text (stable across runs);
5. **classifies** the representative with the query-type rules (:mod:`weknora_nb.analysis.stratify`)
   and tags what a person may want to drop (:func:`vagueness`): ``off-topic`` (greetings, small
   talk) and ``vague`` (too short, or nothing left but generic words such as 怎么弄, 不行了);
6. **stratifies** by frequency x query type. Frequency: the most asked clusters that together make
   the first ``frequent_share`` (half) of the traffic are ``frequent`` (the cluster that crosses the
   line included; a cluster asked once is never frequent), the rest ``long-tail``;
7. **samples** ``n`` clusters, seeded: every non-empty stratum first gets ``min(k_min, its size)``
   (``k_min`` lowered so that these minimums fit in ``n``), the rest of ``n`` is shared in proportion
   to the strata's sizes (largest remainders, never more than a stratum holds, what a full stratum
   cannot take going to the others). Within a stratum the clusters are drawn uniformly.

The records written (:func:`write_candidates`) are a loadable test set: ``query_id``, ``query``,
``relevant`` (``{}``: nobody judged them yet), ``query_type``, ``tags`` (``frequent`` or
``long-tail``; ``masked``, ``vague``, ``off-topic`` when they apply), ``weight``, ``source``
(``traffic``: reports tell these queries from generated ones, docs/method.md section 17), and
``n_sessions``, ``first_seen``, ``last_seen``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from weknora_nb.analysis.privacy import KINDS, mask
from weknora_nb.analysis.stratify import QueryTypeRules, load_rules
from weknora_nb.core.errors import UsageError, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.testset.validate import TRAFFIC

FREQUENT, LONG_TAIL = "frequent", "long-tail"
#: greetings and thanks: a text made of these alone is off-topic
_GREETINGS = ("你好", "您好", "hello", "hi", "hey", "在吗", "在不在", "谢谢", "多谢", "感谢", "thanks", "thank you",
              "再见", "拜拜", "bye", "早上好", "下午好", "晚上好", "哈哈", "嗯", "好的", "ok", "测试", "test")
#: small talk: a short text (at most 12 characters) holding one of these is off-topic
_SMALL_TALK = ("天气", "几点了", "笑话", "你是谁", "你叫什么", "吃什么", "机器人吗", "你好吗", "聊聊天")
#: words that say nothing of what is asked: a text with fewer than two characters besides these is vague
_GENERIC = ("怎么回事", "怎么弄", "怎么办", "怎么搞", "咋回事", "咋办", "咋弄", "怎么", "为什么", "什么", "如何",
            "不行", "坏了", "出错", "报错", "错误", "有问题", "问题", "没反应", "用不了", "不能用", "帮帮我", "帮我",
            "看看", "一下", "请问", "这个", "那个", "还是", "又", "了", "的", "吗", "呢", "啊", "吧", "呀", "我", "你",
            "它", "是", "help", "error", "please")
_NUMBER = re.compile(r"\d+")
#: how many of a text's rarest bigrams look up its candidate clusters
_PROBES = 8


class AskedQuery(Protocol):
    """One user query as the history gave it (``weknora_nb.collect.history.UserQuery`` is one): its text as
    asked, its session, and when (RFC 3339)."""

    @property
    def text(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def created_at(self) -> str: ...


def normalise(text: str) -> str:
    """The text two spellings of one question share: NFKC, whitespace collapsed, trailing punctuation
    stripped, case folded (``"  ＶＰＮ 连不上？"`` -> ``"vpn 连不上"``)."""
    text = " ".join(unicodedata.normalize("NFKC", text).split())
    end = len(text)
    while end and (text[end - 1].isspace() or text[end - 1] == "~"
                   or unicodedata.category(text[end - 1])[0] == "P" or unicodedata.category(text[end - 1]) == "So"):
        end -= 1
    return text[:end].casefold()


def vagueness(text: str) -> str | None:
    """``"off-topic"``, ``"vague"`` or None for a normalised text (rules in the module constants)."""
    bare = re.sub(r"[\s\W_]+", "", text)
    rest = bare
    for g in sorted(_GREETINGS, key=len, reverse=True):
        rest = rest.replace(g.replace(" ", ""), "")
    if bare and not rest:
        return "off-topic"
    if len(bare) <= 12 and any(w in bare for w in _SMALL_TALK):
        return "off-topic"
    for g in sorted(_GENERIC, key=len, reverse=True):
        rest = rest.replace(g, "")
    return "vague" if len(rest) < 2 else None


@dataclass
class Cluster:
    """Questions that are one question: their spellings (masked) and where and when they were asked."""

    key: str
    spellings: Counter[str] = field(default_factory=Counter)
    sessions: set[str] = field(default_factory=set)
    times: list[tuple[datetime, str]] = field(default_factory=list)
    masked: bool = False
    exact_keys: set[str] = field(default_factory=set)

    @property
    def weight(self) -> int:
        """How often the question was asked."""
        return sum(self.spellings.values())

    @property
    def representative(self) -> str:
        """The most asked spelling (ties: the first in code-point order)."""
        return min(self.spellings.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    @property
    def query_id(self) -> str:
        """``q-`` + 12 hex digits of the SHA-256 of the representative's normalised text."""
        return "q-" + hashlib.sha256(normalise(self.representative).encode("utf-8")).hexdigest()[:12]

    def absorb(self, other: Cluster) -> None:
        """Take ``other``'s spellings, sessions and times."""
        self.spellings.update(other.spellings)
        self.sessions |= other.sessions
        self.times += other.times
        self.masked = self.masked or other.masked
        self.exact_keys |= other.exact_keys


@dataclass
class Sample:
    """The sampled test-set records and the figures of how they were made."""

    records: list[dict[str, Any]]
    summary: dict[str, Any]


def _when(text: str) -> datetime:
    """An RFC 3339 time as the server wrote it (``Z`` or an offset; up to nanoseconds, read to microseconds)."""
    t = text.strip().replace("Z", "+00:00").replace("z", "+00:00")
    t = re.sub(r"(\.\d{6})\d+", r"\1", t)
    return datetime.fromisoformat(t)


def _exact_groups(asked: Iterable[AskedQuery]) -> tuple[dict[str, Cluster], Counter[str], int, int]:
    """Masked texts grouped by their normalised form; the masked counts per kind; texts read; texts dropped empty."""
    groups: dict[str, Cluster] = {}
    counts: Counter[str] = Counter()
    seen = empty = 0
    for q in asked:
        seen += 1
        m = mask(q.text)
        counts.update(m.counts)
        spelling = " ".join(m.text.split())
        key = normalise(spelling)
        if not key:
            empty += 1
            continue
        g = groups.setdefault(key, Cluster(key, exact_keys={key}))
        g.spellings[spelling] += 1
        g.sessions.add(q.session_id)
        g.times.append((_when(q.created_at), q.created_at))
        g.masked = g.masked or m.masked
    return groups, counts, seen, empty


def cluster(groups: Iterable[Cluster], similarity: float = 0.9) -> list[Cluster]:
    """Near-duplicate groups merged (see the module docstring, step 3); most asked first.

    Candidates for each text are the leaders sharing the most of its :data:`_PROBES` rarest character
    bigrams (at most 30 of them), each checked with the Indel similarity: a near duplicate shares
    nearly all its bigrams, so it shares rare ones too, and common bigrams (怎么) cost nothing.
    """
    from rapidfuzz import fuzz

    if not 0 < similarity <= 1:
        raise UsageError(argument="similarity", allowed="a number in (0, 1]", got=similarity)
    leaders: list[Cluster] = []
    postings: dict[str, list[int]] = defaultdict(list)
    for g in sorted(groups, key=lambda c: (-c.weight, c.key)):
        grams = _bigrams(g.key)
        rarest = sorted((b for b in grams if b in postings), key=lambda b: (len(postings[b]), b))[:_PROBES]
        shared: Counter[int] = Counter(i for b in rarest for i in postings[b])
        best, best_score = None, similarity * 100
        for i, _ in shared.most_common(30):
            lead = leaders[i]
            score = fuzz.ratio(g.key, lead.key)
            if score >= best_score and _NUMBER.findall(g.key) == _NUMBER.findall(lead.key):
                best, best_score = lead, score
        if best is not None:
            best.absorb(g)
            continue
        for b in grams:
            postings[b].append(len(leaders))
        leaders.append(g)
    return sorted(leaders, key=lambda c: (-c.weight, c.query_id))


def _bigrams(text: str) -> set[str]:
    return {text[i:i + 2] for i in range(max(1, len(text) - 1))}


def frequency_strata(clusters: Sequence[Cluster], share: float = 0.5) -> dict[str, str]:
    """``query_id`` -> ``frequent`` / ``long-tail``: the most asked clusters making the first ``share`` of
    the traffic (the one crossing the line included) are frequent, if asked more than once."""
    total = sum(c.weight for c in clusters)
    out: dict[str, str] = {}
    running = 0
    for c in sorted(clusters, key=lambda c: (-c.weight, c.query_id)):
        frequent = running < share * total and c.weight > 1
        out[c.query_id] = FREQUENT if frequent else LONG_TAIL
        running += c.weight
    return out


def allocate(sizes: Mapping[str, int], n: int, k_min: int = 5) -> dict[str, int]:
    """How many to draw from each stratum: ``min(k, size)`` each first (``k`` <= ``k_min``, lowered until
    these fit in ``n``), then the rest of ``n`` in proportion to the sizes by largest remainders, capped
    at each stratum's size (see the module docstring, step 7). Never more than ``sum(sizes)`` in all."""
    live = {s: z for s, z in sizes.items() if z > 0}
    n = min(n, sum(live.values()))
    k = k_min
    while k > 0 and sum(min(k, z) for z in live.values()) > n:
        k -= 1
    take = {s: min(k, z) for s, z in live.items()}
    while sum(take.values()) < n:
        room = {s: live[s] - take[s] for s in live if take[s] < live[s]}
        left = n - sum(take.values())
        weight = sum(live[s] for s in room)
        quota = {s: left * live[s] / weight for s in room}
        floors = {s: min(room[s], math.floor(q)) for s, q in quota.items()}
        if sum(floors.values()) == 0:  # fewer left than strata: by largest remainder, one each
            for s in sorted(room, key=lambda s: (-(quota[s] - math.floor(quota[s])), s))[:left]:
                floors[s] = 1
        for s, f in floors.items():
            take[s] += f
    return {s: take.get(s, 0) for s in sizes}


def sample_candidates(asked: Iterable[AskedQuery], *, n: int = 300, seed: int = 0, rules: QueryTypeRules | None = None,
                      k_min: int = 5, frequent_share: float = 0.5, similarity: float = 0.9) -> Sample:
    """Sample ``n`` candidate queries from ``asked`` (see the module docstring); the records and a summary:
    ``user_queries``, ``empty``, ``unique_exact``, ``clusters``, ``masked`` (per kind), ``strata`` (clusters
    per stratum), ``sampled_by_stratum``, ``sampled``, ``traffic_sampled`` (share of the traffic the
    sample's clusters carry), ``tagged`` (clusters tagged vague / off-topic), the rule and the seed."""
    if n < 1:
        raise UsageError(argument="--n", allowed=">= 1", got=n)
    rules = rules or load_rules()
    groups, masked, seen, empty = _exact_groups(asked)
    clusters = cluster(groups.values(), similarity)
    freq = frequency_strata(clusters, frequent_share)
    strata: dict[str, list[Cluster]] = defaultdict(list)
    types, tags = {}, {}
    for c in clusters:
        types[c.query_id] = rules.classify(c.representative)
        tags[c.query_id] = [freq[c.query_id]] + (["masked"] if c.masked else []) + \
            [t for t in [vagueness(normalise(c.representative))] if t]
        strata[f"{freq[c.query_id]}/{types[c.query_id]}"].append(c)
    take = allocate({s: len(cs) for s, cs in sorted(strata.items())}, n, k_min)
    rng = random.Random(seed)
    chosen: list[Cluster] = []
    for s in sorted(strata):
        chosen += rng.sample(sorted(strata[s], key=lambda c: c.query_id), take[s])
    chosen.sort(key=lambda c: (-c.weight, c.query_id))
    records = [_record(c, types[c.query_id], tags[c.query_id]) for c in chosen]
    total = sum(c.weight for c in clusters)
    summary = {
        "user_queries": seen, "empty": empty, "unique_exact": len(groups), "clusters": len(clusters),
        "masked": {k: masked.get(k, 0) for k in KINDS}, "strata": {s: len(cs) for s, cs in sorted(strata.items())},
        "sampled": len(records), "sampled_by_stratum": {s: v for s, v in take.items() if v},
        "traffic_sampled": round(sum(c.weight for c in chosen) / total, 4) if total else 0.0,
        "tagged": dict(Counter(t for c in clusters for t in tags[c.query_id] if t in ("vague", "off-topic"))),
        "rule": {"frequent_share": frequent_share, "k_min": k_min, "similarity": similarity}, "n": n, "seed": seed}
    return Sample(records, summary)


def _record(c: Cluster, query_type: str, tags: list[str]) -> dict[str, Any]:
    """The test-set record of a sampled cluster."""
    first, last = min(c.times), max(c.times)
    return {"query_id": c.query_id, "query": c.representative, "relevant": {}, "query_type": query_type,
            "tags": tags, "weight": c.weight, "source": TRAFFIC, "n_sessions": len(c.sessions), "first_seen": first[1],
            "last_seen": last[1]}


def summary_path(path: str | Path) -> Path:
    """Where the summary of the candidates written to ``path`` goes: ``<path>.summary.json``."""
    p = Path(path)
    return p.with_name(p.name + ".summary.json")


def write_candidates(path: str | Path, sample: Sample, extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``sample.records`` as JSONL to ``path`` and the summary (``extra`` first, e.g. the crawl's figures)
    beside it (:func:`summary_path`), each atomically; the summary's path. :class:`StorageError` if one
    cannot be written."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in sample.records)
    summary = {**(extra or {}), **sample.summary}
    out = summary_path(path)
    for target, text in ((Path(path), lines), (out, json.dumps(summary, ensure_ascii=False, indent=2) + "\n")):
        with writing(target), atomic_path(target) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return out
