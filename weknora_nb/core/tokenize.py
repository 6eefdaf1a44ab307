"""A Chinese-aware tokenizer for the keyword (BM25) path.

CJK runs are segmented by jieba (search mode: words and their sub-words); ASCII runs
give lower-cased identifier tokens kept whole (``dg-1003``, ``gateway.yaml``,
``x-dg-key``) and their parts (``dg``, ``1003``). Punctuation and a short stopword list
are dropped.
"""

from __future__ import annotations

import re

from weknora_nb.core.segmenter import jieba_ready

_ASCII = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/:]*[A-Za-z0-9]|[A-Za-z0-9]")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
_PARTS = re.compile(r"[A-Za-z]+|\d+")
_STOP = frozenset([
    "的", "了", "是", "在", "和", "与", "或", "及", "等", "也", "就", "都", "而", "并", "被", "把", "对", "从", "向",
    "为", "以", "于", "中", "上", "下", "个", "一", "这", "那", "有", "我", "你", "他", "它", "吗", "呢", "吧", "啊",
    "什么", "怎么", "如何", "哪些", "哪个", "是否", "可以", "需要", "时候",
    "a", "an", "the", "of", "to", "in", "on", "for", "is", "are", "be", "and", "or", "how", "what",
])


def tokenize(text: str) -> list[str]:
    """Tokens of ``text`` for BM25 (order kept, duplicates kept for term frequency)."""
    jb = jieba_ready()
    out: list[str] = []
    for m in _ASCII.finditer(text):
        tok = m.group(0).lower()
        if tok not in _STOP:
            out.append(tok)
        parts = _PARTS.findall(tok)
        if len(parts) > 1:
            out.extend(p for p in parts if p not in _STOP)
    for m in _CJK.finditer(text):
        for w in jb.cut_for_search(m.group(0)):
            if w not in _STOP:
                out.append(w)
    return out
