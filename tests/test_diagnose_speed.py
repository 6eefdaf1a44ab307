"""The fast paths of the diagnosis give what the plain formulations gave, on random inputs:

- ``_lists`` (one sort, split where each (query, stage) block starts) is the groupby over (query, stage)
  it replaced, frame for frame and in the same order; its one frame of every list is their
  concatenation, and each list's :class:`Listing` holds that list's columns;
- ``KnowledgeBase.of`` from that one frame places chunks as a walk over every list's rows did;
- a :class:`DegradedQuery`'s and a :class:`LostChunk`'s values read from the listings (top K,
  path ids, results proper, rows, ranks, scores) are the pandas lookups they replaced;
- ``_tokens`` (each run of characters jieba segments cut once) is jieba over the whole text.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from weknora_nb.analysis import diagnose as dg
from weknora_nb.analysis.diagnose import overlap
from weknora_nb.analysis.diagnose.diagnosis import _listings, _lists
from weknora_nb.core.segmenter import jieba_ready
from weknora_nb.core.unfold import expand_sub_chunks

from .conftest import examples, results_frame

STAGES = ["vector", "keyword", "hybrid", "final"]
CHUNKS = [f"k{d}:{i}" for d in range(3) for i in range(6)]


def plain_lists(results: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """``_lists`` as it was: a groupby over (query, stage), duplicates dropped per list."""
    df, _ = expand_sub_chunks(results.assign(result=results["rank"], holder=results["chunk_id"]))
    df = df[(df["status"].astype("string") == "ok") & df["chunk_id"].notna()]
    first = df.groupby(["query_id", "stage"], observed=True)["repeat"].transform("min")
    df = df[df["repeat"] == first].sort_values(["query_id", "stage", "rank"])
    keep = [c for c in ("chunk_id", "rank", "score", "knowledge_id", "chunk_index", "base_score", "model_score",
                        "result", "holder") if c in df.columns]
    out = {}
    for (q, s), g in df.groupby(["query_id", "stage"], observed=True, sort=False):
        g = g[keep].drop_duplicates("chunk_id").reset_index(drop=True)
        g["rank"] = range(1, len(g) + 1)
        g["holder"] = g["holder"].astype(str)
        out[(str(q), str(s))] = g
    return out


def plain_positions(inventory: pd.DataFrame | None, lists: dict[tuple[str, str], pd.DataFrame]) -> dict:
    """``KnowledgeBase.of``'s positions as they were: inventory rows, then every list's rows in turn."""
    pos = {}
    if inventory is not None and len(inventory):
        pos = {c: (kid, int(i)) for c, kid, i in inventory[["chunk_id", "knowledge_id", "chunk_index"]].itertuples(
            index=False) if pd.notna(i)}
    for lst in lists.values():
        if "chunk_index" in lst.columns:
            for c, kid, i in lst[["chunk_id", "knowledge_id", "chunk_index"]].itertuples(index=False):
                if pd.notna(i) and c not in pos:
                    pos[c] = (kid, int(i))
    return pos


def plain_tokens(text: str) -> frozenset[str]:
    """``_tokens`` as it was: jieba over the whole text."""
    t = text.lower().strip()
    words = jieba_ready().cut_for_search(t, HMM=True) if overlap._CJK.search(t) else t.split()
    return frozenset(w for w in (x.strip() for x in words) if len(w) > 1 and not overlap._punctuation_only(w))


def random_results(rng: np.random.Generator, *, sub_chunks: bool) -> pd.DataFrame:
    """A results table: a few queries and stages, three repeats, failed requests, empty lists, repeated chunks,
    rank ties, rows in any order; positions, rerank scores and merged chunks (``sub_chunks``) here and there."""
    rows = []
    for q in [f"q{i}" for i in range(int(rng.integers(1, 5)))]:
        for st in rng.choice(STAGES, size=int(rng.integers(1, len(STAGES) + 1)), replace=False):
            for rep in (1, 2, 3):
                status, n = ("ok" if rng.random() < 0.8 else "timeout"), int(rng.integers(0, 9))
                if status != "ok" or n == 0:
                    rows.append((q, str(st), rep, None, None, None, status))
                    continue
                ranks = rng.permutation(n) + 1 if rng.random() < 0.9 else rng.integers(1, n + 1, size=n)
                rows += [(q, str(st), rep, int(r), str(rng.choice(CHUNKS)), float(rng.random()), "ok") for r in ranks]
    order = rng.permutation(len(rows))
    df = results_frame([rows[i] for i in order])
    ids = df["chunk_id"].astype(object)
    df["knowledge_id"] = pd.Categorical([c.split(":")[0] if isinstance(c, str) and rng.random() < 0.9 else None
                                         for c in ids])
    df["chunk_index"] = pd.array([int(c.split(":")[1]) if isinstance(c, str) and rng.random() < 0.8 else None
                                  for c in ids], dtype="Int64")
    for col in ("base_score", "model_score"):
        df[col] = [float(rng.random()) if rng.random() < 0.5 else math.nan for _ in ids]
    if sub_chunks:
        df["sub_chunk_ids"] = pd.array([json.dumps([str(x) for x in rng.choice(CHUNKS, size=int(rng.integers(1, 3)))])
                                        if rng.random() < 0.3 else ("[]" if rng.random() < 0.1 else None)
                                        for _ in ids], dtype="string")
    return df


def same_values(a: list[Any], b: list[Any]) -> bool:
    """Equal lists, value for value and type for type (missing values equal when of one type; a NumPy scalar
    stands for its Python value: a row of a frame holds those, the values of a column's list these)."""
    def same(x: Any, y: Any) -> bool:
        x, y = (v.item() if isinstance(v, np.generic) else v for v in (x, y))
        if type(x) is not type(y):
            return False
        return bool(pd.isna(x) and pd.isna(y)) if pd.isna(x) or pd.isna(y) else bool(x == y)
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("seed", range(examples(40)))
def test_lists_split_once_are_the_groupby_lists(seed):
    rng = np.random.default_rng(seed)
    results = random_results(rng, sub_chunks=seed % 4 != 0)
    lists, listed = _lists(results)
    plain = plain_lists(results)
    assert list(lists) == list(plain)
    for key, lst in plain.items():
        assert_frame_equal(lists[key], lst, check_exact=True)
    if plain:
        assert_frame_equal(listed, pd.concat(list(plain.values()), ignore_index=True), check_exact=True)
    listings = _listings(lists, listed)
    for lst in lists.values():
        assert all(same_values(listings[id(lst)].column(c), lst[c].tolist()) for c in lst.columns)
    inventory = pd.DataFrame({"chunk_id": CHUNKS[::2], "knowledge_id": ["inv"] * len(CHUNKS[::2]),
                              "chunk_index": range(len(CHUNKS[::2])), "is_enabled": True})
    for inv in (None, inventory):
        assert dg.KnowledgeBase.of(inv, listed).positions == plain_positions(inv, plain)


@pytest.mark.parametrize("seed", range(examples(25)))
def test_values_read_from_the_listings_are_the_pandas_lookups(seed):
    rng = np.random.default_rng(1000 + seed)
    lists, listed = _lists(random_results(rng, sub_chunks=True))
    listings = _listings(lists, listed)
    for (qid, stage), r in lists.items():
        paths = {role: lists[(qid, role)] for role in ("vector", "keyword", "hybrid") if (qid, role) in lists}
        k = int(rng.integers(1, 6))
        q = dg.DegradedQuery(qid, stage, stage, k, {c: 3 for c in CHUNKS}, r, paths, dg.KnowledgeBase(None, {}),
                             listings=listings)
        assert q.top == list(r.head(k)["chunk_id"])
        assert_frame_equal(q.results, r[r["chunk_id"] == r["holder"]], check_exact=True)
        assert same_values(q.result_values("model_score"), q.results["model_score"].tolist())
        for role, lst in paths.items():
            assert set(q.path_ids(role)) == set(lst["chunk_id"])
        for c in CHUNKS:
            lost = dg.LostChunk(q, c)
            at = r.index[r["chunk_id"] == c]
            row = lost.returned_row
            assert (row is None) == (len(at) == 0)
            if row is not None:
                assert same_values(list(row.values()), r.loc[at[0]].tolist()) and list(row) == list(r.columns)
            hyb = paths.get("hybrid")
            ranks = [] if hyb is None else hyb.loc[hyb["chunk_id"] == c, "rank"].tolist()
            assert lost.hybrid_rank == (int(ranks[0]) if ranks else None)
            for role, lst in paths.items():
                scores = lst.loc[lst["chunk_id"] == c, "score"].tolist()
                assert lost.path_score(role) == (float(scores[0]) if scores and pd.notna(scores[0]) else None)


WORDS = ["知识库", "检索", "重排序", "向量", "模型", "配置", "默认", "阈值", "的", "了", "中华人民共和国", "搜索引擎"]
PIECES = ["WeKnora", "RAG", "top-k", "v0.7.2", "C#", "a&b", "50%", "x_y", "3.14", "rerank_threshold", "ok"]
SEPARATORS = [" ", "\n", "\t", "\r\n", "\u3000", "\xa0", "，", "。", "！", "、", "（", "）", ":", ";", "/", "?", "—",
              "😀"]


def random_text(rng: np.random.Generator) -> str:
    """Chinese words and characters (some outside the range jieba segments), ASCII words, digits, punctuation
    and whitespace of every kind, in any mix, sometimes without a separator."""
    parts = []
    for _ in range(int(rng.integers(0, 30))):
        kind = rng.random()
        if kind < 0.35:
            parts.append(str(rng.choice(WORDS)))
        elif kind < 0.5:
            parts.append(chr(int(rng.integers(0x4E00, 0xA000))))
        elif kind < 0.75:
            word = str(rng.choice(PIECES))
            parts.append(word.upper() if rng.random() < 0.2 else word)
        else:
            parts.append(str(rng.choice(SEPARATORS)))
        if rng.random() < 0.3:
            parts.append(str(rng.choice(SEPARATORS)))
    return "".join(parts)


def test_tokens_cut_run_by_run_are_those_of_the_whole_text():
    rng = np.random.default_rng(7)
    texts = [random_text(rng) for _ in range(1500)]
    texts += ["\n".join(texts[i:i + 4]) for i in range(0, 400, 4)]  # kept results: chunk texts joined
    texts += ["", "  ", "ascii only, no Chinese", "中", "\u9fd6\u9fff", "ＡＢＣ全角"]
    for text in texts:
        assert overlap._tokens.__wrapped__(text) == plain_tokens(text), repr(text)
