"""Test-set loading, validation (every rule names file, line and field), hashing, export."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from weknora_nb import TestSetError, load_testset, load_trec_qrels
from weknora_nb.core.testset import TestSet

GOOD = [
    {"query_id": "q001", "query": "如何重置管理员密码？", "relevant": {"doc1#0003": 3, "doc1#0004": 1},
     "query_type": "procedural", "tags": ["frequent"], "answer": "在用户管理页点击重置密码。"},
    {"query_id": "q002", "query": "What does DG-1003 mean?", "relevant": {"api#0010": 2}, "tags": ["english"]},
    {"query_id": "q003", "query": "公司有健身补贴吗", "relevant": {}, "tags": ["no-answer"]},
]


def write_jsonl(path, objs, *, bom=False, raw_lines=()):
    text = "\n".join([json.dumps(o, ensure_ascii=False) for o in objs] + list(raw_lines)) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def problems_of(path):
    with pytest.raises(TestSetError) as err:
        load_testset(path)
    return err.value


def test_loads_canonical_jsonl_with_bom(tmp_path):
    ts = load_testset(write_jsonl(tmp_path / "t.jsonl", GOOD, bom=True))
    assert len(ts) == 3 and ts.n_valid == 2 and ts.invalid_ids == ["q003"]
    assert ts.qrels.shape == (3, 3)
    assert ts.queries.set_index("query_id").loc["q001", "query_type"] == "procedural"
    assert not ts.significant


@pytest.mark.parametrize("record, line_field, fragment", [
    ({"query_id": "q9", "query": "  ", "relevant": {"a": 1}}, "query", "must not be empty"),
    ({"query_id": "", "query": "x", "relevant": {"a": 1}}, "query_id", "must not be empty"),
    ({"query": "x", "relevant": {"a": 1}}, "query_id", "missing"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": 4}}, "relevant", "integer 0-3"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": -1}}, "relevant", "integer 0-3"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": 1.5}}, "relevant", "integer 0-3"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": "2"}}, "relevant", "integer 0-3"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": True}}, "relevant", "integer 0-3"),
    ({"query_id": "q9", "query": "x", "relevant": {" ": 1}}, "relevant", "non-empty string"),
    ({"query_id": "q9", "query": "x"}, "relevant", "missing"),
    ({"query_id": "q9", "query": "x", "relevant": ["a"]}, "relevant", "must be an object"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": 1}, "tags": "long-tail"}, "tags", "list"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": 1}, "query_type": ""}, "query_type", "non-empty"),
    ({"query_id": "q9", "query": "x", "relevant": {"a": 1}, "answer": 3}, "answer", "string"),
])
def test_each_rule_names_file_line_and_field(tmp_path, record, line_field, fragment):
    path = write_jsonl(tmp_path / "bad.jsonl", GOOD + [record])
    err = problems_of(path)
    assert len(err.problems) == 1
    p = err.problems[0]
    assert (p.path, p.line, p.field) == (str(path), 4, line_field)
    assert fragment in p.message
    assert f"{path}, line 4, field '{line_field}'" in str(err)


def test_duplicate_ids_name_both_lines(tmp_path):
    err = problems_of(write_jsonl(tmp_path / "d.jsonl", GOOD + [dict(GOOD[0])]))
    p = err.problems[0]
    assert p.line == 4 and p.field == "query_id" and "first at line 1" in p.message


def test_all_problems_are_reported_at_once(tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", GOOD + [
        {"query_id": "a", "query": "", "relevant": {"x": 9}},
        {"query_id": "b", "query": "ok", "relevant": {"x": 1}},
    ], raw_lines=["{not json", "[1, 2]"])
    err = problems_of(path)
    lines = sorted((p.line, p.field) for p in err.problems)
    assert lines == [(4, "query"), (4, "relevant"), (6, None), (7, None)]
    assert "4 problem(s)" in str(err)


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(GOOD[0]).encode() + b"\n" + '{"query_id": "q2", "query": "caf\xe9"}'.encode("latin-1"))
    err = problems_of(path)
    assert err.problems[0].line == 2 and "UTF-8" in err.problems[0].message


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert "no query" in str(problems_of(path))


def test_unsupported_format(tmp_path):
    path = tmp_path / "t.xlsx"
    path.write_text("x")
    assert "unsupported" in str(problems_of(path))


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        load_testset("/nonexistent/t.jsonl")


def test_csv_both_relevant_syntaxes_and_line_numbers(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "query_id,query,relevant,query_type,tags\n"
        'q001,如何重置管理员密码？,"{""doc1#0003"": 3, ""doc1#0004"": 1}",procedural,frequent\n'
        "q002,What does DG-1003 mean?,api#0010:2,,english\n"
        "q003,公司有健身补贴吗,,,no-answer\n", encoding="utf-8-sig")
    ts = load_testset(path)
    assert ts.hash == TestSet.from_records([{k: v for k, v in r.items() if k != "answer"} for r in GOOD]).hash
    bad = tmp_path / "bad.csv"
    bad.write_text("query_id,query,relevant\nq1,x,a:1\nq2,y,a:9;b\n", encoding="utf-8")
    err = problems_of(bad)
    assert (err.problems[0].line, err.problems[0].field) == (3, "relevant")


def test_csv_missing_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,text\n1,x\n")
    assert "missing column" in str(problems_of(path))


def test_parquet_rows(tmp_path):
    df = pd.DataFrame({
        "query_id": ["q1", "q2"], "query": ["a", "b"],
        "relevant": ['{"c1": 3}', '{"c2": 7}'], "tags": [["x"], None],
    })
    path = tmp_path / "t.parquet"
    df.to_parquet(path)
    err = problems_of(path)
    assert (err.problems[0].line, err.problems[0].field, err.problems[0].where) == (2, "relevant", "row")
    df["relevant"] = ['{"c1": 3}', "c2:1"]
    df.to_parquet(path)
    ts = load_testset(path)
    assert ts.qrels["chunk_id"].tolist() == ["c1", "c2"]


def weknora_folder(tmp_path, *, qrels=None, answers=True):
    d = tmp_path / "ds"
    d.mkdir()
    pd.DataFrame({"id": ["1", "2"], "text": ["什么是 DataGate？", "How to rotate keys?"]}).to_parquet(
        d / "queries.parquet")
    pd.DataFrame(qrels or {"qid": ["1", "1", "2"], "pid": ["p1", "p2", "p9"], "score": [1, 1, 2]}).to_parquet(
        d / "qrels.parquet")
    pd.DataFrame({"id": ["p1"], "text": ["corpus text"]}).to_parquet(d / "corpus.parquet")
    if answers:
        pd.DataFrame({"id": [7], "text": ["An API gateway."]}).to_parquet(d / "answers.parquet")
        pd.DataFrame({"qid": ["1"], "aid": [7]}).to_parquet(d / "qas.parquet")
    return d


def test_weknora_dataset_folder(tmp_path):
    ts = load_testset(weknora_folder(tmp_path))
    assert ts.queries["query_id"].tolist() == ["1", "2"]
    assert ts.queries["answer"].tolist()[0] == "An API gateway."
    assert dict(zip(ts.qrels["chunk_id"], ts.qrels["grade"], strict=True)) == {"p1": 1, "p2": 1, "p9": 2}


def test_weknora_dataset_folder_errors_name_the_file_and_row(tmp_path):
    d = weknora_folder(tmp_path, qrels={"qid": ["1", "5"], "pid": ["p1", "p2"], "score": [1, 4]})
    err = problems_of(d)
    found = {(p.path.split("/")[-1], p.line, p.field) for p in err.problems}
    assert ("qrels.parquet", 2, "qid") in found
    (d / "queries.parquet").unlink()
    assert "required file is missing" in str(problems_of(d))


def test_weknora_dataset_format_sample():
    """tests/data/weknora-dataset-format: WeKnora's dataset schema, as its own sample has it."""
    import pathlib
    sample = pathlib.Path(__file__).resolve().parent / "data" / "weknora-dataset-format"
    ts = load_testset(sample)
    assert len(ts) == 1 and ts.n_valid == 1 and len(ts.qrels) == 4
    assert ts.qrels["grade"].tolist() == [1, 1, 1, 1]
    assert ts.queries["answer"].iloc[0].startswith("常见的关系型数据库有")


def test_hash_is_stable_across_order_format_and_answers(tmp_path):
    a = TestSet.from_records(GOOD)
    b = TestSet.from_records(list(reversed([dict(r, answer="changed") for r in GOOD])))
    assert a.hash == b.hash and a.hash.startswith("sha256:")
    c = TestSet.from_records([GOOD[0], dict(GOOD[1], relevant={"api#0010": 1}), GOOD[2]])
    assert c.hash != a.hash
    path = tmp_path / "round.jsonl"
    a.to_jsonl(path)
    assert load_testset(path).hash == a.hash


def test_trec_qrels_round_trip(tmp_path):
    ts = TestSet.from_records(GOOD)
    ts.to_trec_qrels(tmp_path / "q.qrels", tmp_path / "topics.tsv")
    assert (tmp_path / "q.qrels").read_text().splitlines()[0] == "q001 0 doc1#0003 3"
    back = load_trec_qrels(tmp_path / "q.qrels", tmp_path / "topics.tsv")
    assert back.hash == TestSet.from_records([{k: r[k] for k in ("query_id", "query", "relevant")} for r in GOOD]).hash


def test_trec_qrels_errors(tmp_path):
    (tmp_path / "topics.tsv").write_text("q1\tfirst\n")
    (tmp_path / "q.qrels").write_text("q1 0 a 1\nq2 0 b 1\nq1 0 c\nq1 0 d 5\n")
    with pytest.raises(TestSetError) as err:
        load_trec_qrels(tmp_path / "q.qrels", tmp_path / "topics.tsv")
    got = [(p.line, p.field) for p in err.value.problems]
    assert (2, "query_id") in got and (3, None) in got
    assert len(err.value.problems) == 3  # grade 5 is reported as well
    assert any("integer 0-3" in p.message for p in err.value.problems)


def test_trec_export_refuses_whitespace_ids(tmp_path):
    ts = TestSet.from_records([{"query_id": "q 1", "query": "x", "relevant": {"a": 1}}])
    with pytest.raises(ValueError, match="whitespace"):
        ts.to_trec_qrels(tmp_path / "x.qrels")


def test_subset_keeps_order():
    ts = TestSet.from_records(GOOD)
    assert ts.subset(["q003", "q001"]).queries["query_id"].tolist() == ["q001", "q003"]


def test_label_rows_are_each_labels_query_whatever_the_loader(tmp_path):
    """:attr:`TestSet.label_rows` as the builder records them (each query's labels follow in query order)
    are the rows a lookup of each label's query id finds, for every loader and both paths of the JSONL
    reader (a block at once; line by line, where a lone \\r sends the block)."""
    recs = [{k: r[k] for k in ("query_id", "query", "relevant")} for r in GOOD] + [
        {"query_id": f"x{i}", "query": "y", "relevant": {f"c{j}": j % 4 for j in range(i % 5)}} for i in range(40)]
    jsonl = write_jsonl(tmp_path / "t.jsonl", recs)
    lone_cr = tmp_path / "cr.jsonl"
    lone_cr.write_bytes(jsonl.read_bytes().replace(b"\n", b"\r", 3))
    rows = [{"query_id": r["query_id"], "query": r["query"], "relevant": json.dumps(r["relevant"])} for r in recs]
    csv, text_pq, map_pq = tmp_path / "t.csv", tmp_path / "text.parquet", tmp_path / "map.parquet"
    pd.DataFrame(rows).to_csv(csv, index=False)
    pd.DataFrame(rows).to_parquet(text_pq)
    pq.write_table(pa.Table.from_pylist([{**r, "relevant": list(json.loads(r["relevant"]).items())} for r in rows],
                                        pa.schema([("query_id", pa.string()), ("query", pa.string()),
                                                   ("relevant", pa.map_(pa.string(), pa.int64()))])), map_pq)
    loaded = [TestSet.from_records(recs), *map(load_testset, (jsonl, lone_cr, csv, text_pq, map_pq))]
    loaded[0].to_trec_qrels(tmp_path / "q.qrels", tmp_path / "topics.tsv")
    loaded.append(load_trec_qrels(tmp_path / "q.qrels", tmp_path / "topics.tsv"))
    for ts in loaded:
        assert ts.hash == loaded[0].hash
    dataset = load_testset(Path(__file__).resolve().parent / "data" / "weknora-dataset-format")
    for ts in [*loaded, dataset]:
        looked_up = TestSet(ts.queries, ts.qrels).label_rows   # frames given by hand: found by id
        assert ts.label_rows.tolist() == looked_up.tolist() and len(looked_up) == len(ts.qrels)
        assert not ts.label_rows.flags.writeable
