"""Run folders are untrusted input: the run name decides where reports go, the manifest's fields are
checked when it is read, and a relative test-set path is found from the run folder or the current one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from weknora_nb import cli, write_results
from weknora_nb.core.errors import InputError, RunFolderError, UsageError
from weknora_nb.core.run import MANIFEST, check_run_name, load_run, read_manifest
from weknora_nb.core.testset import TestSet

from .conftest import ranked, results_frame

TS = TestSet.from_records([{"query_id": "q1", "query": "a", "relevant": {"A": 3}},
                           {"query_id": "q2", "query": "b", "relevant": {"B": 1}}])


def make_run(folder: Path, testset_path: str | None = None, **manifest) -> Path:
    """A finished run folder: results for both queries, a manifest with ``manifest``'s keys."""
    folder.mkdir(parents=True, exist_ok=True)
    write_results(results_frame(ranked("q1", ["A"]) + ranked("q2", ["A", "B"])), folder / "results.parquet")
    body = {"run_name": folder.name, "testset": {"path": testset_path, "hash": TS.hash}, **manifest}
    (folder / MANIFEST).write_text(json.dumps(body), encoding="utf-8")
    return folder


# ---------------------------------------------------------------- finding 4: the run name

BAD_NAMES = ["../../../../tmp/x", "/tmp/x", "a/b", "a\\b", "", ".", "..", ".hidden", "a\x00b", "a\nb", "tab\there",
             "x" * 121, "é" * 121, "\u6d4b" * 81, "C:x", "a:b", "what?", "a*b", "a|b", "<a>", 'say"hi"', "ends.",
             "ends ", " starts", "CON", "nul.txt", "lpt1", 7, ["a"], {"a": 1}, True, "\ud800x", "line\u2028sep"]
GOOD_NAMES = ["r1", "rerank-v2", "baseline_2026.11.01", "基线 对比", "x" * 120, "\u6d4b" * 80, "a.b", "a b",
              "x..y", "CONSOLE", "com10"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_an_unsafe_run_name_is_refused_naming_the_manifest_and_field(tmp_path, name):
    folder = make_run(tmp_path / "runs" / "r1", str(tmp_path / "t.jsonl"), run_name=name)
    with pytest.raises(RunFolderError) as err:
        read_manifest(folder)
    message = str(err.value)
    assert str(folder / MANIFEST) in message and "'run_name'" in message and "\n" not in message.strip()
    with pytest.raises(RunFolderError):
        check_run_name(name, "somewhere")


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_a_safe_run_name_is_kept(tmp_path, name):
    assert check_run_name(name, "x") == name
    TS.to_jsonl(tmp_path / "t.jsonl")
    folder = make_run(tmp_path / "runs" / "r1", str(tmp_path / "t.jsonl"), run_name=name)
    assert read_manifest(folder)["run_name"] == name
    assert load_run(folder).name == name


def test_check_run_name_takes_the_error_to_raise():
    with pytest.raises(UsageError, match="--out"):
        check_run_name("..", "--out", error=UsageError)


def test_without_a_run_name_the_folder_name_is_used_and_checked(tmp_path):
    TS.to_jsonl(tmp_path / "t.jsonl")
    folder = make_run(tmp_path / "runs" / "r1", str(tmp_path / "t.jsonl"), run_name=None)
    assert load_run(folder).name == "r1"
    hidden = make_run(tmp_path / "runs" / ".r2", str(tmp_path / "t.jsonl"), run_name=None)
    run = load_run(hidden)
    with pytest.raises(RunFolderError, match="run_name"):
        _ = run.name


def test_a_run_name_changed_after_reading_is_checked_again(tmp_path):
    TS.to_jsonl(tmp_path / "t.jsonl")
    run = load_run(make_run(tmp_path / "runs" / "r1", str(tmp_path / "t.jsonl")))
    run.manifest["run_name"] = "../elsewhere"
    with pytest.raises(RunFolderError, match="run_name"):
        _ = run.name


def test_report_refuses_a_run_name_that_leaves_the_reports_folder(tmp_path, capsys):
    """Before the fix the report was written to ``<tmp>/escaped``, outside ``--out``."""
    TS.to_jsonl(tmp_path / "t.jsonl")
    out = tmp_path / "reports"
    folder = make_run(tmp_path / "runs" / "r1", str(tmp_path / "t.jsonl"), run_name="../escaped")
    code = cli.main(["report", "--run", str(folder), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "'run_name'" in err and str(folder / MANIFEST) in err and "Traceback" not in err
    assert not (tmp_path / "escaped").exists() and not out.exists()


def test_gate_refuses_an_absolute_run_name(tmp_path, capsys):
    TS.to_jsonl(tmp_path / "t.jsonl")
    folder = make_run(tmp_path / "runs" / "r1", str(tmp_path / "t.jsonl"), run_name=str(tmp_path / "abs"))
    assert cli.main(["gate", "--run", str(folder), "--min", "ndcg@5=0.1"]) == 2
    assert "'run_name'" in capsys.readouterr().err


# ---------------------------------------------------------------- finding 4: the other manifest fields

@pytest.mark.parametrize("manifest, field", [
    ({"testset": ["t.jsonl"]}, "testset"),
    ({"testset": {"path": 5, "hash": None}}, "testset.path"),
    ({"testset": {"path": ["t.jsonl"], "hash": None}}, "testset.path"),
    ({"testset": {"path": "a\x00b", "hash": None}}, "testset.path"),
    ({"testset": {"path": "", "hash": None}}, "testset.path"),
    ({"testset": {"path": "t.jsonl", "hash": 12}}, "testset.hash"),
    ({"stages": ["final"]}, "stages"),
    ({"stages": {"final": "hybrid-search"}}, "stages.final"),
    ({"notes": "a note"}, "notes"),
    ({"notes": [1, 2]}, "notes"),
    ({"knowledge_bases": []}, "knowledge_bases"),
    ({"sessions": "none"}, "sessions"),
    ({"server": "v1"}, "server"),
    ({"retrieval_config": [1]}, "retrieval_config"),
    ({"started_at": 5}, "started_at"),
])
def test_a_manifest_field_of_the_wrong_shape_is_named(tmp_path, manifest, field):
    folder = tmp_path / "r1"
    folder.mkdir()
    (folder / MANIFEST).write_text(json.dumps({"run_name": "r1", **manifest}), encoding="utf-8")
    with pytest.raises(RunFolderError) as err:
        read_manifest(folder)
    assert f"field '{field}'" in str(err.value) and str(folder / MANIFEST) in str(err.value)


@pytest.mark.parametrize("content", [b"", b"{", b"[1, 2]", b"\xff\xfe{}", b"[" * 100_000,
                                     b'{"a": 1' + b"0" * 5000 + b"}", b"null"])
def test_a_damaged_manifest_is_a_run_folder_error(tmp_path, content):
    (tmp_path / MANIFEST).write_bytes(content)
    with pytest.raises(RunFolderError) as err:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST) in str(err.value)


def test_a_manifest_that_is_a_folder_is_no_run(tmp_path):
    (tmp_path / MANIFEST).mkdir()
    with pytest.raises(RunFolderError, match="not a run folder"):
        read_manifest(tmp_path)


def test_a_damaged_chunk_listing_is_an_input_error(tmp_path):
    TS.to_jsonl(tmp_path / "t.jsonl")
    run = load_run(make_run(tmp_path / "runs" / "r1", str(tmp_path / "t.jsonl")))
    (run.path / "chunks.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InputError) as err:
        run.inventory()
    assert str(run.path / "chunks.parquet") in str(err.value)


# ---------------------------------------------------------------- finding 5: a relative test-set path

def test_a_relative_testset_path_is_found_next_to_the_run_folder(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    folder = make_run(runs / "r1", "../../data/t.jsonl")  # stored relative to the run folder
    (tmp_path / "data").mkdir()
    TS.to_jsonl(tmp_path / "data" / "t.jsonl")
    monkeypatch.chdir(tmp_path / "runs")  # anywhere but the folder the path was written from
    run = load_run(folder)
    assert run.testset.hash == TS.hash and run.scores.counts.n_scored == 2


def test_a_relative_testset_path_of_an_older_run_is_found_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    TS.to_jsonl(tmp_path / "data" / "t.jsonl")
    folder = make_run(tmp_path / "runs" / "r1", "data/t.jsonl")  # as written by `collect --testset data/t.jsonl`
    monkeypatch.chdir(tmp_path)
    assert load_run(folder).testset.hash == TS.hash
    monkeypatch.chdir(tmp_path / "runs")
    with pytest.raises(RunFolderError) as err:
        load_run(folder)
    message = str(err.value)
    assert str(folder / MANIFEST) in message and "'testset.path'" in message and "data/t.jsonl" in message
    assert "put the file back at that path" in message


def test_the_run_folder_is_tried_before_the_current_folder(tmp_path, monkeypatch):
    folder = make_run(tmp_path / "runs" / "r1", "t.jsonl")
    TS.to_jsonl(folder / "t.jsonl")
    other = TestSet.from_records([{"query_id": "q1", "query": "other", "relevant": {"Z": 1}}])
    other.to_jsonl(tmp_path / "t.jsonl")  # same relative name in the current folder, another test set
    monkeypatch.chdir(tmp_path)
    assert load_run(folder).testset.hash == TS.hash


def test_an_absolute_testset_path_that_is_gone_says_to_pass_the_testset(tmp_path):
    folder = make_run(tmp_path / "runs" / "r1", str(tmp_path / "gone.jsonl"))
    with pytest.raises(RunFolderError) as err:
        load_run(folder)
    message = str(err.value)
    assert "'testset.path'" in message and "gone.jsonl" in message and "put the file back" in message
    TS.to_jsonl(tmp_path / "elsewhere.jsonl")
    assert load_run(folder, testset=tmp_path / "elsewhere.jsonl").testset.hash == TS.hash


def test_gate_works_from_another_folder_with_a_relative_testset_path(tmp_path, monkeypatch, capsys):
    folder = make_run(tmp_path / "runs" / "r1", "t.jsonl")
    TS.to_jsonl(folder / "t.jsonl")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["gate", "--run", os.path.relpath(folder, tmp_path), "--min", "hit@5=0.5"]) == 0, \
        capsys.readouterr().err
