"""Every way into the scorer gives the same figures.

``score(testset, path)`` reads a Parquet file straight into integer codes (no pandas
table); ``score(testset, frame)`` starts from :func:`read_results`. Rows may come in any
order, in many row groups (one dictionary each), with constant columns taken from the
file's statistics, and very long lists may be cut by hashing instead of a grid. All of
these must agree to the last bit, and bad rows must be reported with row and field on
the fast path as on the slow one.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weknora_nb import ResultsError, TestSet, UsageError, read_results, score, write_results
from weknora_nb.core import requests, scoring
from weknora_nb.core.results import ResultCodes, read_results_for_scoring

from .conftest import examples, failed, ranked, results_frame
from .test_metrics_reference import random_case

METRICS = ["recall@3", "recall@10", "hit@5", "mrr@20", "ndcg@5", "ndcg@10:linear", "precision@5", "map@10"]


def same_scores(a, b) -> None:
    pd.testing.assert_frame_equal(a.per_query, b.per_query, check_dtype=False)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_dtype=False)
    pd.testing.assert_frame_equal(a.summary, b.summary, check_dtype=False)
    assert a.counts == b.counts and a.warnings == b.warnings


def write_parquet(df: pd.DataFrame, path, row_group_size: int) -> None:
    """As a foreign writer might: plain strings, small row groups (a dictionary per group)."""
    out = df.copy()
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype("string")
    pq.write_table(pa.Table.from_pandas(out, preserve_index=False), path, row_group_size=row_group_size)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), shuffle=st.booleans(),
       group=st.sampled_from([7, 64, 100_000]))
def test_parquet_fast_path_matches_the_frame_path(tmp_path_factory, seed, shuffle, group):
    ts, res, _, _ = random_case(seed)
    if shuffle:  # rows in any order: requests are regrouped, ranks re-sorted
        res = res.sample(frac=1.0, random_state=seed % 1000).reset_index(drop=True)
    path = tmp_path_factory.mktemp("run") / "results.parquet"
    write_parquet(res, path, group)
    assert isinstance(read_results_for_scoring(path), ResultCodes)
    same_scores(score(ts, path, METRICS), score(ts, read_results(path), METRICS))


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_long_lists_cut_by_hashing_match_the_grid(seed):
    ts, res, _, _ = random_case(seed)
    grid = score(ts, res, METRICS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(requests, "GRID_SLACK", -10**12)  # always the hashing path
        hashed = score(ts, res, METRICS)
    same_scores(grid, hashed)


def test_constant_columns_come_from_the_statistics(tmp_path):
    ts, res, _, _ = random_case(3)
    one = res[(res["stage"] == "final") & (res["repeat"] == 1) & (res["status"] == "ok")].reset_index(drop=True)
    path = write_results(one, tmp_path / "r.parquet")
    meta = pq.read_metadata(path)
    from weknora_nb.core.codes import _constant_column
    assert (_constant_column(meta, "stage"), _constant_column(meta, "repeat"), _constant_column(meta, "status")) \
        == ("final", 1, "ok")
    assert _constant_column(meta, "chunk_id") is None
    same_scores(score(ts, path, METRICS), score(ts, one, METRICS))


def bad_file(tmp_path, **change) -> tuple:
    df = results_frame([("q1", "final", 1, 1, "A", 0.9), ("q1", "final", 1, 2, "B", 0.8),
                        ("q2", "final", 1, 1, "A", 0.7)])
    for (row, col), value in change.get("set", {}).items():
        df[col] = df[col].astype(object)
        df.loc[row, col] = value
    path = tmp_path / "bad.parquet"
    write_parquet(df, path, 2)
    return path


@pytest.mark.parametrize("cell, value, field, fragment", [
    ((1, "rank"), 0, "rank", ">= 1"),
    ((2, "query_id"), " ", "query_id", "empty"),
    ((0, "stage"), "", "stage", "empty"),
    ((2, "repeat"), 0, "repeat", ">= 1"),
    ((1, "status"), "timeout", "chunk_id", "failed request"),
    ((2, "rank"), None, "rank", "empty for a returned chunk"),
])
def test_fast_path_names_the_row_and_field(tmp_path, cell, value, field, fragment):
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}},
                               {"query_id": "q2", "query": "b", "relevant": {"A": 1}}])
    path = bad_file(tmp_path, set={cell: value})
    if field in ("rank", "repeat"):  # keep the column integer-typed so the fast path reads it
        t = pq.read_table(path)
        t = t.set_column(t.column_names.index(field), field, t.column(field).cast(pa.int64()))
        pq.write_table(t, path, row_group_size=2)
    with pytest.raises(ResultsError) as err:
        score(ts, path)
    p = err.value.problems[0]
    assert (p.line, p.field) == (cell[0] + 1, field), str(err.value)
    assert fragment in p.message and str(path) in str(err.value)


def test_a_column_of_the_wrong_type_goes_through_read_results(tmp_path):
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}}])
    df = pd.DataFrame({"query_id": ["q1", "q1"], "stage": "final", "repeat": [1, 1], "rank": ["1", "two"],
                       "chunk_id": ["A", "B"], "score": [1.0, 0.5]})
    path = tmp_path / "r.parquet"
    df.to_parquet(path)
    assert ResultCodes.from_arrow(pq.read_table(path)) is None  # the fast path declines it
    with pytest.raises(ResultsError) as err:
        score(ts, path)
    assert (err.value.problems[0].line, err.value.problems[0].field) == (2, "rank")


def test_merged_results_are_unfolded_on_the_path_too(tmp_path):
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"B": 3}}])
    df = results_frame([("q1", "final", 1, 1, "A", 0.9), ("q1", "final", 1, 2, "C", 0.8)])
    df["sub_chunk_ids"] = pd.array([json.dumps(["B"]), None], dtype="string")
    path = write_results(df, tmp_path / "r.parquet")
    assert not isinstance(read_results_for_scoring(path), ResultCodes)
    a, b = score(ts, path, ["mrr@10"]), score(ts, df, ["mrr@10"])
    assert a.per_query["mrr@10"].tolist() == b.per_query["mrr@10"].tolist() == [0.5]
    assert a.counts.n_sub_chunks_expanded == 1


def test_a_collector_file_without_merged_results_takes_the_fast_path(tmp_path):
    ts, res, _, _ = random_case(5)
    res["sub_chunk_ids"] = pd.array([None if i % 3 else "[]" for i in range(len(res))], dtype="string")
    path = write_results(res, tmp_path / "r.parquet")
    assert isinstance(read_results_for_scoring(path), ResultCodes)
    same_scores(score(ts, path, METRICS), score(ts, read_results(path), METRICS))


def test_empty_and_single_row_files(tmp_path):
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}}])
    one = results_frame([("q1", "final", 1, 1, "A", 0.9)])
    path = write_results(one, tmp_path / "one.parquet")
    assert score(ts, path, ["hit@1"]).per_query["hit@1"].tolist() == [1.0]
    empty = one.iloc[:0]
    path = write_results(empty, tmp_path / "empty.parquet")
    sc = score(ts, path, ["hit@1"])
    assert sc.per_query.empty and sc.summary.empty and sc.counts.n_requests == 0


def test_a_hand_built_table_gets_the_row_checks_too():
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}}])
    df = results_frame([("q1", "final", 1, 1, "A", 0.9), (" ", "final", 1, 1, "B", 0.8)])
    with pytest.raises(ResultsError) as err:
        score(ts, df, source="mine")
    assert [(p.line, p.field) for p in err.value.problems] == [(2, "query_id")]


def three_stages() -> pd.DataFrame:
    return results_frame([("q1", "final", 1, 1, "A", 0.9), ("q1", "vector", 1, 1, "A", 0.9),
                          ("q1", "hybrid", 1, 1, "B", 0.8)])


@pytest.mark.parametrize("asked", [["nosuch"], ["final", "nosuch"], ["nosuch", "vector"]])
def test_a_stage_the_results_do_not_hold_is_refused(tmp_path, asked):
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}}])
    path = write_results(three_stages(), tmp_path / "r.parquet")
    for results in (three_stages(), path):
        with pytest.raises(UsageError) as err:
            score(ts, results, ["hit@1"], stages=asked)
        assert (err.value.argument, err.value.allowed, err.value.got) == ("stage", ["vector", "hybrid", "final"],
                                                                          "nosuch")
        assert str(err.value) == "stage must be one of vector, hybrid, final. Got 'nosuch' instead."


def test_a_stage_without_rows_is_not_held(tmp_path):
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}}])
    df = three_stages()
    df["stage"] = df["stage"].astype("category")
    df = df[df["stage"] != "vector"].reset_index(drop=True)
    assert "vector" in set(df["stage"].cat.categories)  # still in the dictionary, without a row
    path = write_results(df, tmp_path / "r.parquet")
    for results in (df, path):
        with pytest.raises(UsageError) as err:
            score(ts, results, ["hit@1"], stages=["vector"])
        assert (err.value.allowed, err.value.got) == (["hybrid", "final"], "vector")
    sc = score(ts, df, ["hit@1"], stages=["final", "hybrid"])  # stages held: kept in the order asked
    assert sc.stages == ["final", "hybrid"] and sc.counts.stages == ["final", "hybrid"]
    assert sc.summary_wide()["hit@1"].to_dict() == {"final": 1.0, "hybrid": 0.0}


@pytest.mark.parametrize("bad", ["merge", "", "EXPAND", None])
def test_sub_chunks_takes_expand_or_ignore(bad):
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}}])
    with pytest.raises(UsageError) as err:
        score(ts, three_stages(), ["hit@1"], sub_chunks=bad)
    assert (err.value.argument, err.value.allowed, err.value.got) == ("sub_chunks", ["expand", "ignore"], bad)
    assert str(err.value) == f"sub_chunks must be one of expand, ignore. Got {bad!r} instead."
    for ok in ("expand", "ignore"):
        assert score(ts, three_stages(), ["hit@1"], sub_chunks=ok).counts.n_scored == 3


def test_counts_are_typed_frozen_and_complete_follows_from_them():
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}},
                               {"query_id": "q2", "query": "b", "relevant": {"A": 0}}])
    df = results_frame([("q1", "final", 1, 1, "A", 0.9), ("q1", "final", 1, 2, "A", 0.8),
                        ("q2", "final", 1, 1, "A", 0.9), ("q9", "final", 1, 1, "A", 0.9)])
    c = score(ts, df, ["hit@1"]).counts
    assert isinstance(c, scoring.Counts)
    assert c.to_dict() == {
        "n_queries": 2, "n_valid": 1, "n_invalid": 1, "invalid_ids": ["q2"], "n_requests": 3, "n_scored": 1,
        "n_failed": 0, "failed_by_kind": {}, "n_skipped": 0, "skipped_ids": [], "n_missing": 0,
        "n_unknown_query": 1, "n_duplicates_removed": 1,
        "n_sub_chunks_expanded": 0, "stages": ["final"], "repeats": [1], "complete": False}
    assert list(c.to_dict()) == [f.name for f in dataclasses.fields(c)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.n_failed = 0  # type: ignore[misc]
    assert dataclasses.replace(c, n_unknown_query=0).complete
    assert not dataclasses.replace(c, n_unknown_query=0, n_missing=1).complete
    d = c.to_dict()
    d["invalid_ids"].append("x")
    assert c.invalid_ids == ["q2"]  # to_dict is a copy


def test_the_json_summary_is_keyed_by_stage_whatever_the_number_of_stages():
    from weknora_nb.core.testset import TestSet
    ts = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 1}}])
    one = score(ts, three_stages(), ["hit@1", "recall@3"], stages=["final"]).to_json_dict()
    assert one["summary"] == {"final": {"hit@1": 1.0, "recall@3": 1.0}}
    assert one["tiers"] == {"final": {"hit@1": None, "recall@3": "excellent"}}
    three = score(ts, three_stages(), ["hit@1"]).to_json_dict()
    assert three["summary"] == {"vector": {"hit@1": 1.0}, "hybrid": {"hit@1": 0.0}, "final": {"hit@1": 1.0}}
    assert list(three["tiers"]) == ["vector", "hybrid", "final"]
    assert json.loads(json.dumps(one))["counts"] == one["counts"]


def test_codes_made_once_score_as_the_table_they_were_made_from_merged_results_and_all():
    from weknora_nb.core.scoring import result_codes
    from weknora_nb.core.testset import TestSet

    ts = TestSet.from_records([{"query_id": "q1", "query": "x", "relevant": {"c2": 2, "c3": 1}},
                               {"query_id": "q2", "query": "y", "relevant": {"c9": 1}}])
    table = pd.DataFrame({"query_id": ["q1", "q1", "q2"], "stage": "final", "repeat": 1, "rank": [1, 2, 1],
                          "chunk_id": ["c1", "c4", "c9"], "score": [0.9, 0.8, 0.7], "status": "ok",
                          "sub_chunk_ids": ['["c2", "c3"]', None, None]})
    codes = result_codes(table)
    assert codes.unfolded == 2
    same_scores(score(ts, codes, METRICS), score(ts, table, METRICS))
    assert score(ts, codes, METRICS).counts.n_sub_chunks_expanded == 2
    with pytest.raises(UsageError, match="sub_chunks must be"):
        score(ts, codes, METRICS, sub_chunks="ignore")  # unfolded already: the table can be scored that way
    recall = {how: score(ts, table, ["recall@3"], sub_chunks=how).summary_wide().loc["final", "recall@3"]
              for how in ("ignore", "expand")}
    assert recall == {"ignore": 0.5, "expand": 1.0}
    assert score(ts, codes, ["recall@3"]).summary_wide().loc["final", "recall@3"] == 1.0


def test_latency_read_straight_from_parquet_keeps_its_missing_values(tmp_path):
    """A request without a latency (a failed one, a collector that did not time it) reads as NaN on the
    fast path too, never as 0."""
    ts = TestSet.from_records([{"query_id": q, "query": q, "relevant": {"A": 1}} for q in ("q1", "q2", "q3")])
    df = results_frame(ranked("q1", ["A", "B"]) + failed("q2") + ranked("q3", ["B", "A"]))
    df["latency_ms"] = pd.array([12.5, 12.5, None, None, 40.0], dtype="Float64")
    path = write_results(df, tmp_path / "r.parquet")
    fast = score(ts, path)
    assert isinstance(read_results_for_scoring(path), ResultCodes)
    same_scores(fast, score(ts, read_results(path)))
    lat = fast.requests.set_index("query_id")["latency_ms"]
    assert lat["q1"] == 12.5 and np.isnan(lat["q2"]) and np.isnan(lat["q3"])
