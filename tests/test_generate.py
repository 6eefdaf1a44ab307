"""``weknora-nb testset generate`` (issue 50, docs/method.md section 17): questions generated from a knowledge base's
chunks, filtered, each filter counted, every query ``source: synthetic`` with its overlap.

Over real HTTP on loopback: the sandbox (the mini knowledge base: its inventory, hybrid-search for the round trip,
its rule-based generator) and a scripted OpenAI-compatible server of the test's own that answers malformed JSON,
English for Chinese, empty lists and 429s: nothing is lost, nothing malformed is kept, a rerun makes no call."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from weknora_nb.analysis.sampling import normalise
from weknora_nb.analysis.stratify import stratify
from weknora_nb.analysis.synthetic.bias import lexical_advantage, source_table, source_warnings
from weknora_nb.analysis.synthetic.curate import SyntheticCurator, question_id
from weknora_nb.analysis.synthetic.overlap import lexical_overlap, query_overlaps
from weknora_nb.analysis.synthetic.plan import Planner, water_fill
from weknora_nb.cli import main
from weknora_nb.collect.generate.prompts import parse_answerable, parse_questions
from weknora_nb.collect.judge.prompts import InvalidReply
from weknora_nb.core.errors import TestSetError, UsageError
from weknora_nb.core.scoring import score
from weknora_nb.core.synthetic import Candidate, GenerateOptions, Task, parse_mix
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.core.tokenize import tokenize
from weknora_nb.sandbox import SandboxServer, generator

from .conftest import ranked, results_frame
from .test_judge import LLMServer

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
KEY = "sk-generate-test-5e6f"


# ---------------------------------------------------------------------------------------
# the strict reading of replies
# ---------------------------------------------------------------------------------------
def _reply(question: Any, answer: Any = "答案") -> str:
    return json.dumps({"questions": [{"question": question, "answer": answer}]}, ensure_ascii=False)


@pytest.mark.parametrize("text, kind", [
    ("not json {", "unparseable"),
    ('{"questions": []}', "empty"),
    (_reply("   "), "empty"),
    (_reply("How do I reset the admin password?"), "language"),
    (_reply("DG-1003 error"), "language"),
    ('{"questions": [{"question": "密码多久过期？"}]}', "schema"),
    ('{"questions": [{"question": "密码多久过期？", "answer": "90 天", "extra": 1}]}', "schema"),
    ('{"questions": "密码多久过期？"}', "schema"),
    (json.dumps({"questions": [{"question": "密码多久过期？", "answer": "a"}] * 2}, ensure_ascii=False), "schema"),
    ('{"questions": [], "questions": []}', "schema"),
    (_reply("密" * 400), "schema"),
    (_reply(7), "schema"),
])
def test_a_generation_reply_is_read_strictly(text, kind):
    with pytest.raises(InvalidReply) as bad:
        parse_questions(text, "zh")
    assert bad.value.kind == kind


def test_a_good_reply_is_read_with_its_whitespace_collapsed():
    assert parse_questions("```json\n" + _reply(" 密码\n多久  过期？", "90 天") + "\n```", "zh") == [
        {"question": "密码 多久 过期？", "answer": "90 天"}]
    assert parse_questions(_reply("How long is a password valid?", "90 days"), "en")[0]["answer"] == "90 days"
    with pytest.raises(InvalidReply, match="not in English"):
        parse_questions(_reply("密码多久过期？"), "en")
    assert parse_answerable('{"answerable": false, "reason": "没写"}') == {"answerable": False, "reason": "没写"}
    for bad in ('{"answerable": "yes", "reason": ""}', '{"answerable": true}', '{"answerable": 1, "reason": ""}'):
        with pytest.raises(InvalidReply):
            parse_answerable(bad)


# ---------------------------------------------------------------------------------------
# the plan: quotas, types, determinism
# ---------------------------------------------------------------------------------------
def chunk_frame(sizes: dict[str, int], *, zh: bool = True, short: int = 0) -> pd.DataFrame:
    """An inventory: documents of ``sizes`` chunks each (``short`` more, too short to source a question)."""
    rows = []
    for doc, n in sizes.items():
        for i in range(n + short):
            text = (f"{doc} 文档 › 第 {i} 节\n第 {i} 节讲参数 P{i} 的默认值 {i * 3}，执行 dgctl set P{i} 修改它。"
                    if zh else f"{doc} › Section {i}\nSection {i} sets parameter P{i} to {i * 3}; run dgctl to set it.")
            rows.append({"chunk_id": f"{doc}:{i:03d}", "knowledge_base_id": "kb", "knowledge_id": doc,
                         "knowledge_title": f"{doc} 文档", "chunk_index": i, "chunk_type": "text", "is_enabled": True,
                         "parse_status": "completed", "content": text if i < n else "短"})
    return pd.DataFrame(rows)


def test_water_fill_gives_the_smallest_quota_that_reaches_n():
    assert water_fill({"a": 10, "b": 10, "c": 10}, 30) == 10
    assert water_fill({"a": 10, "b": 10, "c": 10}, 7) == 3
    assert water_fill({"a": 1, "b": 50, "c": 50}, 21) == 10   # the small document gives what it has
    assert water_fill({"a": 2, "b": 3}, 100) == 3             # short: the largest capacity
    rng = random.Random(5)
    for _ in range(200):
        caps = {str(i): rng.randint(0, 30) for i in range(rng.randint(1, 12))}
        n = rng.randint(1, 200)
        q = water_fill(caps, n)
        enough = sum(min(q, c) for c in caps.values()) >= n
        assert enough or q == max(caps.values())
        assert q == 1 or sum(min(q - 1, c) for c in caps.values()) < n


def test_the_plan_keeps_every_document_under_its_quota_and_is_the_same_twice():
    chunks = chunk_frame({"big": 60, "mid": 12, "small": 3, "tiny": 1}, short=2)
    options = GenerateOptions(n=20, seed=3)
    one, two = Planner(chunks, options), Planner(chunks, options)
    tasks = one.plan(1, None)
    assert [t.key for t in tasks] == [t.key for t in two.plan(1, None)]
    assert one.doc_quota == 8 and one.skipped == {"disabled": 0, "short": 8, "derived_type": 0}
    by_doc = Counter(t.knowledge_id for t in tasks)
    assert by_doc == {"big": 12, "mid": 12, "small": 3, "tiny": 1}   # ceil(quota x 1.5) a round, or what it has
    assert len({t.key for t in tasks}) == 28
    assert one.language == "zh" and Planner(chunk_frame({"a": 3}, zh=False), options).language == "en"
    for t in tasks:   # a paired question's second chunk is of its document; multi-chunk's is adjacent
        assert len(t.chunk_ids) == (2 if t.question_type in ("comparison", "multi-chunk") else 1)
        assert all(c.startswith(t.knowledge_id + ":") for c in t.chunk_ids)
        if t.question_type == "multi-chunk":
            a, b = (int(c.split(":")[1]) for c in t.chunk_ids)
            assert abs(a - b) == 1
    assert set(Counter(t.question_type for t in tasks)) == {"factual", "procedural", "comparison", "multi-chunk",
                                                           "vague"}
    assert one.plan(2, None)[0].order == 28   # later tasks come after


def test_options_are_checked_with_one_line_naming_the_argument():
    with pytest.raises(UsageError, match="--types"):
        parse_mix("factual=0.5,unknown=0.5")
    with pytest.raises(UsageError, match="--types"):
        GenerateOptions(mix=(("factual", 0.0),))
    assert parse_mix("vague=1") == {"vague": 1.0} and GenerateOptions(mix=(("vague", 1.0),)).shares["vague"] == 1.0
    for bad in ({"n": 0}, {"depth": 0}, {"round_trip": "maybe"}, {"language": "fr"}, {"per_chunk": True}):
        with pytest.raises(UsageError):
            GenerateOptions(**bad)


# ---------------------------------------------------------------------------------------
# the filters and the records
# ---------------------------------------------------------------------------------------
def _task(i: int, doc: str, qtype: str = "factual", chunks: tuple[str, ...] | None = None) -> Task:
    return Task(f"k{i}", qtype, chunks or (f"{doc}:{i:03d}",), doc, "text", "zh", 1, i)


def test_select_counts_each_filter_and_keeps_no_document_over_its_quota():
    chunks = chunk_frame({"a": 10, "b": 10})
    cur = SyntheticCurator(chunks, GenerateOptions(n=4, round_trip="drop", mix=(("factual", 1.0),)))
    assert cur.planner.doc_quota == 2
    cands = [Candidate(_task(0, "a"), "第 0 节的参数默认值是多少？", "0", True, "hit"),
             Candidate(_task(1, "a"), "第 0 节的参数默认值是多少?", "0", True, "hit"),        # the same, normalised
             Candidate(_task(2, "a"), "第 0 节的参数默认值是多少呀？", "0", True, "hit"),      # a near duplicate
             Candidate(_task(3, "a"), "第 3 节的参数默认值是多少？", "9", False, None),         # unanswerable
             Candidate(_task(4, "a"), "第 4 节的参数默认值是多少？", "12", None, None),         # its check failed
             Candidate(_task(5, "a"), "第 5 节的参数默认值是多少？", "15", True, "miss"),       # dropped
             Candidate(_task(6, "a"), "第 6 节的参数默认值是多少？", "18", True, "hit"),
             Candidate(_task(7, "a"), "第 7 节的参数默认值是多少？", "21", True, "hit"),        # over a's quota
             Candidate(_task(8, "b"), "怎么改 P8？", "dgctl", True, "failed")]                  # search failed: dropped
    sel = cur.select(cands)
    assert [c.task.key for c in sel.kept] == ["k0", "k6"] and not sel.reached
    assert sel.counts == {"check_failed": 1, "unanswerable": 1, "near_duplicates": 2, "round_trip_hit": 3,
                          "round_trip_miss": 1, "round_trip_failed": 1, "round_trip_dropped": 2, "over_quota": 1}
    flag = SyntheticCurator(chunks, GenerateOptions(n=4, round_trip="flag", mix=(("factual", 1.0),)))
    sel = flag.select(cands)
    assert [c.task.key for c in sel.kept] == ["k0", "k5", "k8"]   # a's quota (2) holds
    recs = flag.records(sel)
    assert recs[1]["tags"] == ["synthetic", "round-trip-miss"] and recs[2]["tags"] == ["synthetic",
                                                                                      "round-trip-unchecked"]
    assert recs[0] == {"query_id": question_id(cands[0].question), "query": cands[0].question,
                       "relevant": {"a:000": 3}, "query_type": "factual", "tags": ["synthetic"], "answer": "0",
                       "source": "synthetic", "overlap": round(lexical_overlap(cands[0].question,
                                                                               cur.texts["a:000"]), 4)}
    assert recs[0]["query_id"] == "g-" + hashlib.sha256(normalise(cands[0].question).encode()).hexdigest()[:12]
    paired = flag.record(Candidate(_task(9, "b", "multi-chunk", ("b:003", "b:004")), "P3 和 P4 各是多少？", "x",
                                   True, "hit"))
    assert paired["relevant"] == {"b:003": 3, "b:004": 2} and "multi-answer" in paired["tags"]
    TestSet.from_records(recs + [paired])   # a loadable test set


# ---------------------------------------------------------------------------------------
# overlap, and the figures by source
# ---------------------------------------------------------------------------------------
def test_overlap_is_the_share_of_the_question_s_tokens_found_in_the_chunk():
    # tokens: dgctl, db, init, dg-5001, dg, 5001, 执行, 时报, 原因 (什么 and 是 are stopwords); the chunk holds all
    # but 时报 and 原因
    q = "执行 dgctl db init 时报 DG-5001 是什么原因？"
    assert lexical_overlap(q, "DG-5001：无法连接元数据库。执行 dgctl db init 前先检查 database.host。") == 7 / 9
    assert lexical_overlap(q, q) == 1.0 and lexical_overlap(q, "无关的文字") == 0.0
    assert lexical_overlap("？！", "任何") is None


def test_query_overlaps_agree_with_a_plain_reference_on_random_test_sets():
    rng = random.Random(11)
    words = ["网关", "端口", "8443", "证书", "dgctl", "限流", "密码", "锁定", "VPN", "ZeroLink", "DG-1009", "节点"]
    texts = {f"c{i}": "".join(rng.choices(words, k=rng.randint(3, 12))) for i in range(30)}
    for _ in range(20):
        recs = [{"query_id": f"q{j}", "query": " ".join(rng.choices(words, k=rng.randint(1, 6))),
                 "relevant": {c: rng.randint(0, 3) for c in rng.sample(sorted(texts), rng.randint(0, 4))}}
                for j in range(15)]
        ts = TestSet.from_records(recs)
        got = query_overlaps(ts, texts)
        for r in recs:
            top = max([g for g in r["relevant"].values() if g > 0], default=0)
            q = set(tokenize(r["query"]))
            expect = max(len(q & set(tokenize(texts[c]))) / len(q) for c, g in r["relevant"].items() if g == top) \
                if top and q else None
            assert (r["query_id"] not in got.index) if not top else \
                (pd.isna(got[r["query_id"]]) if expect is None else got[r["query_id"]] == pytest.approx(expect))


def test_figures_by_source_and_the_warnings():
    texts = {"a": "网关默认端口是 8443，证书放在 /etc/datagate。", "b": "密码连续输错 5 次锁定 15 分钟。"}
    recs = [{"query_id": "s1", "query": "网关默认端口是多少", "relevant": {"a": 3}, "source": "synthetic"},
            {"query_id": "s2", "query": "密码输错几次锁定", "relevant": {"b": 3}, "source": "synthetic"},
            {"query_id": "t1", "query": "控制台打不开", "relevant": {"a": 3}, "source": "traffic"},
            {"query_id": "n1", "query": "账号被锁了怎么办", "relevant": {"b": 2}}]
    ts = TestSet.from_records(recs)
    rows = []
    for stage, lists in (("keyword", {"s1": ["a"], "s2": ["b"], "t1": ["b", "a"], "n1": ["a", "b"]}),
                         ("vector", {"s1": ["b", "a"], "s2": ["b"], "t1": ["a"], "n1": ["b"]})):
        rows += [r for q, cs in lists.items() for r in ranked(q, cs, stage)]
    scores = score(ts, results_frame(rows), ["ndcg@5", "hit@1"])
    table = source_table(scores, ts, texts, stages=["vector", "keyword", "final"], metrics=["hit@1"], resamples=200)
    kw = table[table["stage"] == "keyword"].set_index("source")
    assert kw.loc["synthetic", "n"] == 2 and kw.loc["synthetic", "hit@1"] == 1.0 and kw.loc["(none)", "hit@1"] == 0
    assert kw.loc["synthetic", "overlap"] > kw.loc["traffic", "overlap"]
    adv = lexical_advantage(table, "hit@1").set_index("source")
    assert adv.loc["synthetic", "keyword - vector"] == 0.5 and adv.loc["traffic", "keyword - vector"] == -1.0
    over = query_overlaps(ts, texts)
    warnings = source_warnings(ts, over)
    assert len(warnings) == 1 and "share" in warnings[0]       # 2 of 4: not a majority; overlap far higher
    only = TestSet.from_records(recs[:2])
    assert [w.split()[0] for w in source_warnings(only, over)] == ["2", "Every"]
    assert source_warnings(TestSet.from_records(recs[2:]), over) == []
    groups = stratify(scores, ts, stage="keyword", dimensions=["source"], resamples=100)
    assert sorted(groups["group"].unique()) == ["(none)", "synthetic", "traffic"]


def test_source_and_overlap_are_fields_the_loaders_check_and_the_hash_leaves_out(tmp_path):
    recs = [{"query_id": "g-1", "query": "端口是多少", "relevant": {"a": 3}, "source": "synthetic", "overlap": 0.75},
            {"query_id": "q2", "query": "怎么改密码", "relevant": {"b": 1}}]
    ts = TestSet.from_records(recs)
    assert ts.hash == TestSet.from_records([{k: v for k, v in r.items() if k not in ("source", "overlap")}
                                            for r in recs]).hash
    ts.to_jsonl(tmp_path / "t.jsonl")
    back = load_testset(tmp_path / "t.jsonl").records()
    assert (back[0]["source"], back[0]["overlap"], back[1]["source"], back[1]["overlap"]) == ("synthetic", 0.75,
                                                                                             None, None)
    (tmp_path / "t.csv").write_text("query_id,query,relevant,source,overlap\ng-1,端口,a:3,synthetic,0.5\n",
                                    encoding="utf-8")
    assert load_testset(tmp_path / "t.csv").records()[0]["overlap"] == 0.5
    for bad, field in (({"overlap": 1.5}, "overlap"), ({"overlap": "x"}, "overlap"), ({"source": ""}, "source"),
                       ({"source": 3}, "source")):
        p = tmp_path / "bad.jsonl"
        p.write_text(json.dumps({**recs[1], **bad}, ensure_ascii=False) + "\n", encoding="utf-8")
        with pytest.raises(TestSetError, match=rf"line 1, field '{field}'"):
            load_testset(p)


# ---------------------------------------------------------------------------------------
# the sandbox's generator
# ---------------------------------------------------------------------------------------
def test_the_sandbox_generator_follows_its_rules_and_says_what_it_is(sandbox):
    a = "VPN 与远程办公 › 连接失败排查\n如果连接失败并提示 ZL-201，通常是手机令牌时间不同步，请在 App 中同步时间。"
    reply = generator.write_question("factual", [a], "zh")
    assert reply == {"questions": [{"question": "VPN 与远程办公中关于“连接失败排查”是怎么规定的？",
                                    "answer": a.split("\n")[1]}]}
    vague = generator.write_question("vague", [a], "zh")["questions"][0]["question"]
    assert vague == "连接失败那块老是出问题，怎么办？"
    assert generator.check_answerable("提示 ZL-201 时手机令牌要怎么同步时间？", [a], "zh")["answerable"]
    assert not generator.check_answerable("令牌那块老是出问题，怎么办？", [a], "zh")["answerable"]
    assert not generator.check_answerable("报销要几天？", [a], "zh")["answerable"]
    import httpx
    with httpx.Client(base_url=sandbox.base_url, headers={"Authorization": f"Bearer {KEY}"}) as c:
        models = [m["id"] for m in c.get("/v1/models").json()["data"]]
        assert models == ["sandbox-rule-judge", "sandbox-rule-grader", "sandbox-rule-generator"]
        r = c.post("/v1/chat/completions", json={"model": "sandbox-rule-generator", "messages": [
            {"role": "system", "content": "中文"}, {"role": "user", "content": "你好"}]})
        assert r.status_code == 400 and "sandbox-rule-generator" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"model": "gpt-x", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 404 and "sandbox-rule-generator" in r.json()["error"]["message"]


# ---------------------------------------------------------------------------------------
# end to end, on loopback
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sandbox(embedding_cache):
    with SandboxServer("baseline", data_dir=MINI, cache_dir=embedding_cache, api_key=KEY) as s:
        yield s


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    monkeypatch.setenv("WEKNORA_NB_JUDGE_API_KEY", KEY)


def generate(sandbox, out: Path, llm_url: str, model: str, *extra: str) -> int:
    return main(["testset", "generate", "--base-url", sandbox.base_url, "--kb-id", sandbox.kb_id, "--out", str(out),
                 "--llm-base-url", llm_url, "--model", model, "--quiet", "--max-attempts", "3", *extra])


def records_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_sandbox_generates_a_test_set_and_a_rerun_makes_no_call(tmp_path, sandbox, keys, capsys):
    out = tmp_path / "gen.jsonl"
    assert generate(sandbox, out, sandbox.base_url + "/v1", "sandbox-rule-generator", "--n", "5") == 0
    printed = capsys.readouterr().out
    assert "5 of 5 questions kept" in printed and "rule-based generator" in printed
    assert "not a language model" in printed
    recs = records_of(out)
    assert len(recs) == 5 and all(r["source"] == "synthetic" and 0 <= r["overlap"] <= 1 for r in recs)
    assert all(3 in r["relevant"].values() and "synthetic" in r["tags"] for r in recs)
    note = json.loads((tmp_path / "gen.jsonl.summary.json").read_text(encoding="utf-8"))
    assert note["reached"] and note["generator"]["rule_based"] and note["quota"]["documents_over_quota"] == []
    assert note["quota"]["most_kept_by_a_document"] <= note["quota"]["per_document"]
    made = note["calls"]["made"]
    assert made == note["ledger"]["calls"] > 0
    before = out.read_bytes()
    assert generate(sandbox, out, sandbox.base_url + "/v1", "sandbox-rule-generator", "--n", "5", "--json") == 0
    again = json.loads(capsys.readouterr().out)
    assert again["calls"]["made"] == 0 and out.read_bytes() == before
    assert again["ledger"] == note["ledger"]   # the same records, the same ledger


def _faulty(key: str, n: int, body: dict) -> dict:
    """The scripted server: by the request's prompt, a fault (module docstring); else the sandbox's reply."""
    h = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 6
    good = json.dumps(generator.reply(body["messages"][:2]), ensure_ascii=False)
    if "<question_type>" not in key:       # a check: malformed once, for some
        return {"reply": "答案是可以" if h == 0 and n == 1 else good}
    if h == 0:
        return {"reply": '{"questions": [{"question": "半截'}                      # always malformed
    if h == 1:
        return {"reply": "好的，问题如下" if n == 1 else good}                        # malformed, then good
    if h == 2:
        return {"reply": json.dumps({"questions": [{"question": "How do I reset it?", "answer": "Click reset."}]})}
    if h == 3:
        return {"reply": '{"questions": []}' if n == 1 else good}                   # empty, then good
    if h == 4:
        return {"status": 429, "json": {"error": {"message": "slow down"}}, "headers": {"Retry-After": "0"}} \
            if n <= 2 else {"reply": good}                                          # 429 twice, then good
    return {"status": 429, "json": {"error": {"message": "quota"}}, "headers": {"Retry-After": "0"}}   # always


def _user(text: str) -> str:
    return text


def test_a_faulty_llm_loses_nothing_keeps_nothing_malformed_and_a_rerun_makes_no_call(tmp_path, sandbox, keys,
                                                                                       capsys):
    out = tmp_path / "gen.jsonl"
    with LLMServer(_faulty, key=_user) as llm:
        rc = generate(sandbox, out, llm.base_url, "scripted", "--n", "6", "--per-chunk", "3", "--json")
        note = json.loads(capsys.readouterr().out)
        sent = len(llm.requests)
        replies = Counter(llm.counts)
        log = records_of(tmp_path / "gen.jsonl.generation" / "log.jsonl")
        gens = [r for r in log if r["kind"] == "generate"]
        # nothing lost: one record per task planned, each a question or a failure with its kind
        assert len(gens) == note["filters"]["tasks"] == len({r["key"] for r in gens})
        failed = Counter(r["failure"] for r in gens if r["status"] == "failed")
        assert dict(failed) == note["filters"]["generation_failed"]
        assert {"unparseable", "language", "rate_limited"} <= set(failed)
        assert note["filters"]["generated"] + sum(failed.values()) == len(gens)
        assert all("raw" in r for r in gens if r.get("failure") in ("unparseable", "language"))
        # recovered ones: malformed or empty first, then a good reply on the re-ask; 429s retried by the client
        assert any(n >= 2 for n in replies.values())
        assert any(r["status"] == "ok" and len(r["calls"]) == 2 for r in gens)
        # nothing malformed kept: every question is one a valid reply gave, in Chinese
        recs = records_of(out)
        good = {r["question"] for r in gens if r["status"] == "ok"}
        assert recs and all(r["query"] in good and sum("\u4e00" <= ch <= "\u9fff" for ch in r["query"]) >= 2
                            for r in recs)
        assert rc == (0 if note["reached"] else 1) and note["kept"] == len(recs)
        assert note["filters"]["unanswerable"] + note["filters"]["check_failed"] \
            + note["filters"]["near_duplicates"] + note["filters"]["round_trip"]["hit"] \
            + note["filters"]["round_trip"]["miss"] + note["filters"]["round_trip"]["failed"] \
            == note["filters"]["generated"]
        # a rerun makes no call, and writes the same test set
        before = out.read_bytes()
        assert generate(sandbox, out, llm.base_url, "scripted", "--n", "6", "--per-chunk", "3", "--json") == rc
        assert len(llm.requests) == sent and out.read_bytes() == before
        assert json.loads(capsys.readouterr().out)["calls"]["made"] == 0


def test_dry_run_calls_no_model_and_writes_nothing(tmp_path, sandbox, keys, capsys):
    out = tmp_path / "gen.jsonl"
    with LLMServer(_faulty, key=_user) as llm:
        assert generate(sandbox, out, llm.base_url, "scripted", "--n", "4", "--dry-run", "--json",
                        "--price-in", "2", "--price-out", "8") == 0
        assert llm.requests == []
    est = json.loads(capsys.readouterr().out)["estimate"]
    assert est["tasks"] == est["to_write"] == 6 and est["calls"] == 12 and est["cost_at_most"] > 0
    assert not out.exists() and not (tmp_path / "gen.jsonl.generation").exists()


def test_the_cost_limit_stops_the_run_and_the_next_run_goes_on(tmp_path, sandbox, keys, capsys):
    out = tmp_path / "gen.jsonl"
    url = sandbox.base_url + "/v1"
    args = ["--n", "4", "--price-in", "1000", "--price-out", "1000", "--concurrency", "1", "--json"]
    assert generate(sandbox, out, url, "sandbox-rule-generator", *args, "--max-cost", "1.5") == 1
    first = json.loads(capsys.readouterr().out)
    assert first["stopped_by_max_cost"] and first["status"] == "stopped_by_max_cost" and first["ledger"]["cost"] <= 1.5
    assert generate(sandbox, out, url, "sandbox-rule-generator", *args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["reached"] and second["calls"]["records_already_in_the_log"] > 0


@pytest.mark.parametrize("args, says", [
    (["--types", "factual=x"], "--types"),
    (["--n", "0"], "--n"),
    (["--round-trip", "maybe"], "--round-trip"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, sandbox, keys, capsys, args, says):
    assert generate(sandbox, tmp_path / "g.jsonl", sandbox.base_url + "/v1", "sandbox-rule-generator", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]


def test_a_refused_key_an_unknown_model_and_a_missing_model_are_usage_errors(tmp_path, sandbox, keys, capsys,
                                                                             monkeypatch):
    out = tmp_path / "g.jsonl"
    assert generate(sandbox, out, sandbox.base_url + "/v1", "no-such-model", "--n", "2") == 2
    assert "no-such-model" in capsys.readouterr().err
    monkeypatch.setenv("WEKNORA_NB_JUDGE_API_KEY", "sk-wrong")
    assert generate(sandbox, out, sandbox.base_url + "/v1", "sandbox-rule-generator", "--n", "2") == 2
    err = capsys.readouterr().err
    assert "refused the key" in err and "sk-wrong" not in err
    assert main(["testset", "generate", "--base-url", sandbox.base_url, "--kb-id", sandbox.kb_id, "--out",
                 str(out)]) == 2
    assert "--model" in capsys.readouterr().err
    assert generate(sandbox, out, sandbox.base_url + "/v1", "sandbox-rule-generator", "--kb-id", "no-such-kb") == 2
    assert "no-such-kb" in capsys.readouterr().err
