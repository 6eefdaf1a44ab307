"""The sandbox's vector path in Postgres + pgvector, in WeKnora's tables (docs/weknora-contract.md C70-C72, C75,
C89-C92).

One database per index build (:func:`database_name`: the embedding model, the HNSW ``m`` /
``ef_construction``, the session's ``ef_search``, the FAQ knowledge base's index entries, the
knowledge-base ids, the seeded integrity faults and the vectors themselves), filled from a
:class:`~weknora_nb.sandbox.index.SandboxIndex` and kept in the cluster for the next process.

What the database holds, as WeKnora writes it (C70, C71, C89, C90):

- ``knowledge_bases``, ``knowledges`` (``parse_status`` completed), ``chunks`` (soft-deleted ones keep
  their row with ``deleted_at`` set) and one ``models`` row for the embedding model with its dimension in
  ``parameters.embedding_parameters.dimension``;
- ``embeddings``: one row per index entry, ``source_id`` = the chunk id (an FAQ entry's further questions
  in ``separate`` mode: ``<chunk id>-<n>``), ``source_type`` 0, ``content`` = the index text,
  ``dimension`` = the vector's length, ``embedding`` a ``halfvec``;
- an HNSW index ``embeddings_embedding_idx_<dim>`` on ``(embedding::halfvec(dim)) halfvec_cosine_ops`` with
  the version's ``m`` / ``ef_construction``, ``WHERE dimension = dim``, as WeKnora's migrations create for
  3584, 798 and 1024 (C72; a team whose model has another dimension adds its own, else every search is a
  sequential scan); the version's ``ef_search`` is the database's default ``hnsw.ef_search``.

Seeded faults (a version's ``integrity`` section): chunks whose rows are missing, a chunk whose row
carries another chunk's vector, chunks soft-deleted with their rows left behind (what WeKnora's chunk
DELETE does, C89).

:meth:`VectorStore.search` is WeKnora's vector query (C75): in one transaction ``SET LOCAL
hnsw.ef_search = max(expanded, 40)`` and ``hnsw.iterative_scan = strict_order``; the inner query orders
by ``embedding::halfvec(N) <=> q`` over ``dimension = N``, the knowledge bases (and knowledge ids when
given) and enabled rows, ``LIMIT expanded = clamp(2 TopK, 100, 200)`` (at least TopK); the outer keeps
``distance <= 1 - threshold``, ``LIMIT TopK``, score ``1 - distance``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from weknora_nb.sandbox.auth import TENANT_ID
from weknora_nb.sandbox.pgcluster import cluster

if TYPE_CHECKING:
    from weknora_nb.sandbox.chunking import Chunk
    from weknora_nb.sandbox.versions import VersionConfig

log = logging.getLogger(__name__)

SCHEMA_SQL = Path(__file__).with_name("weknora_schema.sql")
#: C75: the candidates of the inner query, and pgvector's default ef_search (WeKnora's floor)
EXPANDED_MIN, EXPANDED_MAX, EF_SEARCH_FLOOR = 100, 200, 40
_BUILD_FORMAT = 2  # bump when what a database holds changes


def expanded_top_k(top_k: int) -> int:
    """C75: ``clamp(2 TopK, 100, 200)``, raised to TopK when TopK > 200."""
    return max(min(max(2 * top_k, EXPANDED_MIN), EXPANDED_MAX), top_k)


def ef_search_for(top_k: int) -> int:
    """C75: the ``hnsw.ef_search`` WeKnora sets for a query of ``top_k``: ``max(expanded, 40)``."""
    return max(expanded_top_k(top_k), EF_SEARCH_FLOOR)


def halfvec_text(vector: np.ndarray) -> str:
    """A vector as pgvector's text form ``[x,y,...]``: each float32 in the shortest text that reads back to it
    (orjson's, much faster than Python's float repr), which halfvec rounds on input."""
    return orjson.dumps(np.ascontiguousarray(vector, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY).decode()


class IndexRows(Protocol):
    """What a store is filled from (:class:`weknora_nb.sandbox.index.SandboxIndex`): the chunks, the rows of each
    vector index with their texts and embeddings."""

    chunks: list[Chunk]
    by_id: dict[str, int]

    def positions(self, kb_type: str) -> list[int]: ...

    def rows(self, kind: str) -> list[int]: ...

    def row_vectors(self, model: str, kind: str) -> np.ndarray: ...

    def texts(self, role: str) -> list[str]: ...


@dataclass(frozen=True)
class _Row:
    source_id: str
    chunk: int  # position in the index
    vector: np.ndarray
    content: str


def database_name(version: VersionConfig, kb_ids: dict[str, str], vectors_digest: str) -> str:
    """The database of one index build: ``wk_`` + 16 hex digits of everything that makes it."""
    key = json.dumps({"format": _BUILD_FORMAT, "model": version.embedding_model, "m": version.hnsw_m,
                      "ef_construction": version.hnsw_ef_construction, "ef_search": version.hnsw_ef_search,
                      "faq": version.faq_role if version.faq_enabled else None, "kbs": kb_ids,
                      "faults": version.integrity_faults(), "vectors": vectors_digest,
                      # parents are rows of chunks only (C110): a parent-child build is its own database
                      **({"parent_child": [version.chunking_parent_chunk_size, version.chunking_child_chunk_size]}
                         if version.parent_child is not None else {})}, sort_keys=True)
    return "wk_" + hashlib.sha256(key.encode()).hexdigest()[:16]


class VectorStore:
    """One version's vector index in Postgres: built on first use, searched per query (a connection per thread)."""

    def __init__(self, index: IndexRows, version: VersionConfig, kb_ids: dict[str, str]):
        self.index = index
        self.version = version
        self.kb_ids = dict(kb_ids)  # engine kind (document / faq) -> knowledge base id
        self._local = threading.local()
        self._lock = threading.Lock()
        self._dbname: str | None = None

    # -- the database --------------------------------------------------------------------
    @property
    def dbname(self) -> str:
        """The database's name, building it first when needed."""
        with self._lock:
            if self._dbname is None:
                rows = self._rows()
                digest = hashlib.sha256(b"".join(r.source_id.encode() + r.vector.astype("<f4").tobytes()
                                                 for r in rows)).hexdigest()
                name = database_name(self.version, self.kb_ids, digest)
                cluster().ensure_database(name, lambda db: self._build(db, rows))
                self._dbname = name
            return self._dbname

    def build(self) -> str:
        """Build the database now (rather than on the first search); its name."""
        return self.dbname

    def dsn(self, *, user: str = "postgres", password: str | None = None) -> str:
        """A connection string to this version's database (the superuser's, or ``user``'s with ``password``)."""
        return cluster().dsn(self.dbname, user=user, password=password)

    @property
    def dimension(self) -> int:
        return int(self.index.row_vectors(self.version.embedding_model, "document").shape[1])

    def _kinds(self) -> list[str]:
        v = self.version
        return ["document"] + ([v.faq_role] if v.faq_enabled and self.index.positions("faq") else [])

    def _rows(self) -> list[_Row]:
        """The embeddings rows WeKnora would have written (C90), seeded faults applied (C89)."""
        faults, model = self.version.integrity_faults(), self.version.embedding_model
        missing = set(faults["without_vectors"])
        copies = {b: a for b, a in faults["duplicated_vectors"]}
        rows: list[_Row] = []
        for kind in self._kinds():
            owners, vectors = self.index.rows(kind), self.index.row_vectors(model, kind)
            texts = self.index.texts("index" if kind == "document" else kind)
            seen: dict[int, int] = {}
            for r, owner in enumerate(owners):
                cid = self.index.chunks[owner].id
                if cid in missing:
                    continue
                n = seen[owner] = seen.get(owner, -1) + 1
                text = texts[owner] if kind == "document" else texts[r]
                vec = vectors[r]
                if cid in copies:
                    vec = vectors[owners.index(self.index.by_id[copies[cid]])]
                rows.append(_Row(cid if n == 0 else f"{cid}-{n}", owner, vec, text))
        return rows

    def _build(self, db: Any, rows: list[_Row]) -> None:
        """Schema, knowledge bases, knowledge, chunks, the model, the embeddings rows and the HNSW index."""
        v, dim = self.version, self.dimension
        db.execute(SCHEMA_SQL.read_text(encoding="utf-8"))
        model_id = v.embedding_model  # the KB JSON's embedding_model_id (C49, C94)
        db.execute("INSERT INTO models (id, tenant_id, name, type, source, parameters) VALUES (%s, %s, %s, "
                   "'Embedding', 'local', %s)",
                   (model_id, TENANT_ID, v.embedding_model,
                    json.dumps({"embedding_parameters": {"dimension": dim, "truncate_prompt_tokens": 0}})))
        deleted = set(v.integrity_faults()["deleted_chunks"])
        with db.cursor() as cur:
            self._write_catalog(cur, model_id, deleted)
            with cur.copy("COPY embeddings (source_id, source_type, chunk_id, knowledge_id, knowledge_base_id, "
                          "content, dimension, embedding, is_enabled) FROM STDIN") as copy:
                for r in rows:
                    c = self.index.chunks[r.chunk]
                    copy.write_row((r.source_id, 0, c.id, c.knowledge_id, self._kb_of(r.chunk), r.content, dim,
                                    halfvec_text(r.vector), True))
        db.execute(f"CREATE INDEX embeddings_embedding_idx_{dim} ON embeddings USING hnsw "
                   f"((embedding::halfvec({dim})) halfvec_cosine_ops) "
                   f"WITH (m = {int(v.hnsw_m)}, ef_construction = {int(v.hnsw_ef_construction)}) "
                   f"WHERE (dimension = {dim})")
        db.execute("ANALYZE")
        db.execute(f"ALTER DATABASE {db.info.dbname} SET hnsw.ef_search = {int(v.hnsw_ef_search)}")
        log.info("built %s: %d embeddings rows, hnsw m=%d ef_construction=%d", db.info.dbname, len(rows),
                 v.hnsw_m, v.hnsw_ef_construction)

    def _kb_of(self, position: int) -> str:
        return self.kb_ids["faq" if self.index.chunks[position].chunk_type == "faq" else "document"]

    def _write_catalog(self, cur: Any, model_id: str, deleted: set[str]) -> None:
        """knowledge_bases, knowledges and chunks rows (a seeded deleted chunk: ``deleted_at`` set)."""
        served = {self._kb_of(p) for kind in self._kinds() for p in self.index.rows(kind)}
        for kind, kb in self.kb_ids.items():
            if kb in served:
                cur.execute("INSERT INTO knowledge_bases (id, name, tenant_id, type, embedding_model_id) "
                            "VALUES (%s, %s, %s, %s, %s)", (kb, f"sandbox {kind}", TENANT_ID, kind, model_id))
        knowledge: dict[str, tuple[str, str]] = {}
        with cur.copy("COPY chunks (id, tenant_id, knowledge_base_id, knowledge_id, content, chunk_index, "
                      "is_enabled, start_at, end_at, chunk_type, parent_chunk_id, deleted_at) FROM STDIN") as copy:
            for p, c in enumerate(self.index.chunks):
                kb = self._kb_of(p)
                if kb not in served:
                    continue
                knowledge.setdefault(c.knowledge_id, (kb, c.knowledge_title))
                copy.write_row((c.id, TENANT_ID, kb, c.knowledge_id, c.content, c.chunk_index, True, c.start_at,
                                c.end_at, c.chunk_type, c.parent_chunk_id or None,
                                "2025-01-07T09:00:00Z" if c.id in deleted else None))
        for kid, (kb, title) in knowledge.items():
            cur.execute("INSERT INTO knowledges (id, tenant_id, knowledge_base_id, type, title, source, "
                        "parse_status, embedding_model_id) VALUES (%s, %s, %s, 'file', %s, 'upload', 'completed', "
                        "%s)", (kid, TENANT_ID, kb, title, model_id))

    # -- searching -----------------------------------------------------------------------
    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            import psycopg

            conn = self._local.conn = psycopg.connect(cluster().dsn(self.dbname))
        return conn

    def search(self, vector: np.ndarray, kinds: Sequence[str], top_k: int, threshold: float,
               knowledge_ids: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """WeKnora's vector query (C75) over the knowledge bases of ``kinds``: (chunk id, cosine) best first,
        one per row (a chunk may own several rows; deleted chunks' rows included, as in WeKnora)."""
        if top_k <= 0:
            return []
        dim, expanded = len(vector), expanded_top_k(top_k)
        kbs = [self.kb_ids[k] for k in kinds if k in self.kb_ids]
        where = "dimension = %(dim)s AND knowledge_base_id = ANY(%(kbs)s)"
        if knowledge_ids:
            where += " AND knowledge_id = ANY(%(kids)s)"
        where += " AND (is_enabled IS NULL OR is_enabled = true)"
        sql = (f"SELECT chunk_id, 1 - distance FROM (SELECT chunk_id, embedding::halfvec({dim}) <=> "
               f"%(q)s::halfvec({dim}) AS distance FROM embeddings WHERE {where} "
               f"ORDER BY embedding::halfvec({dim}) <=> %(q)s::halfvec({dim}) LIMIT %(expanded)s) AS t "
               f"WHERE distance <= 1 - %(threshold)s ORDER BY distance ASC LIMIT %(top_k)s")
        params = {"dim": dim, "kbs": kbs, "kids": list(knowledge_ids or []), "q": halfvec_text(vector),
                  "expanded": expanded, "threshold": float(threshold), "top_k": top_k}
        conn = self._connection()
        with conn.transaction():
            conn.execute(f"SET LOCAL hnsw.ef_search = {ef_search_for(top_k)}")
            conn.execute("SET LOCAL hnsw.iterative_scan = strict_order")
            rows = conn.execute(sql, params).fetchall()
        return [(str(cid), float(score)) for cid, score in rows]

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
