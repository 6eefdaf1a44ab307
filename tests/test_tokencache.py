"""The sandbox keeps its texts' tokens on disk (sandbox/tokencache.py, issue 17): what it reads back is what
the tokenizers give, a damaged file is tokenized anew, and an index built from the cache serves what one
built without it serves."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from weknora_nb.sandbox import build_index
from weknora_nb.sandbox.engine import SandboxIndex
from weknora_nb.sandbox.textutil import simple_tokens
from weknora_nb.sandbox.tokencache import TokenCache, tokenizer_version
from weknora_nb.sandbox.tokenize import tokenize

TEXTS = ["网关返回 DG-1003 错误怎么办？", "配置 gateway.yaml 的 x-dg-key 字段", "", "   ", "emoji 😀 和 中文",
         "The quick brown fox", "重复 重复 重复", "重复 重复 重复"]


class Counting:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, text):
        self.calls += 1
        return self.fn(text)


@pytest.mark.parametrize("name, fn", [("bm25", tokenize), ("simple", simple_tokens)])
def test_tokens_read_back_are_the_tokenizers_and_each_text_is_tokenized_once(tmp_path, name, fn):
    first = Counting(fn)
    got = TokenCache(tmp_path, name, first).tokens(TEXTS)
    expected = [sorted(fn(t)) if name == "simple" else fn(t) for t in TEXTS]
    assert got == expected
    again = Counting(fn)
    assert TokenCache(tmp_path, name, again).tokens(TEXTS[::-1]) == expected[::-1]
    assert first.calls == len(set(TEXTS)) and again.calls == 0


def test_the_file_is_named_by_tokenizer_and_version_and_a_token_it_cannot_hold_is_served(tmp_path, caplog):
    cache = TokenCache(tmp_path, "simple", simple_tokens)
    assert cache.path == tmp_path / f"tokens-simple-{tokenizer_version()}.json"
    assert len(tokenizer_version()) == 16
    odd = "ab\ud800cd efg"   # no Han: whitespace tokens, one holding a lone surrogate JSON cannot write
    with caplog.at_level(logging.WARNING, logger="weknora_nb.sandbox.tokencache"):
        assert cache.tokens([odd]) == [sorted(simple_tokens(odd))] and "ab\ud800cd" in simple_tokens(odd)
    assert "not writing the token cache" in caplog.text and not cache.path.exists()
    clean = ["only clean 文本"]
    assert cache.tokens(clean) == [sorted(simple_tokens(clean[0]))] and cache.path.is_file()


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"k": "not a list"}', b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_cache_is_ignored_with_a_warning_and_written_anew(tmp_path, caplog, damage):
    cache = TokenCache(tmp_path, "bm25", tokenize)
    cache.path.write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="weknora_nb.sandbox.tokencache"):
        assert cache.tokens(TEXTS[:2]) == [tokenize(t) for t in TEXTS[:2]]
    assert "ignoring" in caplog.text
    counting = Counting(tokenize)
    assert TokenCache(tmp_path, "bm25", counting).tokens(TEXTS[:2]) == [tokenize(t) for t in TEXTS[:2]]
    assert counting.calls == 0


def test_without_a_cache_folder_nothing_is_written(tmp_path):
    assert TokenCache(None, "bm25", tokenize).path is None
    assert TokenCache(None, "simple", simple_tokens).tokens(TEXTS[:3]) == [sorted(simple_tokens(t)) for t in TEXTS[:3]]


def test_an_index_built_from_the_cache_serves_what_one_built_without_it_serves(tmp_path):
    demo = build_index(cache_dir=tmp_path / "warm")  # the demo's chunks (embeddings from its seed)
    plain = SandboxIndex(demo.chunks, cache_dir=None)
    first = SandboxIndex(demo.chunks, cache_dir=tmp_path / "tokens")   # tokenizes and writes the cache
    cached = SandboxIndex(demo.chunks, cache_dir=tmp_path / "tokens")  # reads it
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "tokens").glob("tokens-*.json")) == []  # built lazily
    for index in (first, cached):
        assert [index.passage_tokens(i) for i in range(len(demo.chunks))] == \
               [plain.passage_tokens(i) for i in range(len(demo.chunks))]
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "tokens").glob("tokens-*.json")) == ["simple"]
    queries = ["网关 DG-1003 错误", "如何配置 gateway.yaml", "重置密码", "VPN 连不上"]
    for corpus in ("keyword", "rerank"):
        want, rows = plain.bm25(1.2, 0.75, corpus)
        for index in (first, cached):
            got, got_rows = index.bm25(1.2, 0.75, corpus)
            assert got_rows == rows
            for q in queries:
                np.testing.assert_array_equal(got.get_scores(tokenize(q)), want.get_scores(tokenize(q)))
