"""Sampling a test set from traffic: normalise, group near duplicates, weigh, stratify, draw (pure functions)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from weknora_nb.analysis.sampling import (
    FREQUENT,
    LONG_TAIL,
    Cluster,
    allocate,
    cluster,
    frequency_strata,
    normalise,
    sample_candidates,
    summary_path,
    vagueness,
    write_candidates,
)
from weknora_nb.core.errors import StorageError, UsageError


@dataclass(frozen=True)
class Q:
    text: str
    session_id: str = "s1"
    created_at: str = "2025-12-01T09:00:00+08:00"


def asked(*texts: str, times: int = 1, session: str = "s", day: int = 1) -> list[Q]:
    return [Q(t, f"{session}{i}", f"2025-12-{day:02d}T09:{i % 60:02d}:00+08:00") for t in texts for i in range(times)]


def groups(*texts: str) -> list[Cluster]:
    out = []
    for t in texts:
        c = Cluster(normalise(t), exact_keys={normalise(t)})
        c.spellings[t] += 1
        out.append(c)
    return out


@pytest.mark.parametrize(("text", "key"), [
    ("  ＶＰＮ 连不上？ ", "vpn 连不上"),
    ("VPN   连不上？？！", "vpn 连不上"),
    ("vpn 连不上", "vpn 连不上"),
    ("怎么重置密码。。。~", "怎么重置密码"),
    ("DG-1003 是什么？", "dg-1003 是什么"),
    ("我的手机<PHONE>", "我的手机<phone>"),
    ("？？", ""),
])
def test_normalise(text, key):
    assert normalise(text) == key


@pytest.mark.parametrize(("text", "tag"), [
    ("怎么弄", "vague"), ("不行了！", "vague"), ("报错了", "vague"), ("这个怎么搞？", "vague"),
    ("你好", "off-topic"), ("hello!", "off-topic"), ("谢谢", "off-topic"), ("今天天气怎么样", "off-topic"),
    ("VPN 连不上怎么办", None), ("如何重置管理员密码", None), ("DG-1003", None),
])
def test_vague_and_off_topic_rules(text, tag):
    assert vagueness(normalise(text)) == tag


def test_typos_and_small_edits_join_the_most_asked_spelling():
    base = "浏览器打开接口正常，但 Java 程序调用 https 接口报错"
    gs = groups(base, base.replace("调用", "掉用"), "请问" + base, base + "呢", "密码复杂度有什么要求")
    gs[0].spellings[base] += 9  # the most asked spelling leads
    out = cluster(gs)
    assert len(out) == 2 and out[0].weight == 13 and out[0].representative == base
    assert len(out[0].exact_keys) == 4


def test_different_numbers_or_short_texts_stay_apart():
    out = cluster(groups("创建路由返回 409，错误码 DG-1003 是什么意思", "创建路由返回 409，错误码 DG-1004 是什么意思",
                         "VPN 连不上", "VPN 连得上"))
    assert len(out) == 4
    with pytest.raises(UsageError, match="similarity"):
        cluster([], similarity=0)


def test_weight_sessions_times_and_masking_before_grouping():
    qs = [Q("我的手机13812345678收不到验证码", "a", "2025-12-02T10:00:00+08:00"),
          Q("我的手机13987654321收不到验证码", "b", "2025-12-01T10:00:00Z"),
          Q("我的手机１３８１２３４５６７８收不到验证码？", "a", "2025-12-03T10:00:00.5+08:00")]
    s = sample_candidates(qs, n=5)
    [r] = s.records
    assert r["query"] == "我的手机<PHONE>收不到验证码" and r["weight"] == 3 and r["n_sessions"] == 2
    # compared as times, not as text: 10:00 UTC on 1 December is 18:00 in +08:00
    assert (r["first_seen"], r["last_seen"]) == ("2025-12-01T10:00:00Z", "2025-12-03T10:00:00.5+08:00")
    assert "masked" in r["tags"] and s.summary["masked"]["phone"] == 3
    assert "138" not in json.dumps(s.records) and s.summary["unique_exact"] == 1


def test_query_ids_are_stable_hashes_of_the_normalised_representative():
    a = sample_candidates(asked("VPN 连不上怎么办？", times=3) + asked("账号被锁定怎么办"), n=5).records
    b = sample_candidates(asked("ＶＰＮ 连不上怎么办", times=3) + asked("账号被锁定怎么办?"), n=5, seed=9).records
    assert {r["query_id"] for r in a} == {r["query_id"] for r in b}
    assert all(r["query_id"].startswith("q-") and len(r["query_id"]) == 14 for r in a)


def test_frequent_is_the_head_that_makes_half_the_traffic():
    gs = groups("a" * 5, "b" * 5, "c" * 5, "d" * 5, "e" * 5)
    for g, w in zip(gs, (50, 20, 15, 10, 1), strict=True):
        g.spellings[g.representative] = w
    strata = frequency_strata(gs)
    assert [strata[g.query_id] for g in gs] == [FREQUENT, LONG_TAIL, LONG_TAIL, LONG_TAIL, LONG_TAIL]
    gs[0].spellings[gs[0].representative] = 40  # 40 of 86: the second crosses the line and is frequent too
    strata = frequency_strata(gs)
    assert [strata[g.query_id] for g in gs][:3] == [FREQUENT, FREQUENT, LONG_TAIL]
    once = groups("x" * 5, "y" * 5)
    assert set(frequency_strata(once).values()) == {LONG_TAIL}  # a question asked once is never frequent


def test_allocation_is_proportional_with_a_minimum_per_stratum():
    take = allocate({"a": 100, "b": 50, "c": 3, "d": 0}, 40, k_min=5)
    # 5, 5 and 3 first; the other 27 shared 2:1 between the strata that have room
    assert take == {"a": 23, "b": 14, "c": 3, "d": 0} and sum(take.values()) == 40
    assert allocate({"a": 2, "b": 2}, 10) == {"a": 2, "b": 2}  # never more than the strata hold
    small = allocate({s: 10 for s in "abcdefgh"}, 5, k_min=5)
    assert sum(small.values()) == 5 and max(small.values()) == 1  # the minimum lowered to fit n
    assert allocate({"a": 7, "b": 3}, 10) == {"a": 7, "b": 3}


def test_the_sample_is_seeded_stratified_and_sums_to_n():
    traffic = asked(*[f"第 {i} 个问题：如何配置网关的限流插件" for i in range(60)])
    traffic += asked(*[f"为什么 {i} 号节点报错 DG-{1000 + i}" for i in range(40)])
    traffic += asked("社区版最多能部署几个网关节点？", times=80) + asked("怎么弄", times=3)
    one = sample_candidates(traffic, n=30, seed=1)
    again = sample_candidates(traffic, n=30, seed=1)
    other = sample_candidates(traffic, n=30, seed=2)
    assert one.records == again.records and one.records != other.records
    s = one.summary
    assert s["sampled"] == len(one.records) == 30 and sum(s["sampled_by_stratum"].values()) == 30
    assert s["clusters"] == 102 and s["user_queries"] == len(traffic)
    # frequent: the 80-times question, and 怎么弄 (3 times) before half the traffic (91.5 of 183) is reached
    assert s["strata"] == {"frequent/factual": 1, "frequent/procedural": 1, "long-tail/procedural": 60,
                           "long-tail/technical": 40}
    assert one.records[0]["query"] == "社区版最多能部署几个网关节点？" and "frequent" in one.records[0]["tags"]
    assert s["sampled_by_stratum"]["frequent/factual"] == 1
    vague = [r for r in one.records if "vague" in r["tags"]]
    assert all(r["query"] == "怎么弄" for r in vague) and s["tagged"] == {"vague": 1}
    with pytest.raises(UsageError, match="--n"):
        sample_candidates(traffic, n=0)


def test_write_candidates_writes_the_records_and_the_summary_beside_them(tmp_path):
    s = sample_candidates(asked("VPN 连不上怎么办", times=2), n=3)
    out = tmp_path / "runs" / "candidates.jsonl"
    path = write_candidates(out, s, {"sessions_failed": 2})
    assert path == summary_path(out) == tmp_path / "runs" / "candidates.jsonl.summary.json"
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == s.records
    summary = json.loads(path.read_text(encoding="utf-8"))
    assert summary["sessions_failed"] == 2 and summary["clusters"] == 1
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    with pytest.raises(StorageError, match="a-file"):
        write_candidates(tmp_path / "a-file" / "c.jsonl", s)
