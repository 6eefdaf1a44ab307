"""The collector hardened (issue 12): one collector per run folder, no credentials in logs or files,
a clean stop on Ctrl-C, an absolute test-set path, read-only and full disks, ``--out`` naming a file;
and the command line's checks of collect and ``sandbox serve`` options.

Collections run for real: ``weknora-nb collect`` in a subprocess (or ``cli.main``) against the
sandbox over loopback, slowed down by its ``latency_ms`` fault where a test needs a collection
to be still running; processes are really killed (SIGKILL), interrupted (SIGINT), limited in the
size of the files they write (RLIMIT_FSIZE) or given a folder that is really read-only.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from weknora_nb import cli
from weknora_nb.collect import collect, read_checkpoint
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.collect.http.redact import RedactingFilter, redact_command, redact_text, redact_url
from weknora_nb.collect.run.lock import LOCK_FILE, RunLock, read_holder
from weknora_nb.core.errors import RunExistsError, RunLockedError
from weknora_nb.sandbox import SandboxServer

from .conftest import interruptible
from .test_collect import MINI, mini_testset

KEY = "sk-hardening-test-8c41d0e2b7"
STAGES = "vector,keyword,hybrid,final"
N_REQUESTS = 11 * 4 * 3  # queries x stages x repeats
NOWHERE = "http://127.0.0.1:9"  # never contacted: the checks below fail before a request is made
SECRET = "s3cret"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, embedding_cache):
    with SandboxServer("rerank", data_dir=MINI, cache_dir=embedding_cache, api_key=KEY, allow_fault_control=True) as s:
        # warm it up: its models load on the first search and embed each new query once (about 1 s each
        # here), so a collection slowed down by latency_ms runs as long as the test means it to
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("WEKNORA_API_KEY", KEY)
            collect(ClientSettings(s.base_url), s.kb_id, mini_testset(), tmp_path_factory.mktemp("warm-up") / "run",
                    stages=STAGES, repeats=1, warmup=0, progress=False, inventory=False)
        yield s


@pytest.fixture(autouse=True)
def key_in_env(monkeypatch, request):
    """The key in the environment; for the tests that use the sandbox, no faults before and after."""
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    if "sandbox" not in request.fixturenames:
        yield
        return
    sandbox = request.getfixturevalue("sandbox")
    sandbox.set_faults()
    yield
    sandbox.set_faults()


@pytest.fixture
def ts_path(tmp_path):
    path = tmp_path / "t.jsonl"
    mini_testset().to_jsonl(path)
    return path


def collect_argv(sandbox, ts_path, out, *extra, base_url=None):
    return ["collect", "--base-url", base_url or sandbox.base_url, "--kb-id", sandbox.kb_id, "--testset",
            str(ts_path), "--stages", STAGES, "--repeats", "3", "--concurrency", "2", "--warmup", "0", "--quiet",
            "--out", str(out), *extra]


def start(argv, *, cwd=None, prefix=()):
    """``weknora-nb ARGV`` in a subprocess (``prefix``: options before the command, e.g. ``-vv``), one that a
    SIGINT interrupts."""
    return subprocess.Popen([sys.executable, "-m", "weknora_nb", *prefix, *argv], cwd=cwd,
                            env={**os.environ, "WEKNORA_API_KEY": KEY, "PYTHONIOENCODING": "utf-8"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def wait_for_records(ckpt: Path, n: int, proc) -> None:
    """Until the checkpoint holds ``n`` lines (the collector is mid-collection), or fail."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ckpt.exists() and ckpt.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    pytest.fail(f"{ckpt} never reached {n} lines")


def checkpoint_keys(ckpt: Path) -> Counter:
    """How often each (query, stage, repeat) has a line in the checkpoint file, as written."""
    return Counter((r["query_id"], r["stage"], r["repeat"])
                   for r in map(json.loads, ckpt.read_text(encoding="utf-8").splitlines()))


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


# ---------------------------------------------------------------- 1. one collector per run folder

@pytest.mark.slow
def test_a_second_collector_is_refused_and_a_resume_after_kill_9_takes_the_lock_over(tmp_path, sandbox, ts_path):
    sandbox.set_faults(latency_ms=100)  # 132 requests, 2 in flight: the first one runs for about 7 s
    out = tmp_path / "run"
    first = start(collect_argv(sandbox, ts_path, out))
    wait_for_records(out / "checkpoint.jsonl", 10, first)
    holder = read_holder(out)
    assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
    assert "collect" in holder["command"] and holder["started_at"]
    for extra in ((), ("--resume",)):
        code, _, err = finish(start(collect_argv(sandbox, ts_path, out, *extra)))
        line = one_error_line(err)
        assert code == 2, err
        assert f"is being collected by pid {first.pid} on host {socket.gethostname()} since" in line
    assert first.poll() is None  # the first one goes on, alone
    first.kill()  # SIGKILL: its lock file stays behind, its flock goes with the process
    first.wait()
    assert (out / LOCK_FILE).exists()
    sandbox.set_faults()
    code, _, err = finish(start(collect_argv(sandbox, ts_path, out, "--resume")))
    assert code == 0, err
    assert f"taking over the lock left by pid {first.pid}" in err  # the stale lock, said in one log line
    keys = checkpoint_keys(out / "checkpoint.jsonl")
    assert len(keys) == N_REQUESTS and set(keys.values()) == {1}  # every request exactly once
    assert not (out / LOCK_FILE).exists()


def test_the_lock_refuses_a_second_holder_names_it_and_is_gone_when_let_go(tmp_path):
    with RunLock(tmp_path / "run", command=["weknora-nb", "collect", "--base-url", f"http://u:{SECRET}@h/"]):
        holder = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid() and SECRET not in json.dumps(holder)
        with pytest.raises(RunLockedError) as err:
            RunLock(tmp_path / "run").acquire()
        assert err.value.holder["pid"] == os.getpid()
        assert f"is being collected by pid {os.getpid()} on host {socket.gethostname()} since" in str(err.value)
        assert isinstance(err.value, RunExistsError) and cli.exit_code(err.value) == 2
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    RunLock(tmp_path / "run").acquire()  # free again


def test_a_stale_lock_file_is_taken_over_with_a_log_line(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "gone", "started_at": "2026-01-01T00:00:00"}))
    lock = RunLock(run)
    with caplog.at_level(logging.WARNING, logger="weknora_nb.collect.run.lock"):
        lock.acquire()
    assert [r.getMessage() for r in caplog.records if "taking over the lock left by pid 999999 on host gone"
            in r.getMessage()]
    assert read_holder(run)["pid"] == os.getpid()
    lock.release()


def test_a_collection_holds_the_lock_and_lets_it_go_however_it_ends(tmp_path, sandbox, ts_path):
    sandbox.set_faults(latency_ms=30)
    out = tmp_path / "run"
    settings = ClientSettings(sandbox.base_url, max_attempts=1)
    options = {"stages": "final", "repeats": 2, "warmup": 0, "progress": False, "inventory": False}
    first = threading.Thread(target=collect, args=(settings, sandbox.kb_id, str(ts_path), out),
                             kwargs={**options, "concurrency": 1})
    first.start()
    try:
        deadline = time.monotonic() + 30
        while not (out / "checkpoint.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(RunLockedError, match=f"is being collected by pid {os.getpid()}"):
            collect(settings, sandbox.kb_id, str(ts_path), out, resume=True, **options)
    finally:
        first.join()
    assert not (out / LOCK_FILE).exists()
    assert len(read_checkpoint(out / "checkpoint.jsonl")) == 22  # the refused one requested nothing
    with pytest.raises(RunExistsError, match="already holds a run"):
        collect(settings, sandbox.kb_id, str(ts_path), out, **options)
    assert not (out / LOCK_FILE).exists()


# ---------------------------------------------------------------- 2. no credentials in logs or files

@pytest.mark.parametrize("url, shown", [
    (f"http://bob:{SECRET}@h:8080/api?token={SECRET}&page=2",
     "http://bob:***@h:8080/api?token=***&page=2"),
    (f"https://h/?api_key={SECRET}&apikey={SECRET}&X-Api-Key={SECRET}&sig={SECRET}&access_token={SECRET}",
     "https://h/?api_key=***&apikey=***&X-Api-Key=***&sig=***&access_token=***"),
    (f"https://h/p?password={SECRET}&secret={SECRET}&signature={SECRET}&auth={SECRET}&kb=1",
     "https://h/p?password=***&secret=***&signature=***&auth=***&kb=1"),
    (f"http://{SECRET}@h/", "http://***@h/"),  # a user name alone is often a token
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),  # nothing secret: unchanged
    (f"h:8080/?token={SECRET}", "h:8080/?token=***"),
    (f"admin:{SECRET}@h:8080/?key={SECRET}", "admin:***@h:8080/?key=***"),  # no scheme: masked alike
])
def test_redact_url_masks_passwords_and_secret_parameters(url, shown):
    assert redact_url(url) == shown
    assert redact_text(f"GET {url} failed") == f"GET {shown} failed"


def test_the_log_filter_redacts_httpx_url_arguments():
    import httpx

    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, 'HTTP Request: %s %s "%s"',
                               ("GET", httpx.URL(f"http://u:{SECRET}@h/x?token={SECRET}"), "HTTP/1.1 200 OK"), None)
    assert RedactingFilter().filter(record)
    assert SECRET not in record.getMessage() and "token=***" in record.getMessage()
    assert redact_command(["--base-url", f"http://u:{SECRET}@h"]) == ["--base-url", "http://u:***@h"]
    assert SECRET not in repr(ClientSettings(f"http://u:{SECRET}@h/?token={SECRET}"))


def test_a_verbose_collection_with_credentials_in_the_base_url_shows_them_nowhere(tmp_path, sandbox, ts_path):
    base = sandbox.base_url.replace("http://", f"http://user:{SECRET}@") + f"/?token={SECRET}"
    out = tmp_path / "run"
    argv = collect_argv(sandbox, ts_path, out, base_url=base)
    argv[argv.index("--repeats") + 1] = "1"
    code, stdout, err = finish(start(argv, prefix=["-vv"]))
    assert code == 0, err  # the sandbox was reached: basic auth and the token go as meant
    assert "HTTP Request: POST" in err and "token=***" in err  # httpx's own lines are there, redacted
    assert SECRET not in err and SECRET not in stdout
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"manifest.json", "checkpoint.jsonl", "results.parquet"}
    for p in files:
        assert SECRET.encode() not in p.read_bytes(), p
    assert json.loads((out / "manifest.json").read_text())["target"]["base_url"] == sandbox.base_url


def test_a_refused_base_url_does_not_show_its_password(capsys, tmp_path, ts_path):
    for url in (f"ftp://user:{SECRET}@host/", f"http://user:{SECRET}@[bad/"):
        rc = cli.main(["collect", "--base-url", url, "--kb-id", "kb", "--testset", str(ts_path),
                       "--out", str(tmp_path / "run"), "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2 and "argument --base-url" in err and SECRET not in err, err


# ---------------------------------------------------------------- 3. Ctrl-C

@pytest.mark.slow
def test_ctrl_c_keeps_what_was_done_and_prints_the_command_that_resumes(tmp_path, sandbox, ts_path):
    sandbox.set_faults(latency_ms=40)
    out = tmp_path / "run"
    proc = start(collect_argv(sandbox, ts_path, out))
    wait_for_records(out / "checkpoint.jsonl", 10, proc)
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    line = one_error_line(err)
    assert code == 130
    assert line.startswith("error: interrupted: ") and "finished request(s) are kept" in line
    kept = len(read_checkpoint(out / "checkpoint.jsonl"))
    assert f" {kept} finished request(s)" in line and 10 <= kept < N_REQUESTS
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["n_done"] == kept
    assert not (out / LOCK_FILE).exists()  # the lock was let go
    command = shlex.split(line.split("to go on, run: ", 1)[1])
    assert command[0] == "weknora-nb" and command[-1] == "--resume"
    assert command[1:-1] == collect_argv(sandbox, ts_path, out)  # the same command, plus --resume
    sandbox.set_faults()
    code, stdout, err = finish(start(command[1:]))
    assert code == 0, err
    assert f"{N_REQUESTS - kept} request(s) made, {kept} already done" in stdout
    keys = checkpoint_keys(out / "checkpoint.jsonl")
    assert len(keys) == N_REQUESTS and set(keys.values()) == {1}


# ---------------------------------------------------------------- 4. the test set's path

def test_a_relative_testset_is_recorded_as_an_absolute_path(tmp_path, sandbox, ts_path, monkeypatch, capsys):
    """The commands run through ``main`` in this process, from the folders a user would run them in."""
    out = tmp_path / "runs" / "r"
    argv = collect_argv(sandbox, "t.jsonl", out)
    argv[argv.index("--repeats") + 1] = "1"
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 0, capsys.readouterr().err
    recorded = json.loads((out / "manifest.json").read_text())["testset"]["path"]
    assert recorded == str(ts_path.resolve()) and os.path.isabs(recorded)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["gate", "--run", str(out), "--min", "recall@5=0"]) == 0, capsys.readouterr().err
    # a run recorded by an older version (a relative path) still resumes: its content is what must match
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["testset"]["path"] = "t.jsonl"
    (out / "manifest.json").write_text(json.dumps(manifest))
    s = collect(ClientSettings(sandbox.base_url), sandbox.kb_id, str(ts_path), out, stages=STAGES, repeats=1,
                warmup=0, resume=True, progress=False, inventory=False)
    assert s.n_requests == 0 and s.n_skipped == 44


# ---------------------------------------------------------------- 5. read-only folders, full disks

@contextmanager
def read_only(folder: Path):
    """``folder`` really read-only for this process: chmod when not root, else a read-only bind mount
    (root writes through any mode); skipped where neither works."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(0o555)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if mounted and subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
        subprocess.run(["umount", str(folder)], capture_output=True)
        mounted = False
    if not mounted:
        pytest.skip("running as root (chmod does not stop root's writes) and a read-only bind mount is not allowed")
    try:
        try:
            (folder / ".probe").touch()
        except OSError:
            pass
        else:
            pytest.skip(f"{folder} is still writable after a read-only bind mount")
        yield
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_read_only_run_folder_is_one_line_and_keeps_what_was_written(capsys, tmp_path, sandbox, ts_path):
    out = tmp_path / "run"
    argv = collect_argv(sandbox, ts_path, out, "--max-attempts", "1")
    argv[argv.index("--repeats") + 1] = "1"
    sandbox.set_faults(error_rate=1.0)
    assert cli.main(argv) == 1  # every request failed: an incomplete run, kept
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    sandbox.set_faults()
    with read_only(out):
        rc = cli.main([*argv, "--resume", "--retry-failed"])
        line = one_error_line(capsys.readouterr().err)
        assert rc == 1 and line.startswith(f"error: cannot write {out}"), line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing lost, nothing half-written
    assert cli.main([*argv, "--resume", "--retry-failed"]) == 0  # writable again: it goes on
    keys = checkpoint_keys(out / "checkpoint.jsonl")
    assert len(read_checkpoint(out / "checkpoint.jsonl")) == 44 and len(keys) == 44


def test_a_new_run_in_a_read_only_folder_is_one_line(capsys, tmp_path, sandbox, ts_path):
    parent = tmp_path / "runs"
    parent.mkdir()
    with read_only(parent):
        rc = cli.main(collect_argv(sandbox, ts_path, parent / "new"))
        line = one_error_line(capsys.readouterr().err)
    assert rc == 1 and line.startswith(f"error: cannot write {parent / 'new'}: "), line
    assert not (parent / "new").exists()


LIMITED = ("import resource, runpy, sys\n"
           "limit = int(sys.argv.pop(1))\n"
           "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # python ignores SIGXFSZ: writes get EFBIG\n"
           "sys.argv[0] = 'weknora-nb'\n"
           "runpy.run_module('weknora_nb', run_name='__main__', alter_sys=True)\n")


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_resume_goes_on(tmp_path, sandbox, ts_path):
    out = tmp_path / "run"
    argv = collect_argv(sandbox, ts_path, out)
    proc = subprocess.Popen([sys.executable, "-c", LIMITED, "20000", *argv],
                            env={**os.environ, "WEKNORA_API_KEY": KEY}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    code, _, err = finish(proc)
    line = one_error_line(err)
    assert code == 1 and line == f"error: cannot write {out / 'checkpoint.jsonl'}: File too large", err
    kept = len(read_checkpoint(out / "checkpoint.jsonl"))  # a torn last line is dropped
    assert 0 < kept < N_REQUESTS
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "stopped" and manifest["stopped_by"].startswith("storage: cannot write")
    assert not (out / LOCK_FILE).exists()
    code, stdout, err = finish(start([*argv, "--resume"]))
    assert code == 0, err
    assert f"{N_REQUESTS - kept} request(s) made, {kept} already done" in stdout
    keys = checkpoint_keys(out / "checkpoint.jsonl")
    assert len(keys) == N_REQUESTS and set(keys.values()) == {1}


def test_resuming_a_damaged_checkpoint_is_one_line_exit_2_and_lets_the_lock_go(capsys, tmp_path, sandbox, ts_path):
    out = tmp_path / "run"
    argv = collect_argv(sandbox, ts_path, out)
    argv[argv.index("--stages") + 1], argv[argv.index("--repeats") + 1] = "final", "1"
    assert cli.main(argv) == 0
    capsys.readouterr()
    lines = (out / "checkpoint.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[1] = json.dumps({"query_id": "m01", "repeat": 1}) + "\n"  # whole JSON, but no record: no stage, no status
    (out / "checkpoint.jsonl").write_text("".join(lines), encoding="utf-8")
    assert cli.main([*argv, "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (f"error: {out / 'checkpoint.jsonl'}: line 2 is not a request record ('stage' missing or not a "
                    "str); the checkpoint is damaged")
    assert not (out / LOCK_FILE).exists()


@contextmanager
def small_disk(folder: Path, size: str):
    """A tmpfs of ``size`` mounted on ``folder`` (a disk that really fills up); skipped where mount is not allowed."""
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs (a disk that fills up) is not allowed here")
    try:
        yield lambda new_size: subprocess.run(["mount", "-o", f"remount,size={new_size}", str(folder)], check=True)
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_disk_that_fills_up_is_one_line_and_resume_goes_on_once_there_is_room(capsys, tmp_path, sandbox, ts_path):
    with small_disk(tmp_path / "disk", "64k") as grow:
        out = tmp_path / "disk" / "run"
        argv = collect_argv(sandbox, ts_path, out)
        assert cli.main(argv) == 1
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: cannot write {out}") and "No space left on device (free some space; what " \
            "was written before is kept)" in line, line
        kept = len(read_checkpoint(out / "checkpoint.jsonl"))
        assert 0 < kept < N_REQUESTS and not (out / LOCK_FILE).exists()
        grow("16m")
        assert cli.main([*argv, "--resume"]) == 0
        assert f"{N_REQUESTS - kept} request(s) made, {kept} already done" in capsys.readouterr().out
        keys = checkpoint_keys(out / "checkpoint.jsonl")
        assert len(keys) == N_REQUESTS and set(keys.values()) == {1}


# ---------------------------------------------------------------- 6. --out naming a file

def test_out_naming_a_file_is_one_line_and_exit_2(capsys, tmp_path, ts_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine\n")
    for out, where in ((f, ""), (f / "run", f" inside {f}")):
        rc = cli.main(["collect", "--base-url", NOWHERE, "--kb-id", "kb", "--testset", str(ts_path),
                       "--out", str(out), "--quiet"])
        line = one_error_line(capsys.readouterr().err)
        assert rc == 2 and line == (f"error: --out must name a run folder{where}, but {f} is a file; choose a "
                                    "folder, e.g. outputs/runs/NAME")
    assert f.read_text() == "mine\n"


# ---------------------------------------------------------------- 7. the options' checks
# Already covered elsewhere: a base URL without a scheme (test_cli.py::test_collect_base_url_without_scheme,
# test_collect.py::test_cli_names_a_bad_argument_and_exits_2), a bad system YAML
# (test_cli.py::test_collect_bad_system_yaml), --max-attempts 0 (test_cli.py::test_collect_option_out_of_range,
# test_collect.py::test_cli_names_a_bad_argument_and_exits_2), sandbox serve's bad --faults JSON
# (test_cli.py::test_sandbox_serve_bad_faults_json), --version nosuch (test_cli.py::test_sandbox_serve_unknown_version),
# --port 70000 (test_cli.py::test_sandbox_serve_port_out_of_range). Missing ones follow.

def test_collect_with_a_bad_stages_file_is_one_problem_list_and_exit_2(capsys, tmp_path, ts_path):
    bad = tmp_path / "stages.yaml"
    bad.write_text("stages:\n  wide:\n    endpoint: nosuch\n", encoding="utf-8")
    rc = cli.main(["collect", "--base-url", NOWHERE, "--kb-id", "kb", "--testset", str(ts_path), "--stages-file",
                   str(bad), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    first, *problems = err.strip().splitlines()
    assert first == f"error: configuration file {bad} has 1 problem(s):"
    assert problems == [f"  - {bad}, line 3, field 'stages.wide.endpoint': must be one of hybrid-search, "
                        "knowledge-search, chat, faq-search; got 'nosuch'"]
    assert not (tmp_path / "run").exists()


def test_sandbox_serve_on_a_port_in_use_is_one_line_and_announces_nothing(capsys):
    sigterm = signal.getsignal(signal.SIGTERM)  # serve sets its own SIGTERM handler: put pytest's back
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            rc = cli.main(["sandbox", "serve", "--port", str(port)])
        finally:
            signal.signal(signal.SIGTERM, sigterm)
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert rc == 1 and f"cannot serve on 127.0.0.1 port {port}: the port is in use" in line
    assert "serving" not in captured.out


@pytest.mark.parametrize("faults, message", [
    ('{"latency_ms": NaN}', "latency_ms must be a number between 0 and 86400000. Got nan instead."),
    ('{"hang_s": Infinity}', "hang_s must be a number between 0 and 86400. Got inf instead."),
    ('{"latency_ms": -5}', "latency_ms must be a number between 0 and 86400000. Got -5 instead."),
    ('{"error_rate": true}', "error_rate must be a number between 0 and 1. Got True instead."),
    ('{"latency_sigma": 1e300}', "latency_sigma must be a number between 0 and 4. Got 1e+300 instead."),
    ('{"latency_ms": 1' + "0" * 400 + '}', "latency_ms must be a number between 0 and 86400000. Got 1"),
    ('{"seed": [1]}', "seed must be an integer or null. Got [1] instead."),
    ("[" * 100_000, "nested too deeply"),
])
def test_sandbox_serve_refuses_faults_it_could_not_run(capsys, faults, message):
    with pytest.raises(SystemExit) as exit_:  # parsed only: a sandbox that accepted them would serve for ever
        cli.build_parser().parse_args(["sandbox", "serve", "--port", "0", "--faults", faults])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, err
    assert lines[0].startswith("weknora-nb sandbox serve: error: argument --faults:") and message in lines[0]
