"""A large JSONL test set parsed by two processes (issue 17): the same test set, the same errors, nothing left.

:class:`~weknora_nb.core.testset.TestSetAhead` forks a child process to parse the second half of the file while
the caller parses the first (what ``weknora-nb score`` does). Forking needs a process of one thread (a pytest
worker has several), so the loadings run in a fresh interpreter, each file loaded both ways there and compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weknora_nb.core.testset import _raw_blocks

#: in a fresh process of one thread: each file loaded by TestSetAhead(fork=True) (the split lowered to 1 kB, so
#: that small files take the two-process path) and by load_testset; prints, per file, whether a child was
#: forked, whether the two test sets (their frames and hash) or the two error messages are equal, the error,
#: the child's exit status (0: it handed the second half back), and whether any child process is left
BOTH_WAYS = """
import json, os, sys
import weknora_nb.core.testset as T
T.SPLIT_BYTES = 1000
if sys.argv[1] == "child fails":
    T._jsonl_tail = lambda path, start: 1 / 0
out = []
for path in sys.argv[2:]:
    def load(fork):
        try:
            with T.TestSetAhead(path, fork=fork) as ahead:
                return ahead.forked, ahead.load(), ahead.exitcode
        except T.TestSetError as exc:
            return fork, str(exc), ahead.exitcode
    forked, split, exitcode = load(True)
    _, whole, _ = load(False)
    if isinstance(split, str) or isinstance(whole, str):
        same = split == whole
    else:
        same = (split.queries.equals(whole.queries) and split.qrels.equals(whole.qrels)
                and split.hash == whole.hash and split.records() == whole.records())
    out.append({"forked": forked, "same": same, "error": whole if isinstance(whole, str) else None,
                "child": exitcode})
try:
    os.waitpid(-1, os.WNOHANG)
    left = True
except ChildProcessError:
    left = False
print(json.dumps({"files": out, "left": left}))
"""


def record(i: int, **extra) -> dict:
    rec = {"query_id": f"q{i:04d}", "query": f"question {i} 第{i}个问题", "relevant": {f"c{i}": 2, f"c{i + 1}": 0},
           "query_type": "procedural" if i % 3 else None, "tags": ["a", "b"][: i % 3]}
    rec.update(extra)
    return {k: v for k, v in rec.items() if v is not None}


def lines(n: int) -> list[str]:
    return [json.dumps(record(i), ensure_ascii=False) for i in range(n)]


def both_ways(files: list[Path], mode: str = "as is") -> dict:
    proc = subprocess.run([sys.executable, "-c", BOTH_WAYS, mode, *map(str, files)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return path


def test_the_second_half_in_a_child_gives_the_same_test_set_and_the_same_errors(tmp_path):
    """Clean files (blank lines, a BOM, CRLF, a record to check on its own) load the same; a problem in the
    second half, in both halves, an id met in both halves, a lone ``\\r`` in the first half (which moves the
    numbering of the second) and text that is not JSON after the split are named at the same lines as the
    loading in one process names them. Every file of 1 kB or more forks a child, and none is left."""
    body = lines(60)
    mid = len(body) // 2
    files = {
        "clean": "\n".join(body) + "\n",
        "blank lines, BOM, CRLF": "\ufeff" + "\r\n".join(body[:mid] + ["", "  "] + body[mid:]) + "\r\n\n",
        "no newline at the end": "\n".join(body),
        "a record to check alone": "\n".join(body[:-2] + [json.dumps(record(999, extra={"x": [[1]]}))]
                                              + body[-2:]) + "\n",
        "a bad grade in the second half": "\n".join(body[:-3] + [json.dumps(record(70, relevant={"c": 7}))]
                                                   + body[-3:]) + "\n",
        "a problem in each half": "\n".join([json.dumps(record(80, query=""))] + body
                                            + [json.dumps(record(81, relevant={"c": "x"}))]) + "\n",
        "an id in both halves": "\n".join(body + [body[2]]) + "\n",
        "a lone CR in the first half": "\n".join(body[:3]) + "\r\n\r" + "\n".join(body[3:] + ["{broken"]) + "\n",
        "not JSON after the split": "\n".join(body[:-5] + ["not json"] + body[-5:]) + "\n",
    }
    paths = [write(tmp_path / f"t{i}.jsonl", text) for i, text in enumerate(files.values())]
    got = both_ways(paths)
    assert not got["left"]
    for name, result in zip(files, got["files"], strict=True):
        assert result["forked"] and result["same"], (name, result)
    # the child hands back a second half that is plainly sound, and only that (3: the caller reads it)
    assert [r["child"] for r in got["files"]] == [0, 0, 0, 3, 3, 3, 0, 3, 3]
    errors = dict(zip(files, (r["error"] for r in got["files"]), strict=True))
    assert all(errors[n] is None for n in list(files)[:4])
    n_lines = len(body) + 1
    assert f"line {n_lines - 3}, field 'relevant'" in errors["a bad grade in the second half"]
    assert "line 1, field 'query'" in errors["a problem in each half"]
    assert f"line {n_lines + 1}, field 'relevant'" in errors["a problem in each half"]
    assert f"line {n_lines}, field 'query_id': duplicate query id 'q0002' (first at line 3)" in \
        errors["an id in both halves"]
    assert f"line {len(body) + 2}:" in errors["a lone CR in the first half"]   # the lone \r ends a line 4
    assert f"line {n_lines - 5}" in errors["not JSON after the split"]


def test_a_child_that_fails_leaves_the_second_half_to_the_caller(tmp_path):
    """The child's failure (here an exception in its work) costs its time only: the caller parses the second
    half itself, with the same result and the same errors."""
    body = lines(40)
    clean = write(tmp_path / "clean.jsonl", "\n".join(body) + "\n")
    bad = write(tmp_path / "bad.jsonl", "\n".join(body + ['{"query_id": "x"}']) + "\n")
    got = both_ways([clean, bad], "child fails")
    assert [(r["forked"], r["same"], r["child"]) for r in got["files"]] == [(True, True, 1), (True, True, 1)]
    assert got["files"][0]["error"] is None and "line 41, field 'query'" in got["files"][1]["error"]
    assert not got["left"]


def test_small_files_and_other_formats_are_read_in_one_process(tmp_path):
    """Under the split size, and for a format other than JSONL, no child is forked."""
    small = write(tmp_path / "small.jsonl", "\n".join(lines(3)) + "\n")
    csv = write(tmp_path / "t.csv", "query_id,query,relevant\n" + "".join(f"q{i},text {i},c{i}:1\n"
                                                                         for i in range(200)))
    script = ("import json, sys\nimport weknora_nb.core.testset as T\nsmall = T.TestSetAhead(sys.argv[1], fork=True)\n"
              "T.SPLIT_BYTES = 1000\nprint(json.dumps([small.forked, T.TestSetAhead(sys.argv[2], fork=True).forked]))")
    proc = subprocess.run([sys.executable, "-c", script, str(small), str(csv)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout) == [False, False], proc.stderr


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30), data=st.data(),
       block=st.sampled_from([1, 7, 40, 1 << 21]))
def test_blocks_end_where_they_are_told_to(tmp_path_factory, sizes, data, block):
    """``_raw_blocks(stop=...)`` ends exactly at ``stop`` (a line's end), even when the lines left hold exactly
    the bytes asked for (``readlines`` reads one line more once the hint is reached, not exceeded), and the
    blocks from there go on to the end: together, every line once, in order."""
    path = tmp_path_factory.mktemp("blocks") / "t.jsonl"
    file_lines = [b"x" * (n - 1) + b"\n" for n in sizes]
    path.write_bytes(b"".join(file_lines))
    cut = data.draw(st.integers(min_value=0, max_value=len(file_lines)))
    stop = sum(sizes[:cut])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("weknora_nb.core.testset._BLOCK_BYTES", block)
        head = [line for b in _raw_blocks(path, stop=stop) for line in b]
        tail = [line for b in _raw_blocks(path, start=stop) for line in b]
    assert head == file_lines[:cut] and tail == file_lines[cut:]
