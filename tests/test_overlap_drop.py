"""C42's overlap drop (sandbox/pipeline.py ``_drop_partial_overlaps``), whose pairs' shared tokens are counted as
the bits two token sets have in common, against the plain formulation with sets (``overlap_ratio``) on random
result lists: Chinese and English texts, one contained in another, shared words, empty texts, tied scores."""

from __future__ import annotations

import random
import threading

import pytest

from weknora_nb.sandbox import pipeline
from weknora_nb.sandbox.pipeline import OVERLAP_DROP, _drop_partial_overlaps, _Result, _token_bits
from weknora_nb.sandbox.textutil import Text, normalize_content, overlap_ratio

from .conftest import examples

WORDS = ["密码", "重置", "管理员", "网关", "配置", "证书", "gateway", "yaml", "reset", "admin", "DG-1003", "VPN", "的",
         "如何", "error", "timeout"]


def plain_drop(results: list[_Result]) -> list[_Result]:
    """The drop as WeKnora's removePartialOverlaps reads, with Python sets."""
    norms = [normalize_content(r.text.s) for r in results]
    sizes = [len(n.encode("utf-8")) for n in norms]
    removed: set[int] = set()
    for i in range(len(results)):
        if i in removed:
            continue
        for j in range(i + 1, len(results)):
            if j in removed:
                continue
            short, long_ = (j, i) if sizes[i] > sizes[j] else (i, j)
            contained = bool(norms[short]) and bool(norms[long_]) and norms[short] in norms[long_]
            if not contained and overlap_ratio(results[short].text.tokens(), results[long_].text.tokens()) \
                    < OVERLAP_DROP:
                continue
            removed.add(long_ if results[short].score > results[long_].score else short)
    return [r for i, r in enumerate(results) if i not in removed]


def random_text(rng: random.Random, made: list[str]) -> Text:
    if made and rng.random() < 0.3:   # another result's text again, or within a longer one
        base = rng.choice(made)
        s = base if rng.random() < 0.5 else base + " " + " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
    elif rng.random() < 0.05:
        s = ""
    else:
        s = (" " if rng.random() < 0.5 else "").join(rng.choices(WORDS, k=rng.randint(1, 30)))
    made.append(s)
    if rng.random() < 0.3 and s:   # a merged result: its pieces tokenized one by one
        cut = rng.randint(0, len(s))
        return Text(s[:cut] + "\n\n" + s[cut:], tuple(p for p in (s[:cut], s[cut:]) if p))
    return Text.of(s)


@pytest.mark.parametrize("seed", range(6))
def test_the_drop_is_the_plain_formulations(seed):
    rng = random.Random(seed)
    for _ in range(examples(60)):
        made: list[str] = []
        results = [_Result(i, None, rng.choice([0.5, 0.7, 0.7, 0.9]), 1, random_text(rng, made))  # type: ignore[arg-type]
                   for i in range(rng.randint(0, 14))]
        assert [r.idx for r in _drop_partial_overlaps(list(results))] == [r.idx for r in plain_drop(results)]


def test_token_bits_count_the_intersection_and_number_tokens_once_across_threads():
    rng = random.Random(3)
    vocabulary = [f"tok-{rng.random()}" for _ in range(3000)]   # tokens no other test has numbered
    sets = [frozenset(rng.sample(vocabulary, rng.randint(0, 400))) for _ in range(120)]
    bits: dict[int, int] = {}

    def number(part: range) -> None:
        for k in part:
            bits[k] = _token_bits(sets[k])
    threads = [threading.Thread(target=number, args=(range(k, len(sets), 4),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = pipeline._TOKEN_NUMBER
    assert sorted(numbers.values()) == list(range(len(numbers)))   # each token its own bit
    for k in range(len(sets)):
        a, b = sets[k], sets[(k + 1) % len(sets)]
        assert (bits[k] & bits[(k + 1) % len(sets)]).bit_count() == len(a & b)
        assert bits[k].bit_count() == len(a) and _token_bits(a) == bits[k]
