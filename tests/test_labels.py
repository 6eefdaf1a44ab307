"""The labels log (core.labels): durable appends, torn last lines, strict reading, latest wins."""

from __future__ import annotations

import pytest

from weknora_nb.core.errors import InputError, UsageError
from weknora_nb.core.labels import LabelsLog, latest, read_labels


def test_append_is_on_disk_at_once(tmp_path):
    log = LabelsLog(tmp_path / "sub" / "labels.jsonl")
    j = log.append("q1", "c1", 3, assessor=" li ")
    assert j.assessor == "li" and j.at.endswith("Z")
    assert read_labels(log.path) == [j]  # read back by a second reader, no close or flush needed


def test_torn_last_line_is_dropped_and_cut_before_the_next_append(tmp_path, caplog):
    log = LabelsLog(tmp_path / "l.jsonl")
    log.append("q1", "c1", 2, assessor="li")
    with open(log.path, "a", encoding="utf-8") as f:
        f.write('{"query_id": "q1", "chunk_id": "c2", "gra')  # a crash while writing
    assert [j.chunk_id for j in log.read()] == ["c1"]
    assert "torn last line" in caplog.text
    log.append("q1", "c3", None, assessor="li")
    assert [(j.chunk_id, j.grade) for j in log.read()] == [("c1", 2), ("c3", None)]


def test_a_whole_last_line_without_newline_is_kept(tmp_path):
    p = tmp_path / "l.jsonl"
    p.write_text('{"query_id":"q","chunk_id":"c","grade":1,"assessor":"a","at":"t"}', encoding="utf-8")
    log = LabelsLog(p)
    log.append("q", "d", 0, assessor="a")
    assert [j.chunk_id for j in log.read()] == ["c", "d"]


def test_a_bad_line_in_the_middle_names_file_line_and_field(tmp_path):
    p = tmp_path / "l.jsonl"
    p.write_text('{"query_id":"q","chunk_id":"c","grade":7,"assessor":"a","at":"t"}\n'
                 '{"query_id":"q","chunk_id":"","grade":1,"assessor":"a","at":"t"}\n', encoding="utf-8")
    with pytest.raises(InputError) as e:
        read_labels(p)
    text = str(e.value)
    assert "line 1, field 'grade'" in text and "line 2, field 'chunk_id'" in text


def test_latest_judgement_wins_per_assessor(tmp_path):
    log = LabelsLog(tmp_path / "l.jsonl")
    log.append("q", "c", 1, assessor="li")
    log.append("q", "c", 2, assessor="wang")
    log.append("q", "c", 3, assessor="li")  # li went back and changed the grade
    got = {(j.assessor, j.grade) for j in latest(log.read())}
    assert got == {("wang", 2), ("li", 3)}


@pytest.mark.parametrize("grade", [4, -1, True, "2", 1.5])
def test_grades_outside_the_scale_are_refused(tmp_path, grade):
    with pytest.raises(UsageError, match="grade must be one of 0, 1, 2, 3, None"):
        LabelsLog(tmp_path / "l.jsonl").append("q", "c", grade, assessor="li")


def test_an_assessor_is_required(tmp_path):
    with pytest.raises(UsageError, match="assessor"):
        LabelsLog(tmp_path / "l.jsonl").append("q", "c", 1, assessor=" ")


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="No such file"):
        read_labels(tmp_path / "nope.jsonl")
