"""Parent-child knowledge bases in the sandbox (docs/weknora-contract.md C110-C112): the chunking as WeKnora's web UI
configures it, what is stored, listed and searched, and how knowledge-search and the chat show a child's parent.

The chunking is checked on documents written here; the API over real HTTP against the demo's ``parent-child``
version (its children index the same texts as the flat chunks, so the shipped embedding seed covers them, and the
queries are the demo test set's, whose embeddings are shipped too).
"""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from weknora_nb.collect.http.transport import default_tls
from weknora_nb.core.errors import ConfigError
from weknora_nb.sandbox import SandboxServer, build_index, load_demo_versions
from weknora_nb.sandbox.chunking import chunk_markdown, corpus_chunks, index_text
from weknora_nb.sandbox.index import SandboxIndex
from weknora_nb.sandbox.parentchild import (
    CHILD_CHUNK_SIZE,
    PARENT_CHUNK_SIZE,
    ParentChild,
    parent_child_chunks,
    parent_child_corpus,
    primary_boundaries,
)
from weknora_nb.sandbox.runner import demo_dir
from weknora_nb.sandbox.versions import VersionConfig, load_versions

KEY = "sk-test-parent-child-0123"
#: demo test-set queries (their embeddings are in the shipped seed)
QUERY = "生产环境的网关节点需要什么配置的服务器？"
QUERIES = (QUERY, "忘记 dgctl 登录密码怎么办", "VPN 连不上怎么办")


def section(title: str, sentences: int, word: str) -> str:
    """A ``##`` section of ``sentences`` sentences of about 40 characters each."""
    return f"## {title}\n\n" + "".join(f"{word}第{i}句的内容是一些用来凑长度的说明文字，讲清楚配置项的含义。" for i in
                                       range(sentences)) + "\n"


def document(*sections: str) -> str:
    return "# 文档标题\n\n前言一句话。\n\n" + "\n".join(sections)


# ---------------------------------------------------------------------------------------
# the chunking (C110)
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C110")
def test_the_web_uis_sizes_are_the_defaults_and_a_version_turns_it_on(tmp_path):
    assert (PARENT_CHUNK_SIZE, CHILD_CHUNK_SIZE) == (4096, 384) and ParentChild() == ParentChild(4096, 384)
    assert VersionConfig("flat").parent_child is None
    demo = load_demo_versions()["parent-child"]
    assert demo.parent_child == ParentChild(4096, 384)
    # one variable changed against baseline: the chunking
    base = load_demo_versions()["baseline"]
    assert {k: v for k, v in demo.to_nested().items() if k not in ("description", "chunking")} == \
        {k: v for k, v in base.to_nested().items() if k not in ("description", "chunking")}
    bad = tmp_path / "versions.yaml"
    bad.write_text("versions:\n  v:\n    chunking: {enable_parent_child: yes please, parent_chunk_size: 0,"
                   " child_chunk_size: 384}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_versions(bad)
    fields = {p.field for p in err.value.problems}
    assert fields == {"versions.v.chunking.enable_parent_child", "versions.v.chunking.parent_chunk_size"}
    bad.write_text("versions:\n  v:\n    chunking: {enable_parent_child: true, parent_chunk_size: 300,"
                   " child_chunk_size: 300}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="child_chunk_size must be smaller"):
        load_versions(bad)


@pytest.mark.contract("C110")
def test_parents_are_primary_sections_joined_until_half_the_parent_size():
    # the preamble, then ## sections of about 900, 900, 600, 1,500 and 100 characters
    text = document(section("一", 28, "甲"), section("二", 28, "乙"), section("三", 19, "丙"), section("四", 48, "丁"),
                    section("五", 3, "戊"))
    bounds = primary_boundaries(text)
    assert bounds[0] == 0 and len(bounds) == 6   # the preamble, then each ##
    sizes = [b - a for a, b in zip(bounds, [*bounds[1:], len(text)], strict=True)]
    assert sum(sizes[:4]) >= 2048 > sum(sizes[:3]) and sum(sizes[4:]) < 2048
    chunks = parent_child_chunks(text, "doc", ParentChild(4096, 384))
    parents = [c for c in chunks if c.chunk_type == "parent_text"]
    children = [c for c in chunks if c.chunk_type == "text"]
    # sections join while the parent so far is under 4096 / 2: [preamble, 一, 二, 三], then [四, 五]
    assert [p.id for p in parents] == ["doc:p000", "doc:p001"]
    assert parents[0].content.startswith("# 文档标题") and parents[1].content.startswith("## 四")
    assert "".join(p.content for p in parents) == text   # parents tile the document, as written
    assert all(len(p.content) <= 4096 for p in parents)
    # children: the flat chunks at the child size, without their heading line, which is their context header
    flat = chunk_markdown(text, "doc", max_chars=384)
    assert [c.content for c in children] == [c.body for c in flat]
    assert [c.context_header for c in children] == [c.content.split("\n", 1)[0] for c in flat]
    assert [c.id for c in children] == [f"doc:c{i:03d}" for i in range(len(flat))]
    assert [c.chunk_index for c in children] == list(range(len(flat)))
    assert [index_text(c) for c in children] == [index_text(c) for c in flat]   # the same embeddings as flat
    for c in children:
        parent = next(p for p in parents if p.id == c.parent_chunk_id)
        assert parent.start_at <= c.start_at < parent.end_at and c.content in parent.content
        assert c.indexed and not c.linked
    assert all(not p.indexed and p.linked for p in parents)
    # listing order: chunk_index, a parent before the child of the same index (recording 22f)
    assert [(c.chunk_type, c.chunk_index) for c in chunks[:3]] == [("parent_text", 0), ("text", 0), ("parent_text", 1)]


@pytest.mark.contract("C110")
def test_a_parent_of_one_child_is_not_stored_and_its_child_is_never_indexed():
    # the last section alone would be a parent of one child (WeKnora's Lite did this to "考勤与休假制度")
    text = document(section("一", 35, "甲"), section("二", 35, "乙"), section("三", 2, "丙"))
    chunks = parent_child_chunks(text, "doc")
    parents = [c for c in chunks if c.chunk_type == "parent_text"]
    orphan = [c for c in chunks if c.chunk_type == "text" and not c.parent_chunk_id]
    assert [p.id for p in parents] == ["doc:p000"] and parents[0].content.count("## ") == 2
    assert len(orphan) == 1 and orphan[0].content.startswith("丙") and not orphan[0].indexed
    index = SandboxIndex(chunks)
    assert index.by_id[orphan[0].id] not in index.positions("document")   # neither embedded nor keyword-indexed
    assert index.texts("index")[index.by_id[orphan[0].id]] == ""
    # a document none of whose parents is kept is chunked flat: children linked and indexed
    short = parent_child_chunks("# 短文档\n\n只有一句话，一个子块就装得下。\n", "s")
    assert {c.chunk_type for c in short} == {"text"} and all(c.indexed and c.linked for c in short)


@pytest.mark.contract("C110")
def test_the_index_links_parents_not_children_and_searches_only_children():
    chunks = parent_child_chunks(document(section("一", 35, "甲"), section("二", 35, "乙"), section("三", 35, "丙")),
                                 "doc")
    index = SandboxIndex(chunks)
    pos = {c.id: i for i, c in enumerate(chunks)}
    p0, p1 = pos["doc:p000"], pos["doc:p001"]
    assert index.neighbour(p0, 1) == p1 and index.neighbour(p1, -1) == p0 and index.neighbour(p0, -1) is None
    assert all(index.neighbour(pos[c.id], off) is None for c in chunks if c.chunk_type == "text" for off in (-1, 1))
    searched = {chunks[i].id for i in index.positions("document")}
    assert searched == {c.id for c in chunks if c.chunk_type == "text"}
    assert all(index.texts(role)[pos[p]] == "" for role in ("index", "rerank") for p in ("doc:p000", "doc:p001"))
    # a flat document's chunks stay linked one to the next
    flat = SandboxIndex(chunk_markdown(document(section("一", 30, "甲")), "f"))
    assert flat.neighbour(0, 1) == 1 and flat.neighbour(1, -1) == 0 and flat.neighbour(0, 2) == 2


@pytest.mark.contract("C110")
def test_the_demo_corpus_chunked_parent_child():
    flat = [c for c in corpus_chunks(demo_dir()) if c.chunk_type == "text"]
    pc = parent_child_corpus(demo_dir())
    kinds = Counter(c.chunk_type for c in pc)
    assert kinds["text"] == len(flat) == 837 and kinds["faq"] == 126
    assert 48 <= kinds["parent_text"] <= 2 * 48   # about two parents a document, as Lite made 93
    by_id = {c.id: c for c in pc}
    children = [c for c in pc if c.chunk_type == "text"]
    assert all(c.parent_chunk_id and c.indexed and c.content in by_id[c.parent_chunk_id].content for c in children)
    assert sorted(index_text(c) for c in children) == sorted(index_text(c) for c in flat)


# ---------------------------------------------------------------------------------------
# over HTTP (C110-C112)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(embedding_cache):
    with SandboxServer("parent-child", cache_dir=embedding_cache, api_key=KEY) as s:
        yield s


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.base_url, headers={"X-API-Key": KEY}, timeout=30, verify=default_tls()) as c:
        yield c


def chunk_list(client, kid: str, *types: str) -> dict:
    params = [("page_size", "100"), *(("chunk_type", t) for t in types)]
    return client.get(f"/api/v1/chunks/{kid}", params=params).json()


@pytest.mark.contract("C110", "C49", "C52", "C55")
def test_listings_show_children_by_default_and_parents_only_when_asked(client, server):
    kb = client.get(f"/api/v1/knowledge-bases/{server.kb_id}").json()["data"]
    assert kb["chunking_config"] | {"enable_parent_child": True, "parent_chunk_size": 4096,
                                    "child_chunk_size": 384} == kb["chunking_config"]
    kid = "admin-guide.01-install-linux"
    text = chunk_list(client, kid)
    assert text["total"] == len(text["data"]) > 0
    assert all(c["chunk_type"] == "text" and c["parent_chunk_id"].startswith(f"{kid}:p") for c in text["data"])
    assert all(c["pre_chunk_id"] == c["next_chunk_id"] == "" for c in text["data"])   # children are not linked
    parents = chunk_list(client, kid, "parent_text")["data"]
    assert parents and all(c["chunk_type"] == "parent_text" and c["parent_chunk_id"] == "" for c in parents)
    assert [c["next_chunk_id"] for c in parents[:-1]] == [c["id"] for c in parents[1:]]
    both = chunk_list(client, kid, "text", "parent_text")
    assert both["total"] == len(text["data"]) + len(parents)
    order = [(c["chunk_index"], c["chunk_type"] == "text") for c in both["data"]]
    assert order == sorted(order)   # chunk_index order, a parent first (recording 22f)
    got = client.get(f"/api/v1/chunks/by-id/{parents[0]['id']}").json()["data"]
    assert got["chunk_type"] == "parent_text" and got["content"] == parents[0]["content"]


@pytest.mark.contract("C111", "C24")
def test_hybrid_search_finds_children_with_their_parent_and_no_neighbours(client, server):
    for query in QUERIES:
        hits = client.post(f"/api/v1/knowledge-bases/{server.kb_id}/hybrid-search",
                           json={"query_text": query, "match_count": 10}).json()["data"]
        assert len(hits) == 10   # enrichment adds nothing: children have no neighbours, parents are not searchable
        assert all(h["chunk_type"] == "text" and h["parent_chunk_id"] and h["sub_chunk_id"] is None
                   and h["match_type"] in (0, 1) for h in hits)
        for h in hits[:3]:
            child = client.get(f"/api/v1/chunks/by-id/{h['id']}").json()["data"]
            assert h["content"] == child["content"] and h["parent_chunk_id"] == child["parent_chunk_id"]


@pytest.mark.contract("C112", "C41")
def test_knowledge_search_shows_the_parent_under_the_childs_id(client, server):
    parents: dict[str, str] = {}
    for query in QUERIES:
        results = client.post("/api/v1/knowledge-search", json={"query": query,
                                                               "knowledge_base_id": server.kb_id}).json()["data"]
        assert results
        for r in results:
            assert r["chunk_type"] == "text" and r["id"] in r["sub_chunk_id"] and r["id"] == r["sub_chunk_id"][0]
            pid = r["parent_chunk_id"]
            if pid not in parents:
                parents[pid] = client.get(f"/api/v1/chunks/by-id/{pid}").json()["data"]["content"]
            assert parents[pid] in r["content"]   # the parent alone, or parents joined across a boundary
            for sub in r["sub_chunk_id"]:
                child = client.get(f"/api/v1/chunks/by-id/{sub}").json()["data"]
                assert child["knowledge_id"] == r["knowledge_id"] and child["content"] in r["content"]
        # siblings merge into one result: no parent is shown twice
        shown = Counter(r["parent_chunk_id"] for r in results)
        assert max(shown.values()) == 1
    merged = [r for q in QUERIES for r in client.post("/api/v1/knowledge-search", json={
        "query": q, "knowledge_base_id": server.kb_id}).json()["data"] if len(r["sub_chunk_id"]) > 1]
    assert merged   # some result lists several children of its parent


@pytest.mark.contract("C112", "C63")
def test_chat_references_show_parents_too(client, server):
    sid = client.post("/api/v1/sessions", json={"title": "pc"}).json()["data"]["id"]
    text = client.post(f"/api/v1/knowledge-chat/{sid}", json={"query": QUERY,
                                                              "knowledge_base_ids": [server.kb_id]}).text
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    (refs,) = [e["knowledge_references"] for e in events if e["response_type"] == "references"]
    assert refs and all(r["parent_chunk_id"] and r["id"] in r["sub_chunk_id"] and len(r["content"]) > 384
                        for r in refs)


def test_the_demo_builds_one_index_per_chunking():
    flat, pc = build_index(), build_index(parent_child=ParentChild())
    assert flat is build_index() and pc is build_index(parent_child=ParentChild()) and pc is not flat
    assert {c.chunk_type for c in pc.chunks} == {"text", "parent_text", "faq"}


@pytest.mark.contract("C110", "C91")
def test_its_postgres_stores_parents_without_embeddings(server):
    import psycopg

    with psycopg.connect(server.sandbox.engine.vectors.dsn()) as conn:
        kinds = dict(conn.execute("SELECT chunk_type, count(*) FROM chunks GROUP BY 1").fetchall())
        linked = conn.execute("SELECT count(*) FROM chunks WHERE chunk_type = 'text' AND parent_chunk_id LIKE "
                              "knowledge_id || ':p%'").fetchone()
        embedded = dict(conn.execute("SELECT c.chunk_type, count(*) FROM embeddings e JOIN chunks c ON c.id = "
                                     "e.chunk_id GROUP BY 1").fetchall())
    assert kinds["text"] == 837 and kinds["parent_text"] >= 48 and linked == (837,)
    assert embedded == {"text": 837}   # parents are stored, never embedded
