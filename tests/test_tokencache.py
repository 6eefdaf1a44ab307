"""The sandbox keeps its texts' tokens on disk (sandbox/tokencache.py, issue 17): what it reads back is what
the tokenizers give, a damaged file is tokenized anew, a data folder's seed is read and never written, the
demo's seed holds every text the demo tokenizes, and an index built from the cache or the seed serves what one
built without them serves."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging

import numpy as np
import pytest

from weknora_nb.core.tokenize import tokenize
from weknora_nb.sandbox import build_index, demo_dir, load_demo_versions
from weknora_nb.sandbox import index as index_module
from weknora_nb.sandbox.index import SandboxIndex
from weknora_nb.sandbox.textutil import simple_tokens
from weknora_nb.sandbox.tokencache import TokenCache, tokenizer_version

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
    seeded = SandboxIndex(demo.chunks, cache_dir=None, seed_dir=demo_dir() / "cache")   # reads the demo's seed
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "tokens").glob("tokens-*.json")) == []  # built lazily
    for index in (first, cached, seeded):
        assert [index.passage_tokens(i) for i in range(len(demo.chunks))] == \
               [plain.passage_tokens(i) for i in range(len(demo.chunks))]
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "tokens").glob("tokens-*.json")) == ["simple"]
    queries = ["网关 DG-1003 错误", "如何配置 gateway.yaml", "重置密码", "VPN 连不上"]
    for corpus in ("keyword", "rerank"):
        want, rows = plain.bm25(1.2, 0.75, corpus)
        for index in (first, cached, seeded):
            got, got_rows = index.bm25(1.2, 0.75, corpus)
            assert got_rows == rows
            for q in queries:
                np.testing.assert_array_equal(got.get_scores(tokenize(q)), want.get_scores(tokenize(q)))


# ---------------------------------------------------------------------------------------
# a data folder's seed
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, fn", [("bm25", tokenize), ("simple", simple_tokens)])
def test_a_seed_is_served_as_written_and_only_what_it_lacks_is_tokenized_and_cached(tmp_path, name, fn):
    seed_dir, cache_dir = tmp_path / "seed", tmp_path / "cache"
    written = TokenCache(None, name, fn).write_seed(TEXTS[:4], seed_dir)
    assert written == seed_dir / f"tokens-{name}-{tokenizer_version()}.json.gz"
    assert TokenCache(None, name, fn).write_seed(TEXTS[:4], seed_dir).read_bytes() == written.read_bytes()
    counting = Counting(fn)
    cache = TokenCache(cache_dir, name, counting, seed_dir)
    expected = [sorted(fn(t)) if name == "simple" else fn(t) for t in TEXTS]
    assert cache.tokens(TEXTS[:4]) == expected[:4] and counting.calls == 0
    assert not cache_dir.exists()   # all from the seed: nothing written
    assert cache.tokens(TEXTS) == expected and counting.calls == len(set(TEXTS[4:]))
    kept = json.loads(cache.path.read_bytes())
    assert set(kept) == {hashlib.sha256(t.encode()).hexdigest() for t in TEXTS[4:]}   # the seed is not copied
    assert written.read_bytes() == TokenCache(None, name, fn).write_seed(TEXTS[:4], tmp_path / "again").read_bytes()
    assert TokenCache(None, name, Counting(fn), seed_dir).tokens(TEXTS) == expected   # a seed without a cache


def test_write_seed_keeps_one_version_per_tokenizer_and_a_seed_of_another_version_is_not_read(tmp_path, caplog):
    other = tmp_path / "tokens-bm25-0000000000000000.json.gz"
    other.write_bytes(gzip.compress(json.dumps({hashlib.sha256(TEXTS[0].encode()).hexdigest(): ["x"]}).encode()))
    simple = TokenCache(None, "simple", simple_tokens).write_seed(TEXTS[:1], tmp_path)
    counting = Counting(tokenize)
    assert TokenCache(None, "bm25", counting, tmp_path).tokens(TEXTS[:1]) == [tokenize(TEXTS[0])]
    assert counting.calls == 1   # the other version's tokens are not read
    TokenCache(None, "bm25", tokenize).write_seed(TEXTS[:1], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [simple.name, f"tokens-bm25-{tokenizer_version()}.json.gz"])
    seed = TokenCache(None, "bm25", tokenize, tmp_path).seed_path
    seed.write_bytes(b"not gzip")
    with caplog.at_level(logging.WARNING, logger="weknora_nb.sandbox.tokencache"):
        assert TokenCache(None, "bm25", tokenize, tmp_path).tokens(TEXTS[:2]) == [tokenize(t) for t in TEXTS[:2]]
    assert f"ignoring unreadable token cache {seed}" in caplog.text


def test_the_demo_seed_holds_every_text_the_demo_tokenizes(tmp_path, monkeypatch):
    """A fresh machine's demo tokenizes nothing when its index is built: regenerate the seed with
    ``weknora-nb sandbox build --write-seed`` when this fails (a document, the chunking, the index texts or a
    tokenizer module changed)."""
    counted = {name: Counting(fn) for name, fn in index_module._TOKENIZERS.items()}
    monkeypatch.setattr(index_module, "_TOKENIZERS", counted)
    index = build_index(cache_dir=tmp_path)   # a cache folder of its own: everything from the seed
    for version in load_demo_versions().values():
        index.warm(version)
    assert {name: c.calls for name, c in counted.items()} == {"bm25": 0, "simple": 0}, \
        "the demo's token seed lacks texts: run `weknora-nb sandbox build --write-seed`"
    assert not list(tmp_path.glob("tokens-*"))
    for name, texts in index._tokenized().items():   # a sample of the seed's tokens against the tokenizer's
        fn = index_module._TOKENIZERS[name].fn
        sample = texts[::max(1, len(texts) // 40)]
        seeded = TokenCache(None, name, fn, demo_dir() / "cache").tokens(sample)
        assert seeded == [sorted(fn(t)) if name == "simple" else fn(t) for t in sample], name
