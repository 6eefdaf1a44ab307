"""What the sandbox-vs-WeKnora comparison rests on (docs/sandbox-vs-weknora.md): the sandbox's ``POST /v1/rerank`` in
the format WeKnora's remote reranker calls (C126), a knowledge base served from a chunk listing, and the comparison
script, which reproduces the document's table from the two runs committed as fixtures.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from weknora_nb.core.errors import ConfigError, InputError
from weknora_nb.sandbox import SandboxServer, build_index
from weknora_nb.sandbox.chunking import corpus_chunks
from weknora_nb.sandbox.versions import load_versions

from .conftest import results_frame

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
MINI = FIXTURES / "mini_kb"
RUNS = FIXTURES / "sandbox_vs_weknora"
KEY = "sk-test-sandbox-vs-weknora-01"
QUERY = "忘记管理员密码怎么办"
E5 = "multilingual-e5-small-q4"


def _script():
    spec = importlib.util.spec_from_file_location("sandbox_vs_weknora", ROOT / "tools" / "sandbox_vs_weknora.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


compare = _script()


@pytest.fixture(scope="module")
def sb(embedding_cache):
    version = replace(load_versions(MINI / "versions.yaml")["baseline"], name="rerank-e5", rerank_enabled=True,
                      rerank_model=E5)
    with SandboxServer(version, data_dir=MINI, cache_dir=embedding_cache, api_key=KEY,
                       allow_fault_control=True) as server:
        yield server


def rerank(sb: SandboxServer, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{sb.base_url}/v1/rerank", json=body, headers=headers, timeout=60)


# ---------------------------------------------------------------------------------------
# C126: POST /v1/rerank
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C126")
def test_rerank_answers_as_weknoras_remote_reranker_reads_it(sb):
    index = sb.sandbox.engine.index
    idxs = [index.by_id[c] for c in ("guide.02-rate-limit:000", "guide.01-passwords:000", "guide.03-vpn:000")]
    passages = [index.rerank_passage(i) for i in idxs]
    r = rerank(sb, {"model": E5, "query": QUERY, "documents": passages})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "model", "usage", "results"} and body["model"] == E5
    assert body["usage"]["total_tokens"] > 0
    results = body["results"]
    assert sorted(x["index"] for x in results) == [0, 1, 2]
    assert [x["relevance_score"] for x in results] == sorted((x["relevance_score"] for x in results), reverse=True)
    assert results[0]["index"] == 1 and all(x["document"] == {"text": passages[x["index"]]} for x in results)
    engine = sb.sandbox.engine.rerank_scores(QUERY, idxs)  # the same model on the same passages
    assert {x["index"]: x["relevance_score"] for x in results} == pytest.approx(dict(enumerate(engine)), abs=1e-6)
    objects = rerank(sb, {"model": E5, "query": QUERY, "documents": [{"text": p} for p in passages], "top_n": 2,
                          "truncate_prompt_tokens": 511})
    assert [x["index"] for x in objects.json()["results"]] == [x["index"] for x in results[:2]]


@pytest.mark.contract("C126", "C37")
def test_rerank_refusals_and_its_fault(sb):
    ok = {"model": E5, "query": QUERY, "documents": ["a"]}
    assert rerank(sb, ok, key=None).status_code == 401
    assert rerank(sb, ok, key="sk-other").status_code == 401
    other = rerank(sb, {**ok, "model": "e5-bm25-features"})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert rerank(sb, {**ok, "documents": []}).status_code == 400
    assert rerank(sb, {**ok, "query": ""}).status_code == 400
    sb.set_faults(rerank_error_rate=1.0)
    try:
        assert rerank(sb, ok).status_code == 500  # WeKnora then keeps the retrieval order (C37)
    finally:
        sb.set_faults()


@pytest.mark.contract("C126", "C39")
def test_the_engines_model_score_is_what_rerank_answers_for_its_passage(sb):
    r = httpx.post(f"{sb.base_url}/api/v1/knowledge-search", headers={"X-API-Key": KEY}, timeout=60,
                   json={"query": QUERY, "knowledge_base_id": sb.kb_id})
    results = r.json()["data"]
    assert results and all("model_score" in x["metadata"] for x in results)
    index = sb.sandbox.engine.index
    passages = [index.rerank_passage(index.by_id[x["id"]]) for x in results]
    scored = rerank(sb, {"model": E5, "query": QUERY, "documents": passages}).json()["results"]
    by_index = {x["index"]: f"{x['relevance_score']:.4f}" for x in scored}
    assert [by_index[i] for i in range(len(results))] == [x["metadata"]["model_score"] for x in results]


# ---------------------------------------------------------------------------------------
# a knowledge base from a chunk listing
# ---------------------------------------------------------------------------------------
def listing_folder(root: Path, rows: list[dict]) -> Path:
    root.mkdir()
    (root / "cache").symlink_to(MINI / "cache", target_is_directory=True)
    (root / "chunks.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                       encoding="utf-8")
    (root / "versions.yaml").write_text("chunks: chunks.jsonl\nversions:\n  listed:\n    description: listed\n",
                                        encoding="utf-8")
    return root


def mini_rows() -> list[dict]:
    """The mini corpus's chunks as a WeKnora would list them, newest document first, with one summary chunk."""
    rows = [{"id": c.id, "knowledge_id": c.knowledge_id, "knowledge_title": c.knowledge_title,
             "chunk_index": c.chunk_index, "content": c.content, "chunk_type": "text", "parent_chunk_id": "",
             "start_at": c.start_at, "end_at": c.end_at} for c in reversed(corpus_chunks(MINI))]
    rows.append({"id": "sum-1", "knowledge_id": "guide.01-passwords", "knowledge_title": "密码与登录",
                 "chunk_index": 3, "content": "# Summary\n密码与登录：重置、锁定与复杂度。", "chunk_type": "summary",
                 "parent_chunk_id": "guide.01-passwords:000",
                 "matched_content": "密码与登录\n# Summary\n密码与登录：重置、锁定与复杂度。"})
    return rows


def test_a_chunk_listing_is_served_as_its_knowledge_base(tmp_path, embedding_cache):
    data = listing_folder(tmp_path / "listed", mini_rows())
    with SandboxServer("listed", data_dir=data, cache_dir=embedding_cache, api_key=KEY) as sb, \
            httpx.Client(base_url=sb.base_url, headers={"X-API-Key": KEY}, timeout=60) as c:
        listed = c.get("/api/v1/chunks/guide.01-passwords",
                       params=[("chunk_type", "text"), ("chunk_type", "summary"), ("page_size", 100)]).json()["data"]
        hits = c.post(f"/api/v1/knowledge-bases/{sb.kb_id}/hybrid-search",
                      json={"query_text": "密码", "match_count": 20, "skip_context_enrichment": True}).json()["data"]
        kb = c.get(f"/api/v1/knowledge-bases/{sb.kb_id}").json()["data"]
    assert kb["chunking_config"]["strategy"] == "listing chunks.jsonl"  # not the sandbox's own chunking
    assert [r["chunk_index"] for r in listed] == sorted(r["chunk_index"] for r in listed)  # by chunk_index (C124)
    summary = {r["id"]: r for r in listed}["sum-1"]
    assert summary["chunk_type"] == "summary" and summary["parent_chunk_id"] == "guide.01-passwords:000"
    by_id = {h["id"]: h for h in hits}
    assert "sum-1" in by_id and by_id["sum-1"]["matched_content"] == mini_rows()[-1]["matched_content"]
    first = by_id["guide.01-passwords:000"]
    assert first["matched_content"] == f"{first['knowledge_title']}\n{first['content']}"  # C76 without one given


def test_a_bad_chunk_listing_names_its_line_and_field(tmp_path):
    rows = mini_rows()
    rows[1] = {**rows[1], "chunk_index": "2"}
    rows[2] = {**rows[2], "chunk_type": "parent_text"}
    rows[3] = {**rows[3], "id": rows[0]["id"]}
    with pytest.raises(InputError) as err:
        build_index(listing_folder(tmp_path / "bad", rows), cache_dir=tmp_path / "cache")
    text = str(err.value)
    assert "line 2, field 'chunk_index': must be an integer, got '2'" in text
    assert "line 3, field 'chunk_type': 'parent_text' is not one of text, summary" in text
    assert "line 4, field 'id': chunk " in text and "is listed twice" in text
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "versions.yaml").write_text("chunks: nowhere.jsonl\nversions: {a: {}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="field 'chunks': no such file"):
        build_index(missing, cache_dir=tmp_path / "cache")


# ---------------------------------------------------------------------------------------
# the comparison script
# ---------------------------------------------------------------------------------------
def test_rbo_and_jaccard_worked_examples():
    assert compare.rbo(["a", "b", "c"], ["a", "b", "c"]) == 1.0 == compare.rbo([], [])
    assert compare.rbo(["a"], []) == 0.0 == compare.jaccard(["a"], [])
    p = 0.9  # b a c against a b c: A_1 = 0, A_2 = 2/2, A_3 = 3/3
    assert compare.rbo(["b", "a", "c"], ["a", "b", "c"]) == pytest.approx((p + p * p) / (1 + p + p * p))
    assert compare.jaccard(["a", "b"], ["b", "c"]) == pytest.approx(1 / 3)
    assert compare.rbo(["a", "x"], ["a"]) == pytest.approx((1 + p * 0.5) / (1 + p))


def test_a_failed_request_is_left_out_not_scored_empty():
    a = results_frame([("q1", "final", 1, 1, "c1", 1.0, "ok"), ("q2", "final", 1, None, None, None, "ok"),
                       ("q3", "final", 1, None, None, None, "timeout"),
                       ("q1", "vector", 1, 1, "c1", 1.0, "ok")])
    b = results_frame([("q1", "final", 1, 1, "c2", 1.0, "ok"), ("q1", "final", 1, 2, "c1", 0.5, "ok"),
                       ("q2", "final", 1, None, None, None, "ok"), ("q3", "final", 1, 1, "c3", 1.0, "ok")])
    (row,) = compare.compare(a, b)
    assert (row.stage, row.queries, row.failed, row.same_ids, row.same_order) == ("final", 2, 1, 0.5, 0.5)
    assert row.jaccard == pytest.approx((0.5 + 1.0) / 2)


def _doc_tables() -> list[tuple[list[str], str]]:
    """The document's tables and the script arguments each says it comes from (``<!-- table: ... -->``)."""
    text = (ROOT / "docs" / "sandbox-vs-weknora.md").read_text(encoding="utf-8")
    marker = r"<!-- table: tools/sandbox_vs_weknora.py ([^>]*?) -->\n(.*?)\n<!-- /table -->"
    found = re.findall(marker, text, flags=re.S)
    return [(args.split(), table.strip()) for args, table in found]


def test_the_script_reproduces_the_documents_tables_from_the_committed_runs():
    tables = _doc_tables()
    assert [args[:2] for args, _ in tables] == [["lite", "sandbox"], ["lite-candidates", "sandbox-candidates"]]
    for args, table in tables:
        runs = [str(RUNS / a) for a in args[:2]]
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "sandbox_vs_weknora.py"), *runs, *args[2:]],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        lines = out.stdout.splitlines()
        assert "lite 0.7.2 (3d5d8bf)" in lines[0] and "sandbox 0.7.2" in lines[1]
        assert out.stdout.split("\n\n", 1)[1].strip() == table
    manifests = [json.loads((RUNS / r / "manifest.json").read_text(encoding="utf-8"))
                 for r in ("lite", "sandbox", "lite-candidates", "sandbox-candidates")]
    assert len({m["testset"]["hash"] for m in manifests}) == 1  # the same queries and labels
    assert {m["server"]["commit_id"] for m in manifests} == {"3d5d8bf"}
    assert [m["server"]["edition"] for m in manifests] == ["lite", "sandbox", "lite", "sandbox"]


def test_the_script_refuses_a_folder_that_is_no_run(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "sandbox_vs_weknora.py"), str(tmp_path),
                          str(RUNS / "sandbox")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.startswith("sandbox_vs_weknora: ") and "no manifest.json" in out.stderr
