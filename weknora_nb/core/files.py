"""Atomic file writes (every file weknora-nb writes appears whole or not at all), the lock processes take
in turn to compute a value once for a folder they share, and the cache folder they share."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def default_cache_dir() -> Path:
    """``$WEKNORA_NB_CACHE`` or ``~/.cache/weknora-nb``: what is computed once per machine (the sandbox's
    embeddings and tokens, jieba's dictionary as :mod:`weknora_nb.core.segmenter` reads it)."""
    return Path(os.environ.get("WEKNORA_NB_CACHE") or Path.home() / ".cache" / "weknora-nb")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that add one do not);
    renamed onto ``path`` when the block succeeds, removed when it fails."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=f".tmp{p.suffix}")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def waiting_lock(lock: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (made, mode 0600, if missing) for the block: processes that
    take the same lock wait for one another, so that the first computes a value and the others, once they
    hold it, find it. Released when the block ends or the holder dies. Where no lock file can be made, or
    there is no ``fcntl`` (not POSIX), the block runs unlocked: two may then compute the same value."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
