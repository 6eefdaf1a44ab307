"""What the sandbox holds, as WeKnora's API shows it: knowledge bases, knowledge, chunks, search results.

One tenant (:data:`~weknora_nb.sandbox.auth.TENANT_ID`) owns everything. Objects carry the JSON
fields of WeKnora's types (docs/weknora-contract.md): the KB object (C49), knowledge (C51), chunks
(C55; content HTML-escaped in listings at v0.6.x, C53), search results (C22, scores in
``metadata`` as 4-decimal strings, C39). Timestamps are fixed (the corpus does not change), one
second apart in index order, so the knowledge list's ``created_at DESC`` order (C50) is defined.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from weknora_nb.sandbox.auth import TENANT_ID
from weknora_nb.sandbox.chunking import MAX_CHARS
from weknora_nb.sandbox.emulation import WeKnoraRelease
from weknora_nb.sandbox.engine import RetrievalEngine
from weknora_nb.sandbox.pipeline import Hit

_EPOCH = datetime(2025, 1, 6, 9, 0, 0, tzinfo=UTC)
_HTML_ESCAPES = (("&", "&amp;"), ("'", "&#39;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;"))


def go_time(offset_s: float = 0.0, at: datetime | None = None) -> str:
    """A timestamp as Go's ``time.Time`` marshals it (RFC 3339, UTC ``Z``): ``at`` or the corpus epoch
    plus ``offset_s`` seconds."""
    t = (at or _EPOCH) + timedelta(seconds=offset_s)
    text = t.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return text.replace(".000000", "")


def go_html_escape(text: str) -> str:
    """Go's ``html.EscapeString``: ``&`` ``'`` ``<`` ``>`` ``"`` as ``&amp;`` ``&#39;`` ``&lt;`` ``&gt;`` ``&#34;``."""
    for char, entity in _HTML_ESCAPES:
        text = text.replace(char, entity)
    return text


@dataclass
class KnowledgeBase:
    """One knowledge base: its id, name, type (``document`` or ``faq``, C49), knowledge ids in index order and
    its embedding model ("": the version's)."""

    id: str
    name: str
    type: str = "document"
    knowledge_ids: list[str] = field(default_factory=list)
    embedding_model: str = ""


class Catalog:
    """The knowledge bases, knowledge and chunks of one engine, and their JSON (see the module docstring).

    ``kbs``: KB id -> :class:`KnowledgeBase` (the document one, and the FAQ one when the version
    serves it); ``kb_of``: knowledge id -> KB id; ``chunks_of``: knowledge id -> positions of its
    chunks in the index (index order = ``chunk_index`` order).
    """

    def __init__(self, engine: RetrievalEngine, *, kb_id: str, faq_kb_id: str, release: WeKnoraRelease):
        self.engine = engine
        self.index = engine.index
        self.release = release
        self.kbs: dict[str, KnowledgeBase] = {kb_id: KnowledgeBase(kb_id, "sandbox demo knowledge base")}
        if engine.serves_faq:
            self.kbs[faq_kb_id] = KnowledgeBase(faq_kb_id, "sandbox FAQ knowledge base", "faq")
        by_type = {kb.type: kb for kb in self.kbs.values()}
        self.kb_of: dict[str, str] = {}
        self.chunks_of: dict[str, list[int]] = {}
        for i, c in enumerate(self.index.chunks):
            kb = by_type.get("faq" if c.chunk_type == "faq" else "document")
            if kb is None:
                continue
            if c.knowledge_id not in self.kb_of:
                self.kb_of[c.knowledge_id] = kb.id
                kb.knowledge_ids.append(c.knowledge_id)
            chunks = self.chunks_of.setdefault(c.knowledge_id, [])
            if i not in engine.deleted:  # a soft-deleted chunk is neither listed nor found by id (C89)
                chunks.append(i)
        self._order = {kid: n for n, kid in enumerate(self.kb_of)}

    # -- lookups -------------------------------------------------------------------------
    def chunk_type(self, i: int) -> str:
        """The chunk type of chunk ``i`` (C54): ``text`` for document chunks, ``faq`` for FAQ entries,
        ``parent_text`` for the parents of a parent-child document (C110)."""
        return self.index.chunks[i].chunk_type

    def kb_of_chunk(self, i: int) -> str | None:
        """The id of the knowledge base chunk ``i`` belongs to (None: a KB this version does not serve, or a
        soft-deleted chunk)."""
        if i in self.engine.deleted:
            return None
        return self.kb_of.get(self.index.chunks[i].knowledge_id)

    def kb_types(self, kb_ids: list[str]) -> tuple[str, ...]:
        """The engine's names (``document``, ``faq``) of the known KBs among ``kb_ids`` that hold knowledge, each
        once (an empty knowledge base adds nothing to search)."""
        return tuple(dict.fromkeys(self.kbs[k].type for k in kb_ids if k in self.kbs and self.kbs[k].knowledge_ids))

    def add_empty_kb(self, kb_id: str, embedding_model: str) -> None:
        """Serve an empty document knowledge base indexed with ``embedding_model`` (C122: what a multi-KB search
        mixing embedding models needs)."""
        self.kbs[kb_id] = KnowledgeBase(kb_id, f"empty knowledge base ({embedding_model})",
                                        embedding_model=embedding_model)

    def embedding_model(self, kb_id: str) -> str:
        """The embedding model a knowledge base was indexed with (its KB JSON's ``embedding_model_id``)."""
        return self.kbs[kb_id].embedding_model or self.engine.version.embedding_model

    def listing(self, kid: str, types: list[str], rng: random.Random | None = None) -> list[int]:
        """The chunks of knowledge ``kid`` of the ``types`` as a chunk listing orders them: ``ORDER BY chunk_index``
        only (C124; repository/chunk.go:248-262 @ v0.7.2), ties in index order as SQLite's rowid gives them, or,
        with ``rng``, in an order drawn from it (Postgres leaves the order of ties unspecified)."""
        idxs = [i for i in self.chunks_of[kid] if self.chunk_type(i) in types]
        tie = (lambda i: rng.random()) if rng is not None else (lambda i: 0.0)
        return sorted(idxs, key=lambda i: (self.index.chunks[i].chunk_index, tie(i)))

    # -- JSON ----------------------------------------------------------------------------
    def kb_json(self, kb_id: str) -> dict[str, Any]:
        """The KB object of ``GET /knowledge-bases[/{id}]`` (C49): type, chunking, embedding model,
        indexing strategy, counts and capabilities."""
        kb, v = self.kbs[kb_id], self.engine.version
        faq = kb.type == "faq"
        chunks = sum(1 for k in kb.knowledge_ids for i in self.chunks_of[k] if self.chunk_type(i) != "parent_text")
        chunking: dict[str, Any] = {"chunk_size": MAX_CHARS, "chunk_overlap": 0, "separators": ["\n\n", "\n", "。"],
                                    "strategy": "heading"}
        if v.parent_child is not None and not faq:  # omitempty when off (types/knowledgebase.go:184-194 @ v0.7.2)
            chunking.update(enable_parent_child=True, parent_chunk_size=v.chunking_parent_chunk_size,
                            child_chunk_size=v.chunking_child_chunk_size)
        return {
            "id": kb.id, "name": kb.name, "type": kb.type, "is_temporary": False, "description": "",
            "tenant_id": TENANT_ID, "creator_id": "", "embedding_model_id": self.embedding_model(kb_id),
            "summary_model_id": "", "chunking_config": self.index.chunking or chunking,
            "indexing_strategy": {"vector_enabled": v.vector_enabled, "keyword_enabled": v.keyword_enabled and not faq,
                                  "wiki_enabled": False, "graph_enabled": False},
            "faq_config": {"index_mode": v.faq_index_mode, "question_index_mode": v.faq_question_index_mode}
            if faq else None,
            "knowledge_count": len(kb.knowledge_ids), "chunk_count": chunks, "is_processing": False,
            "processing_count": 0, "share_count": 0, "is_pinned": False, "pinned_at": None,
            "capabilities": {"vector": v.vector_enabled, "keyword": v.keyword_enabled and not faq, "wiki": False,
                             "graph": False, "faq": faq},
            "created_at": go_time(), "updated_at": go_time(), "deleted_at": None,
        }

    def knowledge_json(self, kid: str) -> dict[str, Any]:
        """The knowledge object (C51; no chunk count): one per document of the corpus."""
        first = self.index.chunks[self.chunks_of[kid][0]]
        faq = first.chunk_type == "faq"  # an FAQ group: type and source "faq" (knowledge_faq.go:1672-1676 @ v0.7.2)
        size = sum(len(self.index.chunks[i].content.encode("utf-8")) for i in self.chunks_of[kid]
                   if self.chunk_type(i) != "parent_text")
        at = go_time(self._order[kid])
        return {
            "id": kid, "tenant_id": TENANT_ID, "knowledge_base_id": self.kb_of[kid], "tags": [],
            "type": "faq" if faq else "file", "title": first.knowledge_title, "description": "",
            "source": "faq" if faq else "", "channel": "web", "parse_status": "completed", "summary_status": "none",
            "enable_status": "enabled", "embedding_model_id": self.engine.version.embedding_model,
            "file_name": "" if faq else f"{kid}.md", "file_type": "" if faq else "md", "file_size": 0 if faq else size,
            "metadata": None, "created_at": at, "updated_at": at, "processed_at": at, "error_message": "",
            "deleted_at": None,
        }

    def knowledge_list(self, kb_id: str) -> list[str]:
        """The knowledge ids of a KB in the list's order, ``created_at DESC`` (C50)."""
        return list(reversed(self.kbs[kb_id].knowledge_ids))

    def chunk_json(self, i: int, *, listing: bool = True) -> dict[str, Any]:
        """Chunk ``i`` as ``GET /chunks/...`` returns it (C55; neighbours' ids, "" at an end); its
        content HTML-escaped on releases that do so (C53)."""
        c = self.index.chunks[i]
        prev_i, next_i = self.index.neighbour(i, -1), self.index.neighbour(i, 1)
        content = go_html_escape(c.content) if listing and self.release.escape_chunk_listing else c.content
        row: dict[str, Any] = {
            "id": c.id, "seq_id": i + 1, "tenant_id": TENANT_ID, "knowledge_id": c.knowledge_id,
            "knowledge_base_id": self.kb_of[c.knowledge_id], "tag_id": "", "content": content}
        if self.release.chunk_revision_fields:  # C55, C123
            row.update(content_revision=0, index_status=self.engine.chunk_index_status(i), last_editor_id="")
        row.update({
            "chunk_index": c.chunk_index, "is_enabled": True, "flags": 1, "status": 2, "start_at": c.start_at,
            "end_at": c.end_at, "pre_chunk_id": self.index.chunks[prev_i].id if prev_i is not None else "",
            "next_chunk_id": self.index.chunks[next_i].id if next_i is not None else "",
            "chunk_type": self.chunk_type(i), "parent_chunk_id": c.parent_chunk_id, "relation_chunks": None,
            "indirect_relation_chunks": None, "metadata": None,
            "content_hash": hashlib.sha256(c.content.encode("utf-8")).hexdigest(), "image_info": "",
            "created_at": go_time(self._order[c.knowledge_id]), "updated_at": go_time(self._order[c.knowledge_id]),
            "deleted_at": None})
        return row

    def result_json(self, h: Hit, *, reranked_metadata: bool = True) -> dict[str, Any]:
        """One search result (C22): the pipeline's text of it (merged, widened, an FAQ answer) or the chunk's.
        ``metadata`` holds ``base_score`` and ``model_score`` as ``%.4f`` strings when the reranker scored
        the hit (C39: ``model_score`` only on releases that write it; none when it failed, C37)."""
        c = self.index.chunks[h.idx]
        meta: dict[str, str] = {}
        if reranked_metadata and h.model_score is not None:
            meta["base_score"] = f"{h.base_score if h.base_score is not None else h.score:.4f}"
            if h.faq_original_score is not None:   # C119, keys in Go's map order
                meta.update(faq_boosted="true", faq_original_score=f"{h.faq_original_score:.4f}")
            if self.release.model_score_metadata:
                meta["model_score"] = f"{h.model_score:.4f}"
        return {
            "id": c.id, "content": self.engine.merged_content(h), "knowledge_id": c.knowledge_id,
            "chunk_index": c.chunk_index, "knowledge_title": c.knowledge_title, "start_at": c.start_at,
            "end_at": c.end_at, "seq": c.chunk_index, "score": h.score, "match_type": h.match_type,
            "sub_chunk_id": list(h.sub_chunk_ids) or None, "metadata": meta, "chunk_type": c.chunk_type,
            "parent_chunk_id": c.parent_chunk_id, "image_info": "",
            "knowledge_filename": "" if c.faq else f"{c.knowledge_id}.md",
            "knowledge_source": "faq" if c.faq else "", "knowledge_channel": "web",
            "matched_content": self.index.texts("index")[h.idx],
            "knowledge_base_id": self.kb_of.get(c.knowledge_id, "")}

    def faq_entries(self, hits: list[Hit]) -> list[dict[str, Any]]:
        """FAQ search's ``[]FAQEntry`` (C46): one entry per FAQ hit, by score; ``match_type`` omitted when 0
        (``omitempty``); no tags, so every entry is untagged (``未分类``)."""
        out = []
        for h in hits:
            c = self.index.chunks[h.idx]
            if c.faq is None:
                continue
            at = go_time(self._order[c.knowledge_id])
            entry: dict[str, Any] = {
                "id": h.idx + 1, "chunk_id": c.id, "knowledge_id": c.knowledge_id,
                "knowledge_base_id": self.kb_of[c.knowledge_id], "tag_id": 0, "tag_name": "未分类",
                "is_enabled": True, "is_recommended": False, "standard_question": c.faq.standard_question,
                "similar_questions": list(c.faq.similar_questions),
                "negative_questions": list(c.faq.negative_questions), "answers": list(c.faq.answers),
                "answer_strategy": "all", "index_mode": "question_answer", "updated_at": at, "created_at": at,
                "score": h.score}
            if h.match_type:
                entry["match_type"] = h.match_type
            entry.update(chunk_type="faq", matched_question=c.faq.standard_question)
            out.append(entry)
        return out
