"""Test-set loading is strict: nothing collapses silently, no foreign traceback, the hash never moves.

Issue 12: duplicate JSON keys, ids equal once stripped, an unterminated CSV quote, foreign
errors from damaged or odd files, and a loader light enough for 1,000,000 queries whose
content hash is the one every stored run already carries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tracemalloc
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weknora_nb import InputError, TestSetError, load_testset, load_trec_qrels
from weknora_nb.core.testset import TestSet

from .conftest import examples

ROOT = Path(__file__).resolve().parent.parent


def problems_of(path, loader=load_testset, *args):
    with pytest.raises(TestSetError) as err:
        loader(path, *args)
    return err.value.problems


def only(problems):
    assert len(problems) == 1, problems
    return problems[0]


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------
# the hash does not change (values recorded with the loader as it was before issue 12)
# ---------------------------------------------------------------------------------------
PINNED = {
    "tests/data/weknora-dataset-format": "sha256:55fd928cda36038066b5f556e6f15949a5e728f421774f573065288522cadd11",
    "weknora_nb/sandbox/demo/testset.jsonl":
        "sha256:0a56763e8e3bd9aaed9554918bcbe72767fcab0fc80c089bd64feb87eaa3d9c7",
    "weknora_nb/sandbox/demo/faq/testset.jsonl":
        "sha256:f39f053150ca15f6c53cf24bf59493b584bab0175046363a14d4d0e34cf8b59b",
    "data/examples/testset.jsonl": "sha256:c2a5571f7652489bf394d4f4aa4cc266fd49b2ddbe9c5cf6db9ae3defc1900b8",
}

GOOD = [
    {"query_id": "q001", "query": "如何重置管理员密码？", "relevant": {"doc1#0003": 3, "doc1#0004": 1},
     "query_type": "procedural", "tags": ["frequent"], "answer": "在用户管理页点击重置密码。"},
    {"query_id": "q002", "query": "What does DG-1003 mean?", "relevant": {"api#0010": 2}, "tags": ["english"]},
    {"query_id": "q003", "query": "公司有健身补贴吗", "relevant": {}, "tags": ["no-answer"]},
]
#: every character class the canonical JSON escapes or sorts differently, and unsorted, repeated tags
NASTY = [
    {"query_id": "z-last", "query": 'quote " backslash \\ tab \t newline \n bell \x07 del \x7f',
     "relevant": {"é-chunk": 1, "Z-chunk": 0, "z-chunk": 2, "a\"b": 3, "😀": 1, "\u2028sep": 0},
     "query_type": "with \"quotes\"", "tags": ["b", "a", "b", "ü", "A"]},
    {"query_id": "A-first", "query": "emoji 😀 and CJK 中文 and U+2028 \u2028 and U+FEFF \ufeff",
     "relevant": {"c\\1": 3}, "tags": []},
    {"query_id": "é-mid", "query": "control \x00\x01\x1f", "relevant": {}, "query_type": "factual"},
    {"query_id": "10", "query": "numeric id", "relevant": {"x": 0, "y": 1}, "answer": "ignored by the hash"},
    {"query_id": "9", "query": "numeric id 9", "relevant": {"x": 1}, "query_type": "factual", "tags": ["t"]},
]


@pytest.mark.parametrize("rel, expected", sorted(PINNED.items()))
def test_hash_of_the_shipped_test_sets_is_unchanged(rel, expected):
    assert load_testset(ROOT / rel).hash == expected


@pytest.mark.parametrize("records, expected", [
    (GOOD, "sha256:fafaf766983e8a299e459c7e57edc8cd42798cf944440d6b2a4da6f3708aaf2a"),
    (NASTY, "sha256:32272f250d7241ce87a38876e2105c7932edb41391b8d9f3bc29ebda968e4292"),
    ([{"query_id": "q", "query": "x", "relevant": {"a": 1}}],
     "sha256:bdec4f2dfb294a5aa0a3cc5fd85e8be91ae616a1a03e6c21fbbd2d5291ca4a7e"),
], ids=["good", "escapes-and-sort-order", "one"])
def test_hash_of_records_is_unchanged_in_every_format(tmp_path, records, expected):
    ts = TestSet.from_records(records)
    assert ts.hash == expected
    ts.to_jsonl(tmp_path / "t.jsonl")
    assert load_testset(tmp_path / "t.jsonl").hash == expected
    pd.DataFrame({"query_id": [r["query_id"] for r in records], "query": [r["query"] for r in records],
                  "relevant": [json.dumps(r["relevant"]) for r in records]}).assign(
        query_type=[r.get("query_type") for r in records],
        tags=[json.dumps(r.get("tags") or []) for r in records]).to_parquet(tmp_path / "t.parquet")
    assert load_testset(tmp_path / "t.parquet").hash == expected


def reference_hash(records) -> str:
    """The hash as it was computed before issue 12: one JSON text of the sorted canonical records."""
    canon = [[r["query_id"], r["query"], sorted(r["relevant"].items()), r.get("query_type"),
              sorted(r.get("tags") or [])] for r in sorted(records, key=lambda r: r["query_id"])]
    return "sha256:" + hashlib.sha256(json.dumps(canon, ensure_ascii=False, separators=(",", ":"))
                                      .encode("utf-8")).hexdigest()


_text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12).map(lambda s: "x" + s + "y")


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.fixed_dictionaries(
    {"query_id": _text, "query": _text, "relevant": st.dictionaries(_text, st.integers(0, 3), max_size=5)},
    optional={"query_type": _text, "tags": st.lists(_text, max_size=3)}), min_size=1, max_size=12,
    unique_by=lambda r: r["query_id"]))
def test_streamed_hash_equals_the_one_json_text(records):
    """Over arbitrary text (quotes, control characters, astral planes, any order) the Arrow-built hash is
    byte for byte the old single JSON text's."""
    assert TestSet.from_records(records).hash == reference_hash(records)


def test_hash_does_not_depend_on_the_slices(tmp_path):
    from weknora_nb.core.testset.model import content_hash
    records = [dict(r, query_id=f"{r['query_id']}-{i}") for i in range(7) for r in NASTY + GOOD]
    ts = TestSet.from_records(records)
    hashes = {content_hash(ts.queries, ts.qrels, ts.label_rows, slice_size=k) for k in (1, 3, 64)}
    assert hashes == {reference_hash(ts.records())}


# ---------------------------------------------------------------------------------------
# finding 1: a key written twice is an error (file, line, field), never last-wins
# ---------------------------------------------------------------------------------------
def test_jsonl_chunk_written_twice_in_relevant(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", json.dumps(GOOD[1]),
                       '{"query_id":"q1","query":"x","relevant":{"c1":3,"c1":0}}')
    p = only(problems_of(path))
    assert (p.path, p.line, p.field) == (str(path), 2, "relevant")
    assert "'c1'" in p.message and "twice" in p.message and "3 and 0" in p.message


def test_jsonl_top_level_key_written_twice(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", '{"query_id":"q1","query":"x","relevant":{"c1":3},"query":"y"}')
    p = only(problems_of(path))
    assert (p.line, p.field) == (1, "query") and "appears twice" in p.message and "'x' and 'y'" in p.message


def test_csv_relevant_json_with_a_key_twice(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('query_id,query,relevant\nq1,x,"{""c1"": 3, ""c1"": 0}"\n', encoding="utf-8")
    p = only(problems_of(path))
    assert (p.line, p.field) == (2, "relevant") and "'c1'" in p.message and "twice" in p.message


def test_csv_chunk_twice_in_the_short_syntax(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("query_id,query,relevant\nq1,x,c1:3;c2:1;c1:0\n", encoding="utf-8")
    p = only(problems_of(path))
    assert (p.line, p.field) == (2, "relevant") and "'c1'" in p.message and "twice" in p.message


def test_csv_header_naming_a_column_twice(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("query_id,query,relevant,query\nq1,x,c1:1,y\n", encoding="utf-8")
    p = only(problems_of(path))
    assert (p.line, p.field) == (1, "query") and "columns 2 and 4" in p.message


def test_parquet_map_with_a_chunk_twice_names_the_row(tmp_path):
    path = tmp_path / "t.parquet"
    rel = pa.array([[("a", 1)], [("c1", 3), ("c1", 0)]], pa.map_(pa.string(), pa.int8()))
    pq.write_table(pa.table({"query_id": ["q1", "q2"], "query": ["x", "y"], "relevant": rel}), path)
    p = only(problems_of(path))
    assert (p.line, p.where, p.field) == (2, "row", "relevant") and "'c1'" in p.message


def test_parquet_struct_naming_a_chunk_twice(tmp_path):
    path = tmp_path / "t.parquet"
    rel = pa.StructArray.from_arrays([pa.array([1]), pa.array([0])], names=["c1", "c1"])
    pq.write_table(pa.table({"query_id": ["q1"], "query": ["x"], "relevant": rel}), path)
    p = only(problems_of(path))
    assert p.field == "relevant" and "['c1'] twice" in p.message


def weknora_folder(tmp_path, qrels, ids=("1", "2")):
    d = tmp_path / "ds"
    d.mkdir()
    pd.DataFrame({"id": list(ids), "text": ["first", "second"][:len(ids)]}).to_parquet(d / "queries.parquet")
    pd.DataFrame(qrels).to_parquet(d / "qrels.parquet")
    return d


def test_weknora_qrels_pair_twice_names_both_rows(tmp_path):
    d = weknora_folder(tmp_path, {"qid": ["1", "2", "1"], "pid": ["p1", "p2", "p1"], "score": [1, 1, 2]})
    p = only(problems_of(d))
    assert (Path(p.path).name, p.line, p.field) == ("qrels.parquet", 3, "pid")
    assert "first at row 1" in p.message


# ---------------------------------------------------------------------------------------
# finding 2: ids equal once stripped are an error naming the line and both spellings
# ---------------------------------------------------------------------------------------
def test_chunk_ids_equal_once_stripped(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", '{"query_id":"q1","query":"x","relevant":{"c1":3," c1":0}}')
    p = only(problems_of(path))
    assert (p.line, p.field) == (1, "relevant") and "'c1' and ' c1'" in p.message


def test_query_ids_equal_once_stripped(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", '{"query_id":"q1","query":"x","relevant":{"c1":1}}',
                       '{"query_id":"q2","query":"y","relevant":{"c1":1}}',
                       '{"query_id":"q1 ","query":"z","relevant":{"c2":1}}')
    p = only(problems_of(path))
    assert (p.line, p.field) == (3, "query_id") and "'q1' (line 1) and 'q1 '" in p.message


def test_from_records_ids_equal_once_stripped():
    with pytest.raises(TestSetError) as err:
        TestSet.from_records([{"query_id": "q1", "query": "x", "relevant": {"c1": 1, "c1\t": 1}}])
    p = only(err.value.problems)
    assert (p.line, p.where) == (1, "record") and "'c1' and 'c1\\t'" in p.message


def test_weknora_ids_equal_once_stripped(tmp_path):
    d = weknora_folder(tmp_path, {"qid": ["1", "1"], "pid": ["p1", " p1"], "score": [1, 0]})
    p = only(problems_of(d))
    assert (Path(p.path).name, p.line, p.field) == ("qrels.parquet", 2, "pid") and "'p1' (row 1) and ' p1'" in p.message
    (d / "queries.parquet").unlink()
    pd.DataFrame({"id": ["1", " 1"], "text": ["a", "b"]}).to_parquet(d / "queries.parquet")
    pd.DataFrame({"qid": ["1"], "pid": ["p1"], "score": [1]}).to_parquet(d / "qrels.parquet")
    p = only(problems_of(d))
    assert (Path(p.path).name, p.line, p.field) == ("queries.parquet", 2, "id") and "'1' (row 1) and ' 1'" in p.message


def test_trec_topics_ids_equal_once_stripped(tmp_path):
    (tmp_path / "topics.tsv").write_text("q1\tfirst\nq1 \tsecond\n")
    (tmp_path / "q.qrels").write_text("q1 0 a 1\n")
    p = only(problems_of(tmp_path / "q.qrels", load_trec_qrels, tmp_path / "topics.tsv"))
    assert (p.line, p.field) == (2, "query_id") and "'q1' (line 1) and 'q1 '" in p.message


# ---------------------------------------------------------------------------------------
# finding 3: an unterminated CSV quote is named where its field starts
# ---------------------------------------------------------------------------------------
def test_csv_unterminated_quote_names_the_line_it_opens(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('query_id,query,relevant\nq1,x,a:1\nq2,"never closed,b:1\nq3,y,c:1\nq4,z,d:1\n',
                    encoding="utf-8")
    p = only(problems_of(path))
    assert p.line == 3 and "column 2" in p.message and "closing quote" in p.message


def test_csv_unterminated_quote_after_a_legitimate_multiline_field(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('query_id,query,relevant\nq1,"two\nlines",a:1\nq2,"fine\nalso",b:1,"open\nq3,y,c:1\n',
                    encoding="utf-8")
    p = only(problems_of(path))
    assert p.line == 5 and "column 4" in p.message


def test_csv_quoted_multiline_fields_still_load(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('query_id,query,relevant\r\nq1,"two\r\nlines ""quoted""",a:1\r\nq2,y,b:1\r\n', encoding="utf-8")
    ts = load_testset(path)
    assert ts.queries["query"].tolist() == ['two\r\nlines "quoted"', "y"]


def test_csv_text_after_a_closing_quote_is_an_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('query_id,query,relevant\nq1,"x"y,a:1\n', encoding="utf-8")
    p = only(problems_of(path))
    assert p.line == 2 and "malformed CSV" in p.message


# ---------------------------------------------------------------------------------------
# finding 4: odd and damaged files are the package's error, naming the file
# ---------------------------------------------------------------------------------------
def good_parquet(path):
    pd.DataFrame({"query_id": ["q1"], "query": ["x"], "relevant": ['{"a": 1}']}).to_parquet(path)
    return path


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_damaged_parquet(tmp_path, damage):
    path = good_parquet(tmp_path / "t.parquet")
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "garbage": b"PAR1" + b"\x00" * 64}[damage])
    p = only(problems_of(path))
    assert p.path == str(path)


def test_damaged_parquet_in_a_weknora_folder(tmp_path):
    d = weknora_folder(tmp_path, {"qid": ["1"], "pid": ["p1"], "score": [1]})
    (d / "qrels.parquet").write_bytes(b"")
    assert only(problems_of(d)).path == str(d / "qrels.parquet")
    (d / "qrels.parquet").unlink()
    (d / "qrels.parquet").mkdir()
    assert only(problems_of(d)).path == str(d / "qrels.parquet")


@pytest.mark.parametrize("column", [
    pa.array([1]), pa.array([[1, 2]]), pa.array([["c1"]]), pa.array([1.5]),
    pa.array([[{"key": "c1", "value": 1}]]),
], ids=["int", "list<int>", "list<string>", "double", "list<struct>"])
def test_parquet_relevant_of_the_wrong_arrow_type(tmp_path, column):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"query_id": ["q1"], "query": ["x"], "relevant": column}), path)
    p = only(problems_of(path))
    assert p.field == "relevant" and f"Arrow type {str(column.type).split('<')[0]}" in p.message


def test_parquet_relevant_as_struct_and_map_still_load(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"query_id": ["q1", "q2"], "query": ["x", "y"],
                             "relevant": pa.array([{"c1": 3, "c2": None}, {"c1": None, "c2": 1}])}), path)
    assert load_testset(path).records()[1]["relevant"] == {"c2": 1}
    pq.write_table(pa.table({"query_id": ["q1"], "query": ["x"],
                             "relevant": pa.array([[("c1", 2)]], pa.map_(pa.string(), pa.int64()))}), path)
    assert load_testset(path).records()[0]["relevant"] == {"c1": 2}


def test_empty_csv(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"")
    assert "empty" in only(problems_of(path)).message
    path.write_bytes(b"\xef\xbb\xbf")
    assert "empty" in only(problems_of(path)).message


def test_trec_files_that_are_folders(tmp_path):
    (tmp_path / "topics").mkdir()
    (tmp_path / "q.qrels").write_text("q1 0 a 1\n")
    with pytest.raises(TestSetError) as err:
        load_trec_qrels(tmp_path / "q.qrels", tmp_path / "topics")
    assert err.value.problems[0].path == str(tmp_path / "topics")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", json.dumps(GOOD[0]))
    path.chmod(0)
    try:
        p = only(problems_of(path))
        assert p.path == str(path) and "ermission" in p.message
    finally:
        path.chmod(0o644)


@pytest.mark.parametrize("line, fragment", [
    ('{"query_id": ' + "1" * 5000 + ', "query": "x", "relevant": {}}', "not valid JSON"),
    ("[" * 100_000, "nested too deeply"),
    ('{"query_id": "q\\ud800", "query": "x", "relevant": {"a": 1}}', "surrogate"),
    ('{"query_id": "q1", "query": "x", "relevant": {"a\\udfff": 1}}', "surrogate"),
], ids=["huge-int", "deep", "surrogate-id", "surrogate-chunk"])
def test_json_python_cannot_hold_is_a_problem(tmp_path, line, fragment):
    p = only(problems_of(write_lines(tmp_path / "t.jsonl", line)))
    assert p.line == 1 and fragment in p.message


def test_from_records_with_what_arrow_cannot_hold():
    for rec in ({"query_id": "q\ud800", "query": "x", "relevant": {"a": 1}},
                {"query_id": 10 ** 5000, "query": "x", "relevant": {"a": 1}}):
        with pytest.raises(TestSetError):
            TestSet.from_records([rec])


def test_a_line_separator_inside_a_json_string_round_trips(tmp_path):
    ts = TestSet.from_records([{"query_id": "q1", "query": "a\u2028b\u0085c\x0cd", "relevant": {"a": 1}}])
    ts.to_jsonl(tmp_path / "t.jsonl")
    assert load_testset(tmp_path / "t.jsonl").hash == ts.hash


def test_trec_grade_that_is_a_digit_but_not_a_number(tmp_path):
    (tmp_path / "topics.tsv").write_text("q1\tfirst\n")
    (tmp_path / "q.qrels").write_text("q1 0 a ²\n", encoding="utf-8")
    p = only(problems_of(tmp_path / "q.qrels", load_trec_qrels, tmp_path / "topics.tsv"))
    assert p.line == 1 and "integer 0-3" in p.message


def test_problem_messages_are_one_line(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", '{"query_id": "q1", "query": "x", "relevant": {"a\\n": 9}}',
                       '{"query_id": "q2", "query": "a\\nb", "relevant": {}, "tags": ["x\\ny", 3]}')
    with pytest.raises(InputError) as err:
        load_testset(path)
    assert all("\n" not in str(p) for p in err.value.problems)


# ---------------------------------------------------------------------------------------
# finding 5: the frames are the test set (no Python dict per query kept beside them)
# ---------------------------------------------------------------------------------------
def test_a_loaded_test_set_keeps_no_python_object_per_query(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(5_000):
            fh.write(json.dumps({"query_id": f"q{i:06d}", "query": f"如何配置网关节点 {i} 的证书？",
                                 "relevant": {f"doc{i % 97}.{j}:00{j}": j for j in range(3)},
                                 "query_type": "procedural", "tags": ["frequent"]}, ensure_ascii=False) + "\n")
    tracemalloc.start()
    try:
        ts = load_testset(path)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ts) == 5_000 and len(ts.qrels) == 15_000
    # before issue 12: a tuple of 5,000 dicts beside object columns, ~1,150 bytes a query (now ~110)
    assert held / len(ts) < 200, f"{held / len(ts):.0f} bytes of Python objects per query"
    assert [f.name for f in dataclasses.fields(TestSet)] == ["queries", "qrels", "source"]


def test_records_are_fresh_plain_python_values():
    ts = TestSet.from_records(GOOD)
    recs = ts.records()
    assert recs == [dict(r, query_type=r.get("query_type"), answer=r.get("answer"), weight=r.get("weight"),
                         source=r.get("source"), overlap=r.get("overlap")) for r in GOOD]
    assert all(type(g) is int for r in recs for g in r["relevant"].values())
    assert all(type(r["tags"]) is list for r in recs)
    recs[0]["relevant"]["new"] = 1
    recs[0]["tags"].append("x")
    assert ts.records()[0]["relevant"] == GOOD[0]["relevant"] and ts.records()[0]["tags"] == ["frequent"]
    assert TestSet.from_records(recs).hash != ts.hash


def test_frames_keep_their_columns_and_dtypes():
    ts = TestSet.from_records(GOOD)
    assert list(ts.queries.columns) == ["query_id", "query", "query_type", "tags", "answer", "weight", "source",
                                        "overlap", "n_labelled", "n_relevant", "valid"]
    assert list(ts.qrels.columns) == ["query_id", "chunk_id", "grade"] and ts.qrels["grade"].dtype == "int8"
    assert ts.qrels.values.tolist() == [["q001", "doc1#0003", 3], ["q001", "doc1#0004", 1], ["q002", "api#0010", 2]]
    assert [list(t) for t in ts.queries["tags"]] == [["frequent"], ["english"], ["no-answer"]]
    assert ts.queries["n_relevant"].tolist() == [2, 1, 0] and ts.queries["valid"].tolist() == [True, True, False]


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(range(len(NASTY))), min_size=1, max_size=5, unique=True))
def test_subset_and_round_trips_keep_the_hash(tmp_path, picks):
    ts = TestSet.from_records(NASTY)
    ids = [NASTY[i]["query_id"] for i in picks]
    sub = ts.subset(ids)
    assert sub.hash == reference_hash([r for r in ts.records() if r["query_id"] in ids])
    sub.to_jsonl(tmp_path / "s.jsonl")
    assert load_testset(tmp_path / "s.jsonl").hash == sub.hash == TestSet.from_records(sub.records()).hash


def test_hash_of_frames_whose_labels_are_not_grouped_by_query():
    ts = TestSet.from_records(NASTY + GOOD)
    shuffled = TestSet(queries=ts.queries, qrels=ts.qrels.sample(frac=1, random_state=3).reset_index(drop=True))
    assert shuffled.qrels["query_id"].tolist() != ts.qrels["query_id"].tolist()
    assert shuffled.hash == ts.hash == reference_hash(ts.records())


def test_csv_unterminated_quote_in_a_big_file_is_named_where_it_opens(tmp_path):
    """The open field reaches csv's field size limit long before the end of the file."""
    path = tmp_path / "t.csv"
    rows = "".join(f"q{i},question number {i},c{i}:1\n" for i in range(3, 20_000))
    path.write_text(f'query_id,query,relevant\nq1,x,a:1\nq2,"never closed,b:1\n{rows}', encoding="utf-8")
    p = only(problems_of(path))
    assert p.line == 3 and "column 2" in p.message and "closing quote" in p.message


# ---------------------------------------------------------------- traffic weights (docs/method.md section 10)

def test_weight_is_kept_out_of_the_hash_and_round_trips(tmp_path):
    recs = [{"query_id": "a", "query": "x", "relevant": {"c": 1}, "weight": 12},
            {"query_id": "b", "query": "y", "relevant": {}}]
    ts = TestSet.from_records(recs)
    assert ts.queries["weight"].iloc[0] == 12 and ts.queries["weight"].isna().tolist() == [False, True]
    assert ts.hash == TestSet.from_records([{k: v for k, v in r.items() if k != "weight"} for r in recs]).hash
    ts.to_jsonl(tmp_path / "t.jsonl")
    back = load_testset(tmp_path / "t.jsonl")
    assert back.records()[0]["weight"] == 12 and back.records()[1]["weight"] is None


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "7", [1]])
def test_a_bad_weight_names_line_and_field(tmp_path, bad):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"query_id": "a", "query": "x", "relevant": {}, "weight": bad}) + "\n", encoding="utf-8")
    with pytest.raises(TestSetError, match=r"line 1, field 'weight': must be an integer >= 1"):
        load_testset(p)
