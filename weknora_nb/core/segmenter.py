"""jieba, the Chinese word segmenter WeKnora's tokenizers use, ready to cut (:func:`jieba_ready`).

jieba starts by reading its prefix dictionary (its 349,045 words and their prefixes: 498,113 entries with
their frequencies) from a ``marshal`` file in the temporary folder, slowly, in every process that segments
Chinese, and a demo has four (two collection workers, two report kernels). :func:`jieba_ready` gives jieba
the same dictionary read from a file of its own in the cache folder
(:func:`~weknora_nb.core.files.default_cache_dir`), ``jieba-<version>.npz``: the entries as one UTF-8 block
(split on newlines, which no entry holds) and their frequencies as an integer array, quicker to read. It
is written once per machine, after jieba's own start; a file that cannot be read, or whose entries and
frequencies do not pair up, is ignored with a warning (jieba starts as it would) and written anew. Only
jieba's default dictionary is kept so: a process that gave jieba another one gets jieba's own start.
"""

from __future__ import annotations

import logging
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

from weknora_nb.core.files import atomic_path, default_cache_dir

log = logging.getLogger(__name__)


@cache
def jieba_ready() -> Any:
    """The ``jieba`` module, its default tokenizer's dictionary loaded (see the module's docstring); its own
    log quieted to warnings."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    tokenizer = jieba.dt
    with tokenizer.lock:
        if not tokenizer.initialized:
            _start(tokenizer, jieba)
    return jieba


def _start(tokenizer: Any, jieba: Any) -> None:
    """Load ``tokenizer``'s default dictionary from this module's file, or start it as jieba does and write
    the file."""
    if tokenizer.dictionary != jieba.DEFAULT_DICT:
        tokenizer.initialize()
        return
    path = default_cache_dir() / f"jieba-{jieba.__version__}.npz"
    kept = _read(path)
    if kept is not None:
        tokenizer.FREQ, tokenizer.total = kept
        tokenizer.initialized = True
        return
    tokenizer.initialize()
    _write(path, tokenizer.FREQ, tokenizer.total)


def _read(path: Path) -> tuple[dict[str, int], int] | None:
    """The dictionary kept in ``path``, or None (missing, unreadable, or not a whole dictionary)."""
    import numpy as np

    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            words = z["words"].tobytes().decode("utf-8").split("\n")
            freqs = z["freqs"].tolist()
            total = int(z["total"])
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:   # UnicodeDecodeError: a ValueError
        log.warning("ignoring unreadable jieba dictionary %s: %s", path, exc)
        return None
    if len(words) != len(freqs) or len(words) < 2:
        log.warning("ignoring jieba dictionary %s: its entries and frequencies do not match", path)
        return None
    return dict(zip(words, freqs, strict=True)), total


def _write(path: Path, freq: dict[str, int], total: int) -> None:
    """Keep jieba's dictionary in ``path`` (atomically); a folder that cannot be written is a warning."""
    import numpy as np

    if any("\n" in w for w in freq):   # not kept: the block could not be split back
        return
    try:
        with atomic_path(path) as tmp:
            np.savez(tmp, words=np.frombuffer("\n".join(freq).encode("utf-8"), dtype=np.uint8),
                     freqs=np.fromiter(freq.values(), dtype=np.int64, count=len(freq)), total=np.int64(total))
    except OSError as exc:
        log.warning("could not keep jieba's dictionary in %s: %s", path, exc)
