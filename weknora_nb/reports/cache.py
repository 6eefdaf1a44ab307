"""The render cache: what a rendering computes from a run (the run loaded and scored, its answers' values, the
groups and coverage the notebooks show), computed once and kept in ``<reports folder>/.cache``.

A rendering's kernels find the folder in :data:`CACHE_ENV` (:func:`weknora_nb.reports.render.render_reports` sets it
in each kernel's environment); a live session has none, and nothing is cached there. Each entry is keyed by the bytes
of the files it was computed from and by :func:`code_version`, written atomically, and loaded only from a private
folder of this user (entries are pickles).
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import pickle
import stat
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa

from weknora_nb.core.errors import WeknoraNbError
from weknora_nb.core.files import waiting_lock
from weknora_nb.core.run import MANIFEST, RESULTS, Run, load_run

log = logging.getLogger(__name__)
#: the environment variable naming the render cache's folder (set in the kernels that render reports;
#: unset in a live session, where nothing is cached)
CACHE_ENV = "WEKNORA_NB_CACHE"
#: the environment variable holding the rendering process's :func:`code_version` in its kernels
CODE_ENV = "WEKNORA_NB_CACHE_CODE"
_CACHE_FORMAT = "2"  # 2: entries compressed with Zstandard (_pack)
_MISS = object()
_refused: set[str] = set()
#: the render-cache key of each run :func:`cached_run` returned, by id (with a reference to check it is that run)
_run_keys: dict[int, tuple[weakref.ref, tuple[str, str]]] = {}
T = TypeVar("T")


def cache_folder() -> Path | None:
    """The render cache's folder (:data:`CACHE_ENV`), or None: nothing is cached."""
    value = os.environ.get(CACHE_ENV)
    return Path(value) if value else None


def _digest(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode("utf-8", "surrogatepass")).hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of the bytes of ``path`` (OSError when it cannot be read)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def code_version() -> str:
    """What a cached value depends on besides its inputs: the package's source, Python and the libraries
    whose objects are stored (a change to any of them is a different key). A rendering's kernels take
    the rendering process's (:data:`CODE_ENV`), so that all of one rendering's entries have one."""
    return os.environ.get(CODE_ENV) or _source_version()


@lru_cache(maxsize=1)
def _source_version() -> str:
    import pyarrow

    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{sys.version} {pd.__version__} {np.__version__} {pyarrow.__version__}".encode())
    for p in sorted(pkg.rglob("*.py")):
        h.update(str(p.relative_to(pkg)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _run_key(run_dir: str | Path, metrics: Iterable[str] | None, domain_adjustment: float) -> tuple[str, str] | None:
    """The key of a run loaded and scored: ``(slot, content)``, the slot naming what was asked (the run
    folder, the metrics, the adjustment), the content hashing the bytes of its manifest, results table and
    test set with :func:`code_version`. None when a file cannot be read (then nothing is cached and
    :func:`load_run` says what is wrong)."""
    from weknora_nb.core.metrics import parse_metrics
    from weknora_nb.core.run import _recorded_testset, read_manifest

    p = Path(run_dir).resolve()
    try:
        names = tuple(m.name for m in parse_metrics(metrics))  # None and the default list: one slot
        testset = _recorded_testset(p, read_manifest(p)).resolve()
        files = [file_digest(f) for f in (p / MANIFEST, p / RESULTS, testset)]
    except (WeknoraNbError, OSError):
        return None
    slot = _digest("run", p, names, float(domain_adjustment))
    return slot, _digest(_CACHE_FORMAT, code_version(), slot, testset, *files)


def usable_cache(folder: Path) -> bool:
    """Make ``folder`` (mode 0700) and tell whether it may hold the cache: a real folder (not a link) of
    this user that no one else can write to, since what it holds is loaded with pickle. Said once when not."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.lstat()
    except OSError as exc:
        problem = f"it cannot be made ({exc.strerror or exc})"
    else:
        uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
        problem = ("it is a link" if stat.S_ISLNK(st.st_mode) else
                   "it is not a folder" if not stat.S_ISDIR(st.st_mode) else
                   "it belongs to another user" if st.st_uid != uid else
                   "others can write to it" if st.st_mode & 0o022 else "")
    if problem and str(folder) not in _refused:
        _refused.add(str(folder))
        log.warning("render cache %s not used: %s; everything is computed", folder, problem)
    return not problem


def _entry(folder: Path, kind: str, key: tuple[str, str]) -> Path:
    return folder / f"{kind}-{key[0][:16]}-{key[1][:32]}.pickle.z"


def _load(path: Path) -> Any:
    """The value stored at ``path``, or :data:`_MISS` (no entry, one this user did not write, or one
    that cannot be read back: it is then computed again)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return _MISS
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o022:
            return _MISS
        try:
            return _unpack(f.read())
        except Exception as exc:  # noqa: BLE001 - an entry from another version or a damaged one: a miss
            log.debug("render cache entry %s not used: %s", path, exc)
            return _MISS


#: how an entry is compressed: Zstandard at level 1 (pyarrow's codec), quicker to write and to read than zlib and
#: smaller; a rendering reads each run's entry once per page that shows it
_CODEC, _LEVEL = "zstd", 1


def _pack(value: Any) -> bytes:
    """An entry's bytes: the length of ``value``'s pickle (8 bytes, little-endian), then the pickle compressed."""
    raw = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return len(raw).to_bytes(8, "little") + pa.Codec(_CODEC, _LEVEL).compress(raw, asbytes=True)


def _unpack(data: bytes) -> Any:
    """The value of an entry :func:`_pack` wrote (what damaged bytes raise, the caller takes as a miss)."""
    size = int.from_bytes(data[:8], "little")
    return pickle.loads(pa.Codec(_CODEC).decompress(memoryview(data)[8:], size, asbytes=True))


def _store(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` atomically (a private temporary file renamed over it), then remove
    the entries of the same slot with another content (older inputs). A failure to write is logged:
    the cache only saves time."""
    data = _pack(value)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".z")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("render cache entry %s not written: %s", path, exc.strerror or exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return
    slot = path.name.rsplit("-", 1)[0]
    for old in path.parent.glob(f"{glob.escape(slot)}-*.pickle.z"):
        if old.name != path.name:
            old.unlink(missing_ok=True)


def cached(kind: str, key: tuple[str, str] | None, compute: Callable[[], T], *, folder: Path | None = None) -> T:
    """``compute()``, computed once for ``key`` and kept in the render cache.

    ``folder``: the cache's folder (default :func:`cache_folder`; None there: ``compute()``, nothing
    kept). ``key``: ``(slot, content)`` (None: not cached); a new content replaces the slot's older
    entry. Kernels rendering at the same time share the folder: the first to need a value computes
    it while the others wait for it (a lock per slot), and entries are written atomically (a reader
    sees a whole entry or none). Values must pickle.
    """
    folder = folder if folder is not None else cache_folder()
    if key is None or folder is None or not usable_cache(folder):
        return compute()
    path = _entry(folder, kind, key)
    value = _load(path)
    if value is _MISS:
        with _computing(path):
            value = _load(path)  # stored by the process that held the lock before
            if value is _MISS:
                value = compute()
                _store(path, value)
    return value


def _computing(entry: Path) -> AbstractContextManager[None]:
    """The lock of ``entry``'s slot (a lock file beside it, :func:`weknora_nb.core.files.waiting_lock`): one
    process computes a value while the others that need it wait, then read it."""
    return waiting_lock(entry.parent / (entry.name.rsplit("-", 1)[0] + ".lock"))


def cached_run(run_dir: str | Path, *, metrics: Iterable[str] | None = None, domain_adjustment: float = 0.0,
               folder: Path | None = None) -> Run:
    """:func:`weknora_nb.core.run.load_run` of ``run_dir`` (``metrics``, ``domain_adjustment``), from the
    render cache when the run's manifest, results table and test set are the bytes it was computed from.

    A rendering's kernels set it as :data:`weknora_nb.core.run.run_cache`, so that the runs other
    functions load (a comparison's, the history's) come from the cache too.
    """
    metrics = None if metrics is None else list(metrics)
    key = _run_key(run_dir, metrics, domain_adjustment) if (folder or cache_folder()) is not None else None
    run = cached("run", key, lambda: load_run(run_dir, metrics=metrics, domain_adjustment=domain_adjustment,
                                              cache=False), folder=folder)
    if key is not None:
        _run_keys[id(run)] = (weakref.ref(run), key)
        weakref.finalize(run, _run_keys.pop, id(run), None)
    return run


def cached_answer_values(run: Run, stage: str, compute: Callable[[], pd.DataFrame], *,
                         folder: Path | None = None) -> pd.DataFrame:
    """``compute()`` (:func:`weknora_nb.analysis.answers.answer_values` of ``run`` at ``stage``), from the render cache
    when ``run`` came from :func:`cached_run` and its answers and judgements files are the bytes the values were
    computed from. A rendering's kernels set it as :data:`weknora_nb.analysis.answers.values_cache`."""
    from weknora_nb.core.answers import JUDGEMENTS
    from weknora_nb.core.run import ANSWERS

    paths = [run.path / name for name in (ANSWERS, JUDGEMENTS)]
    try:
        files = [file_digest(p) if p.is_file() else "-" for p in paths]
    except OSError:   # a file that cannot be read: computed, and its error said where it is read
        return compute()
    key = derived_key(run, "answers", stage)   # the files' bytes are the content: changed, the entry is replaced
    return cached("answers", None if key is None else (key[0], _digest(key[1], *files)), compute, folder=folder)


def derived_key(run: Run, what: str, *params: object) -> tuple[str, str] | None:
    """The key of a value computed from ``run`` (one :func:`cached_run` returned) with ``params``; None
    for any other run (it is not cached)."""
    known = _run_keys.get(id(run))
    if known is None or known[0]() is not run:
        return None
    slot = _digest(what, known[1][0], *params)
    return slot, _digest(slot, known[1][1])


def use_in_this_kernel() -> None:
    """Where a rendering set :data:`CACHE_ENV` (a report's kernel): the runs other functions load (a comparison's,
    the history's) and the answers' values come from the cache too (:data:`weknora_nb.core.run.run_cache`,
    :data:`weknora_nb.analysis.answers.values_cache`). Elsewhere nothing changes."""
    if cache_folder() is None:
        return
    from weknora_nb.analysis import answers
    from weknora_nb.core import run

    run.run_cache = cached_run
    answers.values_cache = cached_answer_values
