"""Lexical overlap of a question with a chunk (docs/method.md section 17): how far a question reuses its answer's
words, which is what flatters keyword retrieval.

    overlap(q, c) = |T(q) & T(c)| / |T(q)|

where ``T(x)`` is the set of tokens of ``x`` as the project's Chinese-aware tokenizer cuts them
(:func:`weknora_nb.core.tokenize.tokenize`, the tokens of the sandbox's keyword path: jieba search-mode words for
Chinese, lower-cased ASCII identifiers and their parts, a short stopword list dropped). It is the share of the
question's distinct tokens that the chunk holds: 1.0 for a question made of the chunk's words, 0.0 for one that
shares none; None for a question with no token at all.

A query's overlap (:func:`query_overlaps`) is taken with the chunks that answer it best: the largest overlap over
its chunks of its highest grade. For a generated question that is its source chunk (grade 3, the others of a
multi-chunk question grade 2), the overlap stored with it; for a labelled or traffic query, its best answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import pandas as pd

from weknora_nb.core.testset import TestSet
from weknora_nb.core.tokenize import tokenize


@lru_cache(maxsize=65536)
def token_set(text: str) -> frozenset[str]:
    """The distinct tokens of ``text`` (:func:`weknora_nb.core.tokenize.tokenize`)."""
    return frozenset(tokenize(text))


def lexical_overlap(question: str, chunk: str) -> float | None:
    """``|T(q) & T(c)| / |T(q)|`` (module docstring); None when the question has no token."""
    q = token_set(question)
    if not q:
        return None
    return len(q & token_set(chunk)) / len(q)


def query_overlaps(testset: TestSet, chunk_texts: Mapping[str, str]) -> pd.Series:
    """Each valid query's overlap with its best answer (module docstring), indexed by query id; NaN where none of
    its highest-grade chunks has a text in ``chunk_texts`` (a chunk the inventory does not list) or the query has
    no token."""
    qrels = testset.qrels[testset.qrels["grade"] > 0]
    top = qrels[qrels["grade"] == qrels.groupby("query_id")["grade"].transform("max")]
    texts = testset.queries.set_index("query_id")["query"]
    out: dict[str, float] = {}
    for qid, group in top.groupby("query_id", sort=False):
        values = [lexical_overlap(str(texts[qid]), chunk_texts[c]) for c in group["chunk_id"] if c in chunk_texts]
        found = [v for v in values if v is not None]
        out[str(qid)] = max(found) if found else float("nan")
    return pd.Series(out, name="overlap", dtype=float)
