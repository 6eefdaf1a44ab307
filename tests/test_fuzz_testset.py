"""Fuzzing every test-set loader: any input ends in a TestSet or the package's InputError.

Raw bytes, and structured records mutated (wrong types, missing fields, unicode, whitespace,
huge numbers, NaN, duplicates), for JSONL, CSV, Parquet, the WeKnora dataset folder, TREC
qrels + topics and ``TestSet.from_records``. Never another exception, never a problem
message of more than one line; what loads round-trips to the same hash.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import event, given, settings
from hypothesis import strategies as st

from weknora_nb import InputError, load_testset, load_trec_qrels
from weknora_nb.core.testset import TestSet

from .conftest import examples

FUZZ = settings(max_examples=examples(150), deadline=None)


def outcome(load: Callable[[], TestSet]) -> TestSet | None:
    """Run a loader: a TestSet (checked to hash and round-trip) or None for an InputError; anything else fails."""
    try:
        ts = load()
    except InputError as exc:
        assert exc.problems, exc
        assert all("\n" not in str(p) for p in exc.problems), exc.problems
        event(f"{type(exc).__name__}")
        return None
    assert isinstance(ts, TestSet) and len(ts) >= 1
    assert ts.hash.startswith("sha256:")
    assert TestSet.from_records(ts.records()).hash == ts.hash
    event("loaded")
    return ts


def in_tmp(write: Callable[[Path], Path], load: Callable[[Path], TestSet]) -> TestSet | None:
    with tempfile.TemporaryDirectory() as tmp:
        return outcome(lambda: load(write(Path(tmp))))


# ---------------------------------------------------------------------------------------
# strategies: records that are nearly right
# ---------------------------------------------------------------------------------------
WS = st.sampled_from(["", " ", "\t", "\u3000", "\n", "\x0b"])
ID = st.sampled_from(["q1", "q2", "c1", "c2", "é", "中", "😀", "a b", "a\"b", "a\\b"])
spaced = st.builds(lambda a, s, b: a + s + b, WS, ID, WS)
weird_text = st.text(max_size=8)
class Huge:
    """An integer of 5,001 digits (more than Python prints by default), drawn without ever being printed."""

    def __repr__(self) -> str:
        return "10**5000"


HUGE = Huge()
#: what Python holds but UTF-8, Arrow or a line reader may not: lone surrogates, line separators, a BOM
NASTY = st.sampled_from(["\ud800", "a\udfffb", "\u2028", "x\u0085y", "\x1c", "\ufeff", "\x00", "😀"])
json_text_value = st.one_of(weird_text, NASTY, st.builds(lambda a, b: a + b, weird_text, NASTY))
number = st.one_of(st.integers(-3, 6), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                   st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 3.0, 2.5, -0.0]),
                   st.builds(lambda: HUGE))
scalar = st.one_of(st.none(), st.booleans(), number, json_text_value, spaced)
json_value = st.recursive(scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(weird_text, c, max_size=3),
                          max_leaves=6)


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` about nine times in ten, ``bad`` otherwise."""
    return st.tuples(st.integers(0, 9), good, bad).map(lambda t: t[2] if t[0] == 0 else t[1])


class Pairs(list):
    """A JSON object as (key, value) pairs: written as text, a key may repeat."""


CHUNK = st.sampled_from(["doc1#0001", "doc1#0002", "api:010", "中文#3", "😀", "a\"b", "a\\b", "x y"])
grade = mostly(st.integers(0, 3), st.one_of(number, st.booleans(), st.none(), weird_text))
label_key = mostly(CHUNK, st.one_of(spaced, json_text_value))
relevant = mostly(st.dictionaries(CHUNK, st.integers(0, 3), max_size=4).map(lambda d: Pairs(d.items())),
                  st.one_of(st.lists(st.tuples(label_key, grade), max_size=4).map(Pairs), json_value))
text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12).map(lambda t: "t" + t)
field_value = {
    "query": mostly(text, st.one_of(json_text_value, spaced, st.just("  "), json_value)),
    "query_type": mostly(st.one_of(st.none(), st.sampled_from(["factual", "procedural", "中文"])),
                         st.one_of(spaced, json_value)),
    "tags": mostly(st.lists(CHUNK, max_size=3), st.one_of(st.lists(st.one_of(spaced, json_text_value)), json_value)),
    "answer": mostly(st.one_of(st.none(), text), json_value),
    "other": json_value,
}


@st.composite
def raw_record(draw, i: int = 0) -> Pairs:
    """Record ``i`` as (key, value) pairs: mostly sound; sometimes a field missing, repeated or of the wrong kind."""
    qid = draw(mostly(st.just(f"q{i}"), st.one_of(ID, spaced, st.integers(), number, st.none(), json_value)))
    out = Pairs([("query_id", qid), ("query", draw(field_value["query"])), ("relevant", draw(relevant))])
    for k in draw(st.lists(st.sampled_from(list(field_value)), max_size=3)):
        out.append((k, draw(field_value[k])))
    if draw(mostly(st.just(False), st.just(True))):   # drop or repeat a key
        k = draw(st.integers(0, len(out) - 1))
        out = Pairs(out[:k] + out[k + 1:]) if draw(st.booleans()) else Pairs(out + [out[k]])
    return out


@st.composite
def record_lists(draw, max_size: int = 5) -> list[Pairs]:
    n = draw(st.integers(0, max_size))
    recs = [draw(raw_record(i)) for i in range(n)]
    if recs and draw(mostly(st.just(False), st.just(True))):
        recs.append(recs[0])   # a whole record twice
    return recs


def text_of(v: Any) -> str:
    """``str(v)``, :data:`HUGE` as its digits."""
    return "1" + "0" * 5000 if isinstance(v, Huge) else str(v)


def json_text(v: Any, *, ascii_only: bool) -> str:
    """``v`` as JSON text; :class:`Pairs` as an object (a key may repeat), a huge integer as its digits."""
    if isinstance(v, (Pairs, dict)):
        items = v if isinstance(v, Pairs) else v.items()
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=ascii_only)}:{json_text(x, ascii_only=ascii_only)}"
                              for k, x in items) + "}"
    if isinstance(v, list):
        return "[" + ",".join(json_text(x, ascii_only=ascii_only) for x in v) + "]"
    if isinstance(v, Huge):
        return text_of(v)
    return json.dumps(v, ensure_ascii=ascii_only)


def record_line(rec: Pairs, ascii_only: bool) -> str:
    return json_text(rec, ascii_only=ascii_only)


def as_dict(v: Any) -> Any:
    """Pairs as a dict (a repeated key: the last wins, as a dict literal would); :data:`HUGE` as the integer."""
    if isinstance(v, Pairs):
        return {k: as_dict(x) for k, x in v}
    if isinstance(v, list):
        return [as_dict(x) for x in v]
    if isinstance(v, dict):
        return {k: as_dict(x) for k, x in v.items()}
    return 10 ** 5000 if isinstance(v, Huge) else v


# ---------------------------------------------------------------------------------------
# JSONL
# ---------------------------------------------------------------------------------------
def load_bytes(name: str, data: bytes) -> TestSet | None:
    def write(tmp: Path) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name
    return in_tmp(write, load_testset)


@FUZZ
@given(st.binary(max_size=400))
def test_jsonl_raw_bytes(data):
    load_bytes("t.jsonl", data)


ODD_LINE = st.sampled_from(["[" * 100_000, "{" * 50_000, "", "  ", "null", "[]", "{}", '"text"', "{,}", "\ufeff{}"])


@FUZZ
@given(record_lists(), st.booleans(), st.booleans(), st.sampled_from(["\n", "\r\n", "\r"]),
       st.lists(ODD_LINE, max_size=1))
def test_jsonl_mutated_records(recs, ascii_only, bom, newline, odd):
    lines = newline.join([record_line(r, ascii_only) for r in recs] + odd)
    load_bytes("t.jsonl", b"\xef\xbb\xbf" * bom + lines.encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------
@FUZZ
@given(st.binary(max_size=400))
def test_csv_raw_bytes(data):
    load_bytes("t.csv", b"query_id,query,relevant\n" + data)
    load_bytes("t.csv", data)


ODD_CELL = st.sampled_from(['"', '""', '"open', "c1:9", "c1", "{", '{"c1": 1, "c1": 2}', "[1]", '{"a":1e400}',
                            '{"a": 1, " a": 0}', "c1:1;c1:2", "1" * 5000, "x\x00y"])


def relevant_cell(v: Any) -> str:
    """A drawn ``relevant`` as CSV text: JSON, or the short ``id:grade;id:grade`` syntax."""
    if isinstance(v, Pairs) and all(isinstance(g, int) for _, g in v) and len(v) % 2:
        return ";".join(f"{k}:{g}" for k, g in v)
    return json_text(v, ascii_only=len(v) % 2 == 0 if isinstance(v, list) else False)


@st.composite
def csv_file(draw) -> str:
    extra = draw(st.lists(st.sampled_from(["query_type", "tags", "answer", "x", "query"]), max_size=3))
    header = draw(mostly(st.just(["query_id", "query", "relevant"] + extra),
                         st.lists(st.sampled_from(["query_id", "query", "relevant", "id", ""]), max_size=4)))
    rows = []
    for rec in draw(record_lists()):
        d = dict(rec)   # last wins; HUGE stays a marker, written as its digits
        cells = {"query_id": text_of(d.get("query_id", "")), "query": text_of(d.get("query", "")),
                 "relevant": relevant_cell(d.get("relevant", Pairs())),
                 "query_type": text_of(d.get("query_type") or ""),
                 "tags": ";".join(map(text_of, d["tags"])) if isinstance(d.get("tags"), list)
                 else text_of(d.get("tags", ""))}
        row = [cells.get(h, draw(st.one_of(text, st.just("")))) for h in header]
        if row and draw(mostly(st.just(False), st.just(True))):
            row[draw(st.integers(0, len(row) - 1))] = draw(ODD_CELL)
        rows.append(row + draw(mostly(st.just([]), st.lists(text, max_size=2))))
    buf = io.StringIO()
    if draw(mostly(st.just(False), st.just(True))):   # written as it is: quotes may open and never close
        buf.write(",".join(header) + "\n" + "\n".join(",".join(r) for r in rows))
    else:
        w = csv.writer(buf, lineterminator=draw(st.sampled_from(["\r\n", "\n"])))
        w.writerow(header)
        w.writerows(rows)
    return buf.getvalue()


@FUZZ
@given(csv_file(), st.booleans())
def test_csv_mutated_rows(text, bom):
    load_bytes("t.csv", b"\xef\xbb\xbf" * bom + text.encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------------------
def _good_parquet_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"query_id": ["q1", "q2"], "query": ["x", "y"],
                             "relevant": pa.array([[("c1", 1)], [("c2", 0)]], pa.map_(pa.string(), pa.int8())),
                             "tags": [["a"], []]}), sink)
    return sink.getvalue().to_pybytes()


GOOD_PARQUET = _good_parquet_bytes()


@FUZZ
@given(st.binary(max_size=300), st.integers(0, len(GOOD_PARQUET)), st.lists(st.integers(0, len(GOOD_PARQUET) - 1),
                                                                              max_size=4))
def test_parquet_raw_and_damaged_bytes(data, cut, flips):
    load_bytes("t.parquet", data)
    damaged = bytearray(GOOD_PARQUET[:cut])
    for i in flips:
        if i < len(damaged):
            damaged[i] ^= 0x5A
    load_bytes("t.parquet", bytes(damaged))


ids_col = mostly(st.just("str"), st.sampled_from(["int", "float", "null", "odd"]))
rel_col = mostly(st.sampled_from(["json", "map", "struct"]),
                 st.sampled_from(["int", "list_int", "list_str", "null", "double"]))


def column(kind: str, n: int, draw, prefix: str = "q") -> pa.Array:
    """``n`` values: ``str`` mostly ``<prefix><row>``, ``odd`` any text; ints, floats (NaN too) or nulls."""
    if kind == "str":
        return pa.array([draw(mostly(st.just(f"{prefix}{i}"), st.one_of(spaced, ID, st.none(), st.just(f"{prefix}0"))))
                         for i in range(n)], pa.string())
    if kind == "odd":
        return pa.array(draw(st.lists(st.one_of(weird_text, spaced, st.none()), min_size=n, max_size=n)), pa.string())
    if kind == "int":
        return pa.array(draw(st.lists(mostly(st.integers(0, 5), st.integers(-(2 ** 63), 2 ** 63 - 1)),
                                      min_size=n, max_size=n)), pa.int64())
    if kind == "float":
        return pa.array(draw(st.lists(st.floats(allow_nan=True), min_size=n, max_size=n)), pa.float64())
    return pa.nulls(n)


def relevant_column(kind: str, n: int, draw) -> pa.Array:
    small_pairs = st.lists(st.tuples(mostly(CHUNK, spaced), mostly(st.integers(0, 3), st.integers(-2, 5))), max_size=3)
    if kind == "json":
        return pa.array([json_text(Pairs(p), ascii_only=False) if draw(mostly(st.just(True), st.just(False)))
                         else draw(ODD_CELL) for p in draw(st.lists(small_pairs, min_size=n, max_size=n))], pa.string())
    if kind == "map":
        return pa.array(draw(st.lists(mostly(small_pairs, st.none()), min_size=n, max_size=n)),
                        pa.map_(pa.string(), pa.int64()))
    if kind == "struct":
        names = draw(st.lists(mostly(st.sampled_from(["c1", "c2", "c3"]), st.just(" c1")), min_size=1, max_size=3))
        fields = [pa.array(draw(st.lists(mostly(st.one_of(st.none(), st.integers(0, 3)),
                                                st.one_of(st.floats(allow_nan=True), st.integers(-1, 4))),
                                         min_size=n, max_size=n)), pa.float64()) for _ in names]
        return pa.StructArray.from_arrays(fields, names=names)
    if kind == "int":
        return pa.array(list(range(n)), pa.int64())
    if kind == "list_int":
        return pa.array([[1, 2]] * n)
    if kind == "list_str":
        return pa.array([["c1"]] * n)
    if kind == "double":
        return pa.array([math.nan] * n)
    return pa.nulls(n)


@st.composite
def parquet_table(draw) -> pa.Table:
    n = draw(st.integers(0, 4))
    names = draw(mostly(st.just(["query_id", "query", "relevant"]), st.just([])))
    names += draw(st.lists(st.sampled_from(["query_id", "query", "relevant", "query_type", "tags", "answer", "other"]),
                           max_size=3))
    cols: dict[str, pa.Array] = {}
    for name in dict.fromkeys(names):
        if name == "relevant":
            cols[name] = relevant_column(draw(rel_col), n, draw)
        elif name == "tags":
            kind = draw(mostly(st.just("list"), st.sampled_from(["str", "odd", "int"])))
            cols[name] = (pa.array(draw(st.lists(st.one_of(st.none(), st.lists(mostly(CHUNK, spaced), max_size=2)),
                                                 min_size=n, max_size=n)), pa.list_(pa.string()))
                          if kind == "list" else column(kind, n, draw))
        elif name == "query_id":
            cols[name] = column(draw(ids_col), n, draw)
        else:
            cols[name] = column(draw(mostly(st.just("str"), st.sampled_from(["odd", "int", "float", "null"]))), n,
                                draw, prefix="text ")
    return pa.table(cols) if cols else pa.table({"x": pa.nulls(n)})


@FUZZ
@given(parquet_table())
def test_parquet_mutated_tables(table):
    def write(tmp: Path) -> Path:
        pq.write_table(table, tmp / "t.parquet")
        return tmp / "t.parquet"
    in_tmp(write, load_testset)


# ---------------------------------------------------------------------------------------
# the WeKnora dataset folder
# ---------------------------------------------------------------------------------------
@st.composite
def weknora_tables(draw) -> dict[str, pa.Table | bytes | None]:
    n, m = draw(mostly(st.integers(1, 3), st.just(0))), draw(st.integers(0, 5))
    scores = st.lists(mostly(st.integers(0, 3), st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-1, 4))),
                      min_size=m, max_size=m)
    qids = [draw(mostly(st.just(f"q{draw(st.integers(0, max(n - 1, 0)))}"), st.one_of(spaced, st.none())))
            for _ in range(m)]
    out: dict[str, pa.Table | bytes | None] = {
        "queries": pa.table({"id": column(draw(ids_col), n, draw),
                             "text": column(draw(mostly(st.just("str"), ids_col)), n, draw, prefix="text ")}),
        "qrels": pa.table({"qid": pa.array(qids, pa.string()),
                           "pid": pa.array([draw(mostly(st.just(f"p{k}"), st.one_of(CHUNK, spaced, st.none())))
                                            for k in range(m)], pa.string()),
                           "score": pa.array(draw(scores), pa.float64())}),
        "answers": pa.table({"id": pa.array(range(n), pa.int64()), "text": column("str", n, draw, prefix="a ")}),
        "qas": pa.table({"qid": column(draw(ids_col), n, draw), "aid": pa.array(
            [draw(mostly(st.just(i), st.integers(-1, 5))) for i in range(n)], pa.int64())}),
    }
    if draw(mostly(st.just(False), st.just(True))):   # one file missing, damaged or without its columns
        name = draw(st.sampled_from(sorted(out)))
        out[name] = draw(st.sampled_from([None, b"", b"PAR1junk", pa.table({"other": [1]})]))
    return out


@FUZZ
@given(weknora_tables())
def test_weknora_folder(tables):
    def write(tmp: Path) -> Path:
        for name, t in tables.items():
            if isinstance(t, pa.Table):
                pq.write_table(t, tmp / f"{name}.parquet")
            elif isinstance(t, bytes):
                (tmp / f"{name}.parquet").write_bytes(t)
        return tmp
    in_tmp(write, load_testset)


# ---------------------------------------------------------------------------------------
# TREC qrels + topics
# ---------------------------------------------------------------------------------------
def load_trec(qrels: bytes, topics: bytes) -> TestSet | None:
    def write(tmp: Path) -> Path:
        (tmp / "q.qrels").write_bytes(qrels)
        (tmp / "topics.tsv").write_bytes(topics)
        return tmp
    return in_tmp(write, lambda tmp: load_trec_qrels(tmp / "q.qrels", tmp / "topics.tsv"))


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_trec_raw_bytes(qrels, topics):
    load_trec(qrels, topics)


trec_token = st.one_of(ID, weird_text.filter(lambda s: s.strip() and not any(c.isspace() for c in s)),
                       st.sampled_from(["0", "1", "3", "4", "-1", "²", "١", "1.0", "9" * 30]))


@st.composite
def trec_files(draw) -> tuple[str, str]:
    n = draw(st.integers(1, 4))
    topics = [draw(mostly(st.just(f"q{i}\t{draw(text)}"), st.one_of(st.just(f" q{i} \t{draw(text)}"),
                                                                    st.just(f"q{i}"), weird_text)))
              for i in range(n)] + draw(mostly(st.just([]), st.just(["q0\tagain"])))
    grades = mostly(st.integers(0, 3).map(str), st.sampled_from(["4", "-1", "²", "١", "1.0", "9" * 5000, "x"]))
    qrels = [draw(mostly(st.builds(lambda q, c, g: f"q{q} 0 {c} {g}", st.integers(0, n), CHUNK.filter(
        lambda c: " " not in c), grades), st.lists(trec_token, min_size=1, max_size=5).map(" ".join)))
        for _ in range(draw(st.integers(0, 6)))]
    return "\n".join(qrels), draw(st.sampled_from(["\n", "\r\n"])).join(topics)


@FUZZ
@given(trec_files())
def test_trec_mutated_lines(files):
    qrels, topics = files
    load_trec(qrels.encode("utf-8", "surrogatepass"), topics.encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------------------------------
# TestSet.from_records
# ---------------------------------------------------------------------------------------
@FUZZ
@given(record_lists(), st.lists(json_value, max_size=1))
def test_from_records(recs, odd):
    outcome(lambda: TestSet.from_records([as_dict(r) for r in recs] + odd))
