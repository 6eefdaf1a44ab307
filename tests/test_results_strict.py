"""Results files that are empty, damaged or of the wrong types: the package's error naming the file, the
row and the field (never a raw traceback), and results that hold nothing to score marked incomplete."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from weknora_nb import cli
from weknora_nb.core.errors import ResultsError
from weknora_nb.core.results import (
    ResultCodes,
    read_results,
    read_results_for_scoring,
    read_trec_run,
    write_results,
)
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet

from .conftest import ranked, results_frame

TS = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 1}},
                           {"query_id": "q2", "query": "b", "relevant": {"A": 1}}])
HEADER = "query_id,stage,repeat,rank,chunk_id,score\n"
READERS = {"read_results": read_results, "read_results_for_scoring": read_results_for_scoring,
           "score": lambda p: score(TS, p, ["hit@1"])}


def problem_of(err: ResultsError, field: str | None):
    """The first problem of ``err`` about ``field``."""
    found = [p for p in err.problems if p.field == field]
    assert found, str(err)
    return found[0]


# ---------------------------------------------------------------- finding 1: nothing to score is incomplete

def test_a_header_only_csv_is_incomplete_with_the_reason(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text(HEADER)
    sc = score(TS, path, ["hit@1"])
    assert not sc.complete and not sc.counts.complete
    assert sc.counts.incomplete_reason == "the results file has no rows"
    out = sc.to_json_dict()
    assert out["complete"] is False and out["incomplete_reason"] == "the results file has no rows"
    assert any("the results file has no rows" in w for w in sc.warnings)


def test_a_parquet_file_with_the_schema_but_no_rows_is_incomplete(tmp_path):
    path = write_results(results_frame(ranked("q1", ["A"])).iloc[:0], tmp_path / "r.parquet")
    assert pq.read_metadata(path).num_rows == 0 and "rank" in pq.read_schema(path).names
    sc = score(TS, path, ["hit@1"])
    assert sc.complete is False and sc.counts.incomplete_reason == "the results file has no rows"


def test_results_of_no_query_of_the_test_set_say_so(tmp_path):
    path = write_results(results_frame(ranked("zz", ["A"]) + ranked("yy", ["B"])), tmp_path / "r.parquet")
    sc = score(TS, path, ["hit@1"])
    assert sc.complete is False
    assert sc.counts.incomplete_reason == "no row belongs to a query of the test set"
    assert sc.to_json_dict()["incomplete_reason"] == "no row belongs to a query of the test set"
    # also when the test set has no valid query (no missing request can be counted then)
    invalid_only = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 0}}])
    sc = score(invalid_only, path, ["hit@1"])
    assert sc.counts.n_missing == 0 and sc.complete is False
    assert sc.counts.incomplete_reason == "no row belongs to a query of the test set"


def test_a_complete_run_has_no_reason_and_a_partial_one_counts_its_requests(tmp_path):
    full = score(TS, results_frame(ranked("q1", ["A"]) + ranked("q2", ["A"])), ["hit@1"])
    assert full.complete and full.counts.incomplete_reason is None
    assert full.to_json_dict()["incomplete_reason"] is None
    part = score(TS, results_frame(ranked("q1", ["A"])), ["hit@1"])
    assert part.counts.incomplete_reason == "0 failed, 1 missing and 0 unknown-query requests"


def test_the_cli_json_of_a_header_only_file_says_incomplete(tmp_path, capsys):
    TS.to_jsonl(tmp_path / "t.jsonl")
    (tmp_path / "r.csv").write_text(HEADER)
    assert cli.main(["score", str(tmp_path / "t.jsonl"), str(tmp_path / "r.csv"), "--json"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["complete"] is False and out["incomplete_reason"] == "the results file has no rows"
    assert captured.err.strip() == "error: nothing was scored: the results file has no rows"


# ---------------------------------------------------------------- finding 2: damaged files, wrong types

def parquet_bytes(tmp_path) -> bytes:
    path = write_results(results_frame(ranked("q1", ["A", "B", "C"]) + ranked("q2", ["A"])), tmp_path / "g.parquet")
    return path.read_bytes()


def damaged(tmp_path, kind: str):
    """A damaged results file of ``kind``."""
    if kind == "empty parquet":
        (p := tmp_path / "r.parquet").write_bytes(b"")
    elif kind == "truncated parquet":
        data = parquet_bytes(tmp_path)
        (p := tmp_path / "r.parquet").write_bytes(data[: len(data) // 2])
    elif kind == "parquet footer only":
        (p := tmp_path / "r.parquet").write_bytes(parquet_bytes(tmp_path)[-200:])
    elif kind == "empty csv":
        (p := tmp_path / "r.csv").write_bytes(b"")
    elif kind == "truncated csv":
        (p := tmp_path / "r.csv").write_bytes((HEADER + 'q1,final,1,1,"A').encode())
    elif kind == "csv not utf-8":
        (p := tmp_path / "r.csv").write_bytes((HEADER + "q1,final,1,1,A,1\n").encode() + b"q\xff\xfe,final,1,2,B,1\n")
    elif kind == "folder .parquet":
        (p := tmp_path / "r.parquet").mkdir()
    elif kind == "folder .csv":
        (p := tmp_path / "r.csv").mkdir()
    else:
        raise AssertionError(kind)
    return p


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("kind", ["empty parquet", "truncated parquet", "parquet footer only", "empty csv",
                                  "truncated csv", "csv not utf-8", "folder .parquet", "folder .csv"])
def test_a_damaged_file_is_a_results_error_naming_it(tmp_path, kind, reader):
    path = damaged(tmp_path, kind)
    with pytest.raises(ResultsError) as err:
        READERS[reader](path)
    assert str(path) in str(err.value) and err.value.path == str(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="running as root: file permissions do not stop reads")
@pytest.mark.parametrize("name", ["r.parquet", "r.csv", "r.jsonl"])
def test_an_unreadable_file_is_a_results_error(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"x")
    path.chmod(0)
    try:
        for read in READERS.values():
            with pytest.raises(ResultsError, match="Permission denied"):
                read(path)
    finally:
        path.chmod(0o600)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("name", ["r.parquet", "r.csv", "r.jsonl", "run.txt"])
def test_a_file_whose_read_fails_is_a_results_error(tmp_path, name):
    """A read that fails in the kernel (EIO: /proc/self/mem at offset 0 is not mapped), as root too."""
    path = tmp_path / name
    path.symlink_to("/proc/self/mem")
    readers = [read_trec_run] if name == "run.txt" else list(READERS.values())
    for read in readers:
        with pytest.raises(ResultsError) as err:
            read(path)
        assert str(path) in str(err.value)


def table(**columns) -> pa.Table:
    """A one-request results table (two rows of q1) with some columns replaced."""
    base = {"query_id": ["q1", "q1"], "stage": ["final", "final"], "repeat": [1, 1], "rank": [1, 2],
            "chunk_id": ["A", "B"], "score": [1.0, 0.5]}
    base.update(columns)
    return pa.table(base)


WRONG_TYPES = [
    # (columns, field, row of the first problem, fragment of the message)
    ({"rank": ["1", "two"]}, "rank", 2, "integer"),
    ({"rank": [[1], [2]]}, "rank", 1, "integer"),
    ({"rank": [1.0, 1e20]}, "rank", 2, "integer"),
    ({"rank": [1.0, float("inf")]}, "rank", 2, "integer"),
    ({"rank": [float("-inf"), 2.0]}, "rank", 1, "integer"),
    ({"rank": [1.0, 2.5]}, "rank", 2, "integer"),
    ({"rank": [-1.0, 2.0]}, "rank", 1, ">= 1"),
    ({"rank": [1.0, float("nan")]}, "rank", 2, "empty for a returned chunk"),
    ({"rank": pa.array([1, 2**63 + 5], pa.uint64())}, "rank", 2, "integer"),
    ({"repeat": pa.array([2**64 - 1, 1], pa.uint64())}, "repeat", 1, "integer"),
    ({"repeat": pa.array([1.0, 9.3e18])}, "repeat", 2, "integer"),
    ({"rank": [True, False]}, "rank", 1, "integer"),
    ({"chunk_id": [{"a": 1}, {"a": 2}]}, "chunk_id", 1, "text"),
    ({"chunk_id": [b"A", b"B"]}, "chunk_id", 1, "text"),
    ({"query_id": [["q1"], ["q1"]]}, "query_id", 1, "text"),
    ({"stage": [1.5, 1.5]}, "stage", 1, "text"),
    ({"score": [{"x": 1}, {"x": 2}]}, "score", 1, "number"),
    ({"chunk_index": ["x", "1"]}, "chunk_index", 1, "integer"),
    ({"latency_ms": [[1.0], [2.0]]}, "latency_ms", 1, "number"),
]


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("columns, field, row, fragment", WRONG_TYPES)
def test_a_parquet_column_of_the_wrong_type_names_the_row_and_field(tmp_path, reader, columns, field, row,
                                                                     fragment):
    path = tmp_path / "r.parquet"
    pq.write_table(table(**columns), path)
    with pytest.raises(ResultsError) as err:
        READERS[reader](path)
    p = problem_of(err.value, field)
    assert (p.line, p.where) == (row, "row") and fragment in p.message, str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("value, fragment", [("1e20", "integer"), ("inf", "integer"), ("-inf", "integer"),
                                             ("nan", "integer"), ("-1", ">= 1"), ("1.5", "integer"),
                                             ("99999999999999999999", "integer"), ("0x1", "integer")])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_rank_that_is_not_an_int64_names_the_line(tmp_path, value, fragment, suffix):
    path = tmp_path / f"r{suffix}"
    if suffix == ".csv":
        path.write_text(HEADER + f"q1,final,1,1,A,1\nq1,final,1,{value},B,1\n")
        line, where = 3, "line"
    else:
        rank = value if value.lstrip("-").replace(".", "").isdigit() or "e" in value else json.dumps(value)
        rows = ['{"query_id": "q1", "stage": "final", "repeat": 1, "rank": 1, "chunk_id": "A", "score": 1}',
                f'{{"query_id": "q1", "stage": "final", "repeat": 1, "rank": {rank}, "chunk_id": "B", "score": 1}}']
        path.write_text("\n".join(rows) + "\n")
        line, where = 2, "row"
    for read in READERS.values():
        with pytest.raises(ResultsError) as err:
            read(path)
        p = problem_of(err.value, "rank")
        assert (p.line, p.where) == (line, where) and fragment in p.message, str(err.value)


def test_a_bad_value_is_reported_once_per_field():
    """A rank that is not an integer is not reported a second time as an empty rank."""
    path_rows = pd.DataFrame({"query_id": ["q1"], "stage": ["final"], "repeat": [1], "rank": ["x"],
                              "chunk_id": ["A"], "score": [1.0]})
    from weknora_nb.core.results import _coerce, validate_results
    problems: list = []
    df = _coerce(path_rows, "<t>", problems)
    with pytest.raises(ResultsError) as err:
        validate_results(df, "<t>", problems=problems)
    assert [(p.line, p.field) for p in err.value.problems] == [(1, "rank")]


def test_a_column_given_twice_is_named(tmp_path):
    t = pa.Table.from_arrays([pa.array(["q1"]), pa.array(["final"]), pa.array([1]), pa.array([1]), pa.array([2]),
                              pa.array(["A"]), pa.array([1.0])],
                             names=["query_id", "stage", "repeat", "rank", "rank", "chunk_id", "score"])
    pq.write_table(t, tmp_path / "r.parquet")
    (tmp_path / "r.csv").write_text("query_id,stage,repeat,rank,rank,chunk_id,score\nq1,final,1,1,2,A,1\n")
    for name in ("r.parquet", "r.csv"):
        for read in READERS.values():
            with pytest.raises(ResultsError) as err:
                read(tmp_path / name)
            assert "rank" in str(err.value) and "more than once" in str(err.value)


def test_the_fast_path_declines_types_it_cannot_take():
    assert ResultCodes.from_arrow(table(rank=pa.array([1, 2], pa.uint64()))) is None
    assert ResultCodes.from_arrow(table(rank=[1.0, 2.0])) is None
    assert ResultCodes.from_arrow(table(chunk_id=[b"A", b"B"])) is None
    assert ResultCodes.from_arrow(table(rank=pa.array([1, 2], pa.int32()))) is not None


def test_integer_ids_are_read_as_their_text(tmp_path):
    """An id column written as integers is not a mistake: the ids are their decimal text."""
    ts = TestSet.from_records([{"query_id": "7", "query": "a", "relevant": {"11": 1}}])
    path = tmp_path / "r.parquet"
    pq.write_table(table(query_id=[7, 7], chunk_id=[11, 12]), path)
    assert read_results(path)["chunk_id"].astype(str).tolist() == ["11", "12"]
    assert score(ts, path, ["hit@1"]).per_query["hit@1"].tolist() == [1.0]


def test_a_huge_integer_rank_is_an_integer(tmp_path):
    path = tmp_path / "r.parquet"
    pq.write_table(table(rank=pa.array([1, 2**62], pa.int64())), path)
    for read in (read_results, read_results_for_scoring):
        got = read(path)
        ranks = got["rank"].tolist() if isinstance(got, pd.DataFrame) else got.rank.tolist()
        assert ranks == [1, 2**62]
    assert score(TS, path, ["hit@1"]).counts.n_scored == 1


# ---------------------------------------------------------------- TREC run files

@pytest.mark.parametrize("body, line, field, fragment", [
    ("q1 Q0 A 1 1 t\nq1 Q0 B 99999999999999999999 1 t\n", 2, "rank", "integer"),
    ("q1 Q0 A 1 1 t\n\nq1 Q0 B 0 1 t\n", 3, "rank", ">= 1"),
    ("q1 Q0 A -3 1 t\n", 1, "rank", ">= 1"),
])
def test_a_trec_rank_out_of_range_names_the_line(tmp_path, body, line, field, fragment):
    (tmp_path / "run.txt").write_text(body)
    with pytest.raises(ResultsError) as err:
        read_trec_run(tmp_path / "run.txt")
    p = err.value.problems[0]
    assert (p.line, p.field) == (line, field) and fragment in p.message, str(err.value)


def test_a_trec_file_that_is_a_folder_or_not_utf8_is_a_results_error(tmp_path):
    (tmp_path / "d.txt").mkdir()
    (tmp_path / "bad.txt").write_bytes(b"q1 Q0 A 1 1 t\n\xff\xfe Q0 B 2 1 t\n")
    for name in ("d.txt", "bad.txt"):
        with pytest.raises(ResultsError) as err:
            read_trec_run(tmp_path / name)
        assert str(tmp_path / name) in str(err.value)
    assert "UTF-8" in str(err.value)


def test_an_empty_trec_file_scores_as_no_rows(tmp_path):
    (tmp_path / "run.txt").write_text("")
    sc = score(TS, read_trec_run(tmp_path / "run.txt"), ["hit@1"])
    assert sc.complete is False and sc.counts.incomplete_reason == "the results file has no rows"


def test_a_missing_file_is_still_file_not_found(tmp_path):
    for read in (read_results, read_results_for_scoring, read_trec_run):
        with pytest.raises(FileNotFoundError, match="not found"):
            read(tmp_path / "none.parquet")


def test_nan_scores_and_latencies_are_not_problems(tmp_path):
    df = results_frame(ranked("q1", ["A", "B"]))
    df["score"] = [np.nan, 0.5]
    df["latency_ms"] = [np.nan, 3.0]
    for suffix in (".parquet", ".csv", ".jsonl"):
        path = write_results(df, tmp_path / f"r{suffix}")
        assert score(TS, path, ["hit@1"]).counts.n_scored == 1
