"""Collection over real HTTP against the sandbox: faults, resume after SIGKILL, no key on disk; and, without
a server, the checks of arguments, client settings and stage files, and the checkpoint writer."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb import cli, read_results, score
from weknora_nb.collect import collect, read_checkpoint
from weknora_nb.collect.http.client import AuthFailed, ClientSettings, WeKnoraClient
from weknora_nb.collect.run import checkpoint
from weknora_nb.collect.run.stages import (
    DEFAULT_SELECTION,
    DEFAULT_STAGES,
    ENDPOINTS,
    FAQ_STAGE,
    Stage,
    load_stage_file,
    resolve_stages,
)
from weknora_nb.core.errors import ConfigError, RateLimited, RunExistsError, ServerFailed, UsageError
from weknora_nb.core.pipeline import PIPELINE, role_of
from weknora_nb.core.testset import TestSet
from weknora_nb.sandbox import SandboxServer

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
KEY = "sk-collect-test-5f2e9a7c1d"
QUERIES = ["忘记管理员密码怎么办", "账号锁定多久", "密码最短几位", "VPN 连接失败 ZL-201", "ZeroLink 在哪里下载",
           "管理 API 限流多少", "熔断多久恢复", "rate-limiting 插件怎么配", "DG-1009 是什么", "DG-3007 熔断"]


def mini_testset() -> TestSet:
    """:data:`QUERIES` on the mini knowledge base, plus one invalid query (no relevant chunk)."""
    return TestSet.from_records([{"query_id": f"m{i:02d}", "query": q, "relevant": {"guide.01-passwords:000": 1}}
                                 for i, q in enumerate(QUERIES)] +
                                [{"query_id": "m99", "query": "健身补贴", "relevant": {}}])


@pytest.fixture(scope="module")
def testset():
    return mini_testset()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with SandboxServer("rerank", data_dir=MINI, cache_dir=cache, api_key=KEY, allow_fault_control=True) as s:
        yield s


@pytest.fixture(autouse=True)
def key_in_env(monkeypatch, request):
    """The key in the environment; for the tests that use the sandbox, no faults before and after."""
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    if "sandbox" not in request.fixturenames:  # a fast test: no server started for it
        yield
        return
    sandbox = request.getfixturevalue("sandbox")
    sandbox.set_faults()
    yield
    sandbox.set_faults()


def fast(base_url, **kw):
    return ClientSettings(base_url, backoff_base_s=0.01, backoff_max_s=0.05, max_attempts=kw.pop("max_attempts", 3),
                          timeout_s=kw.pop("timeout_s", 5), **kw)


def keys_of(df):
    return df.groupby(["query_id", "stage", "repeat"], observed=True).size()


def test_full_run_has_every_request_once(tmp_path, sandbox, testset):
    out = tmp_path / "run"
    s = collect(fast(sandbox.base_url), sandbox.kb_id, testset, out, stages="vector,keyword,hybrid,final,citations",
                repeats=3, concurrency=4, warmup=2, progress=False, system={"chunking": "markdown headings"})
    assert s.complete and s.n_requests == 11 * 5 * 3
    df = read_results(out / "results.parquet")
    req = df.drop_duplicates(["query_id", "stage", "repeat"])
    assert len(req) == 11 * 5 * 3 and set(df["status"]) == {"ok"}
    assert (df.dropna(subset=["chunk_id"]).groupby(["query_id", "stage", "repeat"])["rank"]
            .apply(lambda r: list(r) == list(range(1, len(r) + 1))).all())
    assert df["latency_ms"].notna().all() and (df["latency_ms"] > 0).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete" and m["counts"]["final"] == {"ok": 33}
    assert m["testset"]["hash"] == testset.hash and m["system"]["chunking"] == "markdown headings"
    assert m["system_sources"]["chunking"] in ("user", "user over server")
    assert m["retrieval_config"]["raw"]["rerank_top_k"] == 5
    assert m["stages"]["hybrid"]["params"]["skip_context_enrichment"] is True
    inv = pd.read_parquet(out / "chunks.parquet")
    assert len(inv) == 8 and inv["content"].str.len().min() > 10
    answers = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 33
    # every answer built on references cites some of them (the sandbox's answers cite their top references)
    cited = {(a["query_id"], a["repeat"]): set(a["citations"]) for a in answers}
    refs = df[(df["stage"] == "citations") & df["chunk_id"].notna()].groupby(["query_id", "repeat"])["chunk_id"]
    refs = refs.apply(set)
    assert len(refs) >= 30 and all(cited[key] and cited[key] <= ids for key, ids in refs.items())
    # final results expose the reranker's scores (a query with nothing above the rerank threshold has no result)
    fin = df[(df["stage"] == "final") & df["chunk_id"].notna()]
    assert len(fin) >= 30 and fin["model_score"].notna().all() and fin["base_score"].notna().all()
    sc = score(testset, df)
    assert sc.counts.n_invalid == 1 and sc.complete


def test_many_in_flight_spread_over_several_pools(tmp_path, sandbox, testset, monkeypatch):
    import weknora_nb.collect.run.requests as collect_mod
    opened = []
    real = collect_mod.WeKnoraClient

    def counting(settings, **kw):
        opened.append(settings.max_connections)
        return real(settings, **kw)

    monkeypatch.setattr(collect_mod, "WeKnoraClient", counting)
    out = tmp_path / "run"
    s = collect(fast(sandbox.base_url), sandbox.kb_id, testset, out, stages="vector,keyword,hybrid,final",
                repeats=2, concurrency=20, warmup=0, progress=False, inventory=False)
    assert opened == [7, 7, 7]  # 20 in flight: 3 pools (at most LANE_SIZE = 8 each) of 7 connections
    assert s.complete and s.n_requests == 11 * 4 * 2
    assert 0 < s.request_seconds <= s.seconds and s.requests_per_second == pytest.approx(88 / s.request_seconds)
    assert "req/s while requesting" in s.describe()
    df = read_results(out / "results.parquet")
    assert len(df.drop_duplicates(["query_id", "stage", "repeat"])) == 88 and keys_of(
        df.drop_duplicates(["query_id", "stage", "repeat"])).max() == 1
    assert len(read_checkpoint(out / "checkpoint.jsonl")) == 88


@pytest.mark.parametrize("faults, kind", [
    ({"error_rate": 1.0}, "server"),
    ({"rate_limit_rate": 1.0, "retry_after_s": 0.05}, "rate_limited"),
    ({"malformed_rate": 1.0}, "protocol"),
    ({"hang_rate": 1.0, "hang_s": 0.5}, "timeout"),   # over by the module's end: the server's stop waits for none
])
def test_each_fault_is_recorded_as_its_kind(tmp_path, sandbox, testset, faults, kind):
    sandbox.set_faults(**faults)
    out = tmp_path / "run"
    # a hung request hangs 0.5 s, so a shorter timeout cuts every one sooner (the preflight's five calls too, one
    # after another); the other faults answer at once
    settings = fast(sandbox.base_url, timeout_s=0.05 if kind == "timeout" else 0.3, max_attempts=2)
    s = collect(settings, sandbox.kb_id, testset, out, stages="hybrid,final", repeats=1, concurrency=8, warmup=0,
                progress=False, inventory=False)
    assert not s.complete
    df = read_results(out / "results.parquet")
    assert len(df) == 22 and set(df["status"]) == {kind} and df["chunk_id"].isna().all()
    sc = score(testset, df)
    assert sc.counts.failed_by_kind == {kind: 22} and sc.per_query.empty  # the invalid query failed too
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"
    # resume without faults and with retry_failed: every request now ok, none duplicated
    sandbox.set_faults()
    s2 = collect(fast(sandbox.base_url), sandbox.kb_id, testset, out, stages="hybrid,final", repeats=1,
                 warmup=0, progress=False, inventory=False, resume=True, retry_failed=True)
    assert s2.complete and s2.n_requests == 22 and s2.n_skipped == 0
    df2 = read_results(out / "results.parquet")
    assert set(df2["status"]) == {"ok"} and keys_of(df2.drop_duplicates(["query_id", "stage", "repeat"])).max() == 1


def test_429_honours_retry_after(sandbox):
    """The retry after a 429 waits its Retry-After (0.3 s), longer than any backoff of these settings (0.05 s at
    most): one request, two attempts, no preflight around it."""
    sandbox.set_faults(rate_limit_rate=1.0, retry_after_s=0.3)

    async def ask() -> None:
        async with WeKnoraClient(fast(sandbox.base_url, max_attempts=2)) as client:
            await client.request("POST", "/api/v1/knowledge-search",
                                 {"query": "x", "knowledge_base_ids": [sandbox.kb_id]})
    t = time.perf_counter()
    with pytest.raises(RateLimited):
        asyncio.run(ask())
    assert time.perf_counter() - t >= 0.3


def test_mixed_faults_every_request_exactly_once(tmp_path, sandbox, testset):
    sandbox.set_faults(error_rate=0.3, rate_limit_rate=0.1, retry_after_s=0.01, malformed_rate=0.1,
                       stream_cut_rate=0.3, seed=11)
    out = tmp_path / "run"
    s = collect(fast(sandbox.base_url, max_attempts=2), sandbox.kb_id, testset, out,
                stages="vector,final,citations", repeats=2, concurrency=6, warmup=0, progress=False, inventory=False)
    df = read_results(out / "results.parquet")
    per_req = df.drop_duplicates(["query_id", "stage", "repeat"])
    assert len(per_req) == 11 * 3 * 2
    assert set(per_req["status"]) <= {"ok", "server", "rate_limited", "protocol"}
    assert "protocol" in set(per_req.loc[per_req["stage"] == "citations", "status"])  # cut streams
    failed = per_req[per_req["status"] != "ok"]
    assert len(failed) == len(s.failed) > 0
    assert len(read_checkpoint(out / "checkpoint.jsonl")) == 66


def test_no_retry_on_other_4xx(tmp_path, sandbox, testset, monkeypatch):
    sent = []
    real_send = WeKnoraClient._send

    async def counting(self, method, path, *a):
        sent.append((method, path))
        return await real_send(self, method, path, *a)

    monkeypatch.setattr(WeKnoraClient, "_send", counting)
    monkeypatch.setenv("WEKNORA_API_KEY", "sk-wrong")
    # a key the server refuses stops the collection at its first request, which is not retried
    with pytest.raises(AuthFailed, match="rejected the API key") as err:
        collect(fast(sandbox.base_url), sandbox.kb_id, testset.subset(["m00"]), tmp_path / "r", stages="final",
                repeats=1, warmup=0, progress=False, inventory=False)
    assert err.value.status == 401 and len(sent) == 1 and not (tmp_path / "r").exists()
    monkeypatch.delenv("WEKNORA_API_KEY")
    with pytest.raises(AuthFailed, match="WEKNORA_API_KEY"):
        collect(fast(sandbox.base_url), sandbox.kb_id, testset, tmp_path / "r2", progress=False)


def test_existing_run_is_not_overwritten(tmp_path, sandbox, testset):
    out = tmp_path / "run"
    collect(fast(sandbox.base_url), sandbox.kb_id, testset, out, stages="final", repeats=1, warmup=0,
            progress=False, inventory=False)
    with pytest.raises(RunExistsError, match="--resume"):
        collect(fast(sandbox.base_url), sandbox.kb_id, testset, out, stages="final", repeats=1, progress=False)
    with pytest.raises(RunExistsError, match="changed: stages"):
        collect(fast(sandbox.base_url), sandbox.kb_id, testset, out, stages="hybrid", repeats=1, resume=True,
                progress=False)
    s = collect(fast(sandbox.base_url), sandbox.kb_id, testset, out, stages="final", repeats=1, resume=True,
                progress=False, inventory=False)
    assert s.n_requests == 0 and s.n_skipped == 11


def test_torn_checkpoint_tail_is_dropped(tmp_path):
    p = tmp_path / "checkpoint.jsonl"
    good = json.dumps({"query_id": "a", "stage": "final", "repeat": 1, "status": "ok", "rows": []})
    p.write_text(good + "\n" + good.replace('"a"', '"b"')[:25])
    recs = read_checkpoint(p)
    assert list(recs) == [("a", "final", 1)]
    assert p.read_text() == good + "\n"


def run_cli(args, env, text=True):
    return subprocess.Popen([sys.executable, "-m", "weknora_nb", "collect", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text)


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, sandbox, testset, monkeypatch):
    """The killed collection is a process of its own; the resumed one and the uninterrupted one run through
    ``main`` in this process."""
    sandbox.set_faults(latency_ms=40)
    ts_path = tmp_path / "t.jsonl"
    testset.to_jsonl(ts_path)
    env = {**os.environ, "WEKNORA_API_KEY": KEY}
    common = ["--base-url", sandbox.base_url, "--kb-id", sandbox.kb_id, "--testset", str(ts_path), "--stages",
              "vector,keyword,hybrid,final", "--repeats", "3", "--concurrency", "3", "--warmup", "0", "--quiet"]
    killed = tmp_path / "killed"
    proc = run_cli(common + ["--out", str(killed)], env)
    ckpt = killed / "checkpoint.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:
        if ckpt.exists() and ckpt.read_text().count("\n") >= 30:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n_before = len(read_checkpoint(ckpt))
    assert 30 <= n_before < 132
    assert not (killed / "results.parquet").exists()
    sandbox.set_faults()  # the latency was there to land the kill mid-run; what follows needs none
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    assert cli.main(["collect", *common, "--out", str(killed), "--resume"]) == 0
    assert cli.main(["collect", *common, "--out", str(tmp_path / "full")]) == 0
    a = read_results(killed / "results.parquet")
    b = read_results(tmp_path / "full" / "results.parquet")
    cols = ["query_id", "stage", "repeat", "rank", "chunk_id", "score", "status"]
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True))
    assert a.duplicated(["query_id", "stage", "repeat", "rank"]).sum() == 0
    assert len(read_checkpoint(ckpt)) == 132
    m = json.loads((killed / "manifest.json").read_text())
    assert m["status"] == "complete" and len(m["resumed_at"]) == 1


def test_the_api_key_is_written_nowhere(tmp_path, sandbox, testset):
    sandbox.set_faults(error_rate=0.2, seed=1)
    out = tmp_path / "run"
    collect(fast(sandbox.base_url, max_attempts=1), sandbox.kb_id, testset, out,
            stages="vector,final,citations", repeats=1, warmup=1, progress=False,
            system={"note": "system description"})
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"manifest.json", "checkpoint.jsonl", "results.parquet", "chunks.parquet"}
    for p in files:
        assert KEY.encode() not in p.read_bytes(), p


def test_cli_exit_codes(tmp_path, sandbox, testset):
    ts_path = tmp_path / "t.jsonl"
    testset.to_jsonl(ts_path)
    env = {**os.environ, "WEKNORA_API_KEY": KEY}
    args = ["--base-url", sandbox.base_url, "--kb-id", sandbox.kb_id, "--testset", str(ts_path), "--stages",
            "final", "--repeats", "1", "--warmup", "0", "--quiet", "--max-attempts", "1"]
    ok = run_cli([a for a in args if a != "--quiet"] + ["--out", str(tmp_path / "a")], env, text=False)
    assert ok.wait(timeout=60) == 0 and b"final" in ok.stdout.read()
    progress = ok.stderr.read()   # bytes from a pipe, as in a CI job's log: the bar as lines, never redrawn in place
    assert b"\r" not in progress and re.search(rb"^collecting .*100%.*\|", progress, re.M), progress
    sandbox.set_faults(error_rate=1.0)
    bad = run_cli(args + ["--out", str(tmp_path / "b")], env)
    assert bad.wait(timeout=60) == 1 and "INCOMPLETE" in bad.stdout.read()
    again = run_cli(args + ["--out", str(tmp_path / "b")], env)
    assert again.wait(timeout=60) == 2 and "--resume" in again.stderr.read()


# -- without a server: argument checks, client settings, stages, stage files, the checkpoint writer ------

NOWHERE = "http://127.0.0.1:9"  # never contacted: every check below fails before a request is made


@pytest.mark.parametrize("kwargs, argument, allowed, got", [
    ({"repeats": 0}, "--repeats", ">= 1", 0),
    ({"concurrency": 0}, "--concurrency", ">= 1", 0),
    ({"warmup": -1}, "--warmup", ">= 0", -1),
    ({"repeats": 1.5}, "--repeats", ">= 1", 1.5),
])
def test_bad_collection_arguments_are_usage_errors_before_anything_is_written(tmp_path, testset, kwargs, argument,
                                                                               allowed, got):
    out = tmp_path / "run"
    with pytest.raises(UsageError) as err:
        collect(ClientSettings(NOWHERE), "kb", testset, out, progress=False, **kwargs)
    assert (err.value.argument, err.value.allowed, err.value.got) == (argument, allowed, got)
    assert str(err.value) == f"{argument} must be {allowed}. Got {got!r} instead."
    assert not out.exists()


def test_no_knowledge_base_id_is_a_usage_error(tmp_path, testset):
    with pytest.raises(UsageError, match="--kb-id must be one or more non-empty"):
        collect(ClientSettings(NOWHERE), [], testset, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs, argument, got", [
    ({"max_attempts": 0}, "--max-attempts", 0),
    ({"max_attempts": -2}, "--max-attempts", -2),
    ({"timeout_s": 0}, "--timeout", 0),
    ({"timeout_s": -1.0}, "--timeout", -1.0),
    ({"base_url": "localhost:8080"}, "--base-url", "localhost:8080"),
    ({"base_url": "ftp://example.org"}, "--base-url", "ftp://example.org"),
    ({"base_url": "http://"}, "--base-url", "http://"),
    ({"base_url": ""}, "--base-url", ""),
])
def test_client_settings_are_checked_when_made(kwargs, argument, got):
    kwargs = {"base_url": NOWHERE, **kwargs}
    with pytest.raises(UsageError) as err:
        ClientSettings(**kwargs)
    assert err.value.argument == argument and err.value.got == got
    assert str(err.value).startswith(f"{argument} must be ")
    with pytest.raises(UsageError):  # and when they are copied with a change
        dataclasses.replace(ClientSettings(NOWHERE), **kwargs)


def test_a_rejected_base_url_shows_no_credentials():
    with pytest.raises(UsageError) as err:
        ClientSettings("admin:s3cret@weknora.local:8080/?token=t0ken")
    assert "s3cret" not in str(err.value) and "t0ken" not in str(err.value)
    assert err.value.got == "***@weknora.local:8080/"


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_retryable_failure_is_tried_max_attempts_times(max_attempts):
    calls = []

    async def failing() -> None:
        calls.append(1)
        raise ServerFailed("HTTP 503")

    async def run() -> None:
        settings = ClientSettings(NOWHERE, max_attempts=max_attempts, backoff_base_s=0.001, backoff_max_s=0.001)
        async with WeKnoraClient(settings) as client:
            await client._with_retries(failing)

    with pytest.raises(ServerFailed):
        asyncio.run(run())
    assert len(calls) == max_attempts


@pytest.mark.parametrize("args", [["--max-attempts", "0"], ["--timeout", "0"], ["--repeats", "0"],
                                  ["--concurrency", "0"], ["--warmup", "-1"], ["--base-url", "127.0.0.1:8080"],
                                  ["--stages", "final,nope"]])
def test_cli_names_a_bad_argument_and_exits_2(tmp_path, args, capsys, monkeypatch):
    """Run in this process, where ``main`` raises whatever is no user's mistake (the command line's own exit
    codes: test_cli_exit_codes)."""
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    options = {"--base-url": NOWHERE, "--kb-id": "kb", "--testset": str(tmp_path / "no-such-testset.jsonl"),
               "--out": str(tmp_path / "run"), args[0]: args[1]}
    argv = [x for item in options.items() for x in item] + ["--quiet"]
    code = cli.main(["collect", *argv])
    stderr = capsys.readouterr().err
    assert code == 2 and args[0] in stderr and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "run").exists()  # checked before the test set is read or anything is written


def test_unknown_and_missing_stages_are_usage_errors():
    extra = {"hybrid-100": Stage("hybrid-100", "hybrid-search", {"match_count": 100})}
    with pytest.raises(UsageError) as err:
        resolve_stages("final,nope,hybrid-10", extra)
    assert err.value.argument == "--stages" and err.value.got == ["nope", "hybrid-10"]
    assert err.value.allowed == ["citations", "faq", "final", "hybrid", "hybrid-100", "keyword", "vector"]
    for empty in ("", " , ", []):
        with pytest.raises(UsageError, match="--stages must be at least one stage"):
            resolve_stages(empty)
    assert [s.name for s in resolve_stages("final, hybrid,final")] == ["final", "hybrid"]
    assert resolve_stages([extra["hybrid-100"], "final"]) == [extra["hybrid-100"], DEFAULT_STAGES["final"]]
    with pytest.raises(UsageError, match="two different stages named 'final'"):
        resolve_stages(["final", Stage("final", "chat")])


def test_a_stage_with_an_unknown_endpoint_is_a_usage_error():
    with pytest.raises(UsageError) as err:
        Stage("x", "vector-search")
    assert err.value.allowed == list(ENDPOINTS) and err.value.got == "vector-search"
    assert str(err.value) == ("the endpoint of stage 'x' must be one of hybrid-search, knowledge-search, chat, "
                              "faq-search. Got 'vector-search' instead.")


def test_built_in_stages_follow_the_pipeline():
    built_in = {**DEFAULT_STAGES, FAQ_STAGE.name: FAQ_STAGE}  # faq: an FAQ knowledge base's own search
    assert tuple(built_in) == PIPELINE
    for name, stage in built_in.items():  # what each measures, read from its definition alone
        assert role_of("custom", stage.to_dict()) == name
    assert DEFAULT_SELECTION == "vector,keyword,hybrid,final"  # the chat endpoint only when asked for


def test_a_stage_file_defines_stages(tmp_path):
    p = tmp_path / "stages.yaml"
    p.write_text("stages:\n"
                 "  hybrid-100:\n    endpoint: hybrid-search\n    params: {match_count: 100}\n"
                 "  final-all:\n    endpoint: knowledge-search\n    keep_match_types: null\n"
                 "  answers:\n    endpoint: chat\n    keep_match_types: [0]\n")
    stages = load_stage_file(p)
    assert stages == {"hybrid-100": Stage("hybrid-100", "hybrid-search", {"match_count": 100}),
                      "final-all": Stage("final-all", "knowledge-search", {}, None),
                      "answers": Stage("answers", "chat", {}, (0,))}
    assert [s.name for s in resolve_stages("final,hybrid-100", stages)] == ["final", "hybrid-100"]


def test_every_problem_of_a_stage_file_is_reported_at_once(tmp_path):
    p = tmp_path / "stages.yaml"
    p.write_text("stages:\n"                                   # 1
                 "  ok:\n    endpoint: chat\n"                 # 2-3
                 "  scalar: 3\n"                               # 4
                 "  no-endpoint:\n    params: {a: 1}\n"        # 5-6
                 "  bad-endpoint:\n    endpoint: vector\n"     # 7-8
                 "  bad-params:\n    endpoint: chat\n    params: [1, 2]\n"             # 9-11
                 "  bad-keep:\n    endpoint: chat\n    keep_match_types: [0, one]\n"   # 12-14
                 "  bool-keep:\n    endpoint: chat\n    keep_match_types: true\n")     # 15-17
    with pytest.raises(ConfigError) as err:
        load_stage_file(p)
    found = [(q.line, q.field) for q in err.value.problems]
    assert found == [(4, "stages.scalar"), (5, "stages.no-endpoint.endpoint"), (8, "stages.bad-endpoint.endpoint"),
                     (11, "stages.bad-params.params"), (14, "stages.bad-keep.keep_match_types"),
                     (17, "stages.bool-keep.keep_match_types")]
    assert all(q.path == str(p) for q in err.value.problems)
    assert "hybrid-search, knowledge-search, chat" in str(err.value) and "'vector'" in str(err.value)
    assert str(err.value).startswith(f"configuration file {p} has 6 problem(s):")


@pytest.mark.parametrize("text, line, field, message", [
    (None, None, None, "does not exist"),
    ("stages:\n  a: {endpoint: chat\n  b: 1\n", 3, None, "not valid YAML"),
    ("", None, "stages", "missing"),
    ("other: 1\n", None, "stages", "missing"),
    ("- a\n- b\n", None, "stages", "missing"),
    ("stages: [final]\n", 1, "stages", "not a mapping of stage names"),
    ("stages:\n", 1, "stages", "not a mapping of stage names"),
])
def test_an_unusable_stage_file_is_a_config_error(tmp_path, text, line, field, message):
    p = tmp_path / "stages.yaml"
    if text is not None:
        p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_stage_file(p)
    [problem] = err.value.problems
    assert (problem.path, problem.line, problem.field) == (str(p), line, field)
    assert message in problem.message


def test_read_checkpoint_is_one_function_everywhere():
    import weknora_nb.collect.run.folder as folder

    assert read_checkpoint is folder.read_checkpoint is checkpoint.read_checkpoint


def test_the_checkpoint_writer_appends_every_record(tmp_path):
    p = tmp_path / "checkpoint.jsonl"
    p.write_text(json.dumps({"query_id": "old", "stage": "final", "repeat": 1, "status": "server"}) + "\n")
    records = [{"query_id": f"q{i}", "stage": "final", "repeat": 1, "status": "ok", "rows": [[1, "c", 0.5]]}
               for i in range(500)] + [{"query_id": "old", "stage": "final", "repeat": 1, "status": "ok"}]

    async def write() -> None:
        async with checkpoint.CheckpointWriter(p) as ckpt:
            for i, rec in enumerate(records):
                ckpt.append(rec)
                if i % 50 == 0:
                    await asyncio.sleep(0)  # let the writer thread interleave

    asyncio.run(write())
    back = read_checkpoint(p)
    assert len(back) == 501 and back[("old", "final", 1)]["status"] == "ok"
    assert [back[(r["query_id"], "final", 1)] for r in records] == records
    assert len(p.read_text().splitlines()) == 502  # appended after what was there


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail)")
def test_a_failed_checkpoint_write_is_raised_on_the_event_loop():
    async def write() -> None:
        async with checkpoint.CheckpointWriter("/dev/full") as ckpt:
            ckpt.append({"query_id": "a", "stage": "final", "repeat": 1})
            await asyncio.sleep(0.2)  # the writer thread has failed by now
            ckpt.append({"query_id": "b", "stage": "final", "repeat": 1})

    with pytest.raises(OSError, match="No space left"):
        asyncio.run(write())
