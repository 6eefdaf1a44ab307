"""WeKnora's text helpers of the search pipeline, ported for the sandbox.

Each function names the Go function it follows (paths relative to the WeKnora repository, at
v0.7.2 unless said otherwise; the helpers are the same at v0.6.2 where the pipeline has them):

- :func:`simple_tokens` = ``searchutil.TokenizeSimple`` (internal/searchutil/textutil.go:40-73):
  lower-cased, trimmed; jieba search-mode words when the text holds a Han character, else
  whitespace fields; tokens of one rune and tokens made only of punctuation, symbols or spaces
  are dropped. A set. WeKnora's jieba is gojieba (``types.Jieba``, internal/types/evaluation.go:13-28 @
  v0.7.2: cppjieba with its own dictionary, HMM model and user dictionary), whose ``CutForSearch`` cuts
  differently from Python's jieba (letters and digits: ``01ja7q2`` is ``01`` + ``ja7q2``, ``10.20.3.5`` one
  token; single characters always go to the HMM), so the sandbox cuts with cppjieba too
  (:func:`weknora_jieba`, package ``cppjieba-py-dat``: the same words as gojieba v1.4.7 for every passage of
  docs/sandbox-vs-weknora.md's knowledge base).
- :func:`jaccard` = ``searchutil.Jaccard`` (textutil.go:77-102), :func:`overlap_ratio` =
  ``ContentOverlapRatio`` (:132-151), :func:`normalize_content` = ``NormalizeContent``
  (:106-112), :func:`content_signature` = ``BuildContentSignature`` (:14-24, the normalised
  text itself instead of its MD5: equal exactly when the MD5s are).
- :func:`join_chunk_content` = ``searchutil.JoinChunkContent`` and :func:`contains_chunk_content`
  = ``ContainsChunkContent`` (internal/searchutil/chunkmerge.go:15-58; 12-rune minimum overlap,
  400-rune search span).
- :func:`clean_passage` = ``cleanPassageForRerank`` (internal/application/service/chat_pipeline/
  rerank.go:547-642): what the reranker and MMR read of a chunk (C35, C40).

Token sets are what MMR and the overlap drop compare, for up to 50 results a request, so they
are cached: a :class:`Text` carries the pieces it was joined from (``"\\n\\n"`` never lies inside a
jieba or whitespace token), and its token set is the union of its pieces' cached sets.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from weknora_nb.core.files import default_cache_dir

#: chunkmerge.go: the shortest suffix/prefix overlap that counts, and the longest one looked for
MIN_OVERLAP_RUNES = 12
SEARCH_SPAN = 400

# Go's unicode.Han, as ranges (CJK radicals, ideographs, extensions A-G, compatibility ideographs)
_HAN = re.compile("[\u2e80-\u2e99\u2e9b-\u2ef3\u2f00-\u2fd5\u3005\u3007\u3021-\u3029\u3038-\u303b"
                  "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufa6d\ufa70-\ufad9\U00020000-\U0003134f]")
# Go's \s (RE2, ASCII only): tab, newline, form feed, carriage return, space
_S = r"[\t\n\f\r ]"


def _is_all_punct(word: str) -> bool:
    """Go's isAllPunct: every rune is punctuation (P*), a symbol (S*) or a space."""
    return all(ch.isspace() or unicodedata.category(ch)[0] in "PS" for ch in word)


def _keep(words) -> frozenset[str]:
    out = set()
    for w in words:
        w = w.strip()
        if len(w) > 1 and not _is_all_punct(w):
            out.add(w)
    return frozenset(out)


_JIEBA: list[Any] = []
_JIEBA_LOCK = threading.Lock()


def weknora_jieba() -> Any:
    """WeKnora's segmenter: cppjieba with gojieba's default dictionary, HMM model and user dictionary
    (``gojieba.NewJieba()``), made once; its double-array dictionary is kept in the cache folder
    (``cppjieba/``). The package's own start-up messages are kept off standard output."""
    with _JIEBA_LOCK:
        if not _JIEBA:
            from importlib.resources import files

            import cppjieba_py_dat

            user_dict = files("cppjieba_py_dat") / "dict" / "user.dict.utf8"
            with contextlib.redirect_stdout(io.StringIO()):
                _JIEBA.append(cppjieba_py_dat.Jieba(user_dict_path=str(user_dict),
                                                    dat_cache_dir=str(default_cache_dir() / "cppjieba")))
        return _JIEBA[0]


@lru_cache(maxsize=65536)
def _piece_tokens(piece: str) -> tuple[bool, frozenset[str], frozenset[str]]:
    """(holds a Han character, jieba token set, whitespace token set) of one lower-cased piece."""
    has_han = _HAN.search(piece) is not None
    cut = weknora_jieba().cut_for_search(piece, True) if has_han else ()
    return has_han, _keep(cut), _keep(piece.split())


def simple_tokens(text: str) -> frozenset[str]:
    """WeKnora's ``TokenizeSimple``: the set of lower-cased tokens longer than one rune (see the module docstring)."""
    return _tokens_of_pieces((text,))


def _tokens_of_pieces(pieces: tuple[str, ...]) -> frozenset[str]:
    """TokenizeSimple of the pieces joined by blank lines: jieba for all when any holds Han, else fields."""
    parts = [_piece_tokens(p.lower()) for p in pieces if p.strip()]
    if not parts:
        return frozenset()
    han = any(p[0] for p in parts)
    sets = [p[1] if han else p[2] for p in parts]
    return sets[0] if len(sets) == 1 else frozenset().union(*sets)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a & b| / |a | b| (0 when both are empty)."""
    if not a and not b:
        return 0.0
    inter = len(a & b) if len(a) <= len(b) else len(b & a)
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0


def overlap_ratio(a: frozenset[str], b: frozenset[str]) -> float:
    """ContentOverlapRatio on token sets: |small & large| / |small| (0 when either is empty)."""
    if not a or not b:
        return 0.0
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return len(small & large) / len(small)


def normalize_content(text: str) -> str:
    """Lower-cased, trimmed, whitespace runs collapsed to one space."""
    return " ".join(text.lower().split())


def content_signature(text: str) -> str:
    """What BuildContentSignature hashes: the normalised text ("" for empty text: no signature)."""
    return normalize_content(text)


def contains_chunk_content(container: str, contained: str) -> bool:
    """Equal texts, or ``contained`` (at least 12 runes) is a substring of ``container``."""
    if not container or not contained:
        return False
    return container == contained or (len(contained) >= MIN_OVERLAP_RUNES and contained in container)


def _suffix_prefix_overlap(acc: str, nxt: str) -> int:
    """The longest k in [12, min(len, 400)] with acc[-k:] == nxt[:k], or 0."""
    limit = min(len(acc), len(nxt), SEARCH_SPAN)
    if limit < MIN_OVERLAP_RUNES:
        return 0
    head = nxt[:MIN_OVERLAP_RUNES]
    start = len(acc) - limit
    pos = acc.find(head, start)
    while pos >= 0:  # the first occurrence from the left is the longest overlap
        k = len(acc) - pos
        if acc[pos:] == nxt[:k]:
            return k
        pos = acc.find(head, pos + 1)
    return 0


def join_chunk_content(acc: str, nxt: str, separator: str = "\n\n") -> str:
    """JoinChunkContent: a containment collapses to the container, a real overlap is kept once, else both."""
    return join_texts(Text.of(acc), Text.of(nxt), separator).s


@dataclass(frozen=True)
class Text:
    """A result's content and the pieces whose token sets give its own (see the module docstring)."""

    s: str
    pieces: tuple[str, ...]

    @classmethod
    def of(cls, s: str) -> Text:
        return cls(s, (s,))

    def tokens(self) -> frozenset[str]:
        """TokenizeSimple of :attr:`s`."""
        return _tokens_of_pieces(self.pieces)


def join_texts(acc: Text, nxt: Text, separator: str = "\n\n") -> Text:
    """:func:`join_chunk_content` on :class:`Text` values (pieces kept when the join is plain)."""
    if not acc.s:
        return nxt
    if not nxt.s:
        return acc
    if contains_chunk_content(acc.s, nxt.s):
        return acc
    if contains_chunk_content(nxt.s, acc.s):
        return nxt
    k = _suffix_prefix_overlap(acc.s, nxt.s)
    if k:
        joined = acc.s + nxt.s[k:]
        return Text(joined, (joined,))
    joined = acc.s + separator + nxt.s
    if separator != "\n\n":  # only a blank line is known to separate tokens (and :func:`truncate_text`'s walk)
        return Text(joined, (joined,))
    return Text(joined, acc.pieces + nxt.pieces)


def truncate_text(t: Text, limit: int) -> Text:
    """The first ``limit`` characters (runes) of ``t`` (pieces kept up to the cut)."""
    if len(t.s) <= limit:
        return t
    cut = t.s[:limit]
    if len(t.pieces) == 1 or sum(map(len, t.pieces)) + 2 * (len(t.pieces) - 1) != len(t.s):
        return Text(cut, (cut,))
    kept: list[str] = []
    used = 0
    for p in t.pieces:
        room = limit - used
        if room <= 0:
            break
        kept.append(p[:room])
        used += len(p) + 2
    return Text(cut, tuple(kept))


# -- cleanPassageForRerank (rerank.go:547-642) -------------------------------------------
_URL_BODY = r"[^()\t\n\f\r ]*(?:\([^)]*\)[^()\t\n\f\r ]*)*"
_CODE_BLOCK = re.compile(r"```[^\r\n]*\r?\n(.*?)\r?\n?```", re.S)
_LATEX_BLOCK = re.compile(r"\$\$(.*?)\$\$", re.S)
_HTML_TAG = re.compile(r"</?[a-zA-Z][^>]*>")
_LINKED_IMAGE = re.compile(r"\[!\[([^\]]*)\]\((" + _URL_BODY + r")\)\]\(" + _URL_BODY + r"\)")
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\(" + _URL_BODY + r"\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\(" + _URL_BODY + r"\)")
_RAW_URL = re.compile(r"https?://[^\t\n\f\r )\]>]+")
_TABLE_SEP = re.compile(r"^[ \t]*\|[ \t:|-]+\|[ \t]*$", re.M)
_TABLE_ROW = re.compile(r"^[ \t]*\|(.+?)\|[ \t]*$", re.M)
_HEADING = re.compile(r"^#{1,6}" + _S + "+", re.M)
_QUOTE = re.compile(r"^>" + _S + "?", re.M)
_BOLD3 = re.compile(r"\*{3}(.+?)\*{3}")
_BOLD2 = re.compile(r"\*{2}(.+?)\*{2}")
_BOLD1 = re.compile(r"\*(.+?)\*")
_LIST = re.compile(r"^[\t ]*(?:[-*+]|[0-9]+\.)" + _S + "+", re.M)
_NEWLINES = re.compile(r"\n{3,}")


def _table_row(m: re.Match[str]) -> str:
    return ", ".join(c.strip() for c in m.group(1).split("|") if c.strip())


def clean_passage(text: str) -> str:
    """cleanPassageForRerank: code and LaTeX unwrapped, HTML, images, URLs and table rules removed,
    table rows as comma-joined cells, heading/quote/emphasis/list markers stripped, trimmed."""
    text = _CODE_BLOCK.sub(r"\1", text)
    text = _LATEX_BLOCK.sub(r"\1", text)
    text = _HTML_TAG.sub("", text)
    text = _LINKED_IMAGE.sub(r"![\1](\2)", text)
    text = _MD_IMAGE.sub("", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _RAW_URL.sub("", text)
    text = _TABLE_SEP.sub("", text)
    text = _TABLE_ROW.sub(_table_row, text)
    text = _HEADING.sub("", text)
    text = _QUOTE.sub("", text)
    text = _BOLD3.sub(r"\1", text)
    text = _BOLD2.sub(r"\1", text)
    text = _BOLD1.sub(r"\1", text)
    text = _LIST.sub("", text)
    text = _NEWLINES.sub("\n\n", text)
    return text.strip()
