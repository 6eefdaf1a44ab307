"""The client against what a running WeKnora Lite v0.7.2 (3d5d8bf) answered, replayed over HTTP on loopback.

Each test serves recorded interactions (``tests/fixtures/weknora-v0.7.2/``, README.md there) with the replay
server of ``tests/replay.py`` and asserts what :class:`~weknora_nb.collect.http.client.WeKnoraClient` makes of
them: ids, ranks, scores, match types, parent ids, the failure kind of each error, a chat stream's references
and answer. No WeKnora runs: the answers are WeKnora's own, recorded by hand. Each test is marked with the
facts of docs/weknora-contract.md it holds.
The collections replayed end to end are in tests/test_replay_collect.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from weknora_nb.collect.http.client import ClientSettings, WeKnoraClient
from weknora_nb.collect.http.envelope import route_missing, unwrap
from weknora_nb.collect.run.preflight import read_server
from weknora_nb.core.errors import AuthFailed, BadRequest, NotFound, ServerFailed
from weknora_nb.core.weknora import SEARCHABLE_CHUNK_TYPES

from .replay import ReplayServer, interaction

KEY = "sk-replay-test-0000"
PC, FLAT, FAQ = ("1eb57a17-0036-4510-939b-275d6e5a07b3", "3aa46978-16ee-4cb1-bd79-72a0ff83cb49",
                 "55f272d8-2698-4251-9cc0-7cf977ddf418")
_T = TypeVar("_T")


@pytest.fixture(autouse=True)
def key_in_env(monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    monkeypatch.delenv("WEKNORA_TENANT_ID", raising=False)


@contextlib.contextmanager
def replay(*names: str, hold_s: float = 5.0) -> Iterator[ReplayServer]:
    """The recordings ``names`` served; every request the test makes must have one."""
    server = ReplayServer([interaction(n) for n in names], hold_s=hold_s)
    with server:
        yield server
    assert not server.unmatched, f"requests with no recording: {server.unmatched}"


def call(server: ReplayServer, fn: Callable[[WeKnoraClient], Awaitable[_T]], **settings: Any) -> _T:
    """``fn(client)`` with a client of the replay server (fast retries)."""
    async def main() -> _T:
        opts = {"backoff_base_s": 0.01, "backoff_max_s": 0.02, "max_attempts": 2, "timeout_s": 10, **settings}
        async with WeKnoraClient(ClientSettings(server.url, **opts)) as client:
            return await fn(client)
    return asyncio.run(main())


def data(name: str) -> Any:
    return interaction(name).body["data"]


def body_of(name: str) -> dict[str, Any]:
    return dict(interaction(name).request["body"])


def hybrid(name: str) -> Callable[[WeKnoraClient], Awaitable[list[dict[str, Any]]]]:
    """The client's hybrid-search with the recorded request's body."""
    req = interaction(name).request
    kb = req["path"].split("/")[4]
    params = {k: v for k, v in req["body"].items() if k != "query_text"}
    return lambda c: c.hybrid_search(kb, req["body"]["query_text"], **params)


def stream(name: str) -> Callable[[WeKnoraClient], Awaitable[Any]]:
    """The client's reading of the recorded knowledge-chat stream (its session and body as recorded)."""
    req = interaction(name).request
    return lambda c: c._chat_stream(req["path"].rsplit("/", 1)[1], dict(req["body"]))


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [str(x["id"]) for x in items]


# -- configuration: system info, knowledge bases, retrieval config --------------------------------------------------

@pytest.mark.contract("C10", "C56")
def test_system_info_of_lite():
    with replay("04-system-info") as server:
        info = call(server, lambda c: c.system_info())
    assert info["version"] == "0.7.2" and info["edition"] == "lite" and info["commit_id"] == "3d5d8bf"
    assert info["keyword_index_engine"] == "sqlite" and info["vector_store_engine"] == "sqlite"
    assert info["db_version"] == "11"
    # C56 corrected: minio_enabled and db_migration_error are omitempty, absent when false / empty
    assert "minio_enabled" not in info and "db_migration_error" not in info
    assert set(interaction("04-system-info").body) == {"code", "data", "msg"}   # no "success" (C10)


@pytest.mark.contract("C49", "C47", "C26")
def test_knowledge_base_objects_and_the_preflight():
    names = ("16-kb-detail-parent-child", "17-kb-detail-flat", "18-kb-detail-faq", "04-system-info",
             "24-tenant-retrieval-config-get", "c1-model-get-use-multilingual", "c3-models-list", "c11-memory-config")
    with replay(*names) as server:
        facts = call(server, lambda c: read_server(c, [PC, FLAT, FAQ]))
        pc, flat, faq = (call(server, lambda c, k=k: c.knowledge_base(k)) for k in (PC, FLAT, FAQ))
    assert facts.kb_types == {PC: "document", FLAT: "document", FAQ: "faq"}
    assert pc["chunking_config"]["enable_parent_child"] is True
    assert (pc["chunking_config"]["parent_chunk_size"], pc["chunking_config"]["child_chunk_size"]) == (4096, 384)
    # enable_parent_child is omitempty: a flat knowledge base's config has no such key
    assert "enable_parent_child" not in flat["chunking_config"]
    assert pc["indexing_strategy"] == {"graph_enabled": False, "keyword_enabled": True, "vector_enabled": True,
                                       "wiki_enabled": False}
    # C49 corrected: chunk_count is filled for FAQ bases only, knowledge_count for document bases only
    assert (pc["knowledge_count"], pc["chunk_count"]) == (48, 0)
    assert (faq["knowledge_count"], faq["chunk_count"]) == (0, 126)
    assert faq["faq_config"] == {"index_mode": "question_only", "question_index_mode": "separate"}   # the UI's
    assert facts.version == "0.7.2"


@pytest.mark.contract("C57", "C30")
def test_a_retrieval_config_never_saved_reads_zeros():
    with replay("24-tenant-retrieval-config-get", "76b-error-retrieval-config-unknown-key") as server:
        raw = call(server, lambda c: c.retrieval_config())
        with pytest.raises(BadRequest, match="unsupported key"):
            call(server, lambda c: c.request("GET", "/api/v1/tenants/kv/no-such-key"))
    assert raw == {"embedding_top_k": 0, "vector_threshold": 0, "keyword_threshold": 0, "rerank_top_k": 0,
                   "rerank_threshold": 0, "rerank_model_id": ""}


@pytest.mark.contract("C26")
def test_the_preflight_stops_at_a_missing_knowledge_base():
    with replay("72b-error-unknown-kb-detail") as server, pytest.raises(NotFound, match="not found on this server"):
        call(server, lambda c: read_server(c, ["00000000-0000-0000-0000-000000000000"]))


@pytest.mark.contract("C48", "C94")
def test_knowledge_base_list_and_models():
    with replay("19-kb-list", "09-model-get-embedding", "c3-models-list") as server:
        kbs = call(server, lambda c: c.request("GET", "/api/v1/knowledge-bases", envelope=True))
        model = call(server, lambda c: c.request("GET", "/api/v1/models/823e1564-441c-4ad0-bfc4-09cd9b4cb341"))
        models = call(server, lambda c: c.request("GET", "/api/v1/models"))
    assert set(kbs) == {"success", "data"} and len(kbs["data"]) == 3   # no paging
    assert model["parameters"]["embedding_parameters"]["dimension"] == 512
    assert "api_key" not in model["parameters"]   # the key itself is never returned
    assert sorted(m["type"] for m in models) == ["Embedding", "Embedding", "KnowledgeQA", "Rerank"]


# -- listings ------------------------------------------------------------------------------------------------------

@pytest.mark.contract("C50", "C51", "C9")
def test_knowledge_listing_detail_and_their_errors():
    with replay("20d-knowledge-list-faq-kb", "21-knowledge-detail-manual", "20c-knowledge-list-pagesize-1001",
                "75c-error-knowledge-unknown") as server:
        page = call(server, lambda c: c.request("GET", f"/api/v1/knowledge-bases/{FAQ}/knowledge",
                                                params={"page": 1, "page_size": 20}, envelope=True))
        one = call(server, lambda c: c.request("GET", "/api/v1/knowledge/75dfe1c3-89a0-4ada-95c5-2b038e2a5fd5"))
        with pytest.raises(BadRequest) as too_big:
            call(server, lambda c: c.request("GET", f"/api/v1/knowledge-bases/{PC}/knowledge",
                                             params={"page": 1, "page_size": 1001}))
        with pytest.raises(NotFound, match="Knowledge not found"):
            call(server, lambda c: c.request("GET", "/api/v1/knowledge/00000000-0000-0000-0000-000000000000"))
    assert (page["total"], page["page"], page["page_size"], len(page["data"])) == (1, 1, 20, 1)
    assert one["parse_status"] == "completed" and one["type"] == "manual"
    assert too_big.value.status == 400 and too_big.value.code == 1000


@pytest.mark.contract("C52", "C55", "C54", "C53")
def test_chunk_listings_defaults_types_and_the_page_size_cap():
    kid = "75dfe1c3-89a0-4ada-95c5-2b038e2a5fd5"
    with replay("22-chunks-pc-default", "22c-chunks-pc-pagesize-200", "22d-chunks-pc-parent_text",
                "22e-chunks-pc-summary") as server:
        default = call(server, lambda c: c.request("GET", f"/api/v1/chunks/{kid}", envelope=True))
        capped = call(server, lambda c: c.request("GET", f"/api/v1/chunks/{kid}",
                                                  params={"page": 1, "page_size": 200}, envelope=True))
        parents = call(server, lambda c: c.request("GET", f"/api/v1/chunks/{kid}",
                                                   params={"chunk_type": "parent_text", "page_size": 100}))
        summary = call(server, lambda c: c.request("GET", f"/api/v1/chunks/{kid}",
                                                   params={"chunk_type": "summary", "page_size": 100}))
    assert (default["page_size"], default["total"], len(default["data"])) == (10, 15, 10)   # text only, 10 a page
    assert {c["chunk_type"] for c in default["data"]} == {"text"}
    assert (capped["page_size"], len(capped["data"])) == (100, 15)                            # 200 became 100
    # parent-child: children carry their parent's id and no neighbour links; parents only on request
    children = capped["data"]
    assert {c["parent_chunk_id"] for c in children} == {p["id"] for p in parents}
    assert not any(c["pre_chunk_id"] or c["next_chunk_id"] for c in children)
    assert [p["chunk_type"] for p in parents] == ["parent_text", "parent_text"]
    assert [p["chunk_index"] for p in parents] == [0, 1]   # parent indexes restart at 0 beside the children's
    (s,) = summary
    assert s["chunk_index"] == 15 and s["parent_chunk_id"] == children[0]["id"]   # after the last child
    assert {c["index_status"] for c in children} == {"ready"} and "content_revision" in children[0]
    assert any("<host>" in c["content"] for c in children)   # raw, not HTML-escaped at v0.7.2


@pytest.mark.contract("C52", "C47", "C55")
def test_faq_chunks_need_their_type_and_index_status_is_listed():
    with replay("23-chunks-faq-default-text", "95c-index-status-chunk-list", "22g-chunks-flat-default") as server:
        faq = call(server, lambda c: c.request("GET", "/api/v1/chunks/9e91cf0c-a780-47ba-81b9-8e2c561e8cef",
                                               params={"page_size": 10}, envelope=True))
        edited = call(server, lambda c: c.request("GET", "/api/v1/chunks/81348057-66cc-4f3b-9bc7-6edbd3d441e3",
                                                  params={"page_size": 100}))
        flat = call(server, lambda c: c.request("GET", "/api/v1/chunks/ab8f7c72-c85c-49ba-b901-deb4d5240c29",
                                                params={"page_size": 100}))
    assert (faq["total"], faq["data"]) == (0, [])   # without chunk_type only text chunks: an FAQ base looks empty
    assert [c["index_status"] for c in edited].count("processing") == 1
    assert all(c["parent_chunk_id"] == "" for c in flat)
    assert all(c["next_chunk_id"] for c in flat[:-1]) and all(c["pre_chunk_id"] for c in flat[1:])


@pytest.mark.contract("C52", "C54")
def test_the_clients_chunk_listing_with_parent_text():
    kid = "344bca5f-43b6-4469-bb5f-9f611d475921"
    with replay("c4-chunks-mini-with-parent_text-1") as server:
        got = call(server, lambda c: c.list_chunks(kid, chunk_types=(*SEARCHABLE_CHUNK_TYPES, "parent_text")))
    assert got.complete and got.pages == 1 and len(got.items) == got.total == 18
    kinds = [c["chunk_type"] for c in got.items]
    assert set(kinds) == {"text", "parent_text", "summary"}
    parents = {c["id"] for c in got.items if c["chunk_type"] == "parent_text"}
    assert {c["parent_chunk_id"] for c in got.items if c["chunk_type"] == "text" and c["parent_chunk_id"]} <= parents


@pytest.mark.contract("C51", "C12")
def test_unknown_chunks_and_knowledge_are_not_found():
    with replay("23c-chunk-by-id-unknown", "75b-error-chunks-unknown-knowledge") as server:
        for path in ("/api/v1/chunks/by-id/does-not-exist", "/api/v1/chunks/00000000-0000-0000-0000-000000000000"):
            with pytest.raises(NotFound) as err:
                call(server, lambda c, p=path: c.request("GET", p))
            assert err.value.code == 1003 and not route_missing(err.value)


# -- hybrid-search -------------------------------------------------------------------------------------------------

@pytest.mark.contract("C15", "C16", "C21", "C22", "C76")
def test_hybrid_search_post_and_get_and_the_fields_of_a_hit():
    with replay("31-hybrid-post-thr0-mc10") as server:
        hits = call(server, hybrid("31-hybrid-post-thr0-mc10"))
    with replay("32-hybrid-get-thr0-mc10") as server:
        got = call(server, lambda c: c.request("GET", f"/api/v1/knowledge-bases/{PC}/hybrid-search",
                                               body_of("32-hybrid-get-thr0-mc10")))
    assert ids(got) == ids(hits) and len(hits) == 10   # GET with a JSON body answers as POST
    first = hits[0]
    assert set(first) >= {"id", "content", "knowledge_id", "chunk_index", "knowledge_title", "start_at", "end_at",
                          "seq", "score", "match_type", "sub_chunk_id", "metadata", "chunk_type", "parent_chunk_id",
                          "image_info", "knowledge_filename", "knowledge_source", "knowledge_channel",
                          "matched_content", "knowledge_description", "knowledge_base_id"}
    assert first["sub_chunk_id"] is None and first["seq"] == first["chunk_index"]
    # C22 corrected: metadata is the knowledge's metadata, for manual knowledge the whole document
    assert set(first["metadata"]) == {"content", "format", "status", "updated_at", "version"}
    assert first["matched_content"].startswith(first["knowledge_title"] + "\n")   # the indexed text (C76)
    # both paths ran: weighted RRF, 0.7/(60+r_v) + 0.3/(60+r_k) at most 1/61, falling; found by both: match_type 0
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True) and max(scores) <= 1 / 61
    assert {h["match_type"] for h in hits} == {0}


@pytest.mark.contract("C15")
def test_hybrid_search_settles_on_post():
    async def search(c: WeKnoraClient) -> str | None:
        await hybrid("31-hybrid-post-thr0-mc10")(c)
        return c.hybrid_method
    with replay("31-hybrid-post-thr0-mc10") as server:
        assert call(server, search) == "POST"
    assert [s.method for s in server.log] == ["POST"]


@pytest.mark.contract("C19", "C21", "C25", "C99")
def test_one_path_at_a_time_and_the_thresholds_on_sqlite():
    with replay("34-hybrid-post-vector-only", "34b-hybrid-post-vector-only-thr0.5", "35-hybrid-post-keyword-only",
                "35b-hybrid-post-keyword-only-thr0.9") as server:
        vector = call(server, hybrid("34-hybrid-post-vector-only"))
        vector_05 = call(server, hybrid("34b-hybrid-post-vector-only-thr0.5"))
        keyword = call(server, hybrid("35-hybrid-post-keyword-only"))
        keyword_09 = call(server, hybrid("35b-hybrid-post-keyword-only-thr0.9"))
    assert {h["match_type"] for h in vector} == {0} and all(0 < h["score"] < 1 for h in vector)   # cosine
    assert vector_05 == []                           # the vector threshold applies: none reach 0.5 (data null)
    assert {h["match_type"] for h in keyword} == {1}
    assert all(1e6 < h["score"] < 1e8 for h in keyword)   # SQLite FTS5: bm25 x -1e6, raw
    assert [(h["id"], h["score"]) for h in keyword_09] == [(h["id"], h["score"]) for h in keyword]   # ignored


@pytest.mark.contract("C17", "C25", "C13")
def test_match_count_zero_and_negative():
    with replay("30-hybrid-post-query-only", "39b-hybrid-post-mc0-explicit", "39c-hybrid-post-mc-negative") as server:
        assert call(server, hybrid("30-hybrid-post-query-only")) == []     # no match_count: 0, cut to [:0]
        assert call(server, hybrid("39b-hybrid-post-mc0-explicit")) == []
        with pytest.raises(ServerFailed, match="slice bounds out of range") as err:
            call(server, hybrid("39c-hybrid-post-mc-negative"), max_attempts=1)
    assert err.value.status == 500 and err.value.code is None   # the Recovery panic body, no envelope code


@pytest.mark.contract("C24", "C23")
def test_context_enrichment_on_flat_and_parent_child_bases():
    with replay("36-hybrid-post-flat-thr0-mc10", "31-hybrid-post-thr0-mc10", "39-hybrid-post-skip-enrichment") as srv:
        flat = call(srv, hybrid("36-hybrid-post-flat-thr0-mc10"))
        pc = call(srv, hybrid("31-hybrid-post-thr0-mc10"))
        pc_skipped = call(srv, hybrid("39-hybrid-post-skip-enrichment"))
    primary, added = flat[:10], flat[10:]
    assert {h["match_type"] for h in primary} <= {0, 1} and len(added) == 13
    assert {h["match_type"] for h in added} == {2} and {h["score"] for h in added} == {0}   # neighbours, score 0
    # C24 corrected: children have no neighbour links and parent_text is never returned, so a parent-child
    # base gets nothing from enrichment
    assert ids(pc) == ids(pc_skipped)
    assert all(h["chunk_type"] != "parent_text" for h in flat + pc)


@pytest.mark.contract("C20", "C47")
def test_an_faq_base_has_no_keyword_path():
    with replay("37-hybrid-post-faq-kb") as server:
        hits = call(server, hybrid("37-hybrid-post-faq-kb"))
    assert len(hits) == 10 and {h["match_type"] for h in hits} == {0} and {h["chunk_type"] for h in hits} == {"faq"}


@pytest.mark.contract("C24", "C92", "C55")
def test_a_chunk_being_reindexed_drops_out_of_search_unreplaced():
    with replay("95-index-status-before", "95b-index-status-processing") as server:
        before = call(server, hybrid("95-index-status-before"))
    with replay("95b-index-status-processing") as server:
        during = call(server, hybrid("95b-index-status-processing"))
    assert len(before) == 10 and len(during) == 9   # cut to match_count first, then hydrated: not refilled
    assert ids(during) == ids(before)[1:]           # the chunk set to index_status processing is gone


@pytest.mark.contract("C98", "C16")
def test_knowledge_bases_with_different_embedding_models_are_refused():
    with replay("92-hybrid-two-kbs-different-models", "92c-hybrid-two-kbs-different-models-keyword-only") as server:
        for name in ("92-hybrid-two-kbs-different-models", "92c-hybrid-two-kbs-different-models-keyword-only"):
            with pytest.raises(BadRequest, match="different embedding models") as err:
                call(server, hybrid(name))
            assert (err.value.status, err.value.code) == (400, 1000)


@pytest.mark.contract("C26", "C16", "C11", "C14")
def test_hybrid_search_errors():
    with replay("72-error-unknown-kb-hybrid", "73b-error-wrong-type-hybrid", "73c-error-empty-query-hybrid",
                "73-error-bad-json-hybrid", "75-error-unknown-route") as server:
        with pytest.raises(NotFound, match="knowledge base not found") as missing:
            call(server, lambda c: c.hybrid_search("00000000-0000-0000-0000-000000000000", "网关", match_count=5))
        with pytest.raises(BadRequest, match="Invalid request parameters"):
            call(server, lambda c: c.hybrid_search(PC, "x", match_count="ten"))
        with pytest.raises(BadRequest, match="query_text is required"):
            call(server, lambda c: c.hybrid_search(PC, "", match_count=5))
        bad_json = httpx.post(f"{server.url}/api/v1/knowledge-bases/{PC}/hybrid-search",
                              content=b'{"query_text": "x", ', headers={"X-API-Key": KEY})
        with pytest.raises(BadRequest) as err:
            unwrap(bad_json)
        with pytest.raises(NotFound) as no_route:
            call(server, lambda c: c.request("GET", "/api/v1/no-such-route"))
    assert missing.value.code == 1003 and (err.value.status, err.value.code) == (400, 1000)
    assert route_missing(no_route.value)   # gin's plain-text 404: no envelope, no code


@pytest.mark.contract("C11", "C95", "C34")
def test_an_embedding_429_fails_hybrid_search_and_is_retried_by_the_client():
    with replay("80-embed429-hybrid-search") as server, pytest.raises(ServerFailed, match="Http Status 429") as err:
        call(server, hybrid("80-embed429-hybrid-search"), max_attempts=3)
    assert (err.value.status, err.value.code, err.value.kind) == (500, 1007, "server")
    assert server.hits("80-embed429-hybrid-search") == 3   # WeKnora did not retry the 429; the client does


# -- knowledge-search ----------------------------------------------------------------------------------------------

def ks(name: str) -> Callable[[WeKnoraClient], Awaitable[Any]]:
    """The recorded knowledge-search request through the client's request path (its body as recorded)."""
    return lambda c: c.request("POST", "/api/v1/knowledge-search", body_of(name))


@pytest.mark.contract("C41", "C43", "C38", "C39", "C29", "C44")
def test_knowledge_search_on_a_parent_child_base_shows_the_parent_under_the_childs_id():
    with replay("40-knowledge-search-pc") as server:
        results = call(server, ks("40-knowledge-search-pc"))
    assert len(results) == 8
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert r["chunk_type"] == "text" and r["parent_chunk_id"]   # the id is the child's
        assert len(r["content"]) > 1000                              # the content is the parent's (child <= 384)
        assert r["id"] in r["sub_chunk_id"]                          # C41 corrected: its own id is listed
        meta = r["metadata"]
        model, base = float(meta["model_score"]), float(meta["base_score"])   # "%.4f" strings (C39)
        composite = 0.6 * model + 0.3 * base + 0.1   # C38; a merged result keeps its chunks' best score (C41)
        if len(r["sub_chunk_id"]) == 1:
            assert r["score"] == pytest.approx(composite, abs=1e-3)
        else:
            assert r["score"] >= composite - 1e-3
    merged = next(r for r in results if len(r["sub_chunk_id"]) > 1)   # siblings merged into one result
    assert merged["sub_chunk_id"][0] == merged["id"]


@pytest.mark.contract("C41", "C32", "C47", "C31", "C44", "C36")
def test_knowledge_search_flat_multi_faq_and_nothing_found():
    with replay("40b-knowledge-search-flat", "40c-knowledge-search-pc-and-flat", "40d-knowledge-search-faq",
                "47-q20-q0035-knowledge-search-pc") as server:
        flat = call(server, ks("40b-knowledge-search-flat"))
        both = call(server, lambda c: c.knowledge_search([PC, FLAT], body_of("40c-knowledge-search-pc-and-flat")
                                                         ["query"]))
        faq = call(server, lambda c: c.knowledge_search([FAQ], body_of("40d-knowledge-search-faq")["query"]))
        nothing = call(server, ks("47-q20-q0035-knowledge-search-pc"))
    widened = [r for r in flat if r["sub_chunk_id"]]
    assert widened and all(r["id"] not in r["sub_chunk_id"] for r in widened)   # neighbour ids, not its own
    assert {r["knowledge_base_id"] for r in both} == {PC, FLAT}
    assert faq[0]["chunk_type"] == "faq" and faq[0]["content"].startswith("Q: ")
    assert "\nAnswer:\n- " in faq[0]["content"]
    assert nothing == []   # data: [] (hybrid-search says null)


@pytest.mark.contract("C27", "C28", "C26")
def test_knowledge_search_errors():
    with replay("72c-error-unknown-kb-knowledge-search", "73d-error-knowledge-search-no-scope",
                "73e-error-knowledge-search-empty-query") as server:
        with pytest.raises(NotFound, match="knowledge base not found") as missing:
            call(server, ks("72c-error-unknown-kb-knowledge-search"))
        with pytest.raises(BadRequest, match="At least one knowledge_base_id"):
            call(server, ks("73d-error-knowledge-search-no-scope"))
        with pytest.raises(BadRequest, match="Query"):
            call(server, ks("73e-error-knowledge-search-empty-query"))
    assert (missing.value.status, missing.value.code) == (500, 1007)   # a 500 whose message names the miss
    assert server.hits("72c-error-unknown-kb-knowledge-search") == 1    # never retried


@pytest.mark.contract("C34")
def test_an_embedding_429_leaves_knowledge_search_keyword_only_or_failed():
    with replay("81-embed429-knowledge-search", "81b-embed429-knowledge-search-faq") as server:
        results = call(server, ks("81-embed429-knowledge-search"))
        with pytest.raises(ServerFailed, match="has no keyword fallback"):
            call(server, lambda c: c.knowledge_search([FAQ], body_of("81b-embed429-knowledge-search-faq")["query"]))
    assert len(results) == 9 and {r["match_type"] for r in results} == {1}   # 200, the vector path silently gone


@pytest.mark.contract("C24")
def test_knowledge_search_drops_a_chunk_being_reindexed():
    with replay("95e-index-status-knowledge-search") as server:
        results = call(server, ks("95e-index-status-knowledge-search"))
    assert "d735ecce-3dd8-4a7b-a18a-cd8e19fa2c0b" not in ids(results) + [s for r in results
                                                                         for s in r["sub_chunk_id"] or []]


# -- FAQ search ----------------------------------------------------------------------------------------------------

@pytest.mark.contract("C45", "C46")
def test_faq_search_applies_0_7_when_no_threshold_is_sent():
    names = ("41-faq-search-match-count-only", "41b-faq-search-thr0.3", "41c-faq-search-thr0.01",
             "41d-faq-search-thr0.7")
    got = {}
    with replay(*names) as server:
        for name in names:
            params = {k: v for k, v in body_of(name).items() if k != "query_text"}
            got[name] = call(server, lambda c, p=params, n=name: c.faq_search(FAQ, body_of(n)["query_text"], **p))
    default, low, lowest, explicit = (got[n] for n in names)
    assert len(default) == 1 and default[0]["score"] > 0.9 and default == explicit   # 0.7 applied
    assert len(low) == len(lowest) == 10 and min(e["score"] for e in low) < 0.7
    entry = default[0]
    assert {"chunk_id", "score", "matched_question", "standard_question", "answers", "tag_id"} <= set(entry)
    assert "match_type" not in entry   # C46 corrected: omitempty, a vector match (0) has no match_type


@pytest.mark.contract("C45", "C11")
def test_faq_search_errors():
    with replay("76-error-faq-search-on-document-kb", "82-embed429-faq-search") as server:
        with pytest.raises(BadRequest) as doc_kb:
            call(server, lambda c: c.request("POST", f"/api/v1/knowledge-bases/{PC}/faq/search",
                                             body_of("76-error-faq-search-on-document-kb")))
        with pytest.raises(ServerFailed) as limited:
            call(server, lambda c: c.faq_search(FAQ, body_of("82-embed429-faq-search")["query_text"], match_count=10))
    assert doc_kb.value.code == 1000
    assert str(limited.value).endswith("Internal server error") and limited.value.code == 1007   # nothing said


# -- auth --------------------------------------------------------------------------------------------------------------

@pytest.mark.contract("C1", "C2", "C14")
def test_auth_failures():
    with replay("71-error-bad-api-key") as server, pytest.raises(AuthFailed, match="invalid API key") as bad:
        call(server, lambda c: c.hybrid_search(PC, "网关", match_count=5))
    assert bad.value.status == 401 and bad.value.code is None   # bare {"error"}
    path = f"/api/v1/knowledge-bases/{PC}/hybrid-search"
    for name, headers, said in (("70-error-no-credentials", {}, "missing authentication"),
                                ("71b-error-bad-bearer-no-key", {"Authorization": "Bearer x"}, "invalid or expired"),
                                ("71c-error-api-key-as-bearer", {"Authorization": f"Bearer {KEY}"},
                                 "invalid or expired")):
        with replay(name) as server:
            resp = httpx.post(server.url + path, json={"query_text": "网关", "match_count": 5}, headers=headers)
        with pytest.raises(AuthFailed, match=said):
            unwrap(resp)


# -- sessions ------------------------------------------------------------------------------------------------------

@pytest.mark.contract("C58", "C59", "C10", "C82")
def test_sessions_create_get_delete():
    with replay("50-session-create-empty-object", "50b-session-create-no-body", "50c-session-get",
                "58-session-delete", "58b-session-get-after-delete") as server:
        created = call(server, lambda c: c.request("POST", "/api/v1/sessions", {}, retry=False))
        with pytest.raises(BadRequest, match="EOF"):
            call(server, lambda c: c.request("POST", "/api/v1/sessions", retry=False))
        got = call(server, lambda c: c.request("GET", f"/api/v1/sessions/{created['id']}"))
        call(server, lambda c: c.delete_session("f0fd7402-a1c0-42eb-b062-708d2429dfd2"))
        with pytest.raises(NotFound, match="session not found"):
            call(server, lambda c: c.request("GET", "/api/v1/sessions/f0fd7402-a1c0-42eb-b062-708d2429dfd2"))
    assert created["user_id"] == "api_tenant_key:1:1" and got["id"] == created["id"]
    assert "knowledge_base_id" not in created


@pytest.mark.contract("C60")
def test_chat_errors_before_the_stream():
    with replay("74-error-chat-unknown-session", "74b-error-chat-empty-query") as server:
        with pytest.raises(NotFound, match="Session not found"):
            call(server, stream("74-error-chat-unknown-session"))
        with pytest.raises(BadRequest, match="Query"):
            call(server, stream("74b-error-chat-empty-query"))


# -- chat streams --------------------------------------------------------------------------------------------------

@pytest.mark.contract("C62", "C63", "C64", "C65", "C61")
def test_a_chat_stream_references_tool_events_and_citations():
    name = "53-chat-ui-body"
    rec = interaction(name)
    assert rec.sse.startswith(b"event:message\ndata:{")   # no space after the colons
    with replay(name) as server:
        result = call(server, stream(name))
    events = rec.events()
    kinds = [e["response_type"] for e in events]
    # C63 corrected: normal mode emits tool_call / tool_result events; the client passes over them
    assert kinds.index("tool_call") < kinds.index("references") < kinds.index("answer") < kinds.index("complete")
    refs = next(e for e in events if e["response_type"] == "references")["knowledge_references"]
    assert ids(result.references) == ids(refs) and len(refs) == 5
    answer = "".join(e["content"] for e in events if e["response_type"] == "answer")
    assert result.answer == answer and result.citations and set(result.citations) <= set(ids(refs))
    assert "session_title" in kinds   # sent without disable_title: the title event (C61)


@pytest.mark.contract("C60", "C66")
def test_the_web_uis_chat_runs_the_quick_answer_agent():
    body = body_of("53-chat-ui-body")
    assert body["agent_id"] == "builtin-quick-answer" and body["agent_enabled"] is False and body["channel"] == "web"
    agent = data("59-agent-get-quick-answer-default")["config"]
    assert (agent["embedding_top_k"], agent["vector_threshold"], agent["keyword_threshold"], agent["rerank_top_k"],
            agent["rerank_threshold"]) == (10, 0.5, 0.3, 10, 0.3)
    assert agent["model_id"] == "" and agent["rerank_model_id"] == ""   # a fresh tenant's built-in agent: no model
    with replay("53-chat-ui-body") as server:
        refs = call(server, stream("53-chat-ui-body")).references
    # vector threshold 0.5: the cosine hits (0.43 at best here) are gone; what is left is keyword hits
    assert {r["match_type"] for r in refs} == {1}


@pytest.mark.contract("C63", "C61")
def test_a_terminal_error_ends_the_read_though_weknora_keeps_the_stream_open():
    for name, said in (("52a-chat-quick-answer-agent-model-unset", "chat model is not configured"),
                       ("111-chat-llm-stream-cut", "injected mid-stream failure")):
        rec = interaction(name)
        assert rec.response["stays_open"] and rec.events()[-1 if name.startswith("111") else 1]["done"] is True
        with replay(name, hold_s=20) as server:
            t0 = time.monotonic()
            with pytest.raises(ServerFailed, match=said):
                call(server, stream(name), max_attempts=1, timeout_s=15)
            assert time.monotonic() - t0 < 5   # at the error event, not when the server gives up


@pytest.mark.contract("C63", "C34", "C61")
def test_a_non_terminal_error_then_the_terminal_one():
    """A retrieval that fails in normal mode: a tool result ``error`` with done false, then the pipeline's terminal
    ``error`` (done true), and the stream stays open. The client's chat (session, then stream) fails at once."""
    kinds = [(e["response_type"], e["done"]) for e in interaction("c8-chat-faq-embed429").events()]
    assert kinds[-2:] == [("error", False), ("error", True)]
    query = body_of("c8-chat-faq-embed429")["query"]
    with replay("c7-session-create", "c8-chat-faq-embed429", hold_s=20) as server:
        t0 = time.monotonic()
        with pytest.raises(ServerFailed, match="has no keyword fallback"):
            call(server, lambda c: c.chat([FAQ], query), max_attempts=1, timeout_s=15)
        assert time.monotonic() - t0 < 5
    assert [s.path for s in server.log] == ["/api/v1/sessions", interaction("c8-chat-faq-embed429").request["path"]]


@pytest.mark.contract("C63", "C64", "C66")
def test_a_greeting_skips_retrieval_and_sends_no_references():
    for name in ("54-chat-greeting-no-agent", "54b-chat-greeting-quick-answer", "55-chat-chitchat-no-agent"):
        kinds = [e["response_type"] for e in interaction(name).events()]
        assert "references" not in kinds and "complete" in kinds and kinds.count("tool_call") == 1
        with replay(name) as server:
            result = call(server, stream(name))
        assert result.answer and result.references in ([], None)


def said_no_references(result: Any) -> bool:
    """Whether a chat result tells "WeKnora sent no references event" (retrieval skipped) apart from "it sent an
    empty one": ``references`` None, or a true ``retrieval_skipped`` / ``references_sent`` False."""
    return (result.references is None or getattr(result, "retrieval_skipped", False) is True
            or getattr(result, "references_sent", True) is False)


@pytest.mark.contract("C66")
def test_a_chat_without_a_references_event_says_so():
    with replay("54-chat-greeting-no-agent") as server:
        result = call(server, stream("54-chat-greeting-no-agent"))
    assert said_no_references(result)


@pytest.mark.contract("C38", "C39")
def test_rerank_over_keyword_only_candidates_clamps_every_score_to_1():
    with replay("61b-chat-quick-answer-with-rerank") as server:
        refs = call(server, stream("61b-chat-quick-answer-with-rerank")).references
    assert len(refs) == 4 and {r["match_type"] for r in refs} == {1} and {r["score"] for r in refs} == {1}
    bases = [float(r["metadata"]["base_score"]) for r in refs]
    models = [float(r["metadata"]["model_score"]) for r in refs]
    assert min(bases) > 1e6 and len(set(models)) > 1   # 0.3 x ~1e7 + ...: clamped, the model's order is lost


@pytest.mark.contract("C37")
def test_a_failed_rerank_leaves_the_retrieval_order_without_rerank_scores():
    with replay("61d-chat-quick-answer-rerank-500") as server:
        refs = call(server, stream("61d-chat-quick-answer-rerank-500")).references
    scores = [r["score"] for r in refs]
    assert refs and scores == sorted(scores, reverse=True) and min(scores) > 1e6   # the keyword scores, as retrieved
    assert not any({"base_score", "model_score"} & set(r["metadata"]) for r in refs)


@pytest.mark.contract("C47")
def test_an_faq_chat_references_faq_entries():
    with replay("57-chat-faq-quick-answer") as server:
        refs = call(server, stream("57-chat-faq-quick-answer")).references
    assert len(refs) == 10 and {r["chunk_type"] for r in refs} == {"faq"}
    assert all(r["content"].startswith("Q: ") for r in refs)
