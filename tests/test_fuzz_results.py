"""Fuzzing the readers of untrusted files: whatever the bytes, a results file, a TREC run or a run
folder gives a loaded object or the package's error (an InputError, a RunFolderError), never another
exception (a traceback for the user)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weknora_nb.core.errors import InputError, NotComparableError, RunFolderError
from weknora_nb.core.results import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    ResultCodes,
    read_results,
    read_results_for_scoring,
    read_trec_run,
)
from weknora_nb.core.run import MANIFEST, Run, load_run, read_manifest
from weknora_nb.core.scoring import Scores, score
from weknora_nb.core.testset import TestSet

from .conftest import examples

#: WEKNORA_NB_FUZZ_EXAMPLES=2000 runs a longer, random campaign (default: 60 examples, a fixed seed; fewer under
#: ``make test-fast``, conftest.examples)
_EXAMPLES = int(os.environ.get("WEKNORA_NB_FUZZ_EXAMPLES", examples(60)))
FUZZ = settings(max_examples=_EXAMPLES, deadline=None, derandomize=_EXAMPLES <= 60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
TS = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 1}},
                           {"query_id": "q2", "query": "b", "relevant": {"C": 2}}])
COLUMNS = list(REQUIRED_COLUMNS) + list(OPTIONAL_COLUMNS)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def read_all(path: Path) -> None:
    """Every reader of a results path: a value, or the package's InputError."""
    for read in (read_results, read_results_for_scoring, lambda p: score(TS, p, ["ndcg@5", "hit@1"])):
        try:
            got = read(path)
        except InputError:
            continue
        assert isinstance(got, (pd.DataFrame, ResultCodes, Scores))
        if isinstance(got, pd.DataFrame):  # what read_results returns can be scored (or refused) too
            with contextlib.suppress(InputError):
                score(TS, got, ["hit@1"])


# ---------------------------------------------------------------- cell values and columns

CELL_TEXT = st.one_of(
    st.sampled_from(["", "q1", "q2", "final", "hybrid", "ok", "timeout", "A", "B", "1", "2", "0", "-1", "1.5",
                     "1e20", "-1e20", "9223372036854775808", "99999999999999999999999", "nan", "NaN", "inf",
                     "-inf", "0x10", "1_0", " 1 ", "true", "[]", '["A"]', '["A", 1]', "[1, [2]]", "{}", "null",
                     '"', "a,b", "\n", "\r\n", "\ufeff", "\x00", "\ud7ff", "\u2028", "基线"]),
    st.text(max_size=8))
HEADER_NAMES = st.lists(st.sampled_from(COLUMNS + ["rank", "rank", "extra", "", "rank.1"]), min_size=0, max_size=9)


def csv_bytes() -> st.SearchStrategy[bytes]:
    def render(header: list[str], rows: list[list[str]], required_first: bool, tail: bytes) -> bytes:
        names = (list(REQUIRED_COLUMNS) + header) if required_first else header
        lines = [",".join(names)] + [",".join(r[: len(names)] + [""] * (len(names) - len(r))) for r in rows]
        return "\n".join(lines).encode("utf-8", "surrogatepass") + tail
    rows = st.lists(st.lists(CELL_TEXT, max_size=12), max_size=6)
    tail = st.one_of(st.just(b""), st.just(b"\n"), st.binary(max_size=6))
    return st.one_of(st.builds(render, HEADER_NAMES, rows, st.booleans(), tail), st.binary(max_size=64))


@FUZZ
@given(data=csv_bytes())
def test_fuzz_csv_bytes(work, data):
    path = work / "r.csv"
    path.write_bytes(data)
    read_all(path)


def jsonl_bytes() -> st.SearchStrategy[bytes]:
    scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                       st.floats(allow_nan=True, allow_infinity=True), CELL_TEXT)
    value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                         max_leaves=5)
    row = st.one_of(st.dictionaries(st.sampled_from(COLUMNS + ["extra"]), value, max_size=12), value)
    good = st.fixed_dictionaries({c: value for c in REQUIRED_COLUMNS})
    lines = st.lists(st.one_of(row, good), max_size=5).map(
        lambda rows: "\n".join(json.dumps(r, allow_nan=True) for r in rows).encode("utf-8", "surrogatepass"))
    return st.one_of(lines, st.binary(max_size=64), lines.map(lambda b: b[: max(0, len(b) - 3)]))


@FUZZ
@given(data=jsonl_bytes())
def test_fuzz_jsonl_bytes(work, data):
    path = work / "r.jsonl"
    path.write_bytes(data)
    read_all(path)


# ---------------------------------------------------------------- Parquet: typed columns, then damaged bytes

def arrow_column(n: int) -> st.SearchStrategy[pa.Array]:
    """A column of ``n`` values of one of many Arrow types, including the wrong ones."""
    ints = st.lists(st.one_of(st.none(), st.integers(-3, 4)), min_size=n, max_size=n)
    big = st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=n, max_size=n)
    ubig = st.lists(st.one_of(st.none(), st.integers(0, 2**64 - 1)), min_size=n, max_size=n)
    floats = st.lists(st.one_of(st.none(), st.sampled_from([1.0, 2.0, 1.5, -1.0, 0.0, 1e20, -1e20, 9.3e18,
                                                            math.nan, math.inf, -math.inf])),
                      min_size=n, max_size=n)
    texts = st.lists(st.one_of(st.none(), CELL_TEXT.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))),
                     min_size=n, max_size=n)
    return st.one_of(
        ints.map(lambda v: pa.array(v, pa.int64())), ints.map(lambda v: pa.array(v, pa.int8())),
        big.map(lambda v: pa.array(v, pa.int64())), ubig.map(lambda v: pa.array(v, pa.uint64())),
        ints.map(lambda v: pa.array([None if x is None else abs(x) for x in v], pa.uint32())),
        floats.map(lambda v: pa.array(v, pa.float64())), floats.map(lambda v: pa.array(v, pa.float32())),
        texts.map(lambda v: pa.array(v, pa.string())), texts.map(lambda v: pa.array(v, pa.large_string())),
        texts.map(lambda v: pa.array(v, pa.string()).dictionary_encode()),
        texts.map(lambda v: pa.array([None if x is None else x.encode("utf-8") for x in v], pa.binary())),
        ints.map(lambda v: pa.array([None if x is None else [x, x] for x in v], pa.list_(pa.int64()))),
        ints.map(lambda v: pa.array([None if x is None else {"a": x} for x in v])),
        ints.map(lambda v: pa.array([None if x is None else x > 0 for x in v], pa.bool_())),
        ints.map(lambda v: pa.array([None if x is None else abs(x) for x in v], pa.timestamp("s"))),
        st.just(pa.nulls(n)),
    )


@st.composite
def arrow_tables(draw) -> pa.Table:
    n = draw(st.integers(0, 5))
    names = draw(st.lists(st.sampled_from(COLUMNS + ["extra"]), unique=True, max_size=10))
    if draw(st.booleans()):
        names = list(dict.fromkeys(list(REQUIRED_COLUMNS) + names))
    good = {"query_id": pa.array((["q1", "q2", "zz"] * 2)[:n]), "stage": pa.array(["final"] * n),
            "repeat": pa.array([1] * n), "rank": pa.array(list(range(1, n + 1))), "chunk_id": pa.array(("ABC" * 2)[:n]),
            "score": pa.array([1.0] * n)}
    arrays = [good[c] if c in good and draw(st.booleans()) else draw(arrow_column(n)) for c in names]
    return pa.Table.from_arrays(arrays, names=names)


@FUZZ
@given(table=arrow_tables(), cut=st.one_of(st.none(), st.floats(0, 1)), flips=st.lists(st.integers(0, 10**6),
                                                                                        max_size=3))
def test_fuzz_parquet_of_any_type_and_damaged(work, table, cut, flips):
    path = work / "r.parquet"
    pq.write_table(table, path, row_group_size=2)
    data = bytearray(path.read_bytes())
    for at in flips:  # flip bytes anywhere (data pages, the footer, the magic)
        data[at % len(data)] ^= 0xFF
    if cut is not None:
        data = data[: int(len(data) * cut)]
    path.write_bytes(bytes(data))
    read_all(path)


# ---------------------------------------------------------------- DataFrames with the wrong dtypes, every format

@st.composite
def frames(draw) -> pd.DataFrame:
    n = draw(st.integers(0, 5))
    values = st.one_of(st.none(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True, allow_infinity=True),
                       CELL_TEXT.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)), st.booleans())
    columns = {}
    for c in COLUMNS[: draw(st.integers(0, len(COLUMNS)))] + draw(st.lists(st.sampled_from(COLUMNS), max_size=2)):
        kind = draw(st.sampled_from(["mixed", "float", "int", "str", "dup"]))
        if kind == "mixed":
            columns[c] = pd.Series(draw(st.lists(values, min_size=n, max_size=n)), dtype=object)
        elif kind == "float":
            columns[c] = pd.Series(draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=n,
                                                 max_size=n)), dtype="float64")
        elif kind == "int":
            columns[c] = pd.Series(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)),
                                   dtype="int64")
        else:
            columns[c] = pd.Series((["q1", "q1", "q2", "zz", "q1"])[:n], dtype="string")
    df = pd.DataFrame(columns, index=range(n))
    if n and draw(st.booleans()):
        df = pd.concat([df, df], ignore_index=True)  # duplicated rows: ranks given twice
    return df


@FUZZ
@given(df=frames(), suffix=st.sampled_from([".parquet", ".csv", ".jsonl"]))
def test_fuzz_frames_of_wrong_dtypes_in_every_format(work, df, suffix):
    path = work / f"f{suffix}"
    try:
        if suffix == ".parquet":
            df.to_parquet(path)
        elif suffix == ".csv":
            df.to_csv(path, index=False)
        else:
            df.to_json(path, orient="records", lines=True)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return  # pandas cannot write this frame in this format: nothing to read
    read_all(path)


# ---------------------------------------------------------------- TREC run files

TREC_TOKEN = st.sampled_from(["q1", "q2", "Q0", "A", "B", "1", "2", "0", "-1", "99999999999999999999", "1.5", "nan",
                              "inf", "x", "t", "\t", "1e999", "1_0", "\u3000", "\x0c"])


@FUZZ
@given(data=st.one_of(st.lists(st.lists(TREC_TOKEN, max_size=8).map(" ".join), max_size=6).map(
    lambda lines: "\n".join(lines).encode()), st.binary(max_size=48)))
def test_fuzz_trec_runs(work, data):
    path = work / "run.txt"
    path.write_bytes(data)
    try:
        df = read_trec_run(path)
    except InputError:
        return
    assert isinstance(df, pd.DataFrame)
    with contextlib.suppress(InputError):
        score(TS, df, ["hit@1"])


# ---------------------------------------------------------------- run folders: garbage manifest.json

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)
NAMES = st.one_of(st.sampled_from(["r1", "../x", "/tmp/x", ".", "..", "", ".h", "a\\b", "CON", "x" * 130, "ok name"]),
                  st.text(max_size=10), JSON_VALUES)
TESTSET_PATHS = st.one_of(st.sampled_from(["ABS", "t.jsonl", "../t.jsonl", "results.parquet", MANIFEST, ".", "..",
                                           "missing.jsonl", "", "a\x00b", None]), st.text(max_size=6), JSON_VALUES)


@st.composite
def manifests(draw) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.one_of(st.binary(max_size=40), JSON_VALUES.map(lambda v: json.dumps(v).encode())))
    body = {"run_name": draw(NAMES)}
    testset = draw(st.one_of(st.fixed_dictionaries({"path": TESTSET_PATHS, "hash": st.one_of(
        st.just(TS.hash), st.none(), JSON_VALUES)}), JSON_VALUES))
    body["testset"] = testset
    for key in ("stages", "notes", "knowledge_bases", "sessions", "server", "retrieval_config", "started_at"):
        if draw(st.booleans()):
            body[key] = draw(JSON_VALUES)
    return json.dumps(body).encode("utf-8", "surrogatepass")


@FUZZ
@given(manifest=manifests())
def test_fuzz_run_folders(work, manifest):
    folder = work / "runs" / "r1"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "results.parquet").exists():
        from weknora_nb import write_results

        from .conftest import ranked, results_frame
        write_results(results_frame(ranked("q1", ["A"]) + ranked("q2", ["C"])), folder / "results.parquet")
        TS.to_jsonl(folder / "t.jsonl")
        TS.to_jsonl(work / "runs" / "t.jsonl")
    manifest = manifest.replace(b'"ABS"', json.dumps(str(folder / "t.jsonl")).encode())
    (folder / MANIFEST).write_bytes(manifest)
    with contextlib.chdir(work):
        with contextlib.suppress(RunFolderError):
            read_manifest(folder)
        try:
            run = load_run(folder, metrics=["hit@1"])
        except (InputError, RunFolderError, NotComparableError):
            return
        assert isinstance(run, Run)
        try:  # what a report reads of the run: its name, stages, settings
            assert isinstance(run.name, str)
        except RunFolderError:
            return
        assert isinstance(run.stage_definitions, dict) and isinstance(run.notes, list)
        _ = run.retrieval_config, run.effective_retrieval_config, run.server, run.knowledge_bases, run.sessions
        assert np.isfinite(run.scores.summary["mean"]).all()
