"""The labelling notebook's Python API (weknora_nb.reports.labelling) over real files: every judgement on
disk at once, back and regrade, resume, a SIGKILLed labeller, escaped chunk text. No browser here
(tests/test_browser.py clicks the same widget in Chromium)."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb.core.errors import InputError, UsageError
from weknora_nb.core.labels import LabelsLog, latest
from weknora_nb.reports.labelling import LabellingSession, highlight, query_terms, read_worksheet

COLUMNS = ["query_id", "query", "chunk_id", "knowledge_title", "content", "found_in", "best_rank", "grade",
           "assessor", "note"]
EVIL = '<script>alert("kb")</script><img src=x onerror="alert(1)">'


def write_worksheet(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    """A worksheet as `testset pool` writes it (UTF-8 with BOM) from (query_id, query, chunk_id, content) rows."""
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for q, text, c, content in rows:
            w.writerow([q, text, c, f"title of {c}", content, "final;hybrid", 1, "", "", ""])
    return path


@pytest.fixture
def sheet(tmp_path) -> Path:
    return write_worksheet(tmp_path / "worksheet.csv", [
        ("q1", "年假怎么申请", "d1:000", "年假申请须提前三天提交。"),
        ("q1", "年假怎么申请", "d1:001", "病假需要医院证明。"),
        ("q2", "VPN password reset", "d2:000", "Reset your VPN password in the portal."),
        ("q2", "VPN password reset", "d2:001", "The canteen opens at noon."),
        ("q3", "报销流程", "d3:000", "报销流程分三步。"),
    ])


def log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_each_grade_is_a_line_with_assessor_and_time_when_grade_returns(sheet, tmp_path):
    s = LabellingSession(sheet, tmp_path / "labels.jsonl", " li ")
    assert s.current.key == ("q1", "d1:000") and s.progress.done == 0
    s.grade(3)
    lines = log_lines(tmp_path / "labels.jsonl")  # read back from disk, no close or flush in between
    assert [(x["query_id"], x["chunk_id"], x["grade"], x["assessor"]) for x in lines] == [("q1", "d1:000", 3, "li")]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", lines[0]["at"])
    s.grade(0)
    s.skip()
    assert [x["grade"] for x in log_lines(tmp_path / "labels.jsonl")] == [3, 0, None]
    p = s.progress
    assert (p.done, p.total, p.skipped, p.graded) == (3, 5, 1, 2)
    assert p.per_query == {"q1": (2, 2), "q2": (1, 2), "q3": (0, 1)}
    assert s.current.key == ("q2", "d2:001")
    with pytest.raises(UsageError):
        s.grade(4)
    assert len(log_lines(tmp_path / "labels.jsonl")) == 3  # a refused grade writes nothing


def test_back_and_regrade_appends_a_line_that_wins(sheet, tmp_path):
    log = LabelsLog(tmp_path / "labels.jsonl")
    s = LabellingSession(sheet, log, "li")
    s.grade(1)
    s.grade(2)
    assert s.back() and s.current.key == ("q1", "d1:001")
    assert s.earlier() == (True, 2)
    s.grade(0)
    assert s.current.key == ("q2", "d2:000")  # back to where the assessor was
    assert [j.grade for j in log.read()] == [1, 2, 0]  # nothing rewritten: appended
    assert {(j.chunk_id, j.grade) for j in latest(log.read())} == {("d1:000", 1), ("d1:001", 0)}
    s.back()
    s.back()
    assert s.current.key == ("q1", "d1:000") and not s.back()  # the first candidate has no previous one


def test_a_new_session_resumes_at_the_first_unjudged_candidate(sheet, tmp_path):
    log = tmp_path / "labels.jsonl"
    first = LabellingSession(sheet, log, "li")
    first.grade(3)
    first.skip()
    first.grade(2)
    LabelsLog(log).append("q3", "d3:000", 1, assessor="li")       # judged out of order (an earlier session)
    LabelsLog(log).append("q2", "d2:001", 0, assessor="wang")     # someone else's judgement does not count
    again = LabellingSession(sheet, log, "li")
    assert again.current.key == ("q2", "d2:001")
    assert (again.progress.done, again.progress.skipped) == (4, 1)
    again.grade(1)
    assert again.done and again.current is None
    with pytest.raises(UsageError, match="every candidate has been judged"):
        again.grade(2)
    assert LabellingSession(sheet, log, "wang").current.key == ("q1", "d1:000")


KILLED_LABELLER = textwrap.dedent("""
    import sys
    from weknora_nb.reports.labelling import LabellingSession
    s = LabellingSession(sys.argv[1], sys.argv[2], "li")
    i = 0
    while True:            # grades every candidate, then goes back and regrades the last one, forever
        if s.current is None:
            s.back()
        item, g = s.current, i % 4
        s.grade(g)
        print(item.query_id, item.chunk_id, g, flush=True)   # confirmed: grade() has returned
        i += 1
""")


def test_a_labeller_killed_between_two_labels_loses_none_it_confirmed(tmp_path):
    rows = [(f"q{i // 4}", f"query {i // 4}", f"c{i}", f"text {i}") for i in range(40)]
    sheet = write_worksheet(tmp_path / "worksheet.csv", rows)
    log = tmp_path / "labels.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_LABELLER, str(sheet), str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        confirmed = [proc.stdout.readline().split() for _ in range(60)]  # past the 40: regrades too
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL, err
    confirmed += [line.split() for line in out.splitlines()]
    written = [[j.query_id, j.chunk_id, str(j.grade)] for j in LabelsLog(log).read()]  # reads back: no error
    assert written[:len(confirmed)] == confirmed
    assert len(written) - len(confirmed) in (0, 1)  # at most the one it had no time to confirm
    resumed = LabellingSession(sheet, log, "li")
    assert resumed.done and resumed.progress.done == 40


def test_a_torn_last_line_is_dropped_and_the_next_grade_follows_a_whole_line(sheet, tmp_path, caplog):
    log = tmp_path / "labels.jsonl"
    s = LabellingSession(sheet, log, "li")
    s.grade(2)
    with open(log, "a", encoding="utf-8") as f:
        f.write('{"query_id":"q1","chunk_id":"d1:001","gra')  # a crash in the middle of a write
    again = LabellingSession(sheet, log, "li")
    assert "torn" in caplog.text
    assert again.current.key == ("q1", "d1:001")  # the torn judgement is not counted
    again.grade(1)
    assert [(x["chunk_id"], x["grade"]) for x in log_lines(log)] == [("d1:000", 2), ("d1:001", 1)]


def test_chunk_text_is_escaped_before_the_query_terms_are_marked(tmp_path):
    sheet = write_worksheet(tmp_path / "w.csv", [("q1", "script 统计脚本 amp", "c1", f"统计脚本 {EVIL} & amp")])
    s = LabellingSession(sheet, tmp_path / "labels.jsonl", "li")
    s.widget()
    chunk = s.ui.chunk.value
    assert "<script" not in chunk and "<img" not in chunk and "onerror=\"" not in chunk
    assert "&lt;<mark>script</mark>&gt;alert(&quot;kb&quot;)&lt;/<mark>script</mark>&gt;" in chunk
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in chunk
    assert "<mark>统计脚本</mark>" in chunk  # the bigrams 统计 计脚 脚本, marked as one run
    assert "&amp; <mark>amp</mark>" in chunk  # the entity escaping made is never cut by a mark
    assert "<mark>" not in s.ui.query.value and "script 统计脚本 amp" in s.ui.query.value


def test_query_terms_are_words_and_cjk_bigrams():
    assert query_terms("VPN 密码怎么重置 a") == ["vpn", "密码", "码怎", "怎么", "么重", "重置"]
    assert highlight("Reset the vpn", ["vpn"]) == "Reset the <mark>vpn</mark>"
    assert highlight("<b>", []) == "&lt;b&gt;"


def test_the_widget_buttons_and_keys_call_the_session(sheet, tmp_path):
    log = tmp_path / "labels.jsonl"
    s = LabellingSession(sheet, log, "li")
    s.widget()
    ui = s.ui
    assert [b.description for b in ui.buttons.values()] == ["0 not relevant", "1 partly relevant",
                                                             "2 highly relevant", "3 fully relevant"]
    assert "wk-grade-2" in ui.buttons[2]._dom_classes and "Backspace" in ui.help.value
    ui.buttons[2].click()
    ui.on_key({"type": "keydown", "key": "3"})
    ui.on_key({"type": "keydown", "key": "s"})
    ui.on_key({"type": "keydown", "key": "Backspace"})
    assert "You skipped this one before" in ui.status.value
    ui.on_key({"type": "keydown", "key": "1"})
    ui.on_key({"type": "keydown", "key": "x"})          # not a shortcut: ignored
    ui.on_key({"type": "keydown", "key": "2", "ctrlKey": True})
    assert [(x["chunk_id"], x["grade"]) for x in log_lines(log)] == [
        ("d1:000", 2), ("d1:001", 3), ("d2:000", None), ("d2:000", 1)]
    assert ui.progress_bar.value == 3 and "3 of 5 judged" in ui.progress_text.value
    ui.skip_button.click()
    ui.on_key({"type": "keydown", "key": "0"})
    assert s.done and all(b.disabled for b in ui.buttons.values()) and "All 5 candidates judged" in ui.status.value


def test_an_error_while_saving_is_shown_in_the_panel(sheet, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("", encoding="utf-8")
    s = LabellingSession(sheet, blocked / "labels.jsonl", "li")
    s.widget()
    s.ui.buttons[1].click()
    assert "wk-error" in s.ui.status.value and str(blocked) in s.ui.status.value
    assert s.current.key == ("q1", "d1:000")  # not advanced: nothing was saved


def test_a_worksheet_needs_its_columns_and_an_assessor(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("query_id,chunk_id\nq1,c1\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"field 'query'.*missing column"):
        read_worksheet(bad)
    frame = pd.DataFrame({"query_id": ["q1", ""], "query": ["x", "y"], "chunk_id": ["c1", "c2"], "content": ["", ""]})
    with pytest.raises(InputError, match=r"row 2, field 'query_id': must not be empty"):
        read_worksheet(frame)
    with pytest.raises(InputError, match="No such file"):
        read_worksheet(tmp_path / "missing.csv")
    with pytest.raises(UsageError, match="assessor"):
        LabellingSession(frame.iloc[:1], tmp_path / "l.jsonl", " ")


def test_the_labelling_notebook_is_committed_without_outputs_and_is_not_a_report():
    import nbformat

    from weknora_nb.reports.render import NOTEBOOKS, notebooks_dir

    book = nbformat.read(notebooks_dir() / "07_label.ipynb", as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    assert all(f"{name} =" in code[0].source for name in ("worksheet", "labels_log", "assessor"))
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert any("LabellingSession(" in c.source for c in code) and any(".widget()" in c.source for c in code)
    assert "07_label" not in NOTEBOOKS  # interactive: never rendered as a report
