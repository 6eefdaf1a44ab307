"""Pooling for judging and the worksheet people judge in (analysis/pooling.py, analysis/worksheet.py,
``testset pool``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb import TestSet
from weknora_nb.analysis.pooling import NO_TEXT, pool
from weknora_nb.analysis.worksheet import WORKSHEET_COLUMNS, read_judgements, read_worksheet, write_worksheet
from weknora_nb.cli import main
from weknora_nb.core.errors import InputError, RunFolderError
from weknora_nb.core.results import write_results

from .conftest import failed, ranked, results_frame

CHUNKS = {"A": "甲文档：网关默认端口是 8080。", "B": "乙", "C": "丙：重置密码请联系管理员。", "D": "=HYPERLINK(\"x\")",
          "E": "戊", "F": "己", "G": "- 列表项开头的文本"}


def make_testset(tmp: Path) -> Path:
    path = tmp / "t.jsonl"
    TestSet.from_records([
        {"query_id": "q1", "query": "默认端口是多少？", "relevant": {"A": 3, "B": 0}},
        {"query_id": "q2", "query": "如何重置密码", "relevant": {}},
        {"query_id": "q3", "query": "没有结果的查询", "relevant": {"A": 1}},
    ]).to_jsonl(path)
    return path


def make_run(tmp: Path, name: str, rows: list[tuple], ts_path: Path, *, inventory: dict[str, str] | None = None,
             run_name: str | None = None) -> Path:
    """A run folder: manifest, results.parquet from ``rows``, and a chunks.parquet of ``inventory``."""
    d = tmp / name
    d.mkdir()
    write_results(results_frame(rows), d / "results.parquet")
    ts = TestSet.from_records([json.loads(x) for x in ts_path.read_text(encoding="utf-8").splitlines()])
    (d / "manifest.json").write_text(json.dumps({"run_name": run_name or name,
                                                 "testset": {"path": str(ts_path), "hash": ts.hash}}))
    if inventory is not None:
        pd.DataFrame([{"chunk_id": c, "knowledge_base_id": "kb", "knowledge_id": "doc", "knowledge_title": f"标题{c}",
                       "chunk_index": i, "is_enabled": True, "content": t}
                      for i, (c, t) in enumerate(inventory.items())]).to_parquet(d / "chunks.parquet")
    return d


@pytest.fixture
def pooled(tmp_path):
    ts = make_testset(tmp_path)
    one = make_run(tmp_path, "one", [
        *ranked("q1", ["A", "A", "C", "D", "B", "E"], stage="final"),      # A twice: C is the 2nd distinct chunk
        *ranked("q1", ["F", "C"], stage="vector"),
        *ranked("q1", ["E", "C", "D"], stage="final", repeat=2),            # a repeat: E at rank 1 there
        *failed("q2", stage="final"),
        *ranked("q2", ["C"], stage="vector"),
        *ranked("zz", ["X"], stage="final"),                               # a query the test set lacks
    ], ts, inventory={c: t for c, t in CHUNKS.items() if c != "G"})
    two = make_run(tmp_path, "two", [*ranked("q1", ["G", "A", "C", "Z"], stage="final"), *ranked("q3", [])], ts,
                   inventory={"G": CHUNKS["G"]})
    return ts, one, two


def test_pool_is_the_union_of_every_stage_and_run_top_depth_without_the_labelled(pooled):
    ts, one, two = pooled
    p = pool(ts, [one, two], depth=3, assessor="li")
    got = p.rows[["query_id", "chunk_id", "best_rank", "found_in"]].values.tolist()
    assert got == [
        ["q1", "E", 1, "one/final@1"],                         # repeat 2's first chunk counts
        ["q1", "F", 1, "one/vector@1"],
        ["q1", "G", 1, "two/final@1"],
        ["q1", "C", 2, "one/final@2; one/vector@2; two/final@3"],
        ["q1", "D", 3, "one/final@3"],                         # B (labelled 0) and Z (rank 4) are not pooled
        ["q2", "C", 1, "one/vector@1"],                        # q2's failed final request gives nothing
    ]
    assert list(p.rows.columns) == list(WORKSHEET_COLUMNS)
    assert set(p.rows["assessor"]) == {"li"} and p.rows["grade"].isna().all()
    assert p.n_failed_requests == 1 and p.n_unknown_queries == 1 and p.n_queries == 3


def test_pooled_chunks_carry_their_text_or_a_note(pooled):
    ts, one, two = pooled
    rows = pool(ts, [one, two], depth=5).rows.set_index(["query_id", "chunk_id"])
    assert rows.loc[("q1", "C"), "content"] == CHUNKS["C"] and rows.loc[("q1", "C"), "knowledge_title"] == "标题C"
    assert rows.loc[("q1", "G"), "content"] == CHUNKS["G"]            # from the second run's inventory
    assert rows.loc[("q1", "Z"), "content"] == "" and rows.loc[("q1", "Z"), "note"] == NO_TEXT


def test_coverage_is_the_labelled_share_of_each_run_and_stage_top_depth(pooled):
    ts, one, two = pooled
    p = pool(ts, [one, two], depth=3)
    cov = {(r.run, r.stage): (r.labelled, r.in_top) for r in p.coverage.itertuples()}
    # one/final: repeat 1 top 3 = A, C, D; repeat 2 adds E -> A is labelled (q1); q2 failed
    assert cov == {("one", "final"): (1, 4), ("one", "vector"): (0, 3), ("two", "final"): (1, 3)}
    text = p.describe()
    assert "one/final: 25% (1 of 4)" in text and "1 failed requests" in text


def test_csv_worksheet_has_a_bom_defuses_formulas_and_reads_back(pooled, tmp_path):
    ts, one, two = pooled
    p = pool(ts, [one, two], depth=3)
    out = write_worksheet(p.rows, tmp_path / "ws.csv")
    raw = out.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and "默认端口是多少" in raw.decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"), newline="")))
    d = next(r for r in rows if r["chunk_id"] == "D")
    assert d["content"] == "'=HYPERLINK(\"x\")"                        # a spreadsheet shows it, never runs it
    for r in rows:
        r["grade"], r["assessor"] = {"C": "2", "D": "0", "E": ""}.get(r["chunk_id"], ""), "wang"
    _write_csv(out, rows)
    got = {(j.query_id, j.chunk_id): (j.grade, j.assessor) for j in read_worksheet(out)}
    assert got == {("q1", "C"): (2, "wang"), ("q1", "D"): (0, "wang"), ("q2", "C"): (2, "wang")}


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_xlsx_worksheet_round_trip_keeps_text_cells(pooled, tmp_path):
    from openpyxl import load_workbook

    ts, one, two = pooled
    out = write_worksheet(pool(ts, [one, two], depth=3).rows, tmp_path / "ws.xlsx")
    wb = load_workbook(out)
    ws = wb.active
    header = [c.value for c in ws[1]]
    assert header == list(WORKSHEET_COLUMNS)
    col = {h: i + 1 for i, h in enumerate(header)}
    for r in range(2, ws.max_row + 1):
        cid = ws.cell(r, col["chunk_id"]).value
        if cid == "D":
            cell = ws.cell(r, col["content"])
            assert cell.value == '=HYPERLINK("x")' and cell.data_type == "s"   # text, not a formula
        ws.cell(r, col["grade"]).value = {"C": 3, "G": 1.0}.get(cid)           # Excel numbers may be floats
    wb.save(out)
    got = {(j.query_id, j.chunk_id, j.grade, j.assessor) for j in read_worksheet(out, assessor="zhao")}
    assert got == {("q1", "C", 3, "zhao"), ("q1", "G", 1, "zhao"), ("q2", "C", 3, "zhao")}


@pytest.mark.parametrize("bad", ["4", "high", "2.5", "-1"])
def test_a_bad_grade_names_file_row_and_field(tmp_path, bad):
    path = tmp_path / "ws.csv"
    _write_csv(path, [{"query_id": "q1", "chunk_id": "A", "grade": "1", "assessor": "li"},
                      {"query_id": "q1", "chunk_id": "B", "grade": bad, "assessor": "li"}])
    with pytest.raises(InputError) as e:
        read_worksheet(path)
    assert f"{path}, row 3, field 'grade': must be 0, 1, 2 or 3 (blank: not judged), got {bad!r}" in str(e.value)


def test_a_graded_row_without_assessor_or_ids_is_reported(tmp_path):
    path = tmp_path / "ws.csv"
    _write_csv(path, [{"query_id": "q1", "chunk_id": "", "grade": "1", "assessor": ""},
                      {"query_id": "q1", "chunk_id": "B", "grade": "", "assessor": ""}])   # blank grade: fine
    with pytest.raises(InputError) as e:
        read_worksheet(path)
    assert [(p.line, p.field) for p in e.value.problems] == [(2, "chunk_id"), (2, "assessor")]


def test_a_worksheet_that_is_not_one_is_an_input_error(tmp_path):
    (tmp_path / "ws.xlsx").write_text("not a workbook")
    (tmp_path / "ws.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="ws.xlsx"):
        read_worksheet(tmp_path / "ws.xlsx")
    with pytest.raises(InputError, match=r"missing column\(s\) \['query_id', 'chunk_id', 'grade'\]"):
        read_worksheet(tmp_path / "ws.csv")


def test_read_judgements_reads_labels_logs_and_worksheets(tmp_path):
    from weknora_nb.core.labels import LabelsLog

    LabelsLog(tmp_path / "l.jsonl").append("q1", "A", 2, assessor="li")
    _write_csv(tmp_path / "w.csv", [{"query_id": "q1", "chunk_id": "A", "grade": "3", "assessor": "wang"}])
    assert [(j.assessor, j.grade) for j in read_judgements(tmp_path / "l.jsonl")] == [("li", 2)]
    assert [(j.assessor, j.grade) for j in read_judgements(tmp_path / "w.csv")] == [("wang", 3)]


def test_cli_pool_writes_the_worksheet_and_prints_the_summary(pooled, tmp_path, capsys):
    ts, one, two = pooled
    out = tmp_path / "ws.csv"
    code = main(["testset", "pool", "--testset", str(ts), "--runs", str(one), str(two), "--depth", "3",
                 "--out", str(out), "--assessor", "li"])
    text = capsys.readouterr().out
    assert code == 0 and out.is_file()
    assert "3 queries, 6 chunks to judge for 2 of them" in text and "two/final: 33% (1 of 3)" in text
    assert len(read_worksheet(out)) == 0                               # nothing graded yet


def test_cli_pool_refuses_a_folder_that_is_not_a_run(pooled, tmp_path, capsys):
    ts, one, _ = pooled
    code = main(["testset", "pool", "--testset", str(ts), "--runs", str(one), str(tmp_path), "--out",
                 str(tmp_path / "w.csv")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --runs:") and "is not a run folder" in err
    with pytest.raises(RunFolderError):
        pool(ts, [tmp_path])
