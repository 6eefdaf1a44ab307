"""Structure-aware chunking of the sandbox corpus."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest

from weknora_nb.sandbox import chunk_corpus, chunk_markdown, demo_dir

DOC = """# 标题

## 第一节

第一段说明。第二句话在这里。

| 列 A | 列 B |
|---|---|
| 1 | 2 |

## 空的节

### 子节

```yaml
a: 1
# 不是标题
b: 2
```

- 列表项一
- 列表项二
  续行
"""


def test_headings_split_and_blocks_stay_whole():
    chunks = chunk_markdown(DOC, "demo.doc")
    assert [c.heading_path for c in chunks] == [("标题", "第一节"), ("标题", "空的节", "子节")]
    assert [c.id for c in chunks] == ["demo.doc:000", "demo.doc:001"]
    assert "| 1 | 2 |" in chunks[0].content and chunks[0].content.startswith("标题 › 第一节\n")
    assert "# 不是标题" in chunks[1].content  # a '#' inside code is not a heading
    assert "  续行" in chunks[1].content
    assert all(c.knowledge_title == "标题" for c in chunks)


def test_long_paragraph_is_cut_between_sentences_never_inside_one():
    sentences = [f"这是第{i}句话，用来把段落拉长到超过上限。" for i in range(40)]
    chunks = chunk_markdown("# T\n\n## S\n\n" + "".join(sentences) + "\n", "d", max_chars=120)
    assert len(chunks) > 3
    for c in chunks:
        assert len(c.body) <= 120
        assert c.body.endswith("。")
    assert "".join(c.body for c in chunks) == "".join(sentences)


def test_big_table_is_cut_between_rows_with_its_header():
    rows = "\n".join(f"| 参数{i} | 取值说明{i}{'很长' * 20} |" for i in range(30))
    chunks = chunk_markdown(f"# T\n\n## S\n\n| 参数 | 说明 |\n|---|---|\n{rows}\n", "d", max_chars=200)
    assert len(chunks) > 1
    for c in chunks:
        assert c.body.startswith("| 参数 | 说明 |\n|---|---|")


def test_ids_are_deterministic():
    assert [c.id for c in chunk_markdown(DOC, "x")] == [c.id for c in chunk_markdown(DOC, "x")]
    assert [c.content for c in chunk_markdown(DOC, "x")] == [c.content for c in chunk_markdown(DOC, "x")]


@pytest.fixture(scope="module")
def demo_chunks():
    return chunk_corpus(demo_dir() / "docs")


def test_demo_corpus_size(demo_chunks):
    docs = {c.knowledge_id for c in demo_chunks}
    assert len(docs) >= 40 and len(demo_chunks) >= 500
    assert len({c.id for c in demo_chunks}) == len(demo_chunks)
    assert max(len(c.body) for c in demo_chunks) <= 900


def test_demo_corpus_has_real_structure(demo_chunks):
    bodies = [c.body for c in demo_chunks]
    assert sum("|---" in b for b in bodies) >= 40  # tables
    assert sum("```" in b for b in bodies) >= 40  # code blocks
    assert sum(bool(re.search(r"^\d+\. ", b, re.M)) for b in bodies) >= 40  # numbered steps


def test_demo_chunks_never_end_mid_sentence(demo_chunks):
    for c in demo_chunks:
        tail = c.body.rstrip()
        assert tail.endswith(("。", "！", "？", "|", "```", "：", ")", "）", "`", "”")) or re.search(
            r"^\s*(?:[-*+]|\d+[.)])\s", tail.splitlines()[-1]), (c.id, tail[-40:])


def test_every_label_of_the_demo_test_set_names_a_chunk_the_chunker_produces(demo_chunks):
    from weknora_nb import load_testset

    ts = load_testset(demo_dir() / "testset.jsonl")
    ids = {c.id for c in demo_chunks}
    unknown = sorted(set(ts.qrels["chunk_id"]) - ids)
    assert not unknown, f"{len(unknown)} labelled chunk ids are not produced by the chunker: {unknown[:10]}"
    assert len(ts) >= 320 and 3 <= len(ts.invalid_ids) <= 20
    types = set(ts.queries["query_type"])
    assert types == {"factual", "procedural", "conceptual", "technical"}
    tags = {t for tags in ts.queries["tags"] for t in tags}
    assert {"frequent", "long-tail", "vague", "multi-answer"} <= tags


def test_some_answers_span_two_adjacent_chunks(demo_chunks):
    """Queries whose best chunks are neighbours graded 2 (each holds part of the answer)."""
    from weknora_nb import load_testset

    ts = load_testset(demo_dir() / "testset.jsonl")
    pos = {c.id: (c.knowledge_id, c.chunk_index) for c in demo_chunks}
    spanning = 0
    for _, grp in ts.qrels[ts.qrels["grade"] == 2].groupby("query_id"):
        places = sorted(pos[c] for c in grp["chunk_id"])
        if any(a[0] == b[0] and b[1] - a[1] == 1 for a, b in pairwise(places)):
            spanning += 1
    assert spanning >= 10


def test_shipped_embedding_seed_covers_every_chunk(demo_chunks):
    """A fresh clone must not re-embed the corpus: regenerate with `weknora-nb sandbox build --write-seed`."""
    import numpy as np

    from weknora_nb.sandbox.engine import E5Embedder, UseEmbedder

    for cls in (UseEmbedder, E5Embedder):
        seed = demo_dir() / "cache" / f"embeddings-{cls.name}.npz"
        with np.load(seed) as z:
            keys = set(z["keys"].tolist())
        want = {cls.key(c.content) for c in demo_chunks}
        assert want <= keys, f"{len(want - keys)} chunks missing from {seed.name}"
