"""The chat's query expansion (docs/weknora-contract.md C115): the query variants WeKnora searches when a chat's
search found too little.

When a chat's search (CHUNK_SEARCH) finds fewer than ``max(1, embedding_top_k)`` results and query expansion is
on (config.yaml's and the built-in agent's ``enable_query_expansion``), WeKnora makes up to five variants of the
query **without a language model** and runs one more hybrid search per variant and knowledge base, appending
their hits (internal/application/service/chat_pipeline/search.go:140-146 and query_expansion.go:14-124 @ v0.7.2).
:func:`expand_queries` is ``expandQueries`` (query_expansion.go:126-234), in order:

1. the query's keywords joined by spaces, when there are at least two: its tokens (runs of Han characters
   cut by jieba in search mode, runs of letters and digits kept whole) that are not stopwords and have more
   than one character;
2. the text inside quotes (``"'「」『』``), longer than two bytes;
3. the pieces between delimiters (``,，;；、。！？!?`` and white space), longer than five bytes;
4. the query without a leading question word (什么是, 如何, 请问, ...).

A variant is kept when, trimmed, it has at least 3 bytes (UTF-8) and is neither the query nor a variant
already kept (case-insensitive). WeKnora's jieba is gojieba with its own dictionary; the sandbox's is Python's
jieba (:mod:`weknora_nb.core.segmenter`), so a Chinese query may be cut a little differently.
"""

from __future__ import annotations

import re

from weknora_nb.core.segmenter import jieba_ready

#: query_expansion.go:177-188: stopwords (a token that is one, lower-cased, is not a keyword)
STOPWORDS = frozenset([
    "的", "是", "在", "了", "和", "与", "或",
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had", "do", "does", "did",
    "will", "would", "could", "should", "may", "might", "must", "can", "to", "of", "in", "for", "on", "with", "at",
    "by", "from", "as", "into", "through", "about", "what", "how", "why", "when", "where", "which", "who", "whom",
    "whose"])
#: query_expansion.go:191
_QUESTION_WORDS = re.compile(r"^(什么是|什么|如何|怎么|怎样|为什么|为何|哪个|哪些|谁|何时|何地|请问|请告诉我|帮我|"
                             r"我想知道|我想了解)")
#: query_expansion.go:208 (ASCII double and single quotes, 「」『』)
_QUOTED = re.compile(r"[\"'「」『』]([^\"'「」『』]+)[\"'「」『』]")
#: query_expansion.go:220 (RE2's \s is ASCII white space)
_DELIMITERS = re.compile(r"[,，;；、。！？!?\t\n\f\r ]+")
#: Go's unicode.Han (as in :mod:`.textutil`)
_HAN = re.compile("[\u2e80-\u2e99\u2e9b-\u2ef3\u2f00-\u2fd5\u3005\u3007\u3021-\u3029\u3038-\u303b"
                  "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufa6d\ufa70-\ufad9\U00020000-\U0003134f]")
#: expandQueries keeps at most this many variants
MAX_VARIANTS = 5


def _tokens(text: str) -> list[str]:
    """``tokenize`` (query_expansion.go:236-283): Han runs cut by jieba (search mode), letter and digit runs whole."""
    out: list[str] = []
    run: list[str] = []
    han = False

    def flush() -> None:
        nonlocal han
        if run:
            word = "".join(run)
            out.extend(w.strip() for w in (jieba_ready().cut_for_search(word) if han else [word]) if w.strip())
            run.clear()
        han = False

    for ch in text:
        if _HAN.match(ch):
            if run and not han:
                flush()
            han = True
            run.append(ch)
        elif ch.isalpha() or ch.isdigit():
            if run and han:
                flush()
            run.append(ch)
        else:
            flush()
    flush()
    return out


def expand_queries(query: str, original: str | None = None) -> list[str]:
    """Up to five variants of ``query`` (the rewritten query; ``original``: the query as asked, also never a
    variant), see the module docstring."""
    query = query.strip()
    if not query:
        return []
    seen = {query.lower()} | ({original.lower()} if original else set())
    out: list[str] = []

    def add(s: str) -> None:
        s = s.strip()
        if len(s.encode("utf-8")) < 3 or s.lower() in seen:
            return
        seen.add(s.lower())
        out.append(s)

    keywords = [w for w in _tokens(query) if w.lower() not in STOPWORDS and len(w) > 1]
    if len(keywords) >= 2:
        add(" ".join(keywords))
    for phrase in _QUOTED.findall(query):
        if len(phrase.encode("utf-8")) > 2:
            add(phrase)
    for seg in (p.strip() for p in _DELIMITERS.split(query)):
        if len(seg.encode("utf-8")) > 5:
            add(seg)
    cleaned = _QUESTION_WORDS.sub("", query, count=1).strip()
    if cleaned != query:
        add(cleaned)
    return out[:MAX_VARIANTS]
