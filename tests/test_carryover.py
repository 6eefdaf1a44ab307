"""Labels that survive re-chunking (analysis/carryover.py, ``testset carry-over``): crafted re-chunkings
whose right answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb import TestSet, load_testset
from weknora_nb.analysis.carryover import carry_over, carry_over_files, link_chunks, normalise, review_path
from weknora_nb.analysis.worksheet import WORKSHEET_COLUMNS, read_worksheet
from weknora_nb.cli import main
from weknora_nb.core.errors import InputError, UsageError
from weknora_nb.core.lineage import lineage_path, merge_labels, read_lineage

HEAD = "安装指南 › 依赖组件\n"
P1 = "网关节点需要 8 vCPU、16 GB 内存和 200 GB SSD，单节点可承载一万五千 QPS，生产环境至少部署三个节点以保证高可用。"
P2 = "元数据库使用 PostgreSQL 15.4 及以上版本，限流计数与会话缓存依赖 Redis 7，同步引擎启用时还需要 Kafka 3.6。"
P3 = "时间同步由 chrony 或 NTP 提供，节点之间的时钟偏差必须小于五百毫秒，否则令牌校验会失败并返回 DG-1003 错误。"
P4 = "安装脚本的参数可以顺带安装内置的数据库与缓存，但这种方式只适用于测试环境，生产环境请使用独立部署的组件。"


def inventory(chunks: dict[str, str], knowledge: str = "doc") -> pd.DataFrame:
    return pd.DataFrame([{"chunk_id": c, "knowledge_base_id": "kb", "knowledge_id": knowledge,
                          "knowledge_title": "安装指南", "chunk_index": i, "is_enabled": True, "content": t}
                         for i, (c, t) in enumerate(chunks.items())])


def make_testset(relevant: dict[str, dict[str, int]]) -> TestSet:
    return TestSet.from_records([{"query_id": q, "query": f"问题 {q}", "relevant": r} for q, r in relevant.items()])


def carried(result) -> dict[tuple[str, str], int]:
    return {(r.query_id, r.chunk_id): r.grade for r in result.carried.itertuples()}


def test_normalise_folds_width_case_and_whitespace():
    assert normalise("ＤＧ－１００３\n\n  Redis\t7") == "dg-1003 redis 7"


def test_the_same_chunks_under_new_ids_carry_every_label():
    old = inventory({"o1": HEAD + P1, "o2": HEAD + P2, "o3": HEAD + P3})
    new = inventory({"n1": HEAD + P3, "n2": HEAD + P1, "n3": HEAD + P2})      # reordered, renamed
    r = carry_over(make_testset({"q": {"o1": 3, "o2": 0, "o3": 1}}), old, new)
    assert carried(r) == {("q", "n2"): 3, ("q", "n3"): 0, ("q", "n1"): 1}
    assert set(r.old_labels["status"]) == {"carried"} and r.review.empty
    assert r.records[0]["relevant"] == {"n2": 3, "n3": 0, "n1": 1}


def test_ids_reused_for_other_text_do_not_fool_it():
    old = inventory({"doc:000": HEAD + P1, "doc:001": HEAD + P2})
    new = inventory({"doc:000": HEAD + P2, "doc:001": HEAD + P1})
    assert carried(carry_over(make_testset({"q": {"doc:000": 3}}), old, new)) == {("q", "doc:001"): 3}


def test_a_chunk_split_in_two_carries_its_grade_to_both_halves_by_the_lenient_rule():
    old = inventory({"o1": HEAD + P1 + P2, "o2": HEAD + P3})
    new = inventory({"n1": HEAD + P1, "n2": HEAD + P2, "n3": HEAD + P3})
    r = carry_over(make_testset({"q": {"o1": 2, "o2": 0}}), old, new, rule="lenient")
    assert carried(r) == {("q", "n1"): 2, ("q", "n2"): 2, ("q", "n3"): 0}
    links = link_chunks(old, new).set_index(["old_chunk_id", "new_chunk_id"])
    assert links.loc[("o1", "n1"), "new_from_old"] == pytest.approx(1.0)
    assert 0.4 < links.loc[("o1", "n1"), "old_in_new"] < 0.6
    assert ("o2", "n1") not in links.index            # the shared heading line alone links nothing


def test_by_the_strict_rule_halves_keep_grade_0_and_a_relevant_chunks_halves_need_a_person():
    old = inventory({"o1": HEAD + P1 + P2, "o2": HEAD + P3 + P4})
    new = inventory({"n1": HEAD + P1, "n2": HEAD + P2, "n3": HEAD + P3, "n4": HEAD + P4})
    r = carry_over(make_testset({"q": {"o1": 2, "o2": 0}}), old, new)
    assert carried(r) == {("q", "n3"): 0, ("q", "n4"): 0}
    assert r.review["chunk_id"].tolist() == ["n1", "n2"]
    assert "what made that chunk relevant may have gone to another piece" in r.review.loc[0, "note"]
    status = dict(zip(r.old_labels["old_chunk_id"], r.old_labels["status"], strict=True))
    assert status == {"o1": "flagged", "o2": "carried"}


def test_merged_chunks_with_different_grades_need_a_person():
    old = inventory({"o1": HEAD + P1, "o2": HEAD + P2, "o3": HEAD + P3, "o4": HEAD + P4})
    new = inventory({"n1": HEAD + P1 + "\n\n" + P2, "n2": HEAD + P3 + "\n\n" + P4})
    r = carry_over(make_testset({"q": {"o1": 3, "o2": 0, "o3": 0, "o4": 0}}), old, new)
    assert carried(r) == {("q", "n2"): 0}                          # grade 0 merged whole: carried
    assert r.review[["query_id", "chunk_id"]].values.tolist() == [["q", "n1"]]
    row = r.review.iloc[0]
    assert "different grades [0, 3]: suggested 3" in row["note"]
    assert row["old_chunk_ids"].startswith("o1 (grade 3") and "o2 (grade 0" in row["old_chunk_ids"]
    assert P1 in row["old_content"] and P2 in row["old_content"] and row["content"] == new.loc[0, "content"]
    status = dict(zip(r.old_labels["old_chunk_id"], r.old_labels["status"], strict=True))
    assert status == {"o1": "flagged", "o2": "flagged", "o3": "carried", "o4": "carried"}
    assert "n1" not in r.records[0]["relevant"]


def test_relevant_chunks_merged_whole_need_a_person_unless_lenient():
    old = inventory({"o1": HEAD + P1, "o2": HEAD + P2})
    new = inventory({"n1": HEAD + P1 + "\n\n" + P2})
    ts = make_testset({"q": {"o1": 2, "o2": 2}})
    strict = carry_over(ts, old, new)
    assert strict.carried.empty and "together they may answer more (at least 2)" in strict.review.loc[0, "note"]
    assert carried(carry_over(ts, old, new, rule="lenient")) == {("q", "n1"): 2}
    with pytest.raises(UsageError, match="--rule must be one of strict, lenient"):
        carry_over(ts, old, new, rule="loose")


def test_a_merged_chunk_mostly_of_unjudged_text_needs_a_person():
    old = inventory({"o1": HEAD + P1, "o2": HEAD + P2, "o3": HEAD + P3})
    new = inventory({"n1": HEAD + P1 + P2 + P3})
    r = carry_over(make_testset({"q": {"o1": 3}}), old, new)
    assert r.carried.empty and "of its text comes from chunks judged for this query" in r.review.loc[0, "note"]


def test_small_pieces_keep_grade_0_but_not_a_positive_grade():
    body = P1 + P2 + P3 + P4
    old = inventory({"o1": HEAD + body})
    pieces = [body[i:i + 40] for i in range(0, len(body), 40)]
    new = inventory({f"n{i}": HEAD + p for i, p in enumerate(pieces)})
    zero = carry_over(make_testset({"q": {"o1": 0}}), old, new)
    assert set(carried(zero).values()) == {0} and len(zero.carried) == len(pieces)
    for rule in ("strict", "lenient"):
        three = carry_over(make_testset({"q": {"o1": 3}}), old, new, rule=rule)
        assert three.carried.empty and three.old_labels.loc[0, "status"] == "flagged"
        assert "holds only" in three.review.loc[0, "note"]


def test_text_of_another_document_is_never_matched():
    old = inventory({"o1": HEAD + P1}, knowledge="doc-a")
    new = inventory({"n1": HEAD + P1}, knowledge="doc-b")
    r = carry_over(make_testset({"q": {"o1": 3}}), old, new)
    assert r.carried.empty and r.old_labels.loc[0, "status"] == "lost"
    by_title = carry_over(make_testset({"q": {"o1": 3}}), old, new, by="knowledge_title")
    assert carried(by_title) == {("q", "n1"): 3}


def test_labels_on_chunks_the_old_inventory_lacks_are_kept():
    old = inventory({"o1": HEAD + P1})
    new = inventory({"n1": HEAD + P1})
    r = carry_over(make_testset({"q": {"o1": 2, "faq-7": 3}}), old, new)
    assert r.records[0]["relevant"] == {"faq-7": 3, "n1": 2} and r.kept_unmapped == 1


def _files(tmp: Path) -> tuple[Path, Path, Path]:
    ts = tmp / "t.jsonl"
    make_testset({"q1": {"o1": 3, "o2": 0}, "q2": {"o3": 1}}).to_jsonl(ts)
    inventory({"o1": HEAD + P1, "o2": HEAD + P2, "o3": HEAD + P3}).to_parquet(tmp / "old.parquet")
    inventory({"n1": HEAD + P1 + "\n\n" + P2, "n2": HEAD + P3}).to_parquet(tmp / "new.parquet")
    return ts, tmp / "old.parquet", tmp / "new.parquet"


def test_files_new_version_lineage_and_a_review_sheet_that_merges_back(tmp_path):
    ts, old, new = _files(tmp_path)
    out = tmp_path / "t2.jsonl"
    result, lineage = carry_over_files(ts, old, new, out)
    t2 = load_testset(out)
    assert [r["relevant"] for r in t2.records()] == [{}, {"n2": 1}]
    lin = read_lineage(out)
    assert lin == lineage and lin["parent"]["hash"] == load_testset(ts).hash and lin["kind"] == "carry-over"
    assert lin["carried_over_from"]["path"] == str(old) and len(lin["carried_over_from"]["sha256"]) == 64
    assert lin["old_labels"] == {"old_labels": 3, "carried": 1, "partly": 0, "flagged": 2, "lost": 0}
    sheet = pd.read_csv(review_path(out), encoding="utf-8-sig", keep_default_na=False)
    assert list(sheet.columns) == [*WORKSHEET_COLUMNS, "old_chunk_ids", "old_content"]
    assert sheet[["query_id", "chunk_id"]].values.tolist() == [["q1", "n1"]]
    sheet.loc[0, ["grade", "assessor"]] = ["3", "li"]
    sheet.to_csv(review_path(out), index=False, encoding="utf-8-sig")
    assert [(j.chunk_id, j.grade) for j in read_worksheet(review_path(out))] == [("n1", 3)]
    t3 = tmp_path / "t3.jsonl"
    from weknora_nb.analysis.worksheet import label_file

    merge_labels(out, [label_file(review_path(out))], t3)
    assert [r["relevant"] for r in load_testset(t3).records()] == [{"n1": 3}, {"n2": 1}]
    assert [h["kind"] for h in read_lineage(t3)["history"]] == ["carry-over"]


def test_cli_carry_over(tmp_path, capsys):
    ts, old, new = _files(tmp_path)
    out = tmp_path / "t2.jsonl"
    code = main(["testset", "carry-over", "--testset", str(ts), "--old-chunks", str(old), "--new-chunks", str(new),
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "carried automatically 1 (33.3%)" in text and "need a person 2 (66.7%)" in text
    assert lineage_path(out).is_file() and review_path(out).is_file()
    lin = json.loads(lineage_path(out).read_text(encoding="utf-8"))
    assert lin["review_file"] == str(review_path(out)) and lin["rule"]["name"] == "strict"
    lenient = tmp_path / "t2-lenient.jsonl"   # a new version goes to a new file (issue 46: --out is never overwritten)
    assert main(["testset", "carry-over", "--testset", str(ts), "--old-chunks", str(old), "--new-chunks", str(new),
                 "--out", str(lenient), "--rule", "lenient"]) == 0
    assert json.loads(lineage_path(lenient).read_text(encoding="utf-8"))["rule"]["name"] == "lenient"


def test_an_inventory_without_the_needed_columns_is_an_input_error(tmp_path):
    ts, old, _ = _files(tmp_path)
    pd.DataFrame({"chunk_id": ["x"], "text": ["t"]}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(InputError, match=r"needs the column\(s\) \['knowledge_id', 'content'\]"):
        carry_over_files(ts, old, tmp_path / "bad.parquet", tmp_path / "t2.jsonl")
    assert main(["testset", "carry-over", "--testset", str(ts), "--old-chunks", str(tmp_path / "nope.parquet"),
                 "--new-chunks", str(old), "--out", str(tmp_path / "t2.jsonl")]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["strict", "lenient"])
def test_the_demo_check_sheets_hold_the_sample_the_rules_draw_today(rule, tmp_path):
    """The verdicts in tests/data/carryover-check-<rule>.csv were given by reading the sample that
    benchmarks/carryover_demo.py draws; a change of the rules or the demo draws another sample, and
    this fails until the new sample is read (the script refuses the old sheet)."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("carryover_demo", root / "benchmarks" / "carryover_demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    outcomes = demo.run(tmp_path, rule)
    counts = demo.check(demo.sample(outcomes, 25, 13, 20), root / "tests" / "data" / f"carryover-check-{rule}.csv")
    assert counts is not None
    right, wrong, rows = counts["random sample (half + double)"]
    assert rows == 50 and right + wrong == 50


# -- the linking and explaining, against their plain formulation (analysis/carryover.py's module docstring) ------
def plain_links(old: pd.DataFrame, new: pd.DataFrame, n: int) -> list[dict]:
    """Every (old, new) pair of one knowledge, its n-grams compared pair by pair: shared = sum over the n-grams of
    min(old count, new count); an old chunk's own n-grams are those no other old chunk holds. Rows in the order
    the workbench gives them: by new chunk, then by the first of the new chunk's n-grams (in its text's order)
    the old chunk holds, then by old chunk."""
    from collections import Counter

    from weknora_nb.analysis.carryover import COVERS, INSIDE, LINK_NEW, LINK_OLD, MIN_OWN, PURE, ngrams

    og = [ngrams(normalise(t), n) for t in old["content"]]
    ng = [ngrams(normalise(t), n) for t in new["content"]]
    holders = Counter(g for grams in og for g in grams)
    rows = []
    for j, b in enumerate(ng):
        order = {g: p for p, g in enumerate(b)}
        pairs = []
        for i, a in enumerate(og):
            common = [g for g in b if g in a]
            if not common:
                continue
            s = sum(min(a[g], b[g]) for g in common)
            own = sum(min(a[g], b[g]) for g in common if holders[g] == 1)
            own_size = sum(c for g, c in a.items() if holders[g] == 1)
            size_o, size_n = sum(a.values()), sum(b.values())
            if own_size >= max(MIN_OWN, 0.1 * size_o):
                cov, own_new = own / own_size, own / size_n
                linked = own_new >= LINK_NEW or cov >= LINK_OLD
            else:
                cov, own_new = s / size_o, s / size_n
                linked = (own_new >= PURE and cov >= COVERS) or cov >= INSIDE
            if linked:
                pairs.append((min(order[g] for g in common), i, {
                    "old_chunk_id": old["chunk_id"].iloc[i], "new_chunk_id": new["chunk_id"].iloc[j],
                    "knowledge": "doc", "old_in_new": s / size_o, "new_from_old": s / size_n, "coverage": cov,
                    "own_new": own_new}))
        rows += [r for *_, r in sorted(pairs, key=lambda p: p[:2])]
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_links_equal_the_pair_by_pair_formulation_on_random_rechunkings(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    pieces = ["".join(rng.choice(list("网关节点内存缓存令牌校验错误部署"), size=int(rng.integers(5, 40))))
              for _ in range(12)]                                    # a small alphabet: n-grams repeat and overlap
    old = inventory({f"o{i}": "".join(rng.choice(pieces, size=int(rng.integers(1, 4)))) for i in range(10)})
    new = inventory({f"n{i}": "".join(rng.choice(pieces, size=int(rng.integers(1, 4)))) for i in range(10)})
    got = link_chunks(old, new, n=3).to_dict("records")
    want = plain_links(old, new, 3)
    assert got == want and len(want) > 5


@pytest.mark.parametrize("seed", range(4))
def test_explained_is_the_share_of_the_new_chunks_ngrams_in_the_union_of_its_sources(seed):
    from collections import Counter

    import numpy as np

    from weknora_nb.analysis.carryover import _explained

    rng = np.random.default_rng(seed)
    for _ in range(50):
        new = Counter({g: int(c) for g, c in zip("abcdefgh", rng.integers(0, 4, size=8), strict=True) if c})
        sources = [Counter({g: int(c) for g, c in zip("abcdefgh", rng.integers(0, 4, size=8), strict=True) if c})
                   for _ in range(int(rng.integers(1, 4)))]
        total = sum(new.values())
        want = sum(min(c, max(s.get(g, 0) for s in sources)) for g, c in new.items()) / total if total else 0.0
        assert _explained(new, sources) == want
