"""Text overlap as WeKnora's merge step sees it (C42): does a kept result cover a lost chunk's text?

CHUNK_MERGE drops a result whose text another kept result covers: one text, normalised, contained in the
other, or >= :data:`OVERLAP_DROP` of the smaller token set found in the other. Texts are tokenised as
WeKnora's ``TokenizeSimple`` does (:func:`_tokens`: jieba for Chinese). The cause "dropped in merge" asks
:func:`overlap`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache

from weknora_nb.core.segmenter import jieba_ready

#: C42: the share of the shorter result's tokens found in the longer that drops the shorter
OVERLAP_DROP = 0.85

_CJK = re.compile(r"[\u4e00-\u9fff]")


def _punctuation_only(word: str) -> bool:
    return all(unicodedata.category(ch)[0] in "PSZ" or ch.isspace() for ch in word)


@lru_cache(maxsize=65536)
def _tokens(text: str) -> frozenset[str]:
    """WeKnora's ``TokenizeSimple``: lower case; jieba search-mode words when the text holds Chinese, else
    whitespace-separated words; one-character and punctuation-only tokens dropped.

    jieba cuts each run of the characters it segments (``jieba.re_han_default``: Chinese, ASCII letters
    and digits, ``+#&._%-``) on its own, and yields what lies between runs as single characters and
    whitespace, all dropped here: a text's tokens are those of its runs, each run cut once
    (:func:`_run_tokens`) whichever texts hold it (a kept result's text holds its chunks' texts).
    """
    t = text.lower().strip()
    if not _CJK.search(t):
        return _kept_tokens(t.split())
    return frozenset().union(*map(_run_tokens, jieba_ready().re_han_default.findall(t)))


@lru_cache(maxsize=65536)
def _run_tokens(run: str) -> frozenset[str]:
    """The tokens jieba's search mode gives one run of segmented characters (see :func:`_tokens`)."""
    return _kept_tokens(jieba_ready().cut_for_search(run, HMM=True))


def _kept_tokens(words: Iterable[str]) -> frozenset[str]:
    """``words`` stripped, without one-character and punctuation-only ones."""
    return frozenset(w for w in (x.strip() for x in words) if len(w) > 1 and not _punctuation_only(w))


@lru_cache(maxsize=65536)
def _normalised(text: str) -> str:
    """``text`` in lower case, runs of whitespace made one space, stripped."""
    return " ".join(text.lower().split())


def overlap(text: str, kept: str) -> str | None:
    """How ``kept`` covers ``text`` as C42's overlap drop sees it: one normalised text contained in the
    other, or >= 85 % of the smaller token set found in the other (``|A & B| / min(|A|, |B|)``)."""
    a, b = _normalised(text), _normalised(kept)
    if not a or not b:
        return None
    if a in b:
        return "its text is contained in"
    if b in a:
        return "its text contains"
    ta, tb = _tokens(text), _tokens(kept)
    if not ta or not tb:
        return None
    ratio = len(ta & tb) / min(len(ta), len(tb))
    return f"{ratio:.0%} of the shorter text's tokens shared with" if ratio >= OVERLAP_DROP else None
