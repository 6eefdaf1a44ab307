"""``weknora-nb collect`` replayed against what a running WeKnora Lite v0.7.2 (3d5d8bf) answered to it.

Each collection of ``tests/fixtures/weknora-v0.7.2/collect-*`` was run by hand against WeKnora Lite through a
recording proxy (README.md there); here the same command runs against the replay server of ``tests/replay.py``:
the preflight, the probes, every request, the inventory, the integrity checks and the deletion of the chat
sessions meet WeKnora's own answers. The tests assert what the collector makes of them: the rows of each record
against the recorded response, failures recorded as failures, the inventory, the manifest. Each is marked with
the facts of docs/weknora-contract.md it holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from weknora_nb.analysis.diagnose.settings import effective_config, stage_settings
from weknora_nb.core.run import CHUNKS

from .replay import Collected, Recording, interaction, replay_collection, scenario

MINI, FAQ, HASH = ("f34e9b0f-4d7b-407d-8336-c7ee06c37352", "55f272d8-2698-4251-9cc0-7cf977ddf418",
                   "b8193858-a925-4995-8e62-2514d2a8fc88")
#: the chunk listings of the small parent-child base with parent_text asked for too (the same server state)
WITH_PARENTS = ("c4-chunks-mini-with-parent_text-1", "c5-chunks-mini-with-parent_text-2",
                "c6-chunks-mini-with-parent_text-3")
#: the same for the hash-embedding base's two documents
HASH_WITH_PARENTS = ("c9-chunks-hash256-with-parent_text-1", "c10-chunks-hash256-with-parent_text-2")
#: the embedding models of the small base and of the hash-embedding base, and the tenant's memory config (a key
#: v0.7.2 does not have: 400)
MODELS = ("c1-model-get-use-multilingual", "c2-model-get-hash-embed-256", "c3-models-list", "c11-memory-config")


def _collected(folder: str, tmp_path_factory: pytest.TempPathFactory, extra: tuple[str, ...] = ()) -> Collected:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WEKNORA_API_KEY", "sk-replay-test-0000")
        mp.delenv("WEKNORA_TENANT_ID", raising=False)
        return replay_collection(folder, tmp_path_factory.mktemp(folder),
                                 extra=[interaction(n) for n in extra])


@pytest.fixture(scope="module")
def pc(tmp_path_factory) -> Collected:
    return _collected("collect-pc", tmp_path_factory, WITH_PARENTS + MODELS)


@pytest.fixture(scope="module")
def faq(tmp_path_factory) -> Collected:
    return _collected("collect-faq", tmp_path_factory, MODELS)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Collected:
    return _collected("collect-mixed", tmp_path_factory, WITH_PARENTS + HASH_WITH_PARENTS + MODELS)


@pytest.fixture(scope="module")
def embed429(tmp_path_factory) -> Collected:
    return _collected("collect-embed429", tmp_path_factory, MODELS)


@pytest.fixture(scope="module")
def redis(tmp_path_factory) -> Collected:
    return _collected("collect-redis", tmp_path_factory, MODELS)


def queries(folder: str) -> dict[str, str]:
    path = Path(__file__).resolve().parent / "fixtures" / "weknora-v0.7.2" / folder / "testset.jsonl"
    return {q["query_id"]: q["query"] for q in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def answer(folder: str, stage: str, query: str) -> Recording:
    """The recording that answered ``query`` at ``stage`` (the stages of ``stages.yaml``) in a collection."""
    def fits(r: Recording) -> bool:
        body, path = r.request.get("body") or {}, r.request["path"]
        if stage in ("vector", "keyword", "hybrid"):
            flags = (bool(body.get("disable_keywords_match")), bool(body.get("disable_vector_match")))
            wanted = {"vector": (True, False), "keyword": (False, True), "hybrid": (False, False)}[stage]
            return path.endswith("/hybrid-search") and body.get("query_text") == query and flags == wanted
        if stage == "final":
            return path == "/api/v1/knowledge-search" and body.get("query") == query
        if stage == "faq":
            return path.endswith("/faq/search") and body.get("query_text") == query
        agent = stage == "citations_ui"   # citations sends agent_id "" (no agent), citations_ui the UI's agent
        return "/knowledge-chat/" in path and body.get("query") == query and bool(body.get("agent_id")) == agent
    (found,) = [r for r in scenario(folder) if fits(r)][-1:]
    return found


def items(rec: Recording) -> list[dict[str, Any]]:
    """What the recording answered: the search results, the FAQ entries, or the chat's references."""
    if rec.sse is not None:
        refs = [e for e in rec.events() if e["response_type"] == "references"]
        return refs[0]["knowledge_references"] if refs else []
    return rec.body["data"] or []


def record(c: Collected, query_id: str, stage: str) -> dict[str, Any]:
    (rec,) = [r for r in c.records() if (r["query_id"], r["stage"]) == (query_id, stage)]
    return rec


# -- a parent-child knowledge base as the web UI creates it ----------------------------------------------------------

@pytest.mark.contract("C15", "C58", "C59", "C56", "C57", "C49")
def test_a_whole_collection_replays(pc):
    assert pc.code == 0 and not pc.server.unmatched and len(pc.records()) == 24
    greeting = [r for r in pc.records() if r["query_id"] == "g001" and r["stage"].startswith("citations")]
    assert {r["status"] for r in pc.records() if r not in greeting} == {"ok"}
    assert {r["status"] for r in greeting} <= {"ok", "skipped"}   # a greeting: no retrieval, never a failure
    m = pc.manifest()
    assert m["server"]["version"] == "0.7.2" and m["server"]["edition"] == "lite"
    assert m["stages"]["hybrid"]["method"] == "POST"
    assert m["sessions"] == {"created": 9, "deleted": 9, "kept": False}   # a probe, then one a chat
    assert m["knowledge_bases"][MINI]["chunking_config"]["enable_parent_child"] is True
    assert m["retrieval_config"]["raw"]["embedding_top_k"] == 0
    assert m["retrieval_config"]["effective"]["embedding_top_k"] == 50


@pytest.mark.contract("C21", "C22", "C23", "C41", "C63", "C99")
@pytest.mark.parametrize("stage", ["vector", "keyword", "hybrid", "final", "citations", "citations_ui"])
def test_every_record_holds_what_weknora_answered(pc, stage):
    for qid, text in queries("collect-pc").items():
        got = record(pc, qid, stage)
        kept = [x for x in items(answer("collect-pc", stage, text)) if x.get("match_type") in (0, 1)]
        rows = got["rows"]
        assert [r[0] for r in rows] == list(range(1, len(kept) + 1))                       # rank
        assert [r[1] for r in rows] == [x["id"] for x in kept]                             # chunk id
        assert [r[2] for r in rows] == [x["score"] for x in kept]                          # score
        assert [r[5] for r in rows] == [x["match_type"] for x in kept]
        assert [r[6] for r in rows] == [x.get("sub_chunk_id") or [] for x in kept]
    if stage == "keyword":
        assert all(r[2] > 1e6 for q in queries("collect-pc") for r in record(pc, q, stage)["rows"])   # SQLite bm25


@pytest.mark.contract("C52", "C53", "C54", "C93")
def test_the_inventory_of_a_parent_child_base(pc):
    chunks = pd.read_parquet(pc.run / CHUNKS)
    knowledge = pd.read_parquet(pc.run / "knowledge.parquet")
    searchable = chunks[chunks["chunk_type"] != "parent_text"]   # parent_text: listed or not, never searchable
    assert len(searchable) == 45 and set(searchable["chunk_type"]) == {"text", "summary"}
    assert chunks["chunk_id"].is_unique and set(chunks["parse_status"]) == {"completed"}
    assert len(knowledge) == 3 and set(knowledge["listing"]) == {"ok"}
    assert chunks["content"].str.contains("<host>", regex=False).any()   # raw at v0.7.2, nothing unescaped
    entry = pc.manifest()["inventory"]
    assert entry["chunks"] == len(chunks) and entry["content"]["escaped"] is False
    assert pc.manifest()["integrity"]["content_changed"] is False


@pytest.mark.contract("C55")
def test_the_inventory_records_parents_and_index_status(pc):
    chunks = pd.read_parquet(pc.run / CHUNKS).set_index("chunk_id")
    listed = {c["id"]: c for r in scenario("collect-pc") if r.request["path"].startswith("/api/v1/chunks/")
              for c in r.body["data"]}
    children = [i for i, c in listed.items() if c["chunk_type"] == "text"]
    assert {"parent_chunk_id", "index_status"} <= set(chunks.columns)
    parents = {i: ("" if pd.isna(v) else v) for i, v in chunks["parent_chunk_id"].items()}
    assert all(parents[i] == listed[i]["parent_chunk_id"] for i in children)
    assert set(chunks["index_status"]) == {"ready"}


# -- an FAQ knowledge base ------------------------------------------------------------------------------------------

@pytest.mark.contract("C45", "C46", "C47", "C52")
def test_an_faq_collection(faq):
    assert faq.code == 0 and not faq.server.unmatched
    found = {qid: record(faq, qid, "faq")["rows"] for qid in queries("collect-faq")}
    assert [len(rows) for rows in found.values()] == [1, 0, 0]   # only match_count sent: 0.7 applied
    assert all(record(faq, q, "faq")["status"] == "ok" for q in found)
    chunks = pd.read_parquet(faq.run / CHUNKS)
    assert len(chunks) == 126 and chunks["chunk_id"].is_unique and set(chunks["chunk_index"]) == {0}
    listings = [r for r in scenario("collect-faq") if r.request["path"].startswith("/api/v1/chunks/")]
    assert [len(r.body["data"]) for r in listings] == [100, 26]   # two pages, every entry once on SQLite
    assert faq.manifest()["integrity"]["content_changed"] is False


@pytest.mark.contract("C45")
def test_the_faq_stage_is_diagnosed_at_the_threshold_it_ran(faq):
    m = faq.manifest()
    settings = stage_settings("faq", m["stages"]["faq"], effective_config(m["retrieval_config"]), m["server"])
    assert settings.vector_threshold == pytest.approx(0.7)


# -- two knowledge bases with different embedding models ------------------------------------------------------------

@pytest.mark.contract("C98", "C32", "C11")
def test_mixed_embedding_models_fail_every_hybrid_request_and_are_recorded_failed(mixed):
    assert not mixed.server.unmatched
    if mixed.code == 2 and not any(s.path.endswith("/hybrid-search") for s in mixed.server.log):
        return   # refused before any request (the preflight of issue 45): nothing failed, nothing scored
    for stage in ("vector", "keyword", "hybrid"):
        for qid in queries("collect-mixed"):
            rec = record(mixed, qid, stage)
            assert (rec["status"], rec["http_status"], rec["error_code"], rec["rows"]) == ("bad_request", 400, 1000, [])
    results = pd.read_parquet(mixed.run / "results.parquet")
    assert set(results.loc[results["stage"] == "hybrid", "status"]) == {"bad_request"}   # never an empty list
    final = record(mixed, "q0001", "final")   # knowledge-search searches each model group apart: 200
    assert final["status"] == "ok" and final["rows"]


@pytest.mark.contract("C98")
def test_a_preflight_refuses_mixed_embedding_models(mixed):
    assert mixed.code == 2
    assert not any(s.path.endswith("/hybrid-search") for s in mixed.server.log)


# -- the query embedding fails (the embedding provider answers 429) -------------------------------------------------

@pytest.mark.contract("C34", "C95", "C38", "C11")
def test_an_embedding_429_fails_hybrid_and_leaves_final_keyword_only(embed429):
    assert not embed429.server.unmatched
    for qid in queries("collect-embed429"):
        hyb = record(embed429, qid, "hybrid")
        assert (hyb["status"], hyb["http_status"], hyb["error_code"]) == ("server", 500, 1007)
        final = record(embed429, qid, "final")
        assert final["status"] == "ok" and {r[5] for r in final["rows"]} == {1}   # vector path silently dropped
        assert {r[2] for r in final["rows"]} == {1.0}   # keyword-only candidates: the rerank composite clamps
    hybrid_posts = [s for s in embed429.server.log if s.path.endswith("/hybrid-search")]
    assert len(hybrid_posts) == 2 * (1 + 3)   # --max-attempts 2: the probe and each request tried twice


def flagged_keyword_only(rec: dict[str, Any]) -> bool:
    """Whether a record says its results came from the keyword path alone (the vector path failed or was
    dropped): a flag or a value naming the missing vector path or a keyword-only fallback."""
    text = json.dumps({k: v for k, v in rec.items() if k != "rows"}).lower()
    return any(w in text for w in ("vector_path_missing", "keyword_only", "keyword-only", "keyword only"))


@pytest.mark.contract("C34")
def test_keyword_only_fallbacks_are_flagged(embed429):
    assert all(flagged_keyword_only(record(embed429, q, "final")) for q in queries("collect-embed429"))


# -- the Redis stream manager -----------------------------------------------------------------------------------------

@pytest.mark.contract("C64", "C97")
def test_redis_rebuilt_references_lose_their_match_types(pc, redis):
    assert redis.code == 0 and not redis.server.unmatched
    for qid, text in queries("collect-redis").items():
        for stage in ("citations", "citations_ui"):
            memory, rebuilt = record(pc, qid, stage)["rows"], record(redis, qid, stage)["rows"]
            assert [r[1:3] for r in rebuilt] == [r[1:3] for r in memory]   # the same ids and scores
            assert {r[5] for r in rebuilt} == {0} and all(r[6] == [] for r in rebuilt)
            events = answer("collect-redis", stage, text).events()
            event = next(e for e in events if e["response_type"] == "references")
            # C97: the event's data.references is the stream manager's copy, with every field kept
            assert [x["match_type"] for x in event["data"]["references"]] == [r[5] for r in memory]
            assert all(x["metadata"] is None for x in event["knowledge_references"])
    assert any(r[5] == 1 for q in queries("collect-redis") for r in record(pc, q, "citations")["rows"])


@pytest.mark.contract("C64", "C97")
def test_references_rebuilt_by_redis_are_recovered_or_said(pc, redis):
    recovered = all([r[5] for r in record(redis, q, s)["rows"]] == [r[5] for r in record(pc, q, s)["rows"]]
                    for q in queries("collect-redis") for s in ("citations", "citations_ui"))
    notes = " ".join(redis.manifest().get("notes") or []).lower()
    assert recovered or ("reference" in notes and ("redis" in notes or "rebuilt" in notes or "lost" in notes))


# -- what the diagnosis makes of a Lite server ------------------------------------------------------------------------

@pytest.mark.contract("C19", "C99")
def test_a_keyword_threshold_is_not_applied_on_sqlite(pc):
    server = pc.manifest()["server"]
    assert server["keyword_index_engine"] == "sqlite"
    definition = {"endpoint": "hybrid-search", "settings_source": "request",
                  "params": {"disable_vector_match": True, "keyword_threshold": 0.9, "match_count": 10}}
    settings = stage_settings("keyword", definition, None, server)
    assert settings.keyword_threshold is None and "sqlite" in (settings.keyword_note or "").lower()
