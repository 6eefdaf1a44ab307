"""Token lists of the knowledge base's texts, kept on disk beside the passage embeddings.

Every process that serves a sandbox builds its BM25 corpora (:func:`~weknora_nb.core.tokenize.tokenize`)
and MMR's token sets (:func:`~weknora_nb.sandbox.textutil.simple_tokens`) from the chunks' texts with
jieba, which is pure Python and slow, paid again by each of the demo's worker processes and each test
process. :class:`TokenCache` keeps each text's tokens in
``<cache folder>/tokens-<tokenizer>-<version>.json`` (keyed by the SHA-256 of the text), so a
text is tokenized once per cache folder.

A data folder may ship a read-only seed of them, ``<data>/cache/tokens-<tokenizer>-<version>.json.gz`` (the
demo's is written by ``weknora-nb sandbox build --write-seed``, beside its embeddings): what the seed holds is
neither tokenized nor written to the cache folder, so a fresh machine's first demo tokenizes nothing.

The ``version`` is the SHA-256 of jieba's and cppjieba-py-dat's versions and of the source of the tokenizer modules
(``core/tokenize.py``, ``textutil.py``): a change to either is a new file, never a stale token (a seed of another
version is not read). A file that cannot be read is ignored (a warning) and written anew; two processes
writing at once may drop each other's new entries (each file is written whole, atomically), which are then
tokenized again.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from functools import cache
from pathlib import Path

import orjson

from weknora_nb.core.files import atomic_path

log = logging.getLogger(__name__)

#: the modules whose source decides the tokens (beside jieba's version), in the order they are hashed
_SOURCES = (Path(__file__).parents[1] / "core" / "tokenize.py", Path(__file__).parent / "textutil.py")


@cache
def tokenizer_version() -> str:
    """SHA-256 (16 hex digits) of jieba's and cppjieba-py-dat's versions (the BM25 tokenizer's and TokenizeSimple's
    segmenters) and the source of the tokenizer modules (:data:`_SOURCES`)."""
    from importlib.metadata import version

    import jieba

    h = hashlib.sha256(f"jieba {jieba.__version__} cppjieba-py-dat {version('cppjieba-py-dat')}".encode())
    for source in _SOURCES:
        h.update(source.read_bytes())
    return h.hexdigest()[:16]


class TokenCache:
    """The tokens ``tokenizer`` gives each text, read from ``seed_dir`` (read-only) and from and added to
    ``cache_dir`` (None: not read, or computed and not kept).

    ``name`` names the tokenizer in the file names (``bm25``, ``simple``).
    """

    def __init__(self, cache_dir: Path | None, name: str, tokenizer: Callable[[str], Collection[str]],
                 seed_dir: Path | None = None):
        self.cache_dir = cache_dir
        self.name = name
        self.tokenizer = tokenizer
        self.seed_dir = seed_dir

    @property
    def path(self) -> Path | None:
        """The cache file (None without a cache folder)."""
        if self.cache_dir is None:
            return None
        return self.cache_dir / f"tokens-{self.name}-{tokenizer_version()}.json"

    @property
    def seed_path(self) -> Path | None:
        """The seed file (None without a seed folder)."""
        return None if self.seed_dir is None else _seed_file(self.seed_dir, self.name)

    def tokens(self, texts: Sequence[str]) -> list[list[str]]:
        """The tokens of each of ``texts``, in order (lists as ``tokenizer`` returns them, sets as sorted lists)."""
        path, seed_path = self.path, self.seed_path
        if path is None and seed_path is None:
            return [self._tokenize(t) for t in texts]
        keys = [_key(t) for t in texts]
        seed = {} if seed_path is None else self._load(seed_path)
        kept = {} if path is None else self._load(path)
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in kept and k not in seed}
        if missing:
            log.info("tokenizing %d of %d texts (%s; the rest are cached)", len(missing), len(texts), self.name)
            kept.update((k, self._tokenize(t)) for k, t in missing.items())
            if path is not None:
                self._save(path, kept)
        return [kept[k] if k in kept else seed[k] for k in keys]

    def write_seed(self, texts: Sequence[str], folder: Path) -> Path:
        """Write the seed of exactly ``texts`` into ``folder`` (``tokens-<name>-<version>.json.gz``, gzip of
        the cache's JSON) and remove this tokenizer's seeds of other versions there; returns its path."""
        out = _seed_file(folder, self.name)
        tokens = TokenCache(self.cache_dir, self.name, self.tokenizer).tokens(texts)
        data = orjson.dumps(dict(zip(map(_key, texts), tokens, strict=True)), option=orjson.OPT_SORT_KEYS)
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        for old in folder.glob(f"tokens-{self.name}-*.json.gz"):
            if old != out:
                old.unlink()
        return out

    def _tokenize(self, text: str) -> list[str]:
        out = self.tokenizer(text)
        return sorted(out) if isinstance(out, (set, frozenset)) else list(out)

    @staticmethod
    def _load(path: Path) -> dict[str, list[str]]:
        """The entries of a cache file, or of a seed (``.gz``); {} when it is missing or cannot be read."""
        if not path.exists():
            return {}
        try:
            data = path.read_bytes()
            kept = orjson.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
        except (OSError, EOFError, orjson.JSONDecodeError) as exc:   # gzip.BadGzipFile is an OSError
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


def _key(text: str) -> str:
    """A text's key in the files: the SHA-256 of its UTF-8 bytes (a lone surrogate kept as it is)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _seed_file(folder: Path, name: str) -> Path:
    """The seed of tokenizer ``name`` at this version in ``folder``."""
    return folder / f"tokens-{name}-{tokenizer_version()}.json.gz"
