"""Structure-aware chunking of the sandbox corpus."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

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


def test_shipped_embedding_seed_covers_every_chunk():
    """A fresh clone must not re-embed the corpus: regenerate with `weknora-nb sandbox build --write-seed`.

    The vector model embeds each chunk's index text (title + content, C76; FAQ entries' questions
    and answers) and the FAQ index entries of the demo's FAQ version, the reranker's model each
    cleaned passage (C35)."""
    import numpy as np

    from weknora_nb.sandbox import load_demo_versions
    from weknora_nb.sandbox.chunking import corpus_chunks
    from weknora_nb.sandbox.embedders import E5Embedder, UseEmbedder
    from weknora_nb.sandbox.index import SandboxIndex

    index = SandboxIndex(corpus_chunks(demo_dir()))
    assert index.positions("faq"), "the demo's FAQ entries are part of the index"
    faq_roles = sorted({v.faq_role for v in load_demo_versions().values() if v.faq_enabled})
    for cls, roles in ((UseEmbedder, ["index", *faq_roles]), (E5Embedder, ["rerank"])):
        seed = demo_dir() / "cache" / f"embeddings-{cls.name}.npz"
        assert seed.stat().st_size < 4_000_000, f"{seed.name} is {seed.stat().st_size} bytes"
        with np.load(seed) as z:
            keys = set(z["keys"].tolist())
        want = {cls.key(t) for role in roles for t in index.texts(role)}
        assert want <= keys, f"{len(want - keys)} of {len(want)} texts missing from {seed.name}"


FAQ_SMALL = Path(__file__).parent / "fixtures" / "faq_small.jsonl"


def test_faq_entries_become_faq_chunks():
    from weknora_nb.sandbox.chunking import faq_answer_content, index_text, load_faq

    chunks = load_faq(FAQ_SMALL)
    assert [c.id for c in chunks] == [f"faq-00{n}" for n in range(1, 7)]
    first = chunks[0]
    assert (first.knowledge_id, first.knowledge_title, first.chunk_type, first.chunk_index) == (
        "faq.accounts", "accounts", "faq", 0)
    assert first.faq is not None and first.faq.similar_questions == ("管理员密码忘了咋办", "admin password forgotten")
    assert first.content.startswith("Q: 忘记管理员密码怎么重置？\nSimilar Questions:\n- 管理员密码忘了咋办\n")
    answer = "在服务器上执行 `dgctl user reset-password admin`，新密码须在 24 小时内修改。"
    questions = ["忘记管理员密码怎么重置？", "管理员密码忘了咋办", "admin password forgotten"]
    assert index_text(first).splitlines() == [*questions, answer]
    assert faq_answer_content(first) == f"Q: 忘记管理员密码怎么重置？\nAnswer:\n- {answer}"
    assert chunks[1].faq is not None and chunks[1].faq.negative_questions == ("VPN 账号被锁定怎么办？",)


def test_a_bad_faq_file_names_every_bad_line(tmp_path):
    from weknora_nb.core.errors import InputError
    from weknora_nb.sandbox.chunking import load_faq

    good = '{"id": "faq-1", "group": "g", "standard_question": "q?", "answers": ["a"]}'
    lines = [good, "{not json", '{"id": "faq-2", "group": "g", "standard_question": "", "answers": ["a"]}',
             '{"id": "faq-3", "group": "g", "standard_question": "q", "answers": ["  "]}', good,
             '{"id": "faq-4", "group": "g", "standard_question": "q", "answers": "a"}']
    p = tmp_path / "faq.jsonl"
    p.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_faq(p)
    assert [(pr.line, pr.field) for pr in err.value.problems] == [
        (2, None), (3, "standard_question"), (4, "answers"), (5, "id"), (6, "answers")]


def test_the_demo_faq_is_a_second_knowledge_base_of_the_corpus(demo_chunks):
    from weknora_nb import load_testset
    from weknora_nb.sandbox.chunking import corpus_chunks

    chunks = corpus_chunks(demo_dir())
    docs, faq = chunks[:len(demo_chunks)], chunks[len(demo_chunks):]
    assert [c.id for c in docs] == [c.id for c in demo_chunks]
    assert len(faq) >= 100 and {c.chunk_type for c in faq} == {"faq"}
    assert all(re.fullmatch(r"faq-\d{3}", c.id) and c.knowledge_id == f"faq.{c.faq.group}" for c in faq if c.faq)
    ts = load_testset(demo_dir() / "faq" / "testset.jsonl")
    unknown = sorted(set(ts.qrels["chunk_id"]) - {c.id for c in faq})
    assert not unknown, f"FAQ test-set labels that name no FAQ entry: {unknown[:10]}"
