"""The collector against answers shaped as WeKnora Lite v0.7.2 gives them (tests/lite_stub.py, over HTTP on
loopback): parent-child results scored as the user sees them, a complete and stable inventory, labels on chunks
search never returns, the web UI's chat with skipped retrieval, SSE error events, the FAQ threshold, keyword-only
answers and rebuilt references flagged, knowledge bases of different embedding models refused, reranker notes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from weknora_nb import cli
from weknora_nb.collect import collect
from weknora_nb.collect.checks.integrity import run_checks
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.collect.run.stages import Stage
from weknora_nb.core.answers import read_answers
from weknora_nb.core.errors import UsageError
from weknora_nb.core.integrity_api import inventory_fingerprint
from weknora_nb.core.results import read_results
from weknora_nb.core.run import read_manifest
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

from . import lite_stub
from .lite_stub import KB, STATE, LiteStub, faq_chunks, reset

KEY = "sk-lite-shapes-test"
TS = TestSet.from_records([
    {"query_id": "q1", "query": "how is the gateway deployed", "relevant": {"c4": 3, "c2": 1}},
    {"query_id": "q2", "query": "你好", "relevant": {"c2": 2}},
    {"query_id": "q3", "query": "embed-fail: what does the gateway log", "relevant": {"c5": 2}}])


@pytest.fixture(autouse=True)
def key_in_env(monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    monkeypatch.delenv("WEKNORA_TENANT_ID", raising=False)


@pytest.fixture(scope="module")
def lite() -> Iterator[str]:
    stub = LiteStub()
    yield stub.url
    stub.stop()


def fast(url: str, **kw: Any) -> ClientSettings:
    return ClientSettings(url, backoff_base_s=0.01, backoff_max_s=0.02, max_attempts=kw.pop("max_attempts", 2),
                          timeout_s=kw.pop("timeout_s", 10), **kw)


def run(url: str, out: Path, stages: str | list[Any] = "hybrid,final", testset: TestSet = TS, **kw: Any) -> Any:
    return collect(fast(url, max_attempts=kw.pop("max_attempts", 2)), kw.pop("kb_ids", KB), testset, out,
                   stages=stages, repeats=1, warmup=0, progress=False, concurrency=2, **kw)


def bodies(path_part: str) -> list[Any]:
    return [b for _, p, b in STATE["seen"] if path_part in p]


# -- 1. parent-child scored as the user sees it (docs/method.md section 14) --------------------------------

@pytest.mark.contract("C100", "C101")
def test_a_parent_child_run_credits_the_chunks_a_result_shows(lite, tmp_path):
    reset()
    s = run(lite, tmp_path / "run")
    assert s.complete
    res = read_results(tmp_path / "run" / "results.parquet")
    final = res[(res["stage"] == "final") & (res["query_id"] == "q1")]
    assert final["chunk_id"].tolist() == ["c2", "c5", "s1"]
    assert final["parent_chunk_id"].tolist() == ["P1", "P2", "c1"]
    assert [json.loads(x) for x in final["shown_chunk_ids"]] == [["c3", "P1", "c1", "c4"], ["P2", "c6"], []]
    assert json.loads(final["sub_chunk_ids"].iloc[0]) == ["c2", "c3"]   # WeKnora's list, kept as it came
    hybrid = res[res["stage"] == "hybrid"]
    assert set(hybrid["shown_chunk_ids"]) == {"[]"} and set(hybrid["parent_chunk_id"]) == {"P1", "P2"}
    m = read_manifest(tmp_path / "run")
    assert m["shown_chunks"] == {"families_from": "start inventory", "parents": 2}
    kb = m["knowledge_bases"][KB]   # the server says chunk_count 0 for a document knowledge base (C101)
    assert (kb["chunk_count"], kb["parent_chunk_count"], kb["knowledge_count"]) == (7, 2, 1)
    shown = score(TS, res, ["recall@10"]).summary_wide().loc["final", "recall@10"]
    child = score(TS, res, ["recall@10"], sub_chunks="ignore").summary_wide().loc["final", "recall@10"]
    assert (shown, child) == (pytest.approx(1.0), pytest.approx((0.5 + 1 + 1) / 3))   # q1: c4 shown, never hit
    assert score(TS, res, ["recall@10"]).counts.n_duplicates_removed == 0


# -- 2. the inventory: complete and stable -------------------------------------------------------------

@pytest.mark.contract("C101", "C102", "C47", "C52")
def test_the_inventory_lists_parents_index_status_and_reads_ties_again(lite, tmp_path):
    reset(ties=True, chunk_cap=7)   # the page size of recording 25-*, FAQ entries all of chunk_index 0
    STATE["knowledge"][KB].append({"id": lite_stub.FAQ_KNOWLEDGE, "title": "FAQ", "parse_status": "completed"})
    STATE["chunks"][lite_stub.FAQ_KNOWLEDGE] = faq_chunks(30)
    run(lite, tmp_path / "run", stages="hybrid")
    inv = pd.read_parquet(tmp_path / "run" / "chunks.parquet")
    assert inv["chunk_id"].is_unique and len(inv) == 9 + 30
    assert set(inv.loc[inv["chunk_type"] == "parent_text", "chunk_id"]) == {"P1", "P2"}
    assert inv.set_index("chunk_id").loc["c5", "parent_chunk_id"] == "P2"
    assert inv.set_index("chunk_id").loc["c6", "index_status"] == "processing"
    m = read_manifest(tmp_path / "run")
    assert m["inventory"]["relisted"][lite_stub.FAQ_KNOWLEDGE] > 1 and "incomplete" not in m["inventory"]
    assert m["inventory"]["unsearchable"] == 3   # P1, P2, c6
    # the fingerprint does not depend on the order the pages came in
    assert m["integrity"]["fingerprint"]["start"] == m["integrity"]["fingerprint"]["end"]
    assert inventory_fingerprint(inv.sample(frac=1, random_state=3)) == m["integrity"]["fingerprint"]["end"]
    assert not m["integrity"]["content_changed"]


@pytest.mark.contract("C101")
def test_a_listing_still_short_after_its_passes_is_recorded_incomplete(lite, tmp_path):
    reset(lie_total={lite_stub.KNOWLEDGE: 5})
    run(lite, tmp_path / "run", stages="hybrid")
    m = read_manifest(tmp_path / "run")
    assert m["inventory"]["incomplete"] == {lite_stub.KNOWLEDGE: "listed 9 of 14"}
    finding = [f for f in m["integrity"]["findings"] if f["check"] == "inventory_incomplete"]
    assert finding and finding[0]["data"]["listed"] == 9 and finding[0]["severity"] == "problem"


# -- 3. labels on chunks search can never return ------------------------------------------------------

@pytest.mark.contract("C100", "C102")
def test_labels_on_unsearchable_chunks_are_flagged_by_check(lite, tmp_path, capsys):
    reset()
    labels = TestSet.from_records([{"query_id": "q1", "query": "x", "relevant": {"P1": 2, "c6": 1, "c2": 3}}])
    result = run_checks(fast(lite), KB, testset=labels)
    found = {f.subject: f for f in result.findings if f.check == "label_chunk_unsearchable"}
    assert set(found) == {"P1", "c6"} and all(f.severity == "problem" for f in found.values())
    assert "parent_text" in found["P1"].detail and "index_status is processing" in found["c6"].detail
    assert result.facts["api"]["knowledge_bases"][KB]["unsearchable"] == 3
    ts = tmp_path / "ts.jsonl"
    ts.write_text(json.dumps({"query_id": "q1", "query": "x", "relevant": {"c6": 1}}) + "\n")
    code = cli.main(["check", "--base-url", lite, "--kb-id", KB, "--testset", str(ts)])
    out = capsys.readouterr().out
    assert code == 1 and "label_chunk_unsearchable" in out and "c6" in out


def test_the_diagnosis_does_not_call_an_unsearchable_label_a_retrieval_loss():
    from weknora_nb.analysis.diagnose.query import KnowledgeBase

    inv = pd.DataFrame(lite_stub.document_chunks()).rename(columns={"id": "chunk_id"})
    kb = KnowledgeBase.of(inv, pd.DataFrame({"chunk_id": []}))
    assert set(kb.unsearchable) == {"P1", "P2", "c6"} and kb.enabled is not None
    assert "c6" not in kb.enabled and "P1" not in kb.enabled and "c5" in kb.enabled


# -- 4. the web UI's chat; skipped retrieval -----------------------------------------------------------

@pytest.mark.contract("C103", "C104", "C66")
def test_chats_name_the_ui_agent_and_a_skipped_retrieval_is_no_failure(lite, tmp_path):
    reset()
    s = run(lite, tmp_path / "run", stages="citations")
    chats = bodies("/knowledge-chat/")
    assert all(b["agent_id"] == "builtin-quick-answer" and b["agent_enabled"] is False for b in chats)
    assert s.complete and s.counts["citations"] == {"ok": 2, "skipped": 1} and "skipped" in s.describe()
    m = read_manifest(tmp_path / "run")
    assert m["status"] == "complete" and m["n_failed"] == 0
    assert m["stages"]["citations"]["params"]["agent_id"] == "builtin-quick-answer"
    assert m["stages"]["citations"]["settings_source"] == "agent configuration (builtin-quick-answer)"
    assert any("skipped retrieval" in n for n in m["notes"])
    res = read_results(tmp_path / "run" / "results.parquet")
    skipped = res[res["query_id"] == "q2"]
    assert skipped["status"].tolist() == ["skipped"] and skipped["chunk_id"].isna().all()
    assert res["flags"].isna().all()   # q3's references are keyword hits only: chats are not flagged
    sc = score(TS, res)
    assert sc.complete and sc.counts.n_skipped == 1 and sc.counts.skipped_ids == ["q2"] and sc.counts.n_failed == 0
    assert sc.summary[sc.summary["metric"] == "recall@10"]["n_queries"].tolist() == [2]
    assert sc.excluded.query("query_id == 'q2'")["reason"].str.startswith("skipped").all()
    assert any("skipped retrieval" in w for w in sc.warnings)
    assert sc.to_json_dict()["counts"]["n_skipped"] == 1
    answers = read_answers(tmp_path / "run" / "answers.jsonl")
    assert set(answers["query_id"]) == {"q1", "q2", "q3"}   # the greeting's answer is kept, marked
    from weknora_nb.analysis.citations import citation_scores
    from weknora_nb.core.run import load_run

    cs = citation_scores(load_run(tmp_path / "run", testset=TS), answers)
    assert cs.n_answers == 2 and cs.n_failed == 0 and set(cs.per_answer["query_id"]) == {"q1", "q3"}


@pytest.mark.contract("C64", "C104")
def test_a_chat_that_retrieved_nothing_is_an_empty_list_not_a_skip(lite, tmp_path):
    reset()
    nothing = TestSet.from_records([{"query_id": "n1", "query": "nothing about it", "relevant": {"c2": 1}}])
    s = run(lite, tmp_path / "run", stages="citations", testset=nothing)
    assert s.counts["citations"] == {"ok": 1}
    sc = score(nothing, read_results(tmp_path / "run" / "results.parquet"), ["recall@10"])
    assert sc.counts.n_scored == 1 and sc.counts.n_skipped == 0
    assert sc.summary_wide().loc["citations", "recall@10"] == 0


@pytest.mark.contract("C66", "C103")
def test_chat_agent_none_sends_no_agent(lite, tmp_path):
    reset()
    run(lite, tmp_path / "run", stages="citations", chat_agent="none")
    assert all("agent_id" not in b and "agent_enabled" not in b for b in bodies("/knowledge-chat/"))
    m = read_manifest(tmp_path / "run")
    assert m["stages"]["citations"]["settings_source"] == "server conversation config"
    with pytest.raises(UsageError, match="--chat-agent"):
        run(lite, tmp_path / "other", stages="citations", chat_agent=" ")


def test_the_cli_records_its_chat_agent(lite, tmp_path, capsys):
    reset()
    ts = tmp_path / "ts.jsonl"
    ts.write_text(json.dumps({"query_id": "q1", "query": "gateway", "relevant": {"c2": 1}}) + "\n")
    code = cli.main(["collect", "--base-url", lite, "--kb-id", KB, "--testset", str(ts), "--out",
                     str(tmp_path / "run"), "--stages", "citations", "--repeats", "1", "--warmup", "0", "--quiet",
                     "--chat-agent", "my-agent"])
    assert code == 0
    assert read_manifest(tmp_path / "run")["stages"]["citations"]["params"]["agent_id"] == "my-agent"


# -- 5. SSE error events ----------------------------------------------------------------------------

ERRORS = TestSet.from_records([{"query_id": q, "query": q, "relevant": {"c2": 1}}
                               for q in ("boom-soft", "boom-hard", "no-model")])


@pytest.mark.contract("C103", "C105")
def test_a_non_terminal_error_is_passed_and_a_terminal_one_ends_the_request_at_once(lite, tmp_path):
    reset()
    t0 = time.monotonic()
    s = run(lite, tmp_path / "run", stages="citations", testset=ERRORS, max_attempts=2)
    assert time.monotonic() - t0 < 20   # the server keeps both failing streams open for 60 s
    ckpt = {json.loads(x)["query_id"]: json.loads(x) for x in
            (tmp_path / "run" / "checkpoint.jsonl").read_text().splitlines()}
    assert ckpt["boom-soft"]["status"] == "ok" and ckpt["boom-soft"]["stream_errors"] == [
        "tool web_fetch failed: timeout"]
    assert ckpt["boom-hard"]["status"] == "server" and "status code: 500" in ckpt["boom-hard"]["error"]
    no_model = ckpt["no-model"]
    assert no_model["status"] == "server" and "has no chat model" in no_model["error"]
    assert "--chat-agent none" in no_model["error"]
    assert not s.complete and {f["query_id"] for f in s.failed} == {"boom-hard", "no-model"}
    attempts = [b["query"] for b in bodies("/knowledge-chat/")]
    assert attempts.count("no-model") == 1 and attempts.count("boom-hard") == 2   # retried; the agent's not
    answers = read_answers(tmp_path / "run" / "answers.jsonl")
    assert answers["query_id"].tolist() == ["boom-soft"]
    line = json.loads((tmp_path / "run" / "answers.jsonl").read_text().splitlines()[0])
    assert line["stream_errors"] == ["tool web_fetch failed: timeout"]


# -- 6. the FAQ threshold, explicit --------------------------------------------------------------------

@pytest.mark.contract("C45")
def test_the_faq_stage_sends_and_records_the_servers_threshold(lite, tmp_path):
    reset(kbs={"kb-faq": {"type": "faq", "embedding_model_id": "m-emb", "vector": True}}, knowledge={"kb-faq": []})
    run(lite, tmp_path / "run", stages="faq", kb_ids="kb-faq")
    assert {b["vector_threshold"] for b in bodies("/faq/search")} == {0.7}
    assert read_manifest(tmp_path / "run")["stages"]["faq"]["params"] == {"match_count": 50, "vector_threshold": 0.7}
    own = Stage("faq-low", "faq-search", {"vector_threshold": 0.3}, keep_match_types=None)
    run(lite, tmp_path / "low", stages=[own], kb_ids="kb-faq")
    assert bodies("/faq/search")[-1]["vector_threshold"] == 0.3


# -- 7. keyword-only answers flagged ------------------------------------------------------------------

@pytest.mark.contract("C23", "C34")
def test_a_knowledge_search_answer_of_keyword_hits_only_is_flagged(lite, tmp_path):
    reset()
    s = run(lite, tmp_path / "run", stages="final")
    res = read_results(tmp_path / "run" / "results.parquet")
    flags = {q: set(g["flags"].astype("string").fillna("")) for q, g in res.groupby("query_id")}
    assert flags["q3"] == {"vector_path_missing"} and flags["q1"] == {""}
    assert s.flags == {"final": {"vector_path_missing": 1}} and "vector_path_missing 1" in s.describe()
    m = read_manifest(tmp_path / "run")
    assert m["flags"] == {"final": {"vector_path_missing": 1}}
    assert any("vector_path_missing (a heuristic)" in n for n in m["notes"])
    reset(kbs={KB: {"type": "document", "embedding_model_id": "m-emb", "vector": False}})   # keyword only: expected
    run(lite, tmp_path / "keyword", stages="final")
    assert read_results(tmp_path / "keyword" / "results.parquet")["flags"].isna().all()


# -- 8. references rebuilt by the Redis stream manager ------------------------------------------------

@pytest.mark.contract("C106")
def test_rebuilt_references_are_flagged_and_their_match_types_not_filtered(lite, tmp_path):
    reset()
    redis = TestSet.from_records([{"query_id": "r1", "query": "redis: the gateway", "relevant": {"c4": 1}},
                                  {"query_id": "m1", "query": "memory: the gateway", "relevant": {"c4": 1}}])
    keyword_only = Stage("cit-kw", "chat", keep_match_types=(1,))
    run(lite, tmp_path / "run", stages=[keyword_only], testset=redis)
    res = read_results(tmp_path / "run" / "results.parquet")
    r1, m1 = res[res["query_id"] == "r1"], res[res["query_id"] == "m1"]
    assert set(r1["flags"]) == {"references_rebuilt"} and r1["chunk_id"].tolist() == ["c2", "c5", "s1"]
    assert m1["chunk_id"].isna().all() and m1["flags"].isna().all()   # match type 0 only: filtered out as asked
    assert json.loads(r1["shown_chunk_ids"].iloc[0]) == ["P1", "c1", "c3", "c4"]   # parent_chunk_id survives
    notes = read_manifest(tmp_path / "run")["notes"]
    assert sum("Redis stream manager" in n for n in notes) == 1


# -- 9. knowledge bases of different embedding models -------------------------------------------------

@pytest.mark.contract("C107", "C94")
def test_knowledge_bases_of_different_embedding_models_are_refused_before_any_request(lite, tmp_path, capsys):
    two = {KB: {"type": "document", "embedding_model_id": "m-emb", "vector": True},
           "kb-hash": {"type": "document", "embedding_model_id": "m-hash", "vector": True}}
    models = {"m-emb": {"name": "use-multilingual-v3", "base_url": "http://127.0.0.1:18083/v1"},
              "m-hash": {"name": "use-multilingual-v3", "base_url": "http://other:9000/v1"}}
    reset(kbs=two, models=models)
    ts = tmp_path / "ts.jsonl"
    ts.write_text(json.dumps({"query_id": "q1", "query": "x", "relevant": {"c2": 1}}) + "\n")
    code = cli.main(["collect", "--base-url", lite, "--kb-id", KB, "--kb-id", "kb-hash", "--testset", str(ts),
                     "--out", str(tmp_path / "run"), "--stages", "hybrid,final", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "kb-pc: use-multilingual-v3 at http://127.0.0.1:18083/v1" in err and "kb-hash: use-multilingual-v3 at " \
        "http://other:9000/v1" in err and "(hybrid)" in err
    assert not bodies("/hybrid-search") and not bodies("/knowledge-search") and not (tmp_path / "run").exists()
    # one model registered twice (two ids, one name and base URL) is one model to WeKnora
    models["m-hash"]["base_url"] = "http://127.0.0.1:18083/v1"
    assert run(lite, tmp_path / "same", stages="hybrid", kb_ids=[KB, "kb-hash"]).complete
    # without a hybrid-search stage nothing is compared (knowledge-search groups by model itself)
    models["m-hash"]["base_url"] = "http://other:9000/v1"
    assert run(lite, tmp_path / "final", stages="final", kb_ids=[KB, "kb-hash"]).complete
    # a knowledge base without an embedding model (wiki or graph only) is left out, as WeKnora leaves it out
    two["kb-hash"]["embedding_model_id"] = ""
    assert run(lite, tmp_path / "wiki", stages="hybrid", kb_ids=[KB, "kb-hash"]).complete


# -- 10. reranker notes -------------------------------------------------------------------------------

@pytest.mark.contract("C108", "C56")
@pytest.mark.parametrize("version, memory, says", [
    ("0.6.3", None, "truncate_prompt_tokens 511"),
    ("0.7.2", {"enabled": True, "write_mode": "auto"}, "MemoryAffinity"),
    ("0.7.2", {"enabled": True, "retrieval_conditioning": False}, None),
    ("0.7.2", None, None)])
def test_the_manifest_names_what_the_server_does_to_rerank_scores(lite, tmp_path, version, memory, says):
    reset(version=version, memory=memory)
    run(lite, tmp_path / "run", stages="hybrid")
    m = read_manifest(tmp_path / "run")
    notes = [n for n in m["notes"] if "rerank" in n]
    assert (notes and says in notes[0]) if says else not notes
    if version.startswith("0.6"):
        assert m["reranker"] == {"truncate_prompt_tokens": 511}
    else:
        assert ("error" in m["reranker"]["memory_config"]) == (memory is None)
