"""jieba's dictionary kept in the cache folder (core/segmenter.py, issue 17): the dictionary read back is the one
jieba builds, entry for entry; a damaged file is ignored with a warning and written anew; jieba cuts the same.

The first case runs in processes of their own, as a user's processes start; the damaged files are read in this
one, each start on a tokenizer of its own (jieba keeps its state in ``jieba.dt``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import jieba
import pytest

from weknora_nb.core import segmenter
from weknora_nb.core.segmenter import jieba_ready

PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
import jieba
from weknora_nb.core.segmenter import jieba_ready
ready = jieba_ready()
text = "网关返回 DG-1003 错误怎么办？配置 gateway.yaml 的 x-dg-key 字段"
got = {"entries": len(ready.dt.FREQ), "cuts": list(ready.cut_for_search(text))}
if sys.argv[1:] == ["compare"]:
    own = jieba.Tokenizer()   # started as jieba starts: its own cache or its dictionary file
    own.initialize()
    got.update(same=ready.dt.FREQ == own.FREQ and ready.dt.total == own.total,
               own_cuts=list(own.cut_for_search(text)))
print(json.dumps(got))
"""


def probe(cache: Path, *args: str) -> tuple[dict, str]:
    env = {**os.environ, "WEKNORA_NB_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_the_kept_dictionary_is_the_one_jieba_builds_and_cuts_the_same(tmp_path):
    kept = tmp_path / f"jieba-{jieba.__version__}.npz"
    first, _ = probe(tmp_path)    # jieba's own start, then the file written
    assert kept.is_file() and first["entries"] > 400_000
    written = kept.read_bytes()
    second, err = probe(tmp_path, "compare")  # read from the file, then compared with jieba's own start
    assert second["same"] and second["entries"] == first["entries"]
    assert second["cuts"] == second["own_cuts"] == first["cuts"] and "网关" in first["cuts"]
    assert kept.read_bytes() == written and "WARNING" not in err   # read, not written again


def test_a_damaged_file_is_ignored_with_a_warning_and_written_anew(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WEKNORA_NB_CACHE", str(tmp_path))
    caplog.set_level(logging.WARNING)
    kept = tmp_path / f"jieba-{jieba.__version__}.npz"
    for damage in (b"", written_without_frequencies(tmp_path)):   # each refused as unreadable or not whole
        kept.write_bytes(damage)
        caplog.clear()
        assert segmenter._read(kept) is None
        assert "ignoring" in caplog.text and str(kept) in caplog.text, caplog.text
    kept.write_bytes(b"not a zip file")
    caplog.clear()
    own = first_start(monkeypatch)    # the file ignored: jieba's own start, then the file written anew
    assert "ignoring" in caplog.text and str(kept) in caplog.text, caplog.text
    caplog.clear()
    read = first_start(monkeypatch)   # read from the file written by the start before
    assert not caplog.records, caplog.text
    assert read.FREQ == own.FREQ and read.total == own.total and len(own.FREQ) > 400_000


def first_start(monkeypatch: pytest.MonkeyPatch) -> jieba.Tokenizer:
    """jieba's default tokenizer as :func:`jieba_ready` starts it in a new process: a tokenizer never started
    stands in for ``jieba.dt`` while it runs, and is returned; the process's own is put back."""
    fresh = jieba.Tokenizer()
    with monkeypatch.context() as m:
        m.setattr(jieba, "dt", fresh)
        jieba_ready.cache_clear()
        try:
            assert jieba_ready().dt is fresh
        finally:
            jieba_ready.cache_clear()
    return fresh


def written_without_frequencies(tmp_path: Path) -> bytes:
    """An npz holding the entries but no frequencies."""
    import numpy as np

    path = tmp_path / "partial.npz"
    np.savez(path, words=np.frombuffer(b"a\nb", dtype=np.uint8), total=np.int64(1))
    return path.read_bytes()
