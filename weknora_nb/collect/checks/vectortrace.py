"""Trace a test set's queries into the vector store: exact and indexed nearest-neighbour search in WeKnora's
Postgres, to split a vector miss into an *index miss* and an *embedding miss* (docs/method.md: "trace degraded
samples to the vector store's own retrieval").

For each query, :func:`trace_queries` embeds its text with the knowledge base's model
(:mod:`weknora_nb.collect.checks.embeddings`) and runs

- the **exact** search: WeKnora's vector query (the same WHERE: dimension, knowledge bases, enabled rows) in a
  transaction with ``SET LOCAL enable_indexscan = off`` (and bitmap scans off): a sequential scan, the truth;
- WeKnora's search **as planned**: inner ``LIMIT`` = TopK x 2 within [100, 200], ``SET LOCAL
  hnsw.ef_search`` = that, ``hnsw.iterative_scan = strict_order`` (postgres/repository.go:350-433 @ v0.7.2),
  and whatever plan Postgres picks: on a small knowledge base the planner prefers the b-tree on
  ``knowledge_base_id`` and a sort (an exact search) to the HNSW index, and ``planner_uses_index`` says so;
- the same query **through the index** (``enable_seqscan`` and ``enable_sort`` off, so that only the HNSW
  index's ordered scan is left): the index's own behaviour, at WeKnora's ``ef_search`` and at each
  ``ef_search`` of a sweep (10 ... 400); what WeKnora gets once the knowledge base is large enough for the
  planner to use it.

Each search is planned with its own values (``plan_cache_mode = force_custom_plan``): a generic plan of the
statement, which Postgres may keep once it has run five times, cannot use the index's ``WHERE dimension = N``,
so that every search "through the index" was a sort of every row (recall 1.0) from about the second query on. A
query's searches are sent in one pipeline, each in a transaction of its own whose ``BEGIN`` and ``COMMIT`` are
statements of the pipeline: one wait for the server per query, not one per statement (psycopg's ``transaction()``
would sync the pipeline twice per search).

Per (query, relevant chunk, K), for K in (the TopK WeKnora asks its vector path for, 10): ``status`` (as
planned) and ``status_index`` (through the index): ``hit`` (the top-K rows hold a row of the chunk),
``index_miss`` (the exact top-K does, this search's does not: ``ef_search`` or ``m`` too low),
``embedding_miss`` (not even the exact top-K holds it: the chunk is not near the query; a relevant chunk
without an enabled vector of the query's dimension is one too, ``has_vector`` False). The index's own
recall@K against exact search, per query and over the test set (the mean over queries): the share of the exact
top-K rows the index's top-K returns, a row at the K-th exact distance counted as found (ties); ``recall_as_
planned`` the same for the planned search.
Rows, not chunks: a chunk with generated questions has several rows; WeKnora deduplicates by chunk afterwards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.collect.checks.embeddings import EmbeddingSettings, embed_texts
from weknora_nb.collect.checks.postgres import PgSession, connect_readonly
from weknora_nb.collect.checks.vector_search import (
    iterative_scan_supported,
    pgvector_version,
    plan_nodes,
    vector_indexes,
    vector_query_sql,
    weknora_search_settings,
    weknora_top_k,
    weknora_vector_limits,
)
from weknora_nb.core.errors import UsageError, writing
from weknora_nb.core.progress import progress_bar
from weknora_nb.core.run import VECTOR_TRACE, VECTOR_TRACE_QUERIES, VECTOR_TRACE_SUMMARY

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

EF_SWEEP = (10, 20, 40, 64, 100, 200, 400)
STATUSES = ("hit", "index_miss", "embedding_miss")
_EPS = 1e-6  # distances equal within this are ties
_TIE_ROOM = 50  # exact rows fetched beyond K, to see the ties at the K-th distance
#: an exact search: the planner takes no index for it
_INDEX_SCANS = ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan")
#: a search through the vector index: nothing but its ordered scan is left to the planner
_SEARCH_BY_INDEX = ("enable_seqscan", "enable_sort")


@dataclass(frozen=True)
class TraceQuery:
    """One query: its id, its text, and its relevant chunks (chunk id -> grade >= 1)."""

    query_id: str
    text: str
    relevant: dict[str, int] = field(default_factory=dict)


@dataclass
class VectorTrace:
    """A trace: ``chunks`` (one row per query, relevant chunk and K), ``queries`` (one row per query, ef_search
    and K: the index's recall against exact search), ``summary`` (JSON-able)."""

    chunks: pd.DataFrame
    queries: pd.DataFrame
    summary: dict[str, Any]

    def write(self, folder: str | Path) -> dict[str, Path]:
        """``vector_trace.parquet``, ``vector_trace_queries.parquet`` and ``vector_trace.json`` in ``folder``."""
        import json

        from weknora_nb.core.files import atomic_path

        folder = Path(folder)
        paths = {"chunks": folder / VECTOR_TRACE, "queries": folder / VECTOR_TRACE_QUERIES,
                 "summary": folder / VECTOR_TRACE_SUMMARY}
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
        for name in ("chunks", "queries"):
            with writing(paths[name]), atomic_path(paths[name]) as tmp:
                getattr(self, name).to_parquet(tmp, index=False)
        with writing(paths["summary"]), atomic_path(paths["summary"]) as tmp:
            tmp.write_text(json.dumps(self.summary, ensure_ascii=False, indent=2), encoding="utf-8")
        return paths


def _as_queries(queries: Any) -> list[TraceQuery]:
    """TraceQuery objects from a TestSet, TraceQuery objects, or JSONL-schema dicts (grade >= 1 kept)."""
    records = queries.records() if hasattr(queries, "records") else list(queries)
    out = []
    for r in records:
        if isinstance(r, TraceQuery):
            out.append(TraceQuery(r.query_id, r.text, {c: g for c, g in r.relevant.items() if g >= 1}))
        else:
            rel = {str(c): int(g) for c, g in (r.get("relevant") or {}).items() if int(g) >= 1}
            out.append(TraceQuery(str(r["query_id"]), str(r.get("query", r.get("text", ""))), rel))
    return out


def trace_queries(dsn: str, kb_ids: Sequence[str], queries: Any, embeddings: EmbeddingSettings, *,
                  match_count: int = 10, ks: Sequence[int] | None = None, ef_sweep: Iterable[int] = EF_SWEEP,
                  vector_threshold: float | None = None, statement_timeout_s: float = 60.0,
                  progress: bool | None = None,
                  embed: Callable[[EmbeddingSettings, Sequence[str]], list[list[float]]] = embed_texts) -> VectorTrace:
    """Trace ``queries`` (a TestSet, :class:`TraceQuery` objects or JSONL dicts) into the vectors of ``kb_ids``.

    ``ks``: the cutoffs (default: the TopK WeKnora's vector path asks for at ``match_count``, and 10).
    ``vector_threshold``: WeKnora's outer ``distance <= 1 - threshold`` on the indexed search (None: none).
    ``progress``: a tqdm bar (None: when there are more than 50 queries). Returns a :class:`VectorTrace`.
    """
    items = _as_queries(queries)
    kb_ids = [kb_ids] if isinstance(kb_ids, str) else [str(k) for k in kb_ids]
    if not items or not kb_ids:
        raise UsageError("a vector trace needs at least one query and one knowledge base")
    top_k = weknora_top_k(match_count, len(kb_ids))
    cutoffs = sorted({int(k) for k in (ks or (top_k, 10))}, reverse=True)
    inner, ef = weknora_vector_limits(top_k)
    sweep = sorted({int(e) for e in ef_sweep} | {ef})
    t0 = time.perf_counter()
    vectors = embed(embeddings, [q.text for q in items])
    t_embed = time.perf_counter() - t0
    s = connect_readonly(dsn, statement_timeout_s=statement_timeout_s, application_name="weknora-nb vector trace")
    try:
        _check_vectors(vectors, _stored_dimensions(s, kb_ids), embeddings.model)
        iterative = "strict_order" if iterative_scan_supported(pgvector_version(s).get("vector")) else None
        plan = _Plan(s, kb_ids, cutoffs, top_k, inner, ef, sweep,
                     2.0 if vector_threshold is None else 1.0 - vector_threshold, iterative, vector_indexes(s))
        chunk_rows, query_rows = plan.run(items, vectors, progress)
    finally:
        s.conn.close()
    summary = _summary(plan, items, chunk_rows, query_rows, embeddings, match_count)
    summary["seconds"] = {"embed": round(t_embed, 3), "search": round(time.perf_counter() - t0 - t_embed, 3)}
    import pandas as pd

    return VectorTrace(pd.DataFrame(chunk_rows, columns=list(_CHUNK_COLUMNS)),
                       pd.DataFrame(query_rows, columns=list(_QUERY_COLUMNS)), summary)


#: the largest magnitude WeKnora's ``halfvec`` column (IEEE half precision) holds
HALFVEC_MAX = 65504.0


def _stored_dimensions(s: PgSession, kb_ids: list[str]) -> list[int]:
    """The dimensions of the knowledge bases' stored embeddings."""
    rows = s.rows("SELECT DISTINCT dimension FROM embeddings WHERE knowledge_base_id = ANY(%s) AND dimension IS NOT"
                  " NULL", (kb_ids,))
    return sorted(int(r[0]) for r in rows)


def _check_vectors(vectors: list[list[float]], stored: list[int], model: str) -> None:
    """:class:`UsageError` when the embeddings model's vectors cannot be the knowledge base's: of a dimension its
    stored embeddings do not have, all zero (no direction: every cosine distance undefined), or beyond what
    WeKnora's ``halfvec`` holds. A wrong model would make every labelled chunk an "embedding miss"."""
    import numpy as np

    dims = sorted({len(v) for v in vectors})
    if stored and not set(dims) & set(stored):
        raise UsageError(f"--embeddings-model {model!r} answers vectors of dimension {', '.join(map(str, dims))}, "
                         f"but the knowledge bases' embeddings have dimension {', '.join(map(str, stored))}: it is not "
                         "the model they were indexed with")
    m = np.array([v for v in vectors if len(v) == dims[0]], dtype=np.float64)
    zero = int((np.abs(m).max(axis=1) == 0).sum()) if len(m) else 0
    if zero:
        raise UsageError(f"--embeddings-model {model!r} answers an all-zero vector for {zero} of {len(vectors)} "
                         "queries: no cosine distance can be computed; is it the knowledge base's model?")
    biggest = float(np.abs(m).max()) if m.size else 0.0
    if biggest > HALFVEC_MAX:
        raise UsageError(f"--embeddings-model {model!r} answers values up to {biggest:.3g}, beyond the "
                         f"+-{HALFVEC_MAX:g} WeKnora's halfvec embeddings hold: it is not the model they were "
                         "indexed with")


_CHUNK_COLUMNS = ("query_id", "chunk_id", "grade", "k", "status", "exact_rank", "planned_rank", "exact_distance",
                  "has_vector", "status_index", "index_rank")


_QUERY_COLUMNS = ("query_id", "ef_search", "weknora", "k", "recall", "exact_rows", "index_rows", "recall_as_planned")


@dataclass
class _Plan:
    """What every query of a trace runs: the session, knowledge bases, cutoffs and WeKnora's limits."""

    s: PgSession
    kb_ids: list[str]
    cutoffs: list[int]
    top_k: int
    inner: int
    ef: int
    sweep: list[int]
    max_distance: float
    iterative: str | None = "strict_order"
    indexes: list[dict[str, Any]] = field(default_factory=list)
    dims: set[int] = field(default_factory=set)
    without_rows: list[str] = field(default_factory=list)
    planner: dict[int, bool] = field(default_factory=dict)  # dimension -> the planned search uses a vector index

    def run(self, items: list[TraceQuery], vectors: list[list[float]],
            progress: bool | None) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Every query's chunk rows and recall rows."""
        chunk_rows: list[tuple[Any, ...]] = []
        query_rows: list[tuple[Any, ...]] = []
        relevant = sorted({c for q in items for c in q.relevant})
        own = self._vectors_of(relevant)
        bar = progress_bar(total=len(items), desc="tracing queries", unit="query",
                           disable=not (progress if progress is not None else len(items) > 50))
        for q, v in zip(items, vectors, strict=True):
            c, r = self.one(q, v, own)
            chunk_rows += c
            query_rows += r
            bar.update(1)
        bar.close()
        return chunk_rows, query_rows

    def _vectors_of(self, chunk_ids: list[str]) -> dict[str, Any]:
        """chunk id -> its enabled rows' vectors (float32 matrix) in the knowledge bases, for the distances."""
        import numpy as np

        enabled = "(is_enabled IS NULL OR is_enabled)" if self.s.has("embeddings", "is_enabled") else "TRUE"
        rows = self.s.rows(f"SELECT chunk_id, embedding::text FROM embeddings WHERE chunk_id = ANY(%s) AND"
                           f" knowledge_base_id = ANY(%s) AND embedding IS NOT NULL AND {enabled}",
                           (chunk_ids, self.kb_ids))
        by: dict[str, list[Any]] = {}
        for cid, text in rows:
            by.setdefault(cid, []).append(np.array(text.strip("[]").split(","), dtype=np.float32))
        return by

    def send(self, vector: str, dim: int, *, exact: bool, ef: int | None = None, force: bool = False) -> Any:
        """Send one search, in a transaction of its own, and return its cursor, whose rows are (id, source id, chunk id,
        knowledge base, distance), best first: exact (no index, ``max(K)`` rows and room for ties) or as WeKnora asks
        it (its inner LIMIT, ``ef``, strict-order iterative scan, threshold), as planned or (``force``) through the
        vector index: sequential scans and sorts off, only its ordered scan is left. Each is planned with its values
        (:data:`~weknora_nb.collect.checks.vector_search.CUSTOM_PLANS`). In the connection's pipeline mode nothing
        waits for the server here, for its transaction neither (see :func:`_pipeline`): the rows are there once the
        pipeline is synced."""
        k = self.cutoffs[0]
        params = {"vector": vector, "dimension": dim, "kb_ids": self.kb_ids,
                  "inner_limit": k + _TIE_ROOM if exact else max(self.inner, k),
                  "max_distance": 2.0 if exact else self.max_distance, "top_k": k + _TIE_ROOM if exact else k}
        sql = vector_query_sql(dim, enabled_column=self.s.has("embeddings", "is_enabled"))
        knobs = dict.fromkeys(_INDEX_SCANS if exact else _SEARCH_BY_INDEX if force else (), "off")
        with weknora_search_settings(self.s, None if exact else ef, None if exact else self.iterative, knobs):
            return self.s.conn.execute(sql, params)

    def uses_index(self, vector: str, dim: int) -> bool:
        """Whether the plan of WeKnora's query (as planned, at its ``ef_search``) scans a vector index."""
        params = {"vector": vector, "dimension": dim, "kb_ids": self.kb_ids, "inner_limit": max(self.inner,
                  self.cutoffs[0]), "max_distance": self.max_distance, "top_k": self.cutoffs[0]}
        sql = vector_query_sql(dim, enabled_column=self.s.has("embeddings", "is_enabled"))
        with weknora_search_settings(self.s, self.ef, self.iterative):
            plan = self.s.rows("EXPLAIN (FORMAT JSON) " + sql, params)[0][0][0]
        names = {ix["name"] for ix in self.indexes if ix.get("dimension") == dim}
        return any(n.get("index") in names for n in plan_nodes(plan["Plan"]))

    def one(self, q: TraceQuery, vector: list[float],
            own: dict[str, list[Any]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """One query: its (query, chunk, K) rows and its (query, ef_search, K) recall rows."""
        import numpy as np

        dim = len(vector)
        self.dims.add(dim)
        text = "[" + ",".join(repr(float(x)) for x in vector) + "]"
        if dim not in self.planner:
            self.planner[dim] = self.uses_index(text, dim)
        with _pipeline(self.s.conn):   # the query's searches sent at once: one wait for the server, not one each
            sent = [self.send(text, dim, exact=True), self.send(text, dim, exact=False, ef=self.ef)]
            sent += [self.send(text, dim, exact=False, ef=ef, force=True) for ef in self.sweep]
        exact, planned, *swept = [[(r[0], r[2], float(r[4])) for r in cursor.fetchall()] for cursor in sent]
        runs = dict(zip(self.sweep, swept, strict=True))
        if not exact:
            self.without_rows.append(q.query_id)
        recall_rows = [(q.query_id, ef, ef == self.ef, k, _recall(exact, rows, k), len(exact), len(rows),
                        _recall(exact, planned, k) if ef == self.ef else None)
                       for ef, rows in runs.items() for k in self.cutoffs]
        indexed = runs[self.ef]
        qv = np.asarray(vector, dtype=np.float16).astype(np.float64)  # the query as halfvec holds it
        chunk_rows = []
        for cid, grade in q.relevant.items():
            exact_rank, planned_rank, index_rank = _rank(exact, cid), _rank(planned, cid), _rank(indexed, cid)
            mine = [v for v in own.get(cid, []) if len(v) == dim]
            distance = _distance(qv, mine)
            for k in self.cutoffs:
                found_exact = exact_rank is not None and (exact_rank <= k or _tied(exact, exact_rank, k))
                chunk_rows.append((q.query_id, cid, grade, k, _status(planned_rank, k, found_exact), exact_rank,
                                   planned_rank, distance, bool(mine), _status(index_rank, k, found_exact),
                                   index_rank))
        return chunk_rows, recall_rows


@contextmanager
def _pipeline(conn: Any) -> Iterator[None]:
    """``conn``'s pipeline mode where its libpq has one (14 or later: psycopg's binary package bundles one), else
    nothing (the statements then wait for the server one by one). A search that fails in the pipeline leaves its
    transaction open (:func:`~weknora_nb.collect.checks.vector_search.weknora_search_settings`): it is rolled back
    here before the error goes on."""
    import psycopg

    if not psycopg.Pipeline.is_supported():
        yield
        return
    try:
        with conn.pipeline():
            yield
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error as exc:   # a lost connection: the error that broke the search goes on
                log.debug("rollback after a failed search: %s", exc)
        raise


def _status(rank: int | None, k: int, found_exact: bool) -> str:
    """``hit`` (ranked within ``k``), else ``index_miss`` when exact search finds it, else ``embedding_miss``."""
    return "hit" if rank is not None and rank <= k else "index_miss" if found_exact else "embedding_miss"


def _status_counts(plan: _Plan, chunk_rows: list[tuple[Any, ...]], column: int) -> dict[str, dict[str, int]]:
    """Per K, how many (query, relevant chunk) pairs have each status in ``column`` of the chunk rows."""
    counts = {str(k): dict.fromkeys(STATUSES, 0) for k in plan.cutoffs}
    for row in chunk_rows:
        counts[str(row[3])][row[column]] += 1
    return counts


def _miss_share(counts: dict[str, dict[str, int]]) -> dict[str, float | None]:
    """Per K: index misses / (index misses + embedding misses); None without a miss."""
    return {k: (c["index_miss"] / (c["index_miss"] + c["embedding_miss"])
                if c["index_miss"] + c["embedding_miss"] else None) for k, c in counts.items()}


def _rank(rows: list[tuple[Any, ...]], chunk_id: str) -> int | None:
    """1-based rank of the chunk's first row in ``rows``, None when absent."""
    return next((i for i, r in enumerate(rows, start=1) if r[1] == chunk_id), None)


def _tied(exact: list[tuple[Any, ...]], rank: int, k: int) -> bool:
    """Whether the row at ``rank`` (beyond ``k``) is at the K-th exact distance (a tie: as good as the K-th)."""
    return len(exact) >= k and exact[rank - 1][2] <= exact[k - 1][2] + _EPS


def _recall(exact: list[tuple[Any, ...]], indexed: list[tuple[Any, ...]], k: int) -> float | None:
    """The index's recall@k against exact search: the share of the exact top-k the indexed top-k holds, a row at
    the k-th exact distance counted as found (None when exact search finds no row)."""
    n = min(k, len(exact))
    if n == 0:
        return None
    kth = exact[n - 1][2]
    return min(n, sum(1 for r in indexed[:k] if r[2] <= kth + _EPS)) / n


def _distance(query: Any, vectors: list[Any]) -> float | None:
    """The cosine distance of the chunk's nearest row to the query (None: no row of the query's dimension)."""
    import numpy as np

    if not vectors:
        return None
    m = np.vstack(vectors).astype(np.float64)
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(query)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = 1.0 - (m @ query) / norms
    d = d[np.isfinite(d)]
    return float(d.min()) if d.size else None


def _summary(plan: _Plan, items: list[TraceQuery], chunk_rows: list[tuple[Any, ...]],
             query_rows: list[tuple[Any, ...]], embeddings: EmbeddingSettings, match_count: int) -> dict[str, Any]:
    """Counts per status and K, the share of vector misses that are index misses, the index's mean recall@K at
    WeKnora's ef_search and at each ef_search of the sweep."""
    counts, counts_index = _status_counts(plan, chunk_rows, 4), _status_counts(plan, chunk_rows, 9)
    by_ef: dict[int, dict[str, list[float]]] = {}
    planned: dict[str, list[float]] = {}
    for _qid, ef, _w, k, recall, _ne, _ni, as_planned in query_rows:
        if recall is not None:
            by_ef.setdefault(ef, {}).setdefault(str(k), []).append(recall)
        if as_planned is not None:
            planned.setdefault(str(k), []).append(as_planned)
    mean = {ef: {k: sum(v) / len(v) for k, v in ks.items()} for ef, ks in by_ef.items()}
    return {
        "queries": len(items), "queries_with_relevant": sum(1 for q in items if q.relevant),
        "relevant_pairs": sum(len(q.relevant) for q in items), "knowledge_base_ids": plan.kb_ids,
        "dimensions": sorted(plan.dims), "model": embeddings.model, "k": plan.cutoffs,
        "weknora": {"match_count": match_count, "top_k": plan.top_k, "inner_limit": plan.inner,
                    "ef_search": plan.ef, "iterative_scan": plan.iterative,
                    "vector_threshold": None if plan.max_distance >= 2 else round(1 - plan.max_distance, 6)},
        "planner_uses_index": {str(d): u for d, u in sorted(plan.planner.items())},
        "status_counts": counts, "index_miss_share": _miss_share(counts),
        "status_counts_index": counts_index, "index_miss_share_index": _miss_share(counts_index),
        "recall": mean.get(plan.ef, {}), "recall_as_planned": {k: sum(v) / len(v) for k, v in planned.items()},
        "sweep": [{"ef_search": ef, "weknora": ef == plan.ef, "recall": mean.get(ef, {})} for ef in plan.sweep],
        "indexes": [{k: ix[k] for k in ("name", "method", "dimension", "parameters", "valid")} for ix in plan.indexes],
        "warnings": [f"{len(plan.without_rows)} queries found no enabled row of their dimension "
                     f"{sorted(plan.dims)} in the knowledge bases: is {embeddings.model!r} the knowledge base's "
                     "embedding model?"] if plan.without_rows else [],
        "notes": ["recall is the index's against exact search (rows, not chunks; ties at the K-th distance found), "
                  "the index forced; recall_as_planned: WeKnora's query with the plan Postgres chose",
                  "index_miss_share: index misses / (index + embedding misses) of relevant chunks, per K, as "
                  "planned (what WeKnora gets); index_miss_share_index: through the index",
                  "a relevant chunk without a vector of the query's dimension (has_vector False) is an embedding miss"],
    }
