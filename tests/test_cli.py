"""The command line, run as a user runs it (a subprocess), and its error contract.

Exit 0 success, 1 a negative verdict, 2 unusable input; an error is one line on stderr
(an input file's problems may follow its first line) and never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from weknora_nb import cli, write_results
from weknora_nb.collect.run.system import load_system_description
from weknora_nb.core.errors import (
    AuthFailed,
    ConfigError,
    ConnectFailed,
    MetricError,
    NotComparableError,
    ReportError,
    ResultsError,
    RunExistsError,
    RunFolderError,
    SandboxError,
    TestSetError,
    UsageError,
)
from weknora_nb.core.testset import TestSet, load_testset

from .conftest import failed, ranked, results_frame


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "weknora_nb", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def files(tmp_path):
    TestSet.from_records([
        {"query_id": "q1", "query": "a", "relevant": {"A": 3, "B": 2, "C": 1}},
        {"query_id": "q2", "query": "b", "relevant": {"A": 1}},
        {"query_id": "q3", "query": "c", "relevant": {}},
    ]).to_jsonl(tmp_path / "t.jsonl")
    rows = ranked("q1", ["X", "B", "A", "Y", "C"]) + ranked("q1", ["X", "B", "A", "Y", "C"], stage="hybrid") \
        + failed("q2", "timeout") + ranked("q2", ["A"], stage="hybrid") + ranked("q3", ["A"])
    write_results(results_frame(rows), tmp_path / "r.parquet")
    return tmp_path / "t.jsonl", tmp_path / "r.parquet"


def main_out(capsysbinary, *args: str) -> str:
    """``weknora-nb ARGS`` through ``main`` in this process (exit 0): what it wrote to stdout. The command as a
    process of its own: the tests that run it so (exit codes, tracebacks, a closed pipe, its teardown)."""
    assert cli.main(list(args)) == 0
    return capsysbinary.readouterr().out.decode("utf-8")


def test_score_json(files, capsysbinary):
    out = json.loads(main_out(capsysbinary, "score", *map(str, files), "--json"))
    assert set(out) >= {"summary", "per_query", "excluded", "counts"}
    assert out["summary"]["final"]["ndcg@5"] == pytest.approx(0.615328, abs=1e-6)
    assert out["summary"]["hybrid"]["recall@3"] == pytest.approx((2 / 3 + 1) / 2)
    assert {(e["query_id"], e["reason"]) for e in out["excluded"]} == {
        ("q3", "invalid query (no chunk of grade >= 1)"), ("q2", "failed: timeout")}
    assert out["counts"]["n_failed"] == 1 and out["counts"]["n_invalid"] == 1
    assert {"query_id", "stage", "ndcg@10"} <= set(out["per_query"][0])
    assert out["complete"] is False


def test_score_json_single_stage_is_keyed_by_stage_too(files, capsysbinary):
    out = json.loads(main_out(capsysbinary, "score", *map(str, files), "--json", "--stage", "final",
                              "--metrics", "ndcg@5,hit@5"))
    assert out["summary"] == {"final": {"ndcg@5": pytest.approx(0.615328, abs=1e-6), "hit@5": 1.0}}
    assert out["tiers"] == {"final": {"ndcg@5": "fail", "hit@5": None}}


def test_score_table_shows_tiers_and_counts(files, capsysbinary):
    out = main_out(capsysbinary, "score", *map(str, files))
    assert "stage" in out and "ndcg@5" in out and "fail" in out
    assert "invalid queries: q3" in out and "failed by kind: timeout=1" in out
    assert "not statistically significant" in out


def test_bad_input_exits_2_with_the_place(tmp_path, files, capsys):
    """The first three through ``main`` in this process (which raises what is no user's mistake), the last as a
    process of its own."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_id": "q1", "query": "x", "relevant": {"a": 5}}\n')
    for args, said in [((bad, files[1]), f"{bad}, line 1, field 'relevant'"),
                       ((files[0], files[1], "--metrics", "ndcg@x"), "family@K"),
                       ((files[0], tmp_path / "none.parquet"), "not found")]:
        assert cli.main(["score", *map(str, args)]) == 2
        err = capsys.readouterr().err
        assert said in err and "error: " in err and "Traceback" not in err, err
    # rows the results' side refuses (in the thread it is prepared in): named as ever
    rows = pq.read_table(files[1]).to_pandas()
    rows.loc[1, "rank"] = 1
    twice = write_results(rows, tmp_path / "twice.parquet")
    proc = run("score", str(files[0]), str(twice), check=False)
    assert proc.returncode == 2 and f"{twice}, row 2, field 'rank': rank 1 appears twice" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_score_as_a_program_writes_its_output_whole(files, tmp_path, capsysbinary):
    """``weknora-nb score`` as a program (cli.run) writes the same bytes as ``main()`` in process, its per-query
    file too, and its exit code is the command's."""
    args = ["score", *map(str, files), "--json"]
    assert cli.main(args) == 0
    in_process = capsysbinary.readouterr().out
    proc = subprocess.run([sys.executable, "-m", "weknora_nb", *args], capture_output=True)
    assert proc.returncode == 0 and proc.stdout == in_process and len(in_process) > 1000
    rows = tmp_path / "rows.jsonl"
    proc = run("score", *map(str, files), "--json", "--per-query-out", str(rows))
    assert len(rows.read_text(encoding="utf-8").splitlines()) == len(json.loads(in_process)["per_query"])
    assert "per_query" not in json.loads(proc.stdout)
    empty = tmp_path / "none.parquet"
    write_results(results_frame(ranked("nosuch", ["A"])), empty)
    proc = run("score", str(files[0]), str(empty), check=False)
    assert proc.returncode == 1 and "nothing was scored" in proc.stderr


def test_a_reader_that_stops_reading_ends_the_command_silently_with_141(files):
    proc = subprocess.Popen([sys.executable, "-m", "weknora_nb", "score", *map(str, files), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()   # as `| head` does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


def test_console_script_is_installed():
    exe = shutil.which("weknora-nb", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert exe, "the weknora-nb console script is not on PATH"
    assert subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.startswith("weknora-nb ")


# ---------------------------------------------------------------- the error contract, case by case

def fails(capsys, argv: list[str], code: int = 2) -> str:
    """Run ``cli.main(argv)``: assert exit ``code``, one line on stderr and no traceback; return that line."""
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == code, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def collect_args(files, tmp_path):
    """A collect command line complete but for the option under test (nothing is ever requested)."""
    return ["collect", "--base-url", "http://127.0.0.1:9", "--kb-id", "kb", "--testset", str(files[0]),
            "--out", str(tmp_path / "out"), "--quiet"]


@pytest.fixture
def run_folder(files, tmp_path):
    """A finished run folder: the results of ``files`` (q2 failed at final) and a manifest naming the test set."""
    folder = tmp_path / "runs" / "r1"
    folder.mkdir(parents=True)
    shutil.copy(files[1], folder / "results.parquet")
    manifest = {"run_name": "r1", "testset": {"path": str(files[0]), "hash": load_testset(files[0]).hash}}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def test_score_domain_adjustment_out_of_range(capsys, files):
    line = fails(capsys, ["score", *map(str, files), "--domain-adjustment", "0.2"])
    assert line.startswith("weknora-nb score: error: argument --domain-adjustment:")
    assert "0.2" in line and "0.05" in line and "0.10" in line


def test_score_domain_adjustment_allowed_values_pass(capsys, files):
    assert cli.main(["score", *map(str, files), "--domain-adjustment", "0.05", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]


def test_score_unknown_stage_lists_the_stages(capsys, files):
    line = fails(capsys, ["score", *map(str, files), "--stage", "nosuch"])
    assert line.startswith("error: ") and "stage" in line and "'nosuch'" in line
    assert "final" in line and "hybrid" in line


def test_score_metric_cutoff_0(capsys, files):
    line = fails(capsys, ["score", *map(str, files), "--metrics", "ndcg@0"])
    assert "argument --metrics" in line and "'ndcg@0'" in line and ">= 1" in line


def test_score_unknown_metric_family(capsys, files):
    line = fails(capsys, ["score", *map(str, files), "--metrics", "recall@5,nosuch@5"])
    assert "argument --metrics" in line and "'nosuch@5'" in line
    assert all(f in line for f in ("'hit'", "'ndcg'", "'recall'", "'mrr'"))


def test_score_missing_testset(capsys, files, tmp_path):
    missing = tmp_path / "none.jsonl"
    line = fails(capsys, ["score", str(missing), str(files[1])])
    assert line.startswith("error: ") and "test set" in line and str(missing) in line


def test_score_missing_results(capsys, files, tmp_path):
    missing = tmp_path / "none.parquet"
    line = fails(capsys, ["score", str(files[0]), str(missing)])
    assert line.startswith("error: ") and "results file" in line and str(missing) in line


@pytest.mark.parametrize("option, value, allowed", [
    ("--concurrency", "0", ">= 1"), ("--repeats", "0", ">= 1"), ("--max-attempts", "0", ">= 1"),
    ("--repeats", "two", ">= 1"), ("--warmup", "-1", ">= 0"), ("--timeout", "0", "> 0"),
])
def test_collect_option_out_of_range(capsys, collect_args, tmp_path, option, value, allowed):
    line = fails(capsys, [*collect_args, option, value])
    assert line.startswith(f"weknora-nb collect: error: argument {option}:")
    assert f"'{value}'" in line and allowed in line
    assert not (tmp_path / "out").exists()


def test_collect_unknown_stage(capsys, collect_args, tmp_path):
    line = fails(capsys, [*collect_args, "--stages", "hybrid,nosuch"])
    assert line.startswith("error: --stages") and "nosuch" in line
    assert all(s in line for s in ("vector", "keyword", "hybrid", "final", "citations"))
    assert not (tmp_path / "out").exists()


def test_collect_bad_system_yaml(capsys, collect_args, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("chunking: {size: 512\nembedding: bge-m3\n", encoding="utf-8")
    assert cli.main([*collect_args, "--system", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first, *problems = err.strip().splitlines()
    assert first == f"error: configuration file {bad} has 1 problem(s):"
    assert len(problems) == 1 and f"{bad}, line 2: not valid YAML" in problems[0]
    assert not (tmp_path / "out").exists()


def test_collect_base_url_without_scheme(capsys, collect_args):
    argv = [*collect_args]
    argv[argv.index("--base-url") + 1] = "localhost:8080"
    line = fails(capsys, argv)
    assert line.startswith("weknora-nb collect: error: argument --base-url:")
    assert "'localhost:8080'" in line and "http://" in line and "https://" in line


def test_gate_bound_not_a_number(capsys, run_folder):
    line = fails(capsys, ["gate", "--run", str(run_folder), "--min", "ndcg@5=abc"])
    assert line.startswith("weknora-nb gate: error: argument --min:")
    assert "'ndcg@5=abc'" in line and "number" in line


def test_gate_bound_unknown_metric(capsys, run_folder):
    line = fails(capsys, ["gate", "--run", str(run_folder), "--max-drop", "nosuch@5=0.1"])
    assert "argument --max-drop" in line and "'nosuch'" in line and "'ndcg'" in line


def test_gate_run_not_a_run_folder(capsys, tmp_path):
    line = fails(capsys, ["gate", "--run", str(tmp_path), "--min", "ndcg@5=0.5"])
    assert line == f"error: --run: {tmp_path} is not a run folder (no manifest.json)"


def test_gate_baseline_not_a_run_folder(capsys, run_folder, tmp_path):
    line = fails(capsys, ["gate", "--run", str(run_folder), "--baseline", str(tmp_path), "--max-drop", "ndcg@5=0.1"])
    assert line == f"error: --baseline: {tmp_path} is not a run folder (no manifest.json)"


def test_gate_verdicts(capsys, run_folder):
    """A broken bound exits 1, kept bounds 0; a run with a failed request fails unless allowed."""
    assert cli.main(["gate", "--run", str(run_folder), "--min", "ndcg@5=0.99", "--allow-incomplete"]) == 1
    assert "FAIL  min        ndcg@5" in capsys.readouterr().out
    assert cli.main(["gate", "--run", str(run_folder), "--min", "ndcg@5=0.5", "--allow-incomplete"]) == 0
    assert "gate passed" in capsys.readouterr().out
    assert cli.main(["gate", "--run", str(run_folder), "--min", "ndcg@5=0.5"]) == 1
    out = capsys.readouterr()
    assert "FAIL  complete" in out.out and out.err == ""


def test_report_run_not_a_run_folder(capsys, tmp_path):
    line = fails(capsys, ["report", "--run", str(tmp_path)])
    assert line == f"error: --run: {tmp_path} is not a run folder (no manifest.json)"


def test_sandbox_serve_unknown_version(capsys, monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", "sk-sandbox-test")
    line = fails(capsys, ["sandbox", "serve", "--version", "nosuch", "--port", "0"])
    assert line.startswith("error: ") and "version" in line and "'nosuch'" in line and "baseline" in line


def test_sandbox_serve_bad_faults_json(capsys, monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", "sk-sandbox-test")
    line = fails(capsys, ["sandbox", "serve", "--faults", "{bad"])
    assert line.startswith("weknora-nb sandbox serve: error: argument --faults:")
    assert "'{bad'" in line and "JSON object" in line


def test_sandbox_serve_unknown_fault_setting(capsys, monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", "sk-sandbox-test")
    line = fails(capsys, ["sandbox", "serve", "--faults", '{"latency": 5}'])
    assert "argument --faults" in line and "latency" in line and "latency_ms" in line


def test_sandbox_serve_port_out_of_range(capsys):
    line = fails(capsys, ["sandbox", "serve", "--port", "70000"])
    assert line.startswith("weknora-nb sandbox serve: error: argument --port:")
    assert "'70000'" in line and "0-65535" in line


def test_sandbox_serve_needs_the_api_key(capsys, monkeypatch):
    monkeypatch.delenv("WEKNORA_API_KEY", raising=False)
    line = fails(capsys, ["sandbox", "serve", "--port", "0"])
    assert line.startswith("error: set WEKNORA_API_KEY first")


def test_demo_limit(capsys):
    assert cli.build_parser().parse_args(["demo", "--limit", "5"]).limit == 5
    assert cli.build_parser().parse_args(["demo"]).limit is None
    line = fails(capsys, ["demo", "--limit", "0"])
    assert line.startswith("weknora-nb demo: error: argument --limit:") and "'0'" in line


def test_argparse_errors_are_one_line(capsys):
    line = fails(capsys, ["collect", "--base-url", "http://x"])
    assert line.startswith("weknora-nb collect: error: the following arguments are required: --kb-id")
    line = fails(capsys, ["nosuch"])
    assert line.startswith("weknora-nb: error: argument command: invalid choice: 'nosuch'")


def test_help_and_version_exit_0(capsys):
    assert cli.main(["score", "--help"]) == 0
    assert "--domain-adjustment" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("weknora-nb ")


@pytest.mark.parametrize("exc, code", [
    (ConnectFailed("refused"), 1), (AuthFailed("401"), 1),
    (ReportError("01-overview", 3, "x = 1", "KeyError", "'a'", Path("p.html")), 1), (SandboxError("port in use"), 1),
    (UsageError(argument="--x", allowed=">= 1", got=0), 2), (MetricError("bad"), 2),
    (TestSetError("t.jsonl", "bad"), 2), (ResultsError("r.csv", "bad"), 2), (ConfigError("s.yaml", "bad"), 2),
    (RunFolderError("not a run"), 2), (RunExistsError("used"), 2), (NotComparableError("other test set"), 2),
    (FileNotFoundError(2, "No such file or directory", "t.jsonl"), 2), (IsADirectoryError("d"), 2),
    (PermissionError("p"), 2), (NotADirectoryError("n"), 2),
    (ValueError("a bug"), None), (KeyError("a bug"), None),
])
def test_exit_code_table(exc, code):
    assert cli.exit_code(exc) == code


def test_messages(tmp_path):
    assert cli.error_message(FileNotFoundError(2, "No such file or directory", "t.jsonl")) == \
        "No such file or directory: t.jsonl"
    assert cli.error_message(RunFolderError("two\n  lines")) == "two lines"
    err = TestSetError("t.jsonl", "first problem")
    assert cli.error_message(err).splitlines() == ["test set t.jsonl has 1 problem(s):", "  - t.jsonl: first problem"]


def test_a_bug_keeps_its_traceback(monkeypatch, files):
    """Only deliberate errors and OS errors on the user's files are mapped; anything else propagates."""
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("weknora_nb.core.scoring.entry._score_prepared", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(["score", *map(str, files)])


@pytest.mark.parametrize("argv, code, start", [
    (["score", "T", "R", "--domain-adjustment", "0.2"], 2, "weknora-nb score: error: argument --domain-adjustment"),
    (["gate", "--run", "TMP", "--min", "ndcg@5=0.5"], 2, "error: --run: "),
    (["sandbox", "serve", "--faults", "{bad"], 2, "weknora-nb sandbox serve: error: argument --faults"),
    (["gate", "--run", "RUN", "--min", "ndcg@5=0.99", "--allow-incomplete"], 1, None),
])
def test_end_to_end_no_traceback(files, tmp_path, run_folder, argv, code, start):
    subst = {"T": str(files[0]), "R": str(files[1]), "TMP": str(tmp_path / "runs"), "RUN": str(run_folder)}
    proc = run(*[subst.get(a, a) for a in argv], check=False)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    if start is None:
        assert proc.stderr == "" and "gate FAILED" in proc.stdout
    else:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(start), proc.stderr


def test_help_loads_no_pandas_httpx_or_matplotlib():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "weknora_nb", "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "usage: weknora-nb" in proc.stdout
    loaded = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "json" in loaded or "argparse" in loaded  # the import log was read
    assert not loaded & {"pandas", "httpx", "matplotlib"}


# ---------------------------------------------------------------- collect --system FILE

def test_system_description_is_a_mapping_with_dates_as_text(tmp_path):
    f = tmp_path / "system.yaml"
    f.write_text("chunking: {strategy: structure-aware, max_chars: 512}\ndeployed: 2024-05-01\n", encoding="utf-8")
    assert load_system_description(f) == {"chunking": {"strategy": "structure-aware", "max_chars": 512},
                                          "deployed": "2024-05-01"}


@pytest.mark.parametrize("text, fragment", [
    ("- a\n- b\n", "Got a list"),
    ("", "Got an empty file"),
    ("just text\n", "Got a str"),
    ("a: !!binary aGVsbG8=\n", "cannot record"),
])
def test_system_description_refuses_what_is_not_a_mapping(tmp_path, text, fragment):
    f = tmp_path / "system.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_system_description(f)
    assert err.value.path == str(f) and fragment in str(err.value)


def test_system_description_bad_yaml_names_the_line(tmp_path):
    f = tmp_path / "system.yaml"
    f.write_text("a: 1\nb: [1, 2\nc: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_system_description(f)
    (problem,) = err.value.problems
    assert problem.line == 3 and problem.message.startswith("not valid YAML")


def test_system_description_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_system_description(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match="is a folder"):
        load_system_description(tmp_path)
