"""Versioned test sets: merging judgements into a new version, its lineage, and which version two runs
are re-scored on (core/lineage.py, ``testset merge-labels``)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import pytest

import weknora_nb
from weknora_nb import TestSet, load_testset
from weknora_nb.analysis.pooling import pool
from weknora_nb.analysis.worksheet import label_file, write_worksheet
from weknora_nb.cli import main
from weknora_nb.core.errors import InputError
from weknora_nb.core.labels import LabelsLog
from weknora_nb.core.lineage import (
    ancestors,
    is_ancestor,
    lineage_path,
    merge_labels,
    read_lineage,
    rescore_plan,
    resolve_judgements,
)
from weknora_nb.core.run import read_manifest

from .conftest import ranked
from .test_pooling import make_run

T_RECORDS = [
    {"query_id": "q1", "query": "默认端口", "relevant": {"A": 3, "B": 1}},
    {"query_id": "q2", "query": "重置密码", "relevant": {"C": 0}},
    {"query_id": "q3", "query": "同步慢", "relevant": {}},
]


@pytest.fixture
def base(tmp_path) -> Path:
    path = tmp_path / "t.jsonl"
    TestSet.from_records(T_RECORDS).to_jsonl(path)
    return path


def log(path: Path, rows: list[tuple]) -> Path:
    lg = LabelsLog(path)
    for q, c, g, who in rows:
        lg.append(q, c, g, assessor=who)
    return path


def test_one_assessor_agreeing_adjudicated_and_median():
    from weknora_nb.core.labels import Judgement

    js = [Judgement(q, c, g, who, "t") for q, c, g, who in [
        ("q", "one", 2, "li"),
        ("q", "agree", 1, "li"), ("q", "agree", 1, "wang"),
        ("q", "adj", 0, "li"), ("q", "adj", 3, "wang"), ("q", "adj", 2, "boss"),
        ("q", "even", 0, "li"), ("q", "even", 3, "wang"),                  # median of 0, 3: the lower, 0
        ("q", "odd", 0, "li"), ("q", "odd", 3, "wang"), ("q", "odd", 2, "zhao"),
        ("q", "later", 0, "li"), ("q", "later", 3, "li"), ("q", "later", None, "li")]]   # skip ignored: 3
    got = {r.chunk_id: (r.grade, r.how) for r in resolve_judgements(js, adjudicator="boss")}
    assert got == {"one": (2, "single"), "agree": (1, "agreed"), "adj": (2, "adjudicated"), "even": (0, "median"),
                   "odd": (2, "median"), "later": (3, "single")}


def test_merge_writes_the_new_version_and_its_lineage(base, tmp_path):
    li = log(tmp_path / "li.jsonl", [("q1", "A", 3, "li"), ("q1", "B", 2, "li"), ("q3", "D", 2, "li"),
                                     ("q3", "E", 0, "li"), ("q2", "C", None, "li")])
    wang = log(tmp_path / "wang.jsonl", [("q3", "D", 3, "wang"), ("q3", "E", 0, "wang")])
    out = tmp_path / "t2.jsonl"
    r = merge_labels(base, [li, wang], out)
    t2 = load_testset(out)
    assert {q: dict(rel) for q, rel in ((x["query_id"], x["relevant"]) for x in t2.records())} == {
        "q1": {"A": 3, "B": 2}, "q2": {"C": 0}, "q3": {"D": 2, "E": 0}}      # D: median of 2 and 3
    assert (r.added, r.changed, r.unchanged) == (2, 1, 1)
    lin = json.loads(lineage_path(out).read_text(encoding="utf-8"))
    parent = load_testset(base)
    assert lin["hash"] == t2.hash and lin["parent"] == {"hash": parent.hash, "path": str(base)}
    assert lin["labels_added"] == 2 and lin["labels_changed"] == 1 and lin["assessors"] == ["li", "wang"]
    assert lin["label_files"] == [
        {"path": str(li), "sha256": hashlib.sha256(li.read_bytes()).hexdigest(), "judgements": 5},
        {"path": str(wang), "sha256": hashlib.sha256(wang.read_bytes()).hexdigest(), "judgements": 2}]
    assert lin["resolved_by_median"] == 1 and lin["resolved_by_median_items"][0]["chunk_id"] == "D"
    assert lin["valid_queries"] == {"before": 1, "after": 2} and lin["history"] == []
    assert lin["created_at"].endswith("Z")
    with_adj = merge_labels(base, [li, wang], tmp_path / "t3.jsonl", adjudicator="wang")
    assert load_testset(tmp_path / "t3.jsonl").records()[2]["relevant"]["D"] == 3 and not with_adj.median_items


def test_a_judgement_for_a_query_not_in_the_test_set_names_file_and_line(base, tmp_path):
    li = log(tmp_path / "li.jsonl", [("q1", "A", 3, "li"), ("q9", "A", 1, "li"), ("q8", "B", 0, "li")])
    out = tmp_path / "t2.jsonl"
    with pytest.raises(InputError) as e:
        merge_labels(base, [li], out)
    assert f"{li}, line 2, field 'query_id': query 'q9' is not in the test set {base}" in str(e.value)
    assert [p.line for p in e.value.problems] == [2, 3]
    assert not out.exists() and not lineage_path(out).exists()


def test_a_chain_of_two_merges(base, tmp_path):
    t2, t3 = tmp_path / "t2.jsonl", tmp_path / "t3.jsonl"
    merge_labels(base, [log(tmp_path / "a.jsonl", [("q3", "D", 2, "li")])], t2)
    merge_labels(t2, [log(tmp_path / "b.jsonl", [("q2", "C", 1, "wang")])], t3)
    h1, h2, h3 = (load_testset(p).hash for p in (base, t2, t3))
    lin3 = read_lineage(t3)
    assert lin3 is not None and lin3["hash"] == h3 and lin3["parent"]["hash"] == h2
    assert [h["hash"] for h in lin3["history"]] == [h2] and lin3["history"][0]["parent"]["hash"] == h1
    assert ancestors(t3) == [h2, h1]
    assert is_ancestor(h1, t3) and is_ancestor(h2, t3) and not is_ancestor(h3, t3) and not is_ancestor(h3, t2)
    assert lin3["valid_queries"] == {"before": 2, "after": 3}


def test_a_test_set_edited_after_its_lineage_is_stale(base, tmp_path):
    t2 = tmp_path / "t2.jsonl"
    merge_labels(base, [log(tmp_path / "a.jsonl", [("q3", "D", 2, "li")])], t2)
    t2.write_text(t2.read_text(encoding="utf-8").replace('"D": 2', '"D": 3'), encoding="utf-8")
    with pytest.raises(InputError, match="edited after its lineage was written"):
        read_lineage(t2)
    # merging on top of it starts a new chain instead of claiming the stale one
    merge_labels(t2, [log(tmp_path / "b.jsonl", [("q2", "C", 1, "li")])], tmp_path / "t3.jsonl")
    assert read_lineage(tmp_path / "t3.jsonl")["history"] == []


def _manifest(path: Path, name: str) -> dict:
    return {"run_name": name, "testset": {"path": str(path), "hash": load_testset(path).hash}}


def test_rescore_plan_uses_the_newer_version_or_says_why_not(base, tmp_path):
    t2 = tmp_path / "t2.jsonl"
    merge_labels(base, [log(tmp_path / "a.jsonl", [("q3", "D", 2, "li")])], t2)
    old, new = _manifest(base, "old"), _manifest(t2, "new")
    for a, b in ((old, new), (new, old)):
        path, reason = rescore_plan(a, b)
        assert path == str(t2) and "an ancestor of new's test set" in reason
    assert rescore_plan(old, old) == (None, f"both runs were scored on the same test-set version "
                                            f"({old['testset']['hash'][:19]}...): nothing to re-score")
    other = tmp_path / "other.jsonl"
    TestSet.from_records([{"query_id": "x", "query": "别的", "relevant": {"Q": 1}}]).to_jsonl(other)
    path, reason = rescore_plan(old, _manifest(other, "other"))
    assert path is None and "are not versions of one another" in reason
    gone = dict(new, testset=dict(new["testset"], path=str(tmp_path / "moved.jsonl")))
    path, reason = rescore_plan(old, gone)
    assert path is None and "moved.jsonl) is missing" in reason
    path, reason = rescore_plan({"testset": {}}, new)
    assert path is None and reason == "run A records no test-set version (manifest testset.hash)"


def test_rescore_plan_follows_a_test_set_that_moved_on(base, tmp_path):
    """Run B's test-set file has since become a later version: it still descends from both runs' versions."""
    t2 = tmp_path / "t2.jsonl"
    merge_labels(base, [log(tmp_path / "a.jsonl", [("q3", "D", 2, "li")])], t2)
    b = _manifest(t2, "b")
    t3 = tmp_path / "t3.jsonl"
    merge_labels(t2, [log(tmp_path / "b.jsonl", [("q2", "C", 1, "li")])], t3)
    for src, dst in ((t3, t2), (lineage_path(t3), lineage_path(t2))):   # t2's file replaced by t3 (moved over it)
        dst.write_bytes(src.read_bytes())
    path, reason = rescore_plan(_manifest(base, "a"), b)
    assert path == str(t2) and "now at the later version" in reason


def test_round_trip_worksheet_labels_merge_score(base, tmp_path):
    """A worksheet from pooling, filled, merged: the new version makes more queries valid and scores them."""
    run = make_run(tmp_path, "run", [*ranked("q1", ["A", "X"]), *ranked("q2", ["Y", "C"]), *ranked("q3", ["Z", "W"])],
                   base, inventory={"X": "x", "Y": "y", "Z": "z", "W": "w"})
    ws = tmp_path / "ws.csv"
    write_worksheet(pool(base, [run], depth=10, assessor="li").rows, ws)
    rows = list(csv.DictReader(io.StringIO(ws.read_text(encoding="utf-8-sig"), newline="")))
    assert [(r["query_id"], r["chunk_id"]) for r in rows] == [("q1", "X"), ("q2", "Y"), ("q3", "Z"), ("q3", "W")]
    for r in rows:
        r["grade"] = {"Y": "3", "Z": "0", "W": "2"}.get(r["chunk_id"], "")
    with open(ws, "w", encoding="utf-8-sig", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    before = weknora_nb.score(load_testset(base), weknora_nb.read_results(run / "results.parquet"), ["recall@2"])
    t2 = tmp_path / "t2.jsonl"
    assert main(["testset", "merge-labels", "--testset", str(base), "--labels", str(ws), "--out", str(t2)]) == 0
    after = weknora_nb.score(load_testset(t2), weknora_nb.read_results(run / "results.parquet"), ["recall@2"])
    assert (before.counts.n_valid, after.counts.n_valid) == (1, 3)
    assert is_ancestor(read_manifest(run)["testset"]["hash"], t2)


def test_worksheet_rows_are_named_in_errors(base, tmp_path):
    ws = tmp_path / "ws.csv"
    ws.write_text("query_id,chunk_id,grade,assessor\nq1,A,2,li\nq7,B,1,li\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"ws.csv, row 3, field 'query_id': query 'q7' is not in the test set"):
        merge_labels(base, [label_file(ws)], tmp_path / "t2.jsonl")


def test_cli_merge_labels_prints_what_changed(base, tmp_path, capsys):
    li = log(tmp_path / "li.jsonl", [("q3", "D", 1, "li"), ("q3", "D", 3, "li")])
    wang = log(tmp_path / "wang.jsonl", [("q3", "D", 0, "wang")])
    out = tmp_path / "t2.jsonl"
    code = main(["testset", "merge-labels", "--testset", str(base), "--labels", str(li), str(wang), "--out", str(out),
                 "--adjudicator", "li"])
    text = capsys.readouterr().out
    assert code == 0 and "labels added 1, changed 0, unchanged 0" in text and "resolved by the adjudicator: 1" in text
    assert "valid queries: 1 -> 2 of 3" in text
    bad = log(tmp_path / "bad.jsonl", [("nope", "D", 1, "li")])
    assert main(["testset", "merge-labels", "--testset", str(base), "--labels", str(bad), "--out",
                 str(tmp_path / "t3.jsonl")]) == 2
    assert "line 1, field 'query_id'" in capsys.readouterr().err
