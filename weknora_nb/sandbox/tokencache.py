"""Token lists of the knowledge base's texts, kept on disk beside the passage embeddings.

Every process that serves a sandbox builds its BM25 corpora (:func:`~weknora_nb.sandbox.tokenize.tokenize`)
and MMR's token sets (:func:`~weknora_nb.sandbox.textutil.simple_tokens`) from the chunks' texts with
jieba, which is pure Python: about 2 s for the demo's knowledge bases, paid again by each of the demo's
worker processes and each test process. :class:`TokenCache` keeps each text's tokens in
``<cache folder>/tokens-<tokenizer>-<version>.json`` (keyed by the SHA-256 of the text), so a
text is tokenized once per cache folder.

The ``version`` is the SHA-256 of jieba's version and of the source of the tokenizer modules
(``tokenize.py``, ``textutil.py``): a change to either is a new file, never a stale token. A file
that cannot be read is ignored (a warning) and written anew; two processes writing at once may drop
each other's new entries (each file is written whole, atomically), which are then tokenized again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from functools import cache
from pathlib import Path

import orjson

from weknora_nb.core.files import atomic_path

__all__ = ["TokenCache", "tokenizer_version"]

log = logging.getLogger(__name__)

#: the modules whose source decides the tokens (beside jieba's version)
_SOURCES = ("tokenize.py", "textutil.py")


@cache
def tokenizer_version() -> str:
    """SHA-256 (16 hex digits) of jieba's version and the source of the sandbox's tokenizer modules."""
    import jieba

    h = hashlib.sha256(f"jieba {jieba.__version__}".encode())
    for name in _SOURCES:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:16]


class TokenCache:
    """The tokens ``tokenizer`` gives each text, read from and added to ``cache_dir`` (None: computed, not kept).

    ``name`` names the tokenizer in the file name (``bm25``, ``simple``).
    """

    def __init__(self, cache_dir: Path | None, name: str, tokenizer: Callable[[str], Collection[str]]):
        self.cache_dir = cache_dir
        self.name = name
        self.tokenizer = tokenizer

    @property
    def path(self) -> Path | None:
        """The cache file (None without a cache folder)."""
        if self.cache_dir is None:
            return None
        return self.cache_dir / f"tokens-{self.name}-{tokenizer_version()}.json"

    def tokens(self, texts: Sequence[str]) -> list[list[str]]:
        """The tokens of each of ``texts``, in order (lists as ``tokenizer`` returns them, sets as sorted lists)."""
        path = self.path
        if path is None:
            return [self._tokenize(t) for t in texts]
        keys = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
        kept = self._load(path)
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in kept}
        if missing:
            log.info("tokenizing %d of %d texts (%s; the rest are cached)", len(missing), len(texts), self.name)
            kept.update((k, self._tokenize(t)) for k, t in missing.items())
            self._save(path, kept)
        return [kept[k] for k in keys]

    def _tokenize(self, text: str) -> list[str]:
        out = self.tokenizer(text)
        return sorted(out) if isinstance(out, (set, frozenset)) else list(out)

    @staticmethod
    def _load(path: Path) -> dict[str, list[str]]:
        if not path.exists():
            return {}
        try:
            kept = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("ignoring unreadable token cache %s: %s", path, exc)
            return {}
        if not isinstance(kept, dict) or not all(isinstance(v, list) for v in kept.values()):
            log.warning("ignoring token cache %s: not an object of token lists", path)
            return {}
        return kept

    @staticmethod
    def _save(path: Path, kept: dict[str, list[str]]) -> None:
        try:
            data = orjson.dumps(kept)
        except orjson.JSONEncodeError as exc:   # a token holding a lone surrogate: served, not kept
            log.warning("not writing the token cache %s: %s", path, exc)
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
        except OSError as exc:   # a read-only cache folder: the tokens are still served, only not kept
            log.warning("could not write the token cache %s: %s", path, exc)
