"""The sandbox's index: the chunks of every knowledge base and everything built from them (:class:`SandboxIndex`).

- what is indexed: WeKnora's index text of each chunk (title + line break + content, C76; an FAQ
  entry's questions and answers, see :func:`weknora_nb.sandbox.chunking.index_text`);
- BM25 retrievers (bm25s) over the Chinese-aware tokenizer of :mod:`.tokenize`: the keyword path's
  corpus (document knowledge bases only, C20, C47) and the reranker's lexical feature;
- passage embeddings (:mod:`.embedders`) of the index texts and of the cleaned passages the reranker reads;
- the Postgres vector stores (:class:`~weknora_nb.sandbox.pgstore.VectorStore`), one per system version.

Each is built on first use and kept; the texts' tokens are cached on disk (:mod:`.tokencache`: the BM25
corpora, MMR's token sets).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from weknora_nb.core.errors import ConfigError
from weknora_nb.core.tokenize import tokenize
from weknora_nb.sandbox.chunking import Chunk, faq_index_texts, index_text
from weknora_nb.sandbox.embedders import EMBEDDERS, RERANK_EMBEDDER, Embedder, ModelMissingError
from weknora_nb.sandbox.textutil import clean_passage, simple_tokens
from weknora_nb.sandbox.tokencache import TokenCache
from weknora_nb.sandbox.versions import VersionConfig

#: C49: the knowledge base types the sandbox serves (its document knowledge base and an FAQ one)
KB_TYPES = ("document", "faq")
#: the sandbox's knowledge-base ids, by engine kind (the server can be told others)
DEFAULT_KB_IDS = {"document": "kb-demo", "faq": "kb-faq"}
#: the tokenizers whose tokens an index keeps (:class:`~weknora_nb.sandbox.tokencache.TokenCache`), by file name
_TOKENIZERS = {"bm25": tokenize, "simple": simple_tokens}
#: what a passage embedding is of: the index text (vector path) or the cleaned passage (reranker)
ROLES = ("index", "rerank")


class SandboxIndex:
    """Chunks of every knowledge base plus everything built from them: BM25, passage embeddings, HNSW graphs.

    ``chunks`` holds the document chunks (``chunk_type`` text) and the FAQ entries (``faq``) in
    one list; a position in it is a :class:`~weknora_nb.sandbox.pipeline.Hit`'s ``idx``. Each knowledge
    base has its own vector index, and only the document one a keyword index (C20, C47).
    """

    def __init__(self, chunks: list[Chunk], *, cache_dir: Path | None = None, seed_dir: Path | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 index_texts: Mapping[str, str] | None = None, chunking: Mapping[str, Any] | None = None):
        """``index_texts``: the indexed text of some chunks by id, in place of :func:`index_text`'s (a chunk listing
        taken from a WeKnora carries what WeKnora indexed, its search results' ``matched_content``: C76's context
        header is in no API field); ``chunking``: the ``chunking_config`` the document knowledge base reports
        (None: the sandbox's own chunking)."""
        self.chunking = dict(chunking) if chunking else None
        self.chunks = chunks
        self.cache_dir = cache_dir
        self.seed_dir = seed_dir
        self.by_id = {c.id: i for i, c in enumerate(chunks)}
        self._links = _links(chunks)
        self._positions: dict[str, list[int]] = {kb: [] for kb in KB_TYPES}
        self._by_knowledge: dict[str, list[int]] = {}
        for i, c in enumerate(chunks):
            if c.indexed:
                self._positions["faq" if c.chunk_type == "faq" else "document"].append(i)
            self._by_knowledge.setdefault(c.knowledge_id, []).append(i)
        # what is embedded and what the reranker reads: nothing of a chunk that is not indexed (C110); a listed
        # chunk's indexed text as WeKnora gave it
        given = index_texts or {}
        self._texts = {"index": [(given.get(c.id) or index_text(c)) if c.indexed else "" for c in chunks],
                       "rerank": [clean_passage(c.content) if c.indexed else "" for c in chunks]}
        self._bm25: dict[tuple[str, float, float], Any] = {}
        self._embedders: dict[str, Embedder] = {}
        self._vectors: dict[tuple[str, str], np.ndarray] = {}
        self._stores: dict[tuple, Any] = {}
        self._passage_tokens: list[frozenset[str]] | None = None
        self._owners: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._progress = progress

    # -- what is where ------------------------------------------------------------------
    def positions(self, kb_type: str) -> list[int]:
        """Positions of the chunks of the ``document`` or the ``faq`` knowledge base, in index order."""
        return self._positions.get(kb_type, [])

    def kb_type_of_knowledge(self, knowledge_id: str) -> str | None:
        """``document`` or ``faq``: the knowledge base a knowledge (document) is in; None if unknown."""
        got = self._by_knowledge.get(knowledge_id)
        return None if not got else ("faq" if self.chunks[got[0]].chunk_type == "faq" else "document")

    def positions_of_knowledge(self, knowledge_id: str) -> list[int]:
        """Positions of one knowledge's chunks, in chunk order (empty if unknown), ``parent_text`` ones left out."""
        return [i for i in self._by_knowledge.get(knowledge_id, []) if self.chunks[i].chunk_type != "parent_text"]

    def neighbour(self, idx: int, offset: int) -> int | None:
        """The chunk ``offset`` links away (``pre_chunk_id`` is -1, ``next_chunk_id`` +1; C55): the previous or next
        text chunk of a flat document, or ``parent_text`` chunk of a parent-child one; None at an end, for FAQ
        entries and for the children of a parent-child document, which are not linked (C110)."""
        j: int | None = idx
        for _ in range(abs(offset)):
            j = self._links.get(j, (None, None))[0 if offset < 0 else 1] if j is not None else None
        return j if offset else idx

    def texts(self, role: str) -> list[str]:
        """What is embedded for ``role``: per chunk, ``index`` (the index text, C76) or ``rerank`` (the cleaned
        passage the reranker reads, C35); per FAQ index entry, ``faq:<index_mode>:<question_index_mode>``."""
        if role.startswith("faq:"):
            self.rows(role)
        return self._texts[role]

    def rows(self, kind: str) -> list[int]:
        """The rows of one vector index, as positions of the chunks they belong to: ``document`` (one row per
        document chunk) or an FAQ role (one row per index entry, ``faq_index_texts``; a chunk may own several)."""
        if kind == "document":
            return self.positions("document")
        if kind not in self._owners:
            _, index_mode, question_mode = kind.split(":")
            texts: list[str] = []
            owners: list[int] = []
            for i in self.positions("faq"):
                entries = faq_index_texts(self.chunks[i], index_mode, question_mode)
                texts += entries
                owners += [i] * len(entries)
            self._texts[kind], self._owners[kind] = texts, owners
        return self._owners[kind]

    def row_vectors(self, model: str, kind: str) -> np.ndarray:
        """Embeddings of :meth:`rows` ``kind`` (the document rows are the chunks' index texts)."""
        if kind == "document":
            return self.passage_vectors(model)[self.positions("document")]
        self.rows(kind)
        return self.passage_vectors(model, kind)

    def rerank_passage(self, idx: int) -> str:
        """The passage the reranker and MMR read for chunk ``idx`` (``getEnrichedPassage``, C35, C40)."""
        return self._texts["rerank"][idx]

    def passage_tokens(self, idx: int) -> frozenset[str]:
        """Simple tokens of :meth:`rerank_passage` (computed once for every chunk, for MMR)."""
        if self._passage_tokens is None:
            cached = self._token_cache("simple").tokens(self._texts["rerank"])
            self._passage_tokens = [frozenset(t) for t in cached]
        return self._passage_tokens[idx]

    def _token_cache(self, name: str) -> TokenCache:
        """The token cache of tokenizer ``name`` (``bm25``: :func:`tokenize`, ``simple``: :func:`simple_tokens`)
        over this index's cache and seed folders."""
        return TokenCache(self.cache_dir, name, _TOKENIZERS[name], self.seed_dir)

    def _tokenized(self) -> dict[str, list[str]]:
        """The texts each tokenizer has tokenized so far (the BM25 corpora built, MMR's token sets), by name."""
        bm25: dict[str, None] = {}
        for corpus, _, _ in self._bm25:
            bm25.update(dict.fromkeys(self._bm25_corpus(corpus)[1]))
        out = {"bm25": list(bm25)} if bm25 else {}
        if self._passage_tokens is not None:
            out["simple"] = [t for t in dict.fromkeys(self._texts["rerank"]) if t]
        return out

    # -- components, built on first use and kept ---------------------------------------
    def embedder(self, name: str) -> Embedder:
        with self._lock:
            if name not in self._embedders:
                if name not in EMBEDDERS:
                    raise ModelMissingError(f"unknown embedding model {name!r}; known: {sorted(EMBEDDERS)}")
                self._embedders[name] = EMBEDDERS[name](self.cache_dir, self.seed_dir)
            return self._embedders[name]

    def passage_vectors(self, model: str, role: str = "index") -> np.ndarray:
        """Embeddings by ``model`` of :meth:`texts` for ``role`` (in their order; zeros for the empty text of a chunk
        that is not indexed, which is not embedded)."""
        key = (model, role)
        if key not in self._vectors:
            emb = self.embedder(model)
            texts = self.texts(role)
            kept = [i for i, t in enumerate(texts) if t]
            done = [0]

            def tick(n: int) -> None:
                done[0] += n
                if self._progress:
                    self._progress(model, done[0], len(kept))
            vectors = emb.passages([texts[i] for i in kept], progress=tick)
            if len(kept) < len(texts) and len(kept):
                full = np.zeros((len(texts), vectors.shape[1]), dtype=vectors.dtype)
                full[kept] = vectors
                vectors = full
            self._vectors[key] = vectors
        return self._vectors[key]

    def bm25(self, k1: float, b: float, corpus: str = "keyword") -> tuple[Any, list[int]] | None:
        """A BM25 retriever and the positions of its rows: ``keyword`` = the document knowledge base's index
        texts (the keyword path), ``rerank`` = every chunk's cleaned passage (the reranker's lexical feature).
        None when the corpus is empty."""
        key = (corpus, k1, b)
        if key not in self._bm25:
            import bm25s

            logging.getLogger("bm25s").setLevel(logging.WARNING)
            rows, texts = self._bm25_corpus(corpus)
            retriever = None
            if rows:
                retriever = bm25s.BM25(k1=k1, b=b)
                retriever.index(self._token_cache("bm25").tokens(texts), show_progress=False)
            self._bm25[key] = (retriever, rows)
        retriever, rows = self._bm25[key]
        return None if retriever is None else (retriever, rows)

    def _bm25_corpus(self, corpus: str) -> tuple[list[int], list[str]]:
        """The rows (chunk positions) of BM25 corpus ``corpus`` (see :meth:`bm25`) and their texts."""
        rows = self.positions("document") if corpus == "keyword" else list(range(len(self.chunks)))
        texts = self._texts["index" if corpus == "keyword" else "rerank"]
        return rows, [texts[i] for i in rows]

    def vector_store(self, version: VersionConfig, kb_ids: Mapping[str, str] | None = None) -> Any:
        """The Postgres vector index of ``version`` (:class:`~weknora_nb.sandbox.pgstore.VectorStore`), one per
        version and knowledge-base ids, built on first use; ``kb_ids`` maps ``document`` / ``faq`` to ids."""
        from weknora_nb.sandbox.pgstore import VectorStore

        ids = dict(kb_ids or DEFAULT_KB_IDS)
        key = (version, tuple(sorted(ids.items())))
        with self._lock:
            if key not in self._stores:
                self._check_fault_chunks(version)
                self._stores[key] = VectorStore(self, version, ids)
            return self._stores[key]

    def _check_fault_chunks(self, version: VersionConfig) -> None:
        """Every chunk a seeded fault names must exist (:class:`ConfigError` naming the unknown ones)."""
        faults = version.integrity_faults()
        named = [*faults["without_vectors"], *faults["deleted_chunks"],
                 *(c for pair in faults["duplicated_vectors"] for c in pair)]
        unknown = sorted({c for c in named if c not in self.by_id})
        if unknown:
            raise ConfigError("versions", f"version {version.name!r}: integrity names unknown chunks: "
                              f"{', '.join(unknown[:5])}")

    def warm(self, version: VersionConfig) -> None:
        """Build everything ``version`` needs now rather than on the first request."""
        if version.keyword_enabled:
            self.bm25(version.bm25_k1, version.bm25_b)
        if version.vector_enabled or version.faq_enabled:
            self.row_vectors(version.embedding_model, "document")
            if version.faq_enabled:
                self.row_vectors(version.embedding_model, version.faq_role)
        if version.rerank_enabled:
            if version.rerank_model not in RERANK_EMBEDDER:
                raise ModelMissingError(f"unknown rerank model {version.rerank_model!r}; "
                                        f"known: {sorted(RERANK_EMBEDDER)}")
            self.passage_vectors(RERANK_EMBEDDER[version.rerank_model], "rerank")
            self.bm25(version.bm25_k1, version.bm25_b, "rerank")
            if self.chunks:
                self.passage_tokens(0)  # MMR's token sets

    def write_seed(self, folder: Path, queries: Sequence[str] = (), also: Sequence[SandboxIndex] = (),
                   vector_queries: Sequence[str] = ()) -> list[Path]:
        """Write, per embedding model used so far, exactly the texts it embedded, and the embeddings of
        ``queries`` (the data folder's test sets; the vector path's models also ``vector_queries``: the variants a
        chat searches, C115); per tokenizer used so far, the tokens of exactly the texts it tokenized: the seed
        shipped with data. ``also``: other indexes of the same data folder (another chunking, C110) whose texts go
        into the same files."""
        texts: dict[str, dict[str, None]] = {}
        tokenized: dict[str, dict[str, None]] = {}
        vector_models: set[str] = set()
        for index in (self, *also):
            for model, role in index._vectors:
                texts.setdefault(model, {}).update(dict.fromkeys(t for t in index._texts[role] if t))
                if role != "rerank":
                    vector_models.add(model)
            for name, got in index._tokenized().items():
                tokenized.setdefault(name, {}).update(dict.fromkeys(got))
        out = [self.embedder(model).write_seed(list(t), folder) for model, t in sorted(texts.items())]
        for model in sorted(texts):
            asked = list(dict.fromkeys([*queries, *(vector_queries if model in vector_models else ())]))
            if asked:
                out.append(self.embedder(model).write_seed(asked, folder, queries=True))
        return out + [self._token_cache(name).write_seed(list(t), folder) for name, t in sorted(tokenized.items())]

def _links(chunks: Sequence[Chunk]) -> dict[int, tuple[int | None, int | None]]:
    """Each linked chunk's (previous, next) position (C55 ``pre_chunk_id`` / ``next_chunk_id``): the ``text`` chunks
    of a flat document, or the ``parent_text`` chunks of a parent-child one, in ``chunk_index`` order; the children
    of a parent-child document and FAQ entries are not linked (C110)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(chunks):
        if c.linked and c.chunk_type in ("text", "parent_text"):
            groups.setdefault((c.knowledge_id, c.chunk_type), []).append(i)
    out: dict[int, tuple[int | None, int | None]] = {}
    for members in groups.values():
        members.sort(key=lambda i: chunks[i].chunk_index)
        for k, i in enumerate(members):
            out[i] = (members[k - 1] if k else None, members[k + 1] if k + 1 < len(members) else None)
    return out
