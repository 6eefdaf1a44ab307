"""Read-only integrity checks of a WeKnora knowledge base's vectors in Postgres (pgvector), through a DSN.

:func:`check_database` connects with a read-only session (``default_transaction_read_only``, a
``statement_timeout`` per query, a bounded ``work_mem``) and never writes. It reads WeKnora's own tables
(``chunks``, ``embeddings``, ``knowledges``, ``knowledge_bases``, ``models``; migrations/versioned/ @ v0.7.2)
and returns :class:`~weknora_nb.core.integrity.Finding` objects (as JSON) and the facts behind them:

- ``chunk_without_embedding``: an enabled, not soft-deleted chunk of an embedded type (``text``, ``summary``,
  image, table, ``faq``, ``wiki_page``; ``parent_text`` is stored but never embedded) with no enabled
  embeddings row holding a vector in its knowledge base. The join is WeKnora's: ``embeddings.chunk_id =
  chunks.id``. Chunks of a knowledge still being parsed (``pending`` / ``processing`` / ``deleting``) and
  chunks stored but not yet indexed (``status = 1``) are reported as ``info``.
- ``embedding_orphan``: a row whose chunk is gone, soft-deleted, or whose knowledge is soft-deleted (WeKnora's
  ``DELETE /chunks`` leaves them: they take LIMIT slots of every vector query and never reach a result).
- ``embedding_of_disabled_chunk``: an enabled row whose chunk is disabled (WeKnora v0.6 leaves them).
- ``duplicate_vector``: one identical vector (the MD5 of the halfvec's binary form, GROUP BY) on rows of
  different chunks of one knowledge base. Several rows of one chunk (generated questions, FAQ similar
  questions: ``source_id = chunk_id || '-' || suffix``, all ``source_type = 0``) are legitimate, not flagged.
- ``near_duplicate_vector``: for a bounded sample of rows (TABLESAMPLE; the facts say how many), the nearest
  row of another chunk through the index, flagged above the cosine threshold.
- ``dimension_mismatch``: rows whose ``dimension`` differs from the knowledge base's model
  (``models.parameters -> 'embedding_parameters' -> 'dimension'``; without one, the majority dimension, marked
  a heuristic), and rows whose vector's length differs from their ``dimension`` column (WeKnora's cast
  ``embedding::halfvec(N)`` fails on them: every query of that dimension errors).
- ``no_vector_index``: a dimension with rows and no valid HNSW / IVFFlat / DiskANN index on WeKnora's
  expression ``(embedding::halfvec(N))`` with cosine ops; ``index_not_used``: ``EXPLAIN (ANALYZE)`` of
  WeKnora's own vector query (with a real vector of the table, its ``SET LOCAL hnsw.ef_search`` and
  ``iterative_scan``) does not use the vector index. Both are ``info`` below :data:`SMALL_KB_ROWS` rows,
  where an exact scan is cheap.

Per-check caps keep a broken database from producing a million findings: at most ``max_findings`` rows per
check, the full count in ``facts["truncated"]``. The DSN's password appears in no message, log or fact.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from weknora_nb.collect.checks.postgres import PgSession, connect_readonly, data_errors, one_line
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
from weknora_nb.core.errors import ConnectFailed, UsageError
from weknora_nb.core.integrity import INFO, PROBLEM, Finding

log = logging.getLogger(__name__)

#: chunk types WeKnora embeds (knowledge_process.go:445-532, 1290-1347; image_multimodal.go; extract.go; faq)
EMBEDDED_CHUNK_TYPES = ("text", "summary", "image_ocr", "image_caption", "table_summary", "table_column", "faq",
                        "wiki_page")
#: a knowledge in these parse states may not have its vectors yet (or is losing them)
TRANSIENT_PARSE_STATUS = ("pending", "processing", "deleting")
#: below this many rows, an exact scan is cheap: a missing or unused index is shown, not failed
SMALL_KB_ROWS = 10_000
_NEAR_EXACT_BUDGET = 2_000_000  # row distances the near-duplicate sample may compute without an index


@dataclass
class _Check:
    """One check_database call: the session, the knowledge bases, what was found, how long each step took."""

    s: PgSession
    kb_ids: list[str]
    max_findings: int
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, check: str, subject: str, detail: str, *, kb: str | None, severity: str = PROBLEM,
            **data: Any) -> None:
        self.findings.append(Finding(check, str(subject), self.s.masked(detail), severity, kb, data))

    def truncated(self, check: str, total: int) -> None:
        if total > self.max_findings:
            self.facts.setdefault("truncated", {})[check] = total

    @property
    def enabled(self) -> str:
        """The predicate WeKnora's queries put on embeddings rows (``e`` aliases the table)."""
        return "(e.is_enabled IS NULL OR e.is_enabled)" if self.s.has("embeddings", "is_enabled") else "TRUE"


def check_database(dsn: str, kb_ids: Sequence[str] | None, *, near_threshold: float = 0.995, sample: int = 200,
                   statement_timeout_s: float = 60.0, work_mem: str = "64MB", max_findings: int = 100,
                   match_count: int = 10, seed: int = 1) -> dict[str, Any]:
    """Check the vectors of knowledge bases ``kb_ids`` (all live ones when empty) in WeKnora's Postgres at ``dsn``.

    Returns ``{"findings": [Finding.to_json(), ...], "facts": {...}}``; facts: ``database`` (server, pgvector,
    user; no password), ``knowledge_bases`` (per KB: rows, per-dimension counts, expected dimension and its
    source, chunks by type), ``indexes`` (vector index definitions and parameters), ``settings`` (the session's
    ``hnsw.ef_search`` ...), ``weknora_query`` (TopK, inner LIMIT and ef_search WeKnora uses at
    ``match_count``), ``planner`` (per KB and dimension: the plan of WeKnora's query), ``near_duplicates``
    (sample sizes), ``steps`` (seconds and status of each step; a step that timed out is ``timeout`` and its
    findings may be incomplete), ``truncated`` (check -> total when more than ``max_findings`` rows were found).
    """
    if not 0 < near_threshold <= 1:
        raise UsageError(argument="near_threshold", allowed="a cosine in (0, 1]", got=near_threshold)
    if sample < 0 or max_findings < 1:
        raise UsageError(argument="sample / max_findings", allowed=">= 0 / >= 1", got=(sample, max_findings))
    started = time.perf_counter()
    s = connect_readonly(dsn, statement_timeout_s=statement_timeout_s, work_mem=work_mem)
    try:
        run = _Check(s, _knowledge_bases(s, kb_ids), max_findings)
        run.facts.update(read_only=True, statement_timeout_s=statement_timeout_s, work_mem=work_mem,
                         near_threshold=near_threshold, knowledge_base_ids=run.kb_ids)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("settings", lambda: _settings(run, match_count)),
            ("indexes", lambda: _indexes(run)),
            ("row_counts", lambda: _row_counts(run)),
            ("dimensions", lambda: _dimensions(run)),
            ("chunks", lambda: _chunks_without_embedding(run)),
            ("embedding_rows", lambda: _embedding_rows(run)),
            ("duplicates", lambda: _duplicates(run)),
            ("near_duplicates", lambda: _near_duplicates(run, near_threshold, sample, seed)),
            ("vector_index", lambda: _no_vector_index(run)),
            ("planner", lambda: _planner(run)),
        ]
        for name, step in steps:
            _step(run, name, step)
    finally:
        s.conn.close()
    run.facts["seconds"] = round(time.perf_counter() - started, 3)
    log.info("checked %d knowledge base(s) in %s: %d finding(s) in %.1f s", len(run.kb_ids), s.shown_dsn,
             len(run.findings), run.facts["seconds"])
    return {"findings": [f.to_json() for f in run.findings], "facts": run.facts}


def _step(run: _Check, name: str, step: Callable[[], None]) -> None:
    """Run one step, timed; a query that hit the statement timeout or a table the role cannot read marks the
    step (``facts["steps"][name]["status"]``) and the check goes on. A lost connection raises."""
    import psycopg

    t0 = time.perf_counter()
    status: dict[str, Any] = {"status": "ok"}
    try:
        step()
    except psycopg.errors.QueryCanceled as exc:
        status = {"status": "timeout", "error": run.s.masked(one_line(str(exc), None))}
        log.warning("step %s of the Postgres check timed out: its findings may be incomplete", name)
    except psycopg.Error as exc:  # a table or column the role cannot read, a lock not granted, ...
        if run.s.conn.broken or run.s.conn.closed:
            raise ConnectFailed(f"Postgres {run.s.shown_dsn} went away during step {name}: "
                                f"{run.s.masked(one_line(str(exc), None))}") from None
        status = {"status": "error", "error": run.s.masked(one_line(str(exc), None))}
        log.warning("step %s of the Postgres check failed: %s", name, status["error"])
    status["seconds"] = round(time.perf_counter() - t0, 3)
    run.facts.setdefault("steps", {})[name] = status


def _knowledge_bases(s: PgSession, kb_ids: Sequence[str] | None) -> list[str]:
    """The knowledge bases to check: ``kb_ids`` (each must be known to the database), or every live one."""
    if not s.has("embeddings"):
        raise UsageError(f"the database of {s.shown_dsn} has no table embeddings the role may read (WeKnora "
                         "keeps its vectors elsewhere, or the role needs GRANT SELECT)")
    if not s.has("chunks"):
        raise UsageError(f"the database of {s.shown_dsn} has no table chunks the role may read")
    if isinstance(kb_ids, str):
        kb_ids = [kb_ids]
    wanted = [str(k) for k in kb_ids or []]
    if not wanted:
        if s.has("knowledge_bases"):
            live = " WHERE deleted_at IS NULL" if s.has("knowledge_bases", "deleted_at") else ""
            return sorted(r[0] for r in s.rows(f"SELECT id FROM knowledge_bases{live}"))
        return sorted(r[0] for r in s.rows("SELECT DISTINCT knowledge_base_id FROM chunks"))
    also = " OR EXISTS (SELECT 1 FROM knowledge_bases b WHERE b.id = k)" if s.has("knowledge_bases") else ""
    known = {r[0] for r in s.rows(
        "SELECT k FROM unnest(%s::text[]) k WHERE EXISTS (SELECT 1 FROM embeddings e WHERE e.knowledge_base_id = k)"
        f" OR EXISTS (SELECT 1 FROM chunks c WHERE c.knowledge_base_id = k){also}", (wanted,))}
    missing = [k for k in wanted if k not in known]
    if missing:
        raise UsageError(f"knowledge base(s) {', '.join(missing)} not in the database of {s.shown_dsn}")
    return wanted


def _settings(run: _Check, match_count: int) -> None:
    """Server and extension versions, the session's vector settings, and the ef_search WeKnora sets."""
    s = run.s
    exts = pgvector_version(s)
    names = ["hnsw.ef_search", "hnsw.iterative_scan", "hnsw.max_scan_tuples", "ivfflat.probes",
             "ivfflat.iterative_scan", "diskann.query_search_list_size", "work_mem", "max_parallel_workers_per_gather"]
    settings = {n: s.rows("SELECT current_setting(%s, true)", (n,))[0][0] for n in names}
    info = s.conn.info
    run.facts["database"] = {"host": info.host, "port": info.port, "dbname": info.dbname, "user": info.user,
                             "server_version": s.rows("SHOW server_version")[0][0],
                             "pgvector": exts.get("vector"), "pgvectorscale": exts.get("vectorscale")}
    run.facts["settings"] = settings
    top_k = weknora_top_k(match_count)  # one knowledge base a search, as the planner step runs it
    inner, ef = weknora_vector_limits(top_k)
    iterative = iterative_scan_supported(exts.get("vector"))
    run.facts["weknora_query"] = {
        "match_count": match_count, "top_k": top_k, "inner_limit": inner,
        "ef_search": ef if iterative else _int(settings["hnsw.ef_search"]),
        "iterative_scan": "strict_order" if iterative else None,
        "note": "WeKnora sets hnsw.ef_search and hnsw.iterative_scan per query (SET LOCAL); on pgvector < 0.8 the "
                "SET fails and it runs with the session's default ef_search (postgres/repository.go:405-443)"}


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _indexes(run: _Check) -> None:
    """The vector index definitions, into the facts."""
    run.facts["indexes"] = vector_indexes(run.s)


def _usable_index(run: _Check, dimension: int) -> dict[str, Any] | None:
    """A valid cosine vector index on WeKnora's expression for ``dimension`` whose WHERE (if any) is
    ``dimension = N`` itself; None when there is none."""
    for ix in run.facts.get("indexes", []):
        if ix["valid"] and ix["cosine"] and ix["dimension"] == dimension and (
                ix["predicate"] is None or ix["predicate_dimension"] == dimension):
            return dict(ix)
    return None


def _row_counts(run: _Check) -> None:
    """Per knowledge base and dimension: rows, enabled rows, rows without a vector, rows beyond a chunk's own
    (generated questions, FAQ similar questions), rows whose vector's length is not their ``dimension``."""
    e = run.enabled
    rows = run.s.rows(
        f"SELECT e.knowledge_base_id, e.dimension, count(*), count(*) FILTER (WHERE {e}),"
        " count(*) FILTER (WHERE e.embedding IS NULL),"
        " count(*) FILTER (WHERE e.source_id IS DISTINCT FROM e.chunk_id),"
        " count(*) FILTER (WHERE e.embedding IS NOT NULL AND vector_dims(e.embedding) <> e.dimension)"
        " FROM embeddings e WHERE e.knowledge_base_id = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 2", (run.kb_ids,))
    kbs: dict[str, Any] = {kb: {"rows": 0, "dimensions": {}} for kb in run.kb_ids}
    for kb, dim, n, enabled, no_vector, extra, wrong_len in rows:
        kbs[kb]["rows"] += n
        kbs[kb]["dimensions"][str(dim)] = {"rows": n, "enabled": enabled, "without_vector": no_vector,
                                           "extra_rows_of_a_chunk": extra, "vector_length_differs": wrong_len}
    run.facts["knowledge_bases"] = kbs
    for kb, dim, _n, _enabled, _no_vector, _extra, wrong_len in rows:
        if wrong_len:
            run.add("dimension_mismatch", f"{kb}/dimension={dim}",
                    f"{wrong_len} embeddings row(s) of dimension {dim} hold a vector of another length: WeKnora's "
                    f"cast embedding::halfvec({dim}) fails on them, so every query of that dimension errors",
                    kb=kb, dimension=dim, rows=wrong_len, kind="vector_length")


def _dimensions(run: _Check) -> None:
    """Rows whose dimension differs from the knowledge base's embedding model's (or from the majority)."""
    kbs = run.facts.get("knowledge_bases", {})
    models = _models(run)
    for kb in run.kb_ids:
        info = kbs.get(kb, {"dimensions": {}})
        dims = {int(d): v["rows"] for d, v in info["dimensions"].items()}
        model = models.get(kb) or {}
        expected, source = model.get("dimension"), "model"
        if not expected and dims:
            expected, source = max(dims, key=lambda d: (dims[d], -d)), "majority (heuristic: no model dimension)"
        info.update(expected_dimension=expected, dimension_source=source if expected else None, model=model or None)
        for dim, n in sorted(dims.items()):
            if expected and dim != expected:
                examples = run.s.rows("SELECT id, chunk_id FROM embeddings WHERE knowledge_base_id = %s AND "
                                      "dimension = %s ORDER BY id LIMIT 5", (kb, dim))
                run.add("dimension_mismatch", f"{kb}/dimension={dim}",
                        f"{n} embeddings row(s) of dimension {dim}; the knowledge base's "
                        f"{'model' if source == 'model' else 'majority'} dimension is {expected}",
                        kb=kb, dimension=dim, expected=expected, expected_from=source, rows=n,
                        examples=[{"embedding_id": i, "chunk_id": c} for i, c in examples])


def _models(run: _Check) -> dict[str, dict[str, Any]]:
    """Per knowledge base: its embedding model's id, name and configured dimension (empty when unreadable)."""
    s = run.s
    if not (s.has("knowledge_bases", "embedding_model_id") and s.has("models", "parameters")):
        return {}
    name = "m.name" if s.has("models", "name") else "NULL"
    rows = s.rows(f"SELECT kb.id, kb.embedding_model_id, {name},"
                  " m.parameters -> 'embedding_parameters' ->> 'dimension' FROM knowledge_bases kb"
                  " LEFT JOIN models m ON m.id = kb.embedding_model_id WHERE kb.id = ANY(%s)", (run.kb_ids,))
    return {kb: {"id": mid, "name": mname, "dimension": _int(dim) or None} for kb, mid, mname, dim in rows}


def _chunks_without_embedding(run: _Check) -> None:
    """Enabled, live chunks of an embedded type with no enabled row holding a vector in their knowledge base."""
    s, e = run.s, run.enabled
    has_k = s.has("knowledges", "deleted_at")
    status = "c.status" if s.has("chunks", "status") else "NULL::int"
    parse = "k.parse_status" if has_k and s.has("knowledges", "parse_status") else "NULL::text"
    join_k = "LEFT JOIN knowledges k ON k.id = c.knowledge_id" if has_k else ""
    live_k = "AND k.deleted_at IS NULL" if has_k else ""
    live_c = "AND c.deleted_at IS NULL" if s.has("chunks", "deleted_at") else ""
    rows = s.rows(
        f"SELECT m.*, own.id, own.enabled, own.has_vector, own.kb FROM ("
        f" SELECT c.id, c.knowledge_base_id, c.knowledge_id, c.chunk_type, {status}, {parse}, count(*) OVER ()"
        f" FROM chunks c {join_k} WHERE c.knowledge_base_id = ANY(%(kb)s) AND c.is_enabled {live_c} {live_k}"
        f" AND c.chunk_type = ANY(%(types)s) AND NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.chunk_id = c.id"
        f"  AND e.knowledge_base_id = c.knowledge_base_id AND {e} AND e.embedding IS NOT NULL)"
        f" ORDER BY c.knowledge_base_id, c.id LIMIT %(cap)s) m"
        f" LEFT JOIN LATERAL (SELECT e.id, {e} AS enabled, e.embedding IS NOT NULL AS has_vector,"
        f"  e.knowledge_base_id AS kb FROM embeddings e WHERE e.source_id = m.id ORDER BY e.source_type LIMIT 1)"
        f" own ON true", {"kb": run.kb_ids, "types": list(EMBEDDED_CHUNK_TYPES), "cap": run.max_findings})
    for cid, kb, kid, ctype, cstatus, pstatus, total, own_id, own_enabled, own_vector, own_kb in rows:
        run.truncated("chunk_without_embedding", total)
        if own_id is None:
            why = "has no embeddings row"
        elif own_kb != kb:
            why = f"has its embeddings row (id {own_id}) in knowledge base {own_kb}"
        elif not own_vector:
            why = f"has an embeddings row (id {own_id}) without a vector"
        else:
            why = f"has only a disabled embeddings row (id {own_id})" if not own_enabled else "has no usable row"
        transient = pstatus in TRANSIENT_PARSE_STATUS or cstatus == 1
        note = (f" (its knowledge is {pstatus}: vectors may still be written)" if pstatus in TRANSIENT_PARSE_STATUS
                else " (stored, not yet indexed: status 1)" if cstatus == 1 else ": the vector path cannot find it")
        run.add("chunk_without_embedding", cid, f"enabled {ctype} chunk {cid} {why}{note}", kb=kb,
                severity=INFO if transient else PROBLEM, knowledge_id=kid, chunk_type=ctype, parse_status=pstatus,
                chunk_status=cstatus, embedding_id=own_id)
    kinds = s.rows(f"SELECT c.knowledge_base_id, c.chunk_type, count(*) FROM chunks c WHERE c.knowledge_base_id ="
                   f" ANY(%s) {live_c} GROUP BY 1, 2 ORDER BY 1, 2", (run.kb_ids,))
    for kb, ctype, n in kinds:
        run.facts.setdefault("knowledge_bases", {}).setdefault(kb, {}).setdefault("chunks_by_type", {})[ctype] = n
    run.facts["embedded_chunk_types"] = list(EMBEDDED_CHUNK_TYPES)


def _embedding_rows(run: _Check) -> None:
    """Rows whose chunk is gone or soft-deleted (orphans) and enabled rows of disabled chunks: one pass."""
    s, e = run.s, run.enabled
    has_k = s.has("knowledges", "deleted_at")
    c_deleted = "c.deleted_at IS NOT NULL" if s.has("chunks", "deleted_at") else "FALSE"
    k_deleted = "k.deleted_at IS NOT NULL" if has_k else "FALSE"
    join_k = "LEFT JOIN knowledges k ON k.id = c.knowledge_id" if has_k else ""
    reason = (f"CASE WHEN e.chunk_id IS NULL THEN 'no_chunk_id' WHEN c.id IS NULL THEN 'chunk_missing'"
              f" WHEN {c_deleted} THEN 'chunk_deleted' WHEN {k_deleted} THEN 'knowledge_deleted'"
              f" WHEN {e} AND NOT c.is_enabled THEN 'chunk_disabled' END")
    rows = s.rows(
        f"SELECT * FROM (SELECT e.id, e.source_id, e.chunk_id, e.knowledge_id, e.knowledge_base_id, {e}, r.reason,"
        f" count(*) OVER w, row_number() OVER (w ORDER BY e.id) FROM embeddings e"
        f" LEFT JOIN chunks c ON c.id = e.chunk_id {join_k} CROSS JOIN LATERAL (SELECT {reason} AS reason) r"
        f" WHERE e.knowledge_base_id = ANY(%(kb)s) AND r.reason IS NOT NULL"
        f" WINDOW w AS (PARTITION BY r.reason = 'chunk_disabled')) x"
        f" WHERE x.row_number <= %(cap)s ORDER BY x.reason, x.id", {"kb": run.kb_ids, "cap": run.max_findings})
    said = {"no_chunk_id": "has no chunk_id", "chunk_missing": "points at chunk {c}, which is not in chunks",
            "chunk_deleted": "points at chunk {c}, which is soft-deleted",
            "knowledge_deleted": "points at chunk {c} of a soft-deleted knowledge",
            "chunk_disabled": "is enabled but its chunk {c} is disabled"}
    for rid, source_id, cid, kid, kb, enabled, why, total, _n in rows:
        check = "embedding_of_disabled_chunk" if why == "chunk_disabled" else "embedding_orphan"
        run.truncated(check, total)
        slots = " and takes a LIMIT slot of every vector query" if enabled and check == "embedding_orphan" else ""
        run.add(check, f"embeddings:{rid}", f"embeddings row {rid} (source {source_id}) "
                f"{said[why].format(c=cid)}{slots}", kb=kb, severity=PROBLEM if enabled else INFO,
                embedding_id=rid, source_id=source_id, chunk_id=cid, knowledge_id=kid, reason=why,
                row_enabled=bool(enabled))


def _duplicates(run: _Check) -> None:
    """Identical vectors on enabled rows of different chunks of one knowledge base, per dimension.

    Two passes, both a (parallel) scan: rows grouped by a fingerprint (the inner product with a fixed
    pseudo-random vector and the L2 norm: equal for identical vectors, and computed by pgvector in C, where
    hashing ``halfvec_send``'s output costs seconds a million rows); then the rows of the fingerprints held by
    several chunks, grouped by the MD5 of their binary form, so that a fingerprint collision is not reported."""
    dims = sorted({dim for _kb, dim, _n in _groups(run)})
    for dim in dims:
        probe = "[" + ",".join(f"{random.Random(dim * 7919 + i).uniform(-1, 1):.6f}" for i in range(dim)) + "]"
        where = (f"e.knowledge_base_id = ANY(%(kb)s) AND {run.enabled} AND e.dimension = %(dim)s"
                 f" AND e.embedding IS NOT NULL AND vector_dims(e.embedding) = %(dim)s")
        rows = run.s.rows(
            f"WITH f AS (SELECT e.knowledge_base_id AS kb, e.embedding <#> %(probe)s::halfvec AS a,"
            f" l2_norm(e.embedding) AS b, count(*) OVER () AS total FROM embeddings e WHERE {where}"
            f" GROUP BY 1, 2, 3 HAVING min(e.chunk_id) <> max(e.chunk_id) LIMIT %(candidates)s),"
            f" r AS (SELECT e.id, e.chunk_id, f.kb, f.total, md5(halfvec_send(e.embedding)) AS h FROM embeddings e"
            f" JOIN f ON f.kb = e.knowledge_base_id AND f.a = (e.embedding <#> %(probe)s::halfvec)"
            f" AND f.b = l2_norm(e.embedding) WHERE {where})"
            f" SELECT kb, h, max(total), array_agg(DISTINCT chunk_id ORDER BY chunk_id), array_agg(id ORDER BY id)"
            f" FROM r GROUP BY kb, h HAVING min(chunk_id) <> max(chunk_id) ORDER BY kb, h LIMIT %(cap)s",
            {"kb": run.kb_ids, "dim": dim, "probe": probe, "candidates": 4 * run.max_findings,
             "cap": run.max_findings})
        for kb, digest, total, chunks, ids in rows:
            run.truncated("duplicate_vector", total)
            run.add("duplicate_vector", chunks[0], f"{len(chunks)} chunks share one identical vector "
                    f"({', '.join(chunks[:5])}{', ...' if len(chunks) > 5 else ''}; {len(ids)} rows)", kb=kb,
                    chunk_ids=chunks[:50], embedding_ids=ids[:50], vector_md5=digest, rows=len(ids), dimension=dim)


def _groups(run: _Check) -> Iterator[tuple[str, int, int]]:
    """(knowledge base, dimension, enabled rows) of every dimension with enabled rows."""
    for kb, info in run.facts.get("knowledge_bases", {}).items():
        for dim, counts in info.get("dimensions", {}).items():
            if counts["enabled"] - counts["without_vector"] > 0:
                yield kb, int(dim), counts["enabled"] - counts["without_vector"]


def _near_duplicates(run: _Check, threshold: float, sample: int, seed: int) -> None:
    """For a sample of rows per KB and dimension, the nearest row of another chunk (WeKnora's search settings)."""
    out: dict[str, Any] = {}
    for kb, dim, n_rows in _groups(run):
        indexed = _usable_index(run, dim) is not None
        n = min(sample, n_rows) if indexed else min(sample, n_rows, max(1, _NEAR_EXACT_BUDGET // n_rows))
        ids = _sample_ids(run, kb, dim, n, n_rows, seed) if n and n_rows > 1 else []
        facts: dict[str, Any] = {"sampled": len(ids), "of_rows": n_rows, "threshold": threshold,
                                 "method": "index" if indexed else "exact (no usable index)"}
        out.setdefault(kb, {})[str(dim)] = facts
        try:
            pairs = _nearest_other_chunk(run, kb, dim, ids) if ids else []
        except data_errors() as exc:  # a vector whose length is not its dimension (reported by row_counts)
            facts["error"] = run.s.masked(one_line(str(exc), None))
            continue
        seen: set[frozenset[str]] = set()
        for sid, schunk, nid, nchunk, distance, same in pairs:
            pair = frozenset((str(schunk), str(nchunk)))
            if same or 1 - distance < threshold or pair in seen:
                continue
            seen.add(pair)
            run.add("near_duplicate_vector", schunk, f"chunks {schunk} and {nchunk} have near-identical vectors "
                    f"(cosine {1 - distance:.5f} >= {threshold})", kb=kb, other_chunk_id=nchunk,
                    cosine=round(1 - float(distance), 6), embedding_ids=[sid, nid], dimension=dim)
        facts.update(pairs_above_threshold=len(seen), identical_in_sample=sum(bool(p[5]) for p in pairs),
                     note="a sample: each sampled row's nearest row of another chunk, with WeKnora's query settings")
    run.facts["near_duplicates"] = out


def _nearest_other_chunk(run: _Check, kb: str, dim: int, ids: list[int]) -> list[tuple[Any, ...]]:
    """For each row of ``ids``: (id, chunk, nearest row of another chunk's id, its chunk, cosine distance,
    identical vector?), searched the way WeKnora searches (its ef_search, iterative scan, WHERE)."""
    q = run.facts.get("weknora_query", {})
    with weknora_search_settings(run.s, q.get("ef_search"), q.get("iterative_scan")):
        return run.s.rows(
            f"SELECT s.id, s.chunk_id, n.id, n.chunk_id, n.distance, n.same FROM embeddings s"
            f" CROSS JOIN LATERAL (SELECT e.id, e.chunk_id, e.embedding::halfvec({dim}) <=>"
            f" s.embedding::halfvec({dim}) AS distance, e.embedding = s.embedding AS same FROM embeddings e"
            f" WHERE e.dimension = %(dim)s AND e.knowledge_base_id = %(kb)s AND {run.enabled}"
            f" AND e.chunk_id IS DISTINCT FROM s.chunk_id ORDER BY e.embedding::halfvec({dim}) <=>"
            f" s.embedding::halfvec({dim}) LIMIT 1) n WHERE s.id = ANY(%(ids)s) ORDER BY s.id",
            {"dim": dim, "kb": kb, "ids": ids})


def _sample_ids(run: _Check, kb: str, dim: int, n: int, n_rows: int, seed: int) -> list[int]:
    """Up to ``n`` ids of enabled rows with a vector (KB, dimension): pages sampled (TABLESAMPLE SYSTEM, about 3n
    rows' worth), or when that finds too few, the first ``n`` rows of a scan."""
    where = (f"knowledge_base_id = %(kb)s AND dimension = %(dim)s AND embedding IS NOT NULL"
             f" AND {run.enabled.replace('e.', '')}")
    pct = min(100.0, 100.0 * 3 * n / max(1, n_rows))
    ids = [r[0] for r in run.s.rows(f"SELECT id FROM embeddings TABLESAMPLE SYSTEM (%(pct)s) REPEATABLE (%(seed)s)"
                                    f" WHERE {where} LIMIT %(n)s", {"pct": pct, "seed": seed, "kb": kb, "dim": dim,
                                                                    "n": n})]
    if len(ids) < n and pct < 100:
        ids = [r[0] for r in run.s.rows(f"SELECT id FROM embeddings WHERE {where} LIMIT %(n)s",
                                        {"kb": kb, "dim": dim, "n": n})]
    return ids


def _no_vector_index(run: _Check) -> None:
    """Dimensions with rows and no valid cosine index on WeKnora's expression: every search is exact."""
    for kb, dim, n_rows in _groups(run):
        if _usable_index(run, dim) is not None:
            continue
        near = [ix for ix in run.facts.get("indexes", []) if ix["dimension"] == dim]
        why = "; ".join(f"{ix['name']} is {'invalid' if not ix['valid'] else ix['opclass'] if not ix['cosine'] else 'partial: ' + str(ix['predicate'])}"  # noqa: E501
                        for ix in near) or f"no index on (embedding::halfvec({dim}))"
        small = n_rows < SMALL_KB_ROWS
        run.add("no_vector_index", f"{kb}/dimension={dim}",
                f"{n_rows} enabled row(s) of dimension {dim} and no usable vector index ({why}): every search is "
                f"a sequential scan{' (cheap at this size)' if small else ''}", kb=kb,
                severity=INFO if small else PROBLEM, dimension=dim, rows=n_rows,
                other_indexes=[ix["name"] for ix in near])


def _planner(run: _Check) -> None:
    """EXPLAIN (ANALYZE) of WeKnora's vector query with a real vector, per KB and dimension: is the index used?"""
    q = run.facts.get("weknora_query", {})
    out: dict[str, Any] = {}
    for kb, dim, n_rows in _groups(run):
        found = run.s.rows(f"SELECT embedding::text FROM embeddings e WHERE knowledge_base_id = %s AND dimension = %s"
                           f" AND embedding IS NOT NULL AND {run.enabled} LIMIT 1", (kb, dim))
        if not found:
            continue
        params = {"vector": found[0][0], "dimension": dim, "kb_ids": [kb], "inner_limit": q.get("inner_limit", 100),
                  "max_distance": 2.0, "top_k": q.get("top_k", 50)}
        sql = vector_query_sql(dim, enabled_column=run.s.has("embeddings", "is_enabled"))
        try:
            with weknora_search_settings(run.s, q.get("ef_search"), q.get("iterative_scan")):
                plan = run.s.rows("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)[0][0][0]
        except data_errors() as exc:  # e.g. a vector whose length is not its dimension: WeKnora's query fails too
            out.setdefault(kb, {})[str(dim)] = {"error": run.s.masked(one_line(str(exc), None)), "rows": n_rows}
            continue
        nodes = list(plan_nodes(plan["Plan"]))
        vector_names = {ix["name"] for ix in run.facts.get("indexes", []) if ix["dimension"] == dim}
        used = sorted({n["index"] for n in nodes if n.get("index") in vector_names})
        usable = _usable_index(run, dim)
        out.setdefault(kb, {})[str(dim)] = {
            "uses_vector_index": bool(used), "index": used[0] if used else None,
            "nodes": [n["node"] + (f" using {n['index']}" if n.get("index") else "") for n in nodes],
            "execution_ms": round(float(plan.get("Execution Time", 0.0)), 3),
            "planning_ms": round(float(plan.get("Planning Time", 0.0)), 3), "rows": n_rows}
        if usable and not used:
            small = n_rows < SMALL_KB_ROWS
            shape = ", ".join(out[kb][str(dim)]["nodes"])
            run.add("index_not_used", f"{kb}/dimension={dim}",
                    f"the planner does not use {usable['name']} for WeKnora's vector query ({shape}; "
                    f"{out[kb][str(dim)]['execution_ms']:.1f} ms){' - cheap at this size' if small else ''}",
                    kb=kb, severity=INFO if small else PROBLEM, dimension=dim, index=usable["name"],
                    plan=out[kb][str(dim)]["nodes"], rows=n_rows)
    run.facts["planner"] = out
