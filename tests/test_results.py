"""Results table: read/write in every format, validation messages, TREC run files."""

from __future__ import annotations

import pandas as pd
import pytest

from weknora_nb import ResultsError, read_results, read_trec_run, score, write_results, write_trec_run
from weknora_nb.core.testset import TestSet

from .conftest import failed, ranked, results_frame

TS = TestSet.from_records([
    {"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 2, "C": 1}},
    {"query_id": "q2", "query": "b", "relevant": {"A": 1}},
    {"query_id": "q3", "query": "c", "relevant": {"A": 1}},
])


def sample():
    df = results_frame(ranked("q1", ["X", "B", "A", "Y", "C"]) + ranked("q2", []) + failed("q3", "timeout"))
    df["latency_ms"] = 12.5
    df["knowledge_id"] = "k1"
    df["chunk_index"] = pd.array([3, 1, 0, 7, 2, None, None], dtype="Int64")
    df["match_type"] = pd.array([0, 1, 0, 0, 1, None, None], dtype="Int64")
    return df


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_round_trip_every_format_scores_the_same(tmp_path, suffix):
    df = sample()
    path = write_results(df, tmp_path / f"r{suffix}")
    back = read_results(path)
    assert len(back) == len(df)
    a = score(TS, df, ["ndcg@5", "recall@3"]).to_json_dict()
    b = score(TS, back, ["ndcg@5", "recall@3"]).to_json_dict()
    assert a["summary"] == b["summary"] and a["counts"] == b["counts"]
    assert b["counts"]["failed_by_kind"] == {"timeout": 1}
    assert back["chunk_index"].dropna().tolist() == [3, 1, 0, 7, 2]


def test_write_is_atomic_and_leaves_no_temp_file(tmp_path):
    write_results(sample(), tmp_path / "r.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]
    with pytest.raises(ValueError):
        write_results(sample(), tmp_path / "r.xlsx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]


def test_status_defaults_to_ok(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("query_id,stage,repeat,rank,chunk_id,score\nq2,final,1,1,A,0.9\n")
    df = read_results(path)
    assert df["status"].tolist() == ["ok"]
    assert score(TS, df, ["hit@1"]).per_query.iloc[0]["hit@1"] == 1.0


@pytest.mark.parametrize("body, line, field, fragment", [
    ("q1,final,1,0,A,0.9\n", 2, "rank", ">= 1"),
    ("q1,final,1,x,A,0.9\n", 2, "rank", "integer"),
    ("q1,final,1,1.5,A,0.9\n", 2, "rank", "integer"),
    ("q1,final,0,1,A,0.9\n", 2, "repeat", ">= 1"),
    (",final,1,1,A,0.9\n", 2, "query_id", "empty"),
    ("q1,,1,1,A,0.9\n", 2, "stage", "empty"),
    ("q1,final,1,1,A,high\n", 2, "score", "number"),
    ("q1,final,1,,A,0.9\n", 2, "rank", "empty for a returned chunk"),
])
def test_csv_problems_name_the_line_and_field(tmp_path, body, line, field, fragment):
    path = tmp_path / "bad.csv"
    path.write_text("query_id,stage,repeat,rank,chunk_id,score\n" + body)
    with pytest.raises(ResultsError) as err:
        read_results(path)
    p = err.value.problems[0]
    assert (p.line, p.field) == (line, field), str(err.value)
    assert fragment in p.message and str(path) in str(err.value)


def test_failed_request_must_not_carry_a_chunk(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"query_id":"q1","stage":"final","repeat":1,"rank":1,"chunk_id":"A","score":1,"status":"server"}\n')
    with pytest.raises(ResultsError) as err:
        read_results(path)
    assert (err.value.problems[0].line, err.value.problems[0].field) == (1, "chunk_id")


def test_missing_columns(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("query_id,chunk_id\nq1,A\n")
    with pytest.raises(ResultsError, match="missing column"):
        read_results(path)


def test_rank_twice_in_one_request_is_refused():
    df = results_frame([("q1", "final", 1, 1, "A", 1.0), ("q1", "final", 1, 1, "B", 1.0)])
    with pytest.raises(ResultsError) as err:
        score(TS, df, source="run.parquet")
    assert "rank 1 appears twice" in str(err.value) and err.value.problems[0].line == 2


def test_one_request_with_two_statuses_is_refused():
    df = results_frame(ranked("q1", ["A"]) + failed("q1", "server"))
    with pytest.raises(ResultsError, match="different statuses"):
        score(TS, df)


def test_trec_run_round_trip_keeps_returned_order(tmp_path):
    df = results_frame([("q1", "final", 1, i + 1, c, 0.5) for i, c in enumerate(["X", "B", "A", "Y", "C"])]
                       + failed("q3", "server"))
    n = write_trec_run(df, tmp_path / "run.txt", tag="mine")
    assert n == 5
    lines = (tmp_path / "run.txt").read_text().splitlines()
    assert lines[0] == "q1 Q0 X 1 5.000000 mine"
    back = read_trec_run(tmp_path / "run.txt", stage="final")
    a = score(TS.subset(["q1"]), df[df["query_id"] == "q1"], ["ndcg@5"]).per_query["ndcg@5"].tolist()
    b = score(TS.subset(["q1"]), back, ["ndcg@5"]).per_query["ndcg@5"].tolist()
    assert a == b == pytest.approx([0.615328], abs=1e-6)


def test_trec_run_errors_name_the_line(tmp_path):
    (tmp_path / "run.txt").write_text("q1 Q0 A 1 1.0 t\nq1 Q0 B two 1.0 t\nq1 Q0 C 3\n")
    with pytest.raises(ResultsError) as err:
        read_trec_run(tmp_path / "run.txt")
    assert [(p.line, p.field) for p in err.value.problems] == [(2, "rank"), (3, None)]


def test_trec_export_needs_a_stage_when_several(tmp_path):
    df = results_frame(ranked("q1", ["A"], stage="a") + ranked("q1", ["A"], stage="b"))
    with pytest.raises(ValueError, match="several stages"):
        write_trec_run(df, tmp_path / "x")
    with pytest.raises(ValueError, match="score_mode"):
        write_trec_run(df, tmp_path / "x", stage="a", score_mode="raw")
