"""Integrity checks through the API (issue 15): each finding on a crafted inventory, none on a clean one; the
fingerprint; a collection against the sandbox that stores them in its manifest and sees a change made
during the run; ``weknora-nb check`` over real HTTP; the reports that show them (escaped)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb import cli
from weknora_nb.collect import collect
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.core.integrity import (
    API_CHECKS,
    INFO,
    PROBLEM,
    Finding,
    broken_chunks,
    describe_findings,
    findings_from_json,
    merge_findings,
    summary_rows,
)
from weknora_nb.core.integrity_api import (
    KNOWLEDGE_COLUMNS,
    api_checks,
    inventory_changes,
    inventory_fingerprint,
)
from weknora_nb.core.run import load_run, read_manifest
from weknora_nb.core.testset import TestSet
from weknora_nb.sandbox import SandboxServer

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
KEY = "sk-integrity-test-3e9b1c7d5a"
EVIL = '<img src=x onerror="alert(1)">'


# -- crafted inventories --------------------------------------------------------------------------------

def chunk(cid, kid="k1", kb="kb1", content=None, enabled=True, status="completed", ctype="text"):
    return {"chunk_id": cid, "knowledge_base_id": kb, "knowledge_id": kid, "knowledge_title": f"title {kid}",
            "chunk_index": 0, "chunk_type": ctype, "is_enabled": enabled, "parse_status": status,
            "content": f"content of {cid}" if content is None else content}


def knowledge(kid, kb="kb1", status="completed", listing="ok", listed=1, total=1, error=None):
    return {"knowledge_id": kid, "knowledge_base_id": kb, "knowledge_title": f"title {kid}", "parse_status": status,
            "enable_status": "enabled", "error_message": error, "listing": listing, "listed": listed, "total": total}


def frames(chunks, knowledges):
    c = pd.DataFrame(chunks)
    k = pd.DataFrame(knowledges, columns=KNOWLEDGE_COLUMNS)
    return c, k


def labels(*rows):
    return pd.DataFrame(rows, columns=["query_id", "chunk_id", "grade"])


CLEAN = frames([chunk("c1"), chunk("c2", "k2"), chunk("c3", "k2", ctype="faq")],
               [knowledge("k1"), knowledge("k2", listed=2, total=2)])


def by_check(findings):
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.check, []).append(f)
    return out


def test_a_clean_inventory_and_labels_produce_no_finding():
    findings, facts = api_checks(*CLEAN, labels=labels(("q1", "c1", 2), ("q2", "c3", 0)))
    assert findings == []
    kb = facts["knowledge_bases"]["kb1"]
    assert (kb["knowledge"], kb["chunks"], kb["enabled"], kb["disabled"]) == (2, 3, 3, 0)
    assert kb["chunk_types"] == {"faq": 1, "text": 2} and kb["parse_status"] == {"completed": 2}
    assert kb["per_knowledge"] == [{"knowledge_id": "k1", "title": "title k1", "chunks": 1, "chunk_types": {"text": 1}},
                                   {"knowledge_id": "k2", "title": "title k2", "chunks": 2,
                                    "chunk_types": {"faq": 1, "text": 1}}]
    assert kb["chunks_per_knowledge"] == {"min": 1, "median": 1.5, "max": 2}
    assert facts["labels"] == {"n": 2, "relevant": 1, "chunks": 2, "in_inventory": 2}


def test_labels_of_missing_disabled_and_failed_chunks_are_found_once_per_chunk_with_their_queries():
    c, k = frames([chunk("ok"), chunk("off", enabled=False), chunk("bad", "k9", status="failed")],
                  [knowledge("k1", listed=2, total=2), knowledge("k9", status="failed")])
    lab = labels(("q1", "gone", 3), ("q2", "gone", 1), ("q3", "gone", 0), ("q1", "off", 2), ("q4", "bad", 1),
                 ("q5", "gone0", 0), ("q1", "ok", 1))
    got = by_check(api_checks(c, k, labels=lab)[0])
    (missing, missing0) = sorted(got["label_chunk_missing"], key=lambda f: f.subject)
    assert missing.subject == "gone" and missing.severity == PROBLEM
    assert missing.data["queries"] == ["q1", "q2"] and missing.data["grade_0_queries"] == ["q3"]
    assert missing.data["n_queries"] == 3 and missing.knowledge_base_id is None
    # a grade-0 label on a missing chunk changes no metric: shown, not failing
    assert missing0.subject == "gone0" and missing0.severity == INFO and "no metric changes" in missing0.detail
    (off,) = got["label_chunk_disabled"]
    assert (off.subject, off.severity, off.data["queries"], off.knowledge_base_id) == ("off", PROBLEM, ["q1"], "kb1")
    (bad,) = got["label_chunk_failed_parse"]
    assert bad.subject == "bad" and bad.data["knowledge_id"] == "k9" and "failed" in bad.detail
    assert "knowledge_failed_parse" in got  # the knowledge itself, once
    assert not any(f.subject == "ok" for f in api_checks(c, k, labels=lab)[0])


def test_knowledge_without_chunks_failed_and_unfinished_knowledge_each_once():
    c, k = frames([chunk("c1")], [knowledge("k1"), knowledge("empty", listed=0, total=0),
                                  knowledge("broken", status="failed", listed=0, total=0, error="pdf: bad xref"),
                                  knowledge("stopped", status="cancelled", listed=0, total=0),
                                  knowledge("busy", status="processing", listed=0, total=0)])
    got = by_check(api_checks(c, k)[0])
    assert [f.subject for f in got["knowledge_without_chunks"]] == ["empty"]  # not also the failed ones
    assert [f.subject for f in got["knowledge_failed_parse"]] == ["broken", "stopped"]
    assert "pdf: bad xref" in got["knowledge_failed_parse"][0].detail
    assert [f.subject for f in got["knowledge_not_ready"]] == ["busy"]
    assert all(f.severity == PROBLEM for fs in got.values() for f in fs)


def test_duplicate_content_is_one_finding_per_group_within_a_knowledge_base():
    c, k = frames([chunk("a", content="同一段话"), chunk("b", "k2", content="同一段话"), chunk("c", content="同一段话"),
                   chunk("d", content="other"), chunk("e", kb="kb2", kid="k3", content="同一段话"),
                   chunk("f", kb="kb2", kid="k3", content=" "), chunk("g", kb="kb2", kid="k3", content=" ")],
                  [knowledge("k1", listed=3, total=3), knowledge("k2"), knowledge("k3", kb="kb2", listed=3, total=3)])
    findings = api_checks(c, k, labels=labels(("q1", "b", 2)))[0]
    (dup,) = by_check(findings)["duplicate_content"]  # kb2's copy is another knowledge base; blanks are not duplicates
    assert dup.subject == "a" and dup.knowledge_base_id == "kb1" and dup.data["chunk_ids"] == ["a", "b", "c"]
    assert dup.data["knowledge_ids"] == ["k1", "k2"] and dup.data["labelled"] == ["b"]
    assert dup.data["content_sha256"] == __import__("hashlib").sha256("同一段话".encode()).hexdigest()


def test_listings_that_fell_short_are_inventory_incomplete_and_qualify_missing_labels():
    c, k = frames([chunk("c1")], [knowledge("k1"), knowledge("k2", listing="incomplete", listed=100, total=120),
                                  knowledge("k3", listing="failed", listed=None, total=None, error="timeout: read")])
    findings = api_checks(c, k, labels=labels(("q1", "x", 1)), unavailable={"kb9": "server: HTTP 500"})[0]
    got = by_check(findings)
    assert sorted(f.subject for f in got["inventory_incomplete"]) == ["k2", "k3", "kb9"]
    assert "listed 100 of 120" in next(f.detail for f in got["inventory_incomplete"] if f.subject == "k2")
    assert "may be unlisted" in got["label_chunk_missing"][0].detail
    assert "knowledge_without_chunks" not in got  # k3's chunks are unknown, not absent


def test_the_fingerprint_ignores_order_and_sees_every_change():
    base = pd.DataFrame([chunk("c1"), chunk("c2", content="ab"), chunk("c3", content=None)])
    fp = inventory_fingerprint(base)
    assert fp.startswith("sha256:") and fp == inventory_fingerprint(base.iloc[::-1].reset_index(drop=True))
    changed = [base.assign(content=["x", "ab", "content of c3"]),
               base.assign(is_enabled=[True, False, True]),
               base.assign(parse_status=["completed", "failed", "completed"]),
               base.iloc[:2], pd.concat([base, pd.DataFrame([chunk("c4")])])]
    assert len({fp, *map(inventory_fingerprint, changed)}) == 6
    # fields are length-prefixed; a missing value is not an empty one
    one, two = pd.DataFrame([chunk("a", content="bc")]), pd.DataFrame([chunk("ab", content="c")])
    assert inventory_fingerprint(one) != inventory_fingerprint(two)
    none, empty = pd.DataFrame([chunk("a", status=None)]), pd.DataFrame([chunk("a", status="")])
    assert inventory_fingerprint(none) != inventory_fingerprint(empty)


def test_inventory_changes_name_the_chunks():
    before = pd.DataFrame([chunk("c1"), chunk("c2"), chunk("c3")])
    after = pd.DataFrame([chunk("c1", content="edited"), chunk("c2", enabled=False), chunk("c4")])
    diff = inventory_changes(before, after)
    assert (diff["added"], diff["removed"], diff["content_changed"], diff["enabled_changed"]) == (
        ["c4"], ["c3"], ["c1"], ["c2"])
    assert diff["counts"] == {"added": 1, "removed": 1, "content_changed": 1, "enabled_changed": 1,
                              "parse_status_changed": 0, "index_status_changed": 0}


def test_findings_summarise_merge_and_mark_broken_chunks():
    fs = [Finding("label_chunk_missing", "c9", "gone", data={"queries": ["q1"]}),
          Finding("label_chunk_missing", "c8", "gone0", INFO),
          Finding("duplicate_content", "c1", "dup", data={"chunk_ids": ["c1", "c2"]}),
          Finding("chunk_without_embedding", "c2", "no vector")]
    (missing, dup, vec) = summary_rows(fs, first=1)
    assert missing == {"check": "label_chunk_missing", "meaning": "a labelled chunk id is not in the knowledge base",
                       "severity": PROBLEM, "count": 2, "problems": 1, "first subjects": "c9 ... (+1)"}
    assert (dup["check"], vec["check"]) == ("duplicate_content", "chunk_without_embedding")
    assert broken_chunks(fs) == {"c9": ["missing"], "c8": ["missing"], "c1": ["duplicated"],
                                 "c2": ["duplicated", "no embedding"]}
    again = findings_from_json([f.to_json() for f in fs])
    assert merge_findings(fs, again) == fs
    assert describe_findings([], checks=API_CHECKS).endswith(f"no problems found by {len(API_CHECKS)} checks")
    assert describe_findings(fs, checks=API_CHECKS).endswith(f"3 problem(s) found by {len(API_CHECKS)} checks")
    with pytest.raises(ValueError, match="unknown check"):
        Finding("no_such_check", "x", "y")


# -- against the sandbox ---------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def key_in_env():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WEKNORA_API_KEY", KEY)
        mp.delenv("WEKNORA_NB_PG_DSN", raising=False)
        yield


def fast(base_url):
    return ClientSettings(base_url, backoff_base_s=0.01, backoff_max_s=0.05, max_attempts=3, timeout_s=5)


def mini_set(relevant_extra: dict[str, int] | None = None) -> TestSet:
    """Three queries on the mini knowledge base; the second also labels ``relevant_extra``."""
    return TestSet.from_records([
        {"query_id": "p1", "query": "忘记管理员密码怎么办", "relevant": {"guide.01-passwords:000": 2}},
        {"query_id": "p2", "query": "VPN 连接失败 ZL-201",
         "relevant": {"guide.03-vpn:000": 1, **(relevant_extra or {})}},
        {"query_id": "p3", "query": "熔断多久恢复", "relevant": {"guide.02-rate-limit:001": 1}}])


@pytest.fixture(scope="module")
def cache(embedding_cache):
    return embedding_cache


@pytest.fixture(scope="module")
def sandbox(cache):
    with SandboxServer("rerank", data_dir=MINI, cache_dir=cache, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def collected(sandbox, tmp_path_factory):
    """A run whose test set labels a chunk the knowledge base does not have (relevant, and an evil id at grade 0)."""
    root = tmp_path_factory.mktemp("runs")
    mini_set({"guide.09-gone:000": 2, EVIL: 0}).to_jsonl(root / "testset.jsonl")
    collect(fast(sandbox.base_url), sandbox.kb_id, root / "testset.jsonl", root / "labelled",
            stages="vector,final", repeats=1, warmup=0, progress=False)
    return root / "labelled"


def test_a_collection_stores_its_integrity_findings_in_the_manifest(collected):
    m = read_manifest(collected)
    entry = m["integrity"]
    assert entry["checks"] == [*API_CHECKS, "changed_during_run"]
    got = by_check(findings_from_json(entry["findings"]))
    assert set(got) == {"label_chunk_missing"}
    by_subject = {f.subject: f for f in got["label_chunk_missing"]}
    assert by_subject["guide.09-gone:000"].severity == PROBLEM and by_subject["guide.09-gone:000"].data["queries"] == [
        "p2"]
    assert by_subject[EVIL].severity == INFO
    fp = entry["fingerprint"]
    assert fp["start"] == fp["end"] and fp["start"].startswith("sha256:")
    assert entry["content_changed"] is False and entry["retrieval_config_changed"] is False
    assert entry["knowledge_base_config_changed"] is False
    assert entry["snapshots"]["start"]["retrieval_config"] == m["retrieval_config"]["raw"]
    assert entry["facts"]["knowledge_bases"]["kb-demo"]["chunks"] == 8
    # the knowledge list beside the chunks: every knowledge, with how its listing ended
    k = pd.read_parquet(collected / "knowledge.parquet")
    assert list(k.columns) == KNOWLEDGE_COLUMNS and len(k) == 3 and set(k["listing"]) == {"ok"}
    assert k["listed"].sum() == 8 and set(k["parse_status"]) == {"completed"}
    assert not any("changed during the run" in n for n in m["notes"])


def test_the_start_listing_reuses_the_listing_code_and_costs_one_listing(sandbox, tmp_path, monkeypatch):
    """With the checks the chunks are listed twice (start, end); with --no-check once, and no integrity but why."""
    import weknora_nb.collect.http.client as client_mod
    calls: list[str] = []
    real = client_mod.WeKnoraClient.list_chunks

    async def counting(self, knowledge_id, *a, **kw):
        calls.append(knowledge_id)
        return await real(self, knowledge_id, *a, **kw)
    monkeypatch.setattr(client_mod.WeKnoraClient, "list_chunks", counting)
    collect(fast(sandbox.base_url), sandbox.kb_id, mini_set(), tmp_path / "a", stages="vector", repeats=1,
            warmup=0, progress=False)
    assert len(calls) == 2 * 3
    calls.clear()
    collect(fast(sandbox.base_url), sandbox.kb_id, mini_set(), tmp_path / "b", stages="vector", repeats=1,
            warmup=0, progress=False, integrity=False)
    assert len(calls) == 3
    assert read_manifest(tmp_path / "b")["integrity"] == {"skipped": "not asked for (--no-check)"}
    assert (tmp_path / "b" / "chunks.parquet").exists()


def disable_after_first_search(server: SandboxServer, chunk_id: str) -> None:
    """Test-only hook on an in-process sandbox: once it has served a hybrid search, ``chunk_id`` is listed as
    disabled (as if someone disabled it in WeKnora's UI during the run)."""
    app = server.sandbox
    assert app is not None
    searched = []
    real_search, real_json = app.engine.hybrid_search, app.catalog.chunk_json

    def search(*a, **kw):
        searched.append(1)
        return real_search(*a, **kw)

    def chunk_json(i, **kw):
        row = real_json(i, **kw)
        if searched and row["id"] == chunk_id:
            row = {**row, "is_enabled": False}
        return row
    app.engine.hybrid_search = search  # type: ignore[method-assign]
    app.catalog.chunk_json = chunk_json  # type: ignore[method-assign]


def test_a_chunk_disabled_during_the_run_is_changed_during_run(cache, tmp_path):
    with SandboxServer("rerank", data_dir=MINI, cache_dir=cache, api_key=KEY) as server:
        disable_after_first_search(server, "guide.03-vpn:000")
        out = tmp_path / "run"
        collect(fast(server.base_url), server.kb_id, mini_set(), out, stages="vector", repeats=1, warmup=0,
                progress=False)
    m = read_manifest(out)
    entry = m["integrity"]
    assert entry["content_changed"] is True and entry["fingerprint"]["start"] != entry["fingerprint"]["end"]
    got = by_check(findings_from_json(entry["findings"]))
    (changed,) = got["changed_during_run"]
    assert changed.subject == "chunks" and changed.severity == PROBLEM
    assert changed.data["enabled_changed"] == ["guide.03-vpn:000"] and changed.data["counts"]["enabled_changed"] == 1
    assert "enabled changed 1" in changed.detail
    # the end inventory is what is checked: the labelled chunk is now disabled
    assert [f.subject for f in got["label_chunk_disabled"]] == ["guide.03-vpn:000"]
    assert any("changed during the run" in n for n in m["notes"])


def test_a_resumed_run_keeps_its_original_start_snapshot(cache, tmp_path):
    out = tmp_path / "run"
    with SandboxServer("rerank", data_dir=MINI, cache_dir=cache, api_key=KEY) as server:
        collect(fast(server.base_url), server.kb_id, mini_set(), out, stages="vector", repeats=1, warmup=0,
                progress=False)
        first = read_manifest(out)["integrity"]["snapshots"]["start"]
        app = server.sandbox
        assert app is not None
        real_json = app.catalog.chunk_json
        app.catalog.chunk_json = lambda i, **kw: {**real_json(i, **kw), "content": "edited"} \
            if real_json(i, **kw)["id"] == "guide.01-passwords:000" else real_json(i, **kw)  # type: ignore
        collect(fast(server.base_url), server.kb_id, mini_set(), out, stages="vector", repeats=1, warmup=0,
                progress=False, resume=True)
    entry = read_manifest(out)["integrity"]
    assert entry["snapshots"]["start"] == first  # not re-taken at the resume
    assert entry["content_changed"] is True
    (changed,) = by_check(findings_from_json(entry["findings"]))["changed_during_run"]
    assert "not known" in changed.data["note"]  # the start inventory was listed by the first collection


# -- weknora-nb check ------------------------------------------------------------------------------------

def run_cli(args, capsys):
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_check_exits_0_when_clean_1_with_problems_and_prints_json(sandbox, tmp_path, capsys):
    base = ["check", "--base-url", sandbox.base_url, "--kb-id", sandbox.kb_id]
    code, out, err = run_cli(base, capsys)
    assert code == 0, err
    assert "kb-demo: 3 knowledge, 8 chunks" in out and out.strip().endswith("no problems found by 5 checks")
    bad = tmp_path / "t.jsonl"
    mini_set({"guide.09-gone:000": 2}).to_jsonl(bad)
    code, out, err = run_cli([*base, "--testset", str(bad)], capsys)
    assert code == 1, err
    assert "PROBLEM label_chunk_missing: 1" in out and "guide.09-gone:000" in out
    assert out.strip().endswith(f"1 problem(s) found by {len(API_CHECKS)} checks")
    code, out, err = run_cli([*base, "--testset", str(bad), "--json"], capsys)
    assert code == 1
    got = json.loads(out)
    assert got["problems"] == 1 and got["checks"] == list(API_CHECKS)
    assert [f["subject"] for f in got["findings"]] == ["guide.09-gone:000"]
    assert got["target"] == {"base_url": sandbox.base_url, "knowledge_base_ids": ["kb-demo"], "database": False,
                             "testset": str(bad)}
    assert got["facts"]["api"]["knowledge_bases"]["kb-demo"]["chunks"] == 8
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", got["fingerprint"])
    assert KEY not in out + err


@pytest.mark.parametrize("extra, message", [
    (["--testset", "{tmp}/nowhere.jsonl"], "not found"),
    (["--testset", "{tmp}/broken.jsonl"], "broken.jsonl"),
    (["--kb-id", "kb-nope"], "knowledge base 'kb-nope' not found"),
])
def test_check_exits_2_on_unusable_input(sandbox, tmp_path, capsys, extra, message):
    (tmp_path / "broken.jsonl").write_text('{"query_id": "q1", "query": \n', encoding="utf-8")
    kb = [] if "--kb-id" in extra else ["--kb-id", sandbox.kb_id]
    code, out, err = run_cli(["check", "--base-url", sandbox.base_url, *kb, *[e.format(tmp=tmp_path) for e in extra]],
                             capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_check_refuses_a_bad_base_url_with_exit_2(capsys):
    code, _, err = run_cli(["check", "--base-url", "ftp://user:pw@host", "--kb-id", "kb"], capsys)
    assert code == 2 and "pw" not in err and "must be an http://" in err


# -- reports ------------------------------------------------------------------------------------------------

def test_the_degraded_drilldown_marks_labels_that_point_at_broken_chunks(collected):
    from weknora_nb.analysis.diagnose import diagnose_run
    from weknora_nb.reports import notebook as wn

    (collected / "check.json").write_text(json.dumps({"checks": ["chunk_without_embedding"], "findings": [
        Finding("chunk_without_embedding", "guide.03-vpn:000", "no embeddings row").to_json()]}), encoding="utf-8")
    try:
        run = load_run(collected)
        broken = wn.broken_labels(run)
        assert broken.set_index("chunk_id")["integrity"].to_dict() == {
            "guide.03-vpn:000": "no embedding", "guide.09-gone:000": "missing", EVIL: "missing"}
        diag = diagnose_run(run, k=10)
        page = wn.drilldown(run, diag, "p2").data
        assert "<th>integrity</th>" in page and "no embedding" in page and "missing" in page
        assert EVIL not in page and "&lt;img src=x onerror=" in page
    finally:
        (collected / "check.json").unlink()


@pytest.mark.slow
def test_the_metrics_report_shows_the_findings_escaped(collected, tmp_path):
    from weknora_nb.reports.render import render_report

    (collected / "check.json").write_text(json.dumps({"checks": ["duplicate_vector"], "findings": [
        Finding("duplicate_vector", EVIL, f"identical vectors {EVIL}").to_json()]}), encoding="utf-8")
    try:
        rep = render_report(collected, out_root=tmp_path / "reports", notebooks=["02_metrics"])
    finally:
        (collected / "check.json").unlink()
    page = rep.pages["02_metrics"].read_text(encoding="utf-8")
    assert "Integrity of the knowledge base" in page
    assert "label_chunk_missing" in page and "duplicate_vector" in page
    assert f"2 problem(s) found by {len(API_CHECKS) + 2} checks (from the manifest and check.json)" in page
    assert EVIL not in page and "&lt;img src=x onerror=" in page
    assert "Traceback" not in page


def test_check_with_a_dsn_adds_the_database_findings_and_never_shows_the_password(capsys, caplog, monkeypatch):
    """The sandbox version with seeded vector faults, checked as a read-only role: the database's findings join
    the API's, the exit is 1, and the DSN's password is in no output or log line."""
    secret = "Pw-apicheck-7f3a9c"
    with SandboxServer("faults", api_key=KEY) as server:
        monkeypatch.setenv("WEKNORA_NB_PG_DSN", server.reader_dsn(secret, role="weknora_nb_apicheck"))
        with caplog.at_level("DEBUG"):
            code, out, err = run_cli(["-vv", "check", "--base-url", server.base_url, "--kb-id", server.kb_id,
                                      "--json"], capsys)
    assert code == 1, err
    got = json.loads(out)
    checks = {f["check"] for f in got["findings"] if f["severity"] == PROBLEM}
    assert {"chunk_without_embedding", "duplicate_vector", "embedding_orphan"} <= checks
    assert got["target"]["database"] is True and "chunk_without_embedding" in got["checks"]
    assert got["facts"]["database"] and got["facts"]["api"]["knowledge_bases"]["kb-demo"]["chunks"] > 800
    assert secret not in out + err + caplog.text
