"""The fast paths of issue 17 give what the slow ones gave: files to figures, value for value.

- ``--per-query-out`` writes the per-query rows ``--json`` would carry (Parquet, CSV, JSONL),
  and ``--json`` then leaves them out;
- ``Scores.to_json_bytes`` (orjson, rows built as Arrow strings) is the JSON text of
  ``to_json_dict``; ``score_files`` (two threads) is ``score(load_testset(...), path)``;
- test sets are checked a block of records at a time: whatever a file holds, the result (frames,
  hash) or the problems (file, line, field, message) are those of the record-by-record check,
  which stays the path for every record that needs a look of its own;
- the hash, now built without a Python loop over queries, keeps the value stored runs carry.
"""

from __future__ import annotations

import gc
import json
import random
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weknora_nb import cli, score, write_results
from weknora_nb.core import codes as codes_module
from weknora_nb.core import requests as requests_module
from weknora_nb.core.errors import MetricError, ResultsError, TestSetError, UsageError
from weknora_nb.core.results import ResultCodes, read_results, read_results_for_scoring
from weknora_nb.core.scoring import score_files
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.core.testset import builder as builder_module
from weknora_nb.core.testset import model as model_module
from weknora_nb.core.testset import textfile as textfile_module
from weknora_nb.core.testset import validate as validate_module

from .conftest import examples, failed, ranked, results_frame
from .test_scoring_paths import METRICS, random_case, same_scores, write_parquet

ROOT = Path(__file__).resolve().parent.parent


def outcome(load):
    """(test set, None) or (None, its problems)."""
    try:
        return load(), None
    except TestSetError as exc:
        return None, exc.problems


def record_by_record():
    """Every record checked alone: the path as it was before issue 17."""
    return mock.patch.object(validate_module, "bulk_columns", lambda objs: None)


def assert_same(fast, slow):
    """Two outcomes of :func:`outcome` are the same: equal frames and hash, or equal problems."""
    (ts_a, prob_a), (ts_b, prob_b) = fast, slow
    assert prob_a == prob_b
    if ts_a is not None:
        pd.testing.assert_frame_equal(ts_a.queries, ts_b.queries)
        pd.testing.assert_frame_equal(ts_a.qrels, ts_b.qrels)
        assert ts_a.hash == ts_b.hash


# ---------------------------------------------------------------------------------------
# the CLI: --per-query-out, --json
# ---------------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    TestSet.from_records([
        {"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 2, "C": 1}},
        {"query_id": 'q"2\\', "query": "b", "relevant": {"A": 1}},
        {"query_id": "q3", "query": "c", "relevant": {}},
        {"query_id": "中文 😀", "query": "d", "relevant": {"C": 2}},
    ]).to_jsonl(tmp_path / "t.jsonl")
    rows = (ranked("q1", ["X", "B", "A", "Y", "C"]) + ranked("q1", ["B", "X"], repeat=2)
            + ranked("q1", ["X", "B", "A", "Y", "C"], stage="hybrid") + failed('q"2\\', "timeout")
            + ranked('q"2\\', ["A"], stage="hybrid") + ranked("q3", ["A"]) + ranked("中文 😀", ["C", "A"])
            + ranked("中文 😀", ["A"], repeat=2))
    write_results(results_frame(rows), tmp_path / "r.parquet")
    return tmp_path / "t.jsonl", tmp_path / "r.parquet"


def run_json(capsys, *args) -> dict:
    assert cli.main(["score", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_per_query_out_holds_the_rows_json_would_carry(capsys, tmp_path, files, suffix):
    full = run_json(capsys, *files)
    out = tmp_path / f"per_query{suffix}"
    lean = run_json(capsys, *files, "--per-query-out", out)
    assert "per_query" not in lean and lean == {k: v for k, v in full.items() if k != "per_query"}
    if suffix == ".parquet":
        rows = pq.read_table(out).to_pylist()
    elif suffix == ".csv":
        rows = pd.read_csv(out, keep_default_na=False).to_dict("records")
    else:
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(full["per_query"]) == 4   # q1 in 2 stages, q"2\ (hybrid), 中文 😀 (2 repeats); q3 is invalid
    assert rows == full["per_query"]   # every value exactly (floats read back to the same double)


def test_per_query_out_refuses_another_suffix_before_any_work(capsys, tmp_path):
    code = cli.main(["score", str(tmp_path / "absent.jsonl"), str(tmp_path / "absent.parquet"),
                     "--per-query-out", str(tmp_path / "rows.xlsx")])
    err = capsys.readouterr().err
    assert code == 2 and "--per-query-out" in err and "rows.xlsx" in err and "absent" not in err


def test_json_text_is_json_dumps_of_the_dict(files):
    sc = score(load_testset(files[0]), files[1], ["recall@3", "ndcg@5", "mrr@20", "judged@5"])
    expected = sc.to_json_dict()
    assert sc.to_json_bytes().decode("utf-8") == json.dumps(expected, ensure_ascii=False, indent=2)
    assert json.loads(sc.to_json_bytes(indent=False)) == expected
    assert json.loads(sc.to_json_bytes(per_query=False)) == {k: v for k, v in expected.items() if k != "per_query"}


@pytest.mark.parametrize("halves_from", [1, 4])
def test_json_text_built_in_two_halves_is_the_same_text(files, tmp_path, monkeypatch, halves_from):
    """From ``JSON_HALVES_FROM`` rows the per-query text is built in two halves (the second in a thread): the same
    bytes as built whole, in every layout (indented, compact, one row a line)."""
    from weknora_nb.core.scoring import json_rows

    sc = score(load_testset(files[0]), files[1], ["recall@3", "ndcg@5", "mrr@20", "judged@5"])
    assert len(sc.per_query_mean()) == 4
    whole = [sc.to_json_bytes(), sc.to_json_bytes(indent=False), sc.write_per_query(tmp_path / "a.jsonl").read_bytes()]
    monkeypatch.setattr(json_rows, "JSON_HALVES_FROM", halves_from)
    halves = [sc.to_json_bytes(), sc.to_json_bytes(indent=False), sc.write_per_query(tmp_path / "b.jsonl").read_bytes()]
    assert halves == whole
    assert len(json_rows.per_query_json(sc.per_query_mean(), sc.metric_names, indent=True)) == 4   # [, 2 halves, ]
    assert whole[0].decode("utf-8") == json.dumps(sc.to_json_dict(), ensure_ascii=False, indent=2)


def test_json_numbers_read_back_as_the_same_doubles():
    from weknora_nb.core.scoring.json_rows import _json_numbers
    values = [0.0, 1.0, -0.0, 1e-05, 1 / 3, 2 / 3, 0.1, 1e300, 5e-324, 123456789.0, float("nan"), float("inf")]
    text = _json_numbers(pd.Series(values).to_numpy()).to_pylist()
    back = [json.loads(t) for t in text]
    assert back[:10] == values[:10] and all(type(b) is float for b in back[:10])
    assert back[10:] == [None, None]   # as _num and orjson write them


def test_per_query_mean_of_one_repeat_is_the_grouped_mean(files):
    ts = load_testset(files[0])
    for sc in (score(ts, files[1], stages=["hybrid"]), score(ts, files[1])):   # one repeat, then two
        g = sc.per_query.groupby(["query_id", "stage"], sort=False, observed=True)
        expected = g[sc.metric_names].mean()
        expected["n_repeats"] = g.size()
        pd.testing.assert_frame_equal(sc.per_query_mean(), expected.reset_index())


def test_score_files_is_score_of_the_loaded_files(files):
    switch = sys.getswitchinterval()
    a = score_files(*files, ["ndcg@5", "hit@1"])
    assert sys.getswitchinterval() == switch and gc.isenabled()   # what it changed for a while is as it was
    b = score(load_testset(files[0]), files[1], ["ndcg@5", "hit@1"], source=str(files[1]))
    assert a.to_json_dict() == b.to_json_dict()
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_score_files_reports_errors_in_the_order_score_did(tmp_path, files):
    bad_results = tmp_path / "bad.parquet"
    bad_results.write_bytes(b"not parquet")
    with pytest.raises(MetricError):   # the options first, as score() checks them before reading
        score_files(files[0], bad_results, ["nosuch@5"])
    with pytest.raises(UsageError):
        score_files(files[0], bad_results, domain_adjustment=0.5)
    bad_testset = tmp_path / "t.csv"
    bad_testset.write_text("query_id\nq1\n", encoding="utf-8")
    with pytest.raises(TestSetError):   # then the test set, then the results
        score_files(bad_testset, bad_results)
    with pytest.raises(ResultsError) as err:
        score_files(files[0], bad_results)
    assert str(bad_results) in str(err.value)


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), group=st.sampled_from([7, 64, 100_000]),
       batch=st.sampled_from([3, 64]))
def test_parquet_read_a_batch_at_a_time_matches_the_frame_path(tmp_path_factory, seed, group, batch):
    """Batches smaller than, equal to and larger than the row groups: every dictionary met merged into one."""
    ts, res, _, _ = random_case(seed)
    path = tmp_path_factory.mktemp("run") / "results.parquet"
    write_parquet(res, path, group)
    with mock.patch.object(codes_module, "_BATCH_ROWS", batch):
        assert isinstance(read_results_for_scoring(path), ResultCodes)
        same_scores(score(ts, path, METRICS), score(ts, read_results(path), METRICS))


def test_results_written_as_one_row_group_are_read_in_one_piece_without_a_copy(tmp_path):
    """``write_results`` writes Parquet as one row group (Arrow's default starts another every 1,048,576 rows,
    each with dictionaries of its own to merge on reading): ``parquet_codes`` takes the text columns' indices
    and the ranks as the file's reader gives them (views, not copies), and they are the table's values."""
    n_q, width = (1 << 20) // 40 + 3, 40   # just over one default row group
    rng = np.random.default_rng(7)
    chunks = np.array([f"doc{i // 10}#{i % 10}" for i in range(5_000)], dtype=object)
    df = pd.DataFrame({
        "query_id": np.repeat([f"q{i}" for i in range(n_q)], width), "stage": "final", "repeat": 1,
        "rank": np.tile(np.arange(1, width + 1), n_q), "chunk_id": chunks[rng.integers(0, len(chunks), n_q * width)],
        "score": 0.5, "status": "ok"})
    path = write_results(df, tmp_path / "results.parquet")
    assert pq.read_metadata(path).num_row_groups == 1
    rc = read_results_for_scoring(path)
    assert isinstance(rc, ResultCodes) and len(rc) == len(df) > 1 << 20
    for column in (rc.query, rc.chunk, rc.rank):
        assert not column.flags.owndata   # a view of what the reader gave
    assert rc.queries[rc.query].tolist() == df["query_id"].tolist()
    assert rc.chunks[rc.chunk].tolist() == df["chunk_id"].tolist()
    assert rc.rank.tolist() == df["rank"].tolist()


def test_columns_without_a_null_are_written_required_and_read_back_the_same(tmp_path):
    """``write_results`` marks each column that holds no null ``required`` (no definition levels for a reader to
    decode); a column with a null (a failed request's chunk) stays ``optional``. The table reads back the same,
    through ``read_results`` and through the scoring path."""
    df = pd.DataFrame({"query_id": ["q1", "q1", "q2"], "stage": "final", "repeat": 1, "rank": [1, 2, pd.NA],
                       "chunk_id": ["a", "b", None], "score": [0.9, 0.5, None],
                       "status": ["ok", "ok", "failed: timeout"]}).astype({"rank": "Int64"})
    path = write_results(df, tmp_path / "results.parquet")
    kinds = {c.name: c.max_definition_level for c in pq.ParquetFile(path).schema}
    assert kinds == {"query_id": 0, "stage": 0, "repeat": 0, "rank": 1, "chunk_id": 1, "score": 1, "status": 0}
    back, optional = read_results(path), tmp_path / "optional.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), optional)   # every column optional
    assert {c.max_definition_level for c in pq.ParquetFile(optional).schema} == {1}
    pd.testing.assert_frame_equal(back, read_results(optional))
    ts = TestSet.from_records([{"query_id": "q1", "query": "x", "relevant": {"a": 1}},
                               {"query_id": "q2", "query": "y", "relevant": {"b": 1}}])
    same_scores(score(ts, path, METRICS), score(ts, back, METRICS))
    # no row, and a column of Arrow's null type (no value to give it another): it stays nullable, as Arrow requires
    for odd in (df.iloc[:0].assign(error=pd.Series([], dtype=object)), df.assign(error=None)):
        assert read_results(write_results(odd, tmp_path / "odd.parquet")).shape == odd.shape


def test_stages_in_the_order_they_first_appear_are_those_of_the_requests_one_by_one():
    """The stage order score() reports (pipeline role, then first appearance) from a pass per distinct stage is
    the order of the requests' stage names read one by one, whatever the codes and their order."""
    from weknora_nb.core.pipeline import stage_order
    from weknora_nb.core.scoring.entry import _stages_seen

    rng = np.random.default_rng(3)
    for _ in range(300):
        names = np.array(rng.permutation(["final", "rerank", "vector", "x", "y"])[:int(rng.integers(1, 6))],
                         dtype=object)
        codes = rng.integers(0, len(names), int(rng.integers(0, 30))).astype(np.int8)
        assert stage_order(_stages_seen(names, codes)) == stage_order(names[codes])


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 18])
def test_ranks_checked_in_blocks_are_the_plain_check(block):
    """Whether ranks strictly increase within every run, checked a block of rows at a time, is the check of the
    whole array at once, wherever a fall or a repeat lies (first row, last row, across a block's edge)."""
    rng = np.random.default_rng(block)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        rank = np.sort(rng.integers(1, 5, n)).astype(np.int64) + np.cumsum(rng.integers(0, 2, n))
        brk = rng.random(n - 1) < 0.1
        if rng.random() < 0.7 and n > 1:
            at = int(rng.integers(1, n))
            rank[at] = rank[at - 1] - int(rng.integers(0, 2))   # a fall or a repeat
        plain = not np.any((rank[1:] <= rank[:-1]) > brk)
        assert requests_module._ranks_increase(rank, brk, block) == plain


@pytest.mark.parametrize("two_threads", [False, True])
@pytest.mark.parametrize(("rows", "width", "k", "values"), [
    (0, 7, 5, 40), (1, 1, 1, 3), (50, 2, 5, 3), (500, 7, 5, 40), (500, 100, 20, 65_536),
    ((1 << 21) // 100 + 3, 100, 20, 200),  # over one block of rows
])
def test_first_k_distinct_is_the_plain_reading(two_threads, rows, width, k, values):
    """Rows of chunk codes (repeats within a row, short and long rows, rows over one block) give each row's
    first K distinct codes and its number of repeats, in one thread or with the second half of the rows in
    another: the choice is speed only."""
    rng = np.random.default_rng(rows + width)
    grid = rng.integers(0, values, size=(rows, width)).astype(np.int32)
    with ThreadPoolExecutor(1) as pool:
        top, n_dup = requests_module._first_k_distinct(grid, k, pool=pool if two_threads else None)
    for r in rng.choice(rows, size=min(rows, 300), replace=False) if rows else []:
        distinct = list(dict.fromkeys(grid[r].tolist()))
        assert top[r].tolist() == (distinct + [-1] * k)[:min(k, width)]
        assert n_dup[r] == width - len(distinct)
    assert top.shape == (rows, min(k, width))


# ---------------------------------------------------------------------------------------
# test sets checked a block at a time
# ---------------------------------------------------------------------------------------
def big_jsonl(path: Path, n: int, bad: dict[int, str] | None = None) -> Path:
    """``n`` plain records, one a line; ``bad`` replaces the text of some (1-based) lines."""
    bad = bad or {}
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(1, n + 1):
            fh.write(bad.get(i, json.dumps({"query_id": f"q{i:06d}", "query": f"查询 {i}",
                                             "relevant": {f"doc{i % 89}#{j}": j for j in range(4)},
                                             "tags": ["t"] if i % 3 else None}, ensure_ascii=False)) + "\n")
    return path


@pytest.fixture
def small_blocks():
    """Files read 16 KB at a time: a few thousand lines make many blocks."""
    with mock.patch.object(textfile_module, "BLOCK_BYTES", 1 << 14):
        yield


def test_a_plain_file_is_checked_in_bulk(tmp_path, small_blocks):
    path = big_jsonl(tmp_path / "t.jsonl", 3_000)
    with mock.patch.object(builder_module.Builder, "add", side_effect=AssertionError("record by record")):
        ts = load_testset(path)
    assert len(ts) == 3_000 and len(ts.qrels) == 12_000 and ts.records()[2_999]["tags"] == []
    with record_by_record():
        assert_same((ts, None), outcome(lambda: load_testset(path)))


def test_problems_deep_in_a_large_file_name_their_line_and_field(tmp_path, small_blocks):
    path = big_jsonl(tmp_path / "t.jsonl", 4_000, {
        5: '{"query_id": "q000007", "query": "x", "relevant": {"a": 1}}',                # duplicate id (line 7)
        2_345: '{"query_id": "q002345", "query": "x", "relevant": {"a": 7}}',             # bad grade
        3_100: '{"query_id": "q003100", "query": "x", "relevant": {"a": 1}, "query": "y"}',   # a key twice
        3_801: '{"query_id": "q003801", "query": "x", "relevant": {"a:1": 1, "a:1": 2}}',     # a chunk twice
    })
    _, problems = outcome(lambda: load_testset(path))
    assert [(p.line, p.field) for p in problems] == [(7, "query_id"), (2_345, "relevant"), (3_100, "query"),
                                                     (3_801, "relevant")]
    assert "first at line 5" in problems[0].message and "7" in problems[1].message
    assert "appears twice" in problems[2].message and "'a:1'" in problems[3].message
    with record_by_record():
        assert outcome(lambda: load_testset(path))[1] == problems


def mostly(good: list, bad: list) -> st.SearchStrategy:
    """One of ``good`` about nine times in ten, one of ``bad`` otherwise."""
    return st.tuples(st.integers(0, 9), st.sampled_from(good), st.sampled_from(bad)).map(
        lambda t: t[2] if t[0] == 9 else t[1])


@pytest.mark.parametrize("relevant, problem", [
    ('{"doc:1": 1, "doc:2": 0}', None),
    ('{"doc:1": 1, "doc:1": 2}', "'doc:1' is labelled twice"),
    ('{"a\\u003ab": 1, "a:b": 2}', "'a:b' is labelled twice"),   # the same id once the escape is read
    ('{"a": 1, "b": 18446744073709551616}', "got 18446744073709551616"),   # past 64 bits: Python's number
])
def test_csv_relevant_json_read_fast_keeps_every_problem(tmp_path, relevant, problem):
    path = tmp_path / "t.csv"
    path.write_text("query_id,query,relevant\nq1,x,\"" + relevant.replace('"', '""') + '"\n', encoding="utf-8")
    ts, problems = outcome(lambda: load_testset(path))
    if problem is None:
        assert ts.records()[0]["relevant"] == {"doc:1": 1, "doc:2": 0}
    else:
        assert [(p.line, p.field) for p in problems] == [(2, "relevant")] and problem in problems[0].message


#: pieces of records: what the record-by-record check accepts (some of it stripped), then what it refuses
_IDS = mostly(["q1", "q2", "q3", " q1", "q4\t", "é", "中 文", "a:b", 'a"b', "a\\b", 7, -3, "\u3000q5", "q6\x85", "😀"],
              ["", "  ", 10 ** 20, 1.5, True, None])
_CHUNKS = mostly(["c1", "c2", "c3", " c4", "c:5", 'c"6', "c\\7", "中", "x" * 30, "文档é", "c\u3000", "\xa0c", "c\x1c",
                  "c\x7f"], ["", " ", " c1"])
_GRADES = mostly([0, 1, 2, 3], [-1, 4, 1.0, 2.5, True, "2", None, 2 ** 64])
_TEXT = mostly(["text", " padded ", "中文？", 'say "hi"', "back\\slash", "\u2028"],
               ["", "   ", "tab\there", "line\nbreak", 7, None])
_OPTIONAL = mostly([None, "factual", " factual "], ["", 3, []])
_TAGS = mostly([None, [], ["a"], ["b", "a", "b"], [" a "], ["中", "😀"]], [[""], "a;b", [1], [None]])
_WEIGHTS = mostly([None, 1, 5, 2 ** 63 - 1], [0, -1, 2 ** 63, 1.0, 2.5, True, "3"])
_EXTRA = mostly([None, 1, "x"], [[1, 2], {"a": 1}, [[[]]], {"a": {"a": 1}}])
_OVERLAPS = mostly([None, 0, 1, 0.0, 0.25, 1.0], [-0.1, 1.5, True, "0.5", float("nan"), float("inf"), 10 ** 400])

record = st.fixed_dictionaries(
    {"query_id": _IDS, "query": _TEXT,
     "relevant": st.tuples(st.integers(0, 9), st.dictionaries(_CHUNKS, _GRADES, max_size=4),
                           st.sampled_from([None, [], "c1:1"])).map(lambda t: t[2] if t[0] == 9 else t[1])},
    optional={"query_type": _OPTIONAL, "tags": _TAGS, "answer": _TEXT, "weight": _WEIGHTS, "source": _OPTIONAL,
              "overlap": _OVERLAPS, "extra": _EXTRA})


def jsonl_text(recs: list[dict], rng: random.Random) -> str:
    """The records as JSONL, each line written a way a file may write it: ASCII or UTF-8, spaced or not, a
    key written twice, a blank line between, a line that is no JSON object."""
    out = []
    for rec in recs:
        line = json.dumps(rec, ensure_ascii=rng.random() < 0.3, separators=rng.choice([(",", ":"), (", ", ": ")]))
        roll = rng.random()
        if roll < 0.05:
            line = line[:-1] + ', "query": "again"}'
        elif roll < 0.08:   # a chunk written twice (when it has a label)
            line = re.sub(r'"relevant": ?\{(?=")', '"relevant": {"c1": 1, ', line, count=1)
        elif roll < 0.10:
            line = rng.choice(["[1, 2]", "{not json", '{"query_id": NaN}', '"text"'])
        out.append(line)
        if rng.random() < 0.05:
            out.append(rng.choice(["", "   ", "\t"]))
    return "\n".join(out) + "\n"


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record, min_size=1, max_size=25), st.integers(0, 2 ** 32), st.sampled_from([64, 1 << 21]))
def test_jsonl_in_bulk_equals_record_by_record(recs, seed, block_bytes):
    import tempfile

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_text(jsonl_text(recs, rng), encoding="utf-8", newline=rng.choice(["\n", "\r\n"]))
        with mock.patch.object(textfile_module, "BLOCK_BYTES", block_bytes):
            fast = outcome(lambda: load_testset(path))
            with record_by_record():
                slow = outcome(lambda: load_testset(path))
    assert_same(fast, slow)


def _cell(v) -> str:
    """A value as a CSV or Parquet text cell writes it."""
    return "" if v is None else v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record, min_size=1, max_size=25), st.sampled_from(["csv", "parquet"]))
def test_csv_and_parquet_in_bulk_equal_record_by_record(recs, fmt):
    import csv
    import tempfile

    # a weight in text is refused
    names = ["query_id", "query", "relevant", "query_type", "tags", "answer", "source", "overlap"]
    rows = [[_cell(r.get(n)) for n in names] for r in recs]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"t.{fmt}"
        if fmt == "csv":
            try:
                with open(path, "w", encoding="utf-8", newline="") as fh:
                    csv.writer(fh).writerows([names, *rows])
            except UnicodeEncodeError:   # a lone surrogate has no UTF-8 form
                return
        else:
            try:
                pd.DataFrame(rows, columns=names).to_parquet(path)
            except Exception:   # what Arrow cannot hold
                return
        fast = outcome(lambda: load_testset(path))
        with record_by_record():
            slow = outcome(lambda: load_testset(path))
    assert_same(fast, slow)


@settings(max_examples=examples(120), deadline=None)
@given(st.lists(record, min_size=1, max_size=25), st.sampled_from([None, "\ud800", (1, 2), 10 ** 5000]))
def test_from_records_in_bulk_equals_record_by_record(recs, odd):
    if odd is not None:   # what only Python holds: an unpaired surrogate, a tuple, an integer of 5,001 digits
        recs = [*recs[:-1], dict(recs[-1], query=odd)]
    fast = outcome(lambda: TestSet.from_records(recs))
    with record_by_record():
        slow = outcome(lambda: TestSet.from_records(recs))
    assert_same(fast, slow)


# ---------------------------------------------------------------------------------------
# the hash keeps its value
# ---------------------------------------------------------------------------------------
def pinned_records() -> list[dict]:
    """3,000 records as benchmarks/testset_memory.py makes them (seed 7), shuffled, some with unsorted and
    repeated tags, quotes and backslashes, no query type, no label, an answer."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from testset_memory import make_records
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    recs = list(make_records(3000, 7))
    random.Random(3).shuffle(recs)
    for i, r in enumerate(recs):
        if i % 5 == 0:
            r["tags"] = ["zeta", "alpha", "Mid", "alpha"]
        if i % 7 == 0:
            r["query"] = r["query"] + ' "quoted" \\ back'
        if i % 11 == 0:
            r.pop("query_type")
        if i % 13 == 0:
            r["relevant"] = {}
        if i % 17 == 0:
            r["answer"] = "an answer"
    return recs


#: computed by the hash as it was before issue 17 (a Python loop over each slice's queries)
PINNED_3000 = "sha256:d4121c9af388e7bc36eaf3fdc0979242cfe25e74d6cca2cce319f64071ea9f65"


def test_hash_of_a_generated_test_set_is_the_one_before_issue_17(tmp_path):
    ts = TestSet.from_records(pinned_records())
    assert ts.hash == PINNED_3000
    ts.to_jsonl(tmp_path / "t.jsonl")
    assert load_testset(tmp_path / "t.jsonl").hash == PINNED_3000
    assert model_module.content_hash(ts.queries, ts.qrels, ts.label_rows, slice_size=97) == PINNED_3000


def test_hash_of_a_hand_built_frame_with_object_tags():
    ts = TestSet.from_records(pinned_records()[:50])
    queries = ts.queries.assign(tags=pd.Series([list(t) for t in ts.queries["tags"]], dtype=object))
    assert queries["tags"].dtype == object and TestSet(queries, ts.qrels).hash == ts.hash


