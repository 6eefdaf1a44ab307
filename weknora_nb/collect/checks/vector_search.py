"""WeKnora's vector search as SQL, and what decides how Postgres runs it: the query, its limits, its settings,
the vector indexes and the plan.

WeKnora's HybridSearch asks its vector path for TopK = ``min(max(5 x match_count, 50) x KBs, 500)`` rows
(C18); its vector query (postgres/repository.go:350-443 @ v0.7.2) asks the index for TopK x 2 within
[100, 200] rows (at least TopK), in a transaction that sets ``hnsw.ef_search`` to that (at least 40) and
``hnsw.iterative_scan = strict_order`` (pgvector >= 0.8). The database checks and the vector-store trace
run the same query the same way (:func:`vector_query_sql`, :func:`weknora_search_settings`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from weknora_nb.collect.checks.postgres import PgSession

VECTOR_INDEX_METHODS = ("hnsw", "ivfflat", "diskann")
#: pgvector's defaults of what an index's WITH (...) leaves out
INDEX_DEFAULTS: dict[str, dict[str, int]] = {"hnsw": {"m": 16, "ef_construction": 64}, "ivfflat": {"lists": 100}}
#: WeKnora's vector query (postgres/repository.go:350-408 @ v0.7.2): TopK x 2 within [100, 200] rows asked of the
#: index (at least TopK), ``hnsw.ef_search`` = that, at least 40; HybridSearch's TopK (C18)
_EXPANDED_MIN, _EXPANDED_MAX, _EF_MIN = 100, 200, 40
_CANDIDATES_FACTOR, _CANDIDATES_FLOOR, _CANDIDATES_CAP = 5, 50, 500


def weknora_top_k(match_count: int, n_kbs: int = 1) -> int:
    """The TopK WeKnora's HybridSearch asks its vector path for: ``min(max(5 x match_count, 50) x KBs, 500)``."""
    return min(max(_CANDIDATES_FACTOR * match_count, _CANDIDATES_FLOOR) * max(1, n_kbs), _CANDIDATES_CAP)


def weknora_vector_limits(top_k: int) -> tuple[int, int]:
    """(rows the inner ORDER BY ... LIMIT asks the index for, the ``hnsw.ef_search`` WeKnora sets) for ``top_k``."""
    expanded = max(min(max(2 * top_k, _EXPANDED_MIN), _EXPANDED_MAX), top_k)
    return expanded, max(expanded, _EF_MIN)


def vector_query_sql(dimension: int, *, enabled_column: bool = True) -> str:
    """WeKnora's vector query for ``dimension`` (postgres/repository.go:377-393 @ v0.7.2), restricted to
    knowledge bases. Parameters: ``vector`` (the query vector's text), ``dimension``, ``kb_ids`` (a list),
    ``inner_limit``, ``max_distance`` (``1 - threshold``; 2 keeps every row), ``top_k``. Columns: ``id``,
    ``source_id``, ``chunk_id``, ``knowledge_base_id``, ``distance`` (cosine distance), best first."""
    d = int(dimension)
    enabled = " AND (is_enabled IS NULL OR is_enabled = true)" if enabled_column else ""
    return (f"SELECT id, source_id, chunk_id, knowledge_base_id, distance FROM ("
            f" SELECT id, source_id, chunk_id, knowledge_base_id,"
            f" embedding::halfvec({d}) <=> %(vector)s::halfvec({d}) AS distance"
            f" FROM embeddings WHERE dimension = %(dimension)s AND knowledge_base_id = ANY(%(kb_ids)s){enabled}"
            f" ORDER BY embedding::halfvec({d}) <=> %(vector)s::halfvec({d}) LIMIT %(inner_limit)s"
            f") AS candidates WHERE distance <= %(max_distance)s ORDER BY distance ASC LIMIT %(top_k)s")


#: every search planned with its own values, as a statement sent once is: a prepared statement's generic plan (which
#: Postgres may keep after its fifth run, and always takes under plan_cache_mode = force_generic_plan) cannot
#: prove ``dimension = $2`` for an index ``WHERE dimension = <d>``, so through it no search would use the index
CUSTOM_PLANS = {"plan_cache_mode": "force_custom_plan"}


@contextmanager
def weknora_search_settings(s: PgSession, ef_search: int | None, iterative_scan: str | None,
                            more: Mapping[str, str] | None = None) -> Iterator[None]:
    """A transaction with WeKnora's ``SET LOCAL hnsw.ef_search`` and ``hnsw.iterative_scan`` (None: left as is),
    the settings of ``more``, and :data:`CUSTOM_PLANS`, set in one statement.

    In the connection's pipeline mode ``BEGIN`` and ``COMMIT`` go into the pipeline as statements of their own,
    as WeKnora's transaction sends them: psycopg's ``transaction()`` there syncs the pipeline as it opens and
    closes (a wait for the server per search). An error (the server's surfaces when the pipeline syncs) leaves the
    transaction open: whoever opened the pipeline rolls it back (``vectortrace._pipeline``)."""
    settings = dict(CUSTOM_PLANS)
    if ef_search is not None:
        settings["hnsw.ef_search"] = str(int(ef_search))
    if iterative_scan is not None:
        settings["hnsw.iterative_scan"] = iterative_scan
    settings.update(more or {})
    set_local = ("SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(settings)),   # SET LOCAL of each
                 [x for item in settings.items() for x in item])
    if not s.conn.info.pipeline_status:   # PipelineStatus.OFF
        with s.conn.transaction():
            s.conn.execute(*set_local)
            yield
        return
    s.conn.execute("BEGIN")
    s.conn.execute(*set_local)
    yield   # an error leaves the transaction open: the pipeline's owner rolls it back
    s.conn.execute("COMMIT")


def pgvector_version(s: PgSession) -> dict[str, str]:
    """``{"vector": "0.8.2", "vectorscale": ...}`` of the extensions installed; loads pgvector in the session, so
    that its settings (``hnsw.ef_search`` ...) exist."""
    s.conn.execute("SELECT '[1]'::halfvec")
    return dict(s.rows("SELECT extname, extversion FROM pg_extension WHERE extname IN ('vector', 'vectorscale')"))


def iterative_scan_supported(version: str | None) -> bool:
    """pgvector >= 0.8 has ``hnsw.iterative_scan`` (WeKnora sets it to ``strict_order``)."""
    return _version_at_least(version, (0, 8))


def _version_at_least(version: str | None, least: tuple[int, ...]) -> bool:
    nums = tuple(int(x) for x in re.findall(r"\d+", version or "")[: len(least)])
    return bool(nums) and nums >= least


def vector_indexes(s: PgSession) -> list[dict[str, Any]]:
    """The vector indexes on ``embeddings``: name, method, opclass, expression, WHERE, the dimension they cover,
    parameters (pgvector's defaults filled in, named in ``defaulted``), validity, size."""
    rows = s.rows(
        "SELECT c.relname, am.amname, opc.opcname, pg_get_indexdef(i.indexrelid), pg_get_expr(i.indexprs, i.indrelid),"
        " pg_get_expr(i.indpred, i.indrelid), c.reloptions, i.indisvalid AND i.indisready, pg_relation_size(c.oid)"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam"
        " LEFT JOIN pg_opclass opc ON opc.oid = i.indclass[0]"
        " WHERE i.indrelid = to_regclass('embeddings') AND am.amname = ANY(%s) ORDER BY c.relname",
        (list(VECTOR_INDEX_METHODS),))
    out = []
    for name, method, opclass, definition, expression, predicate, reloptions, valid, size in rows:
        given = dict(o.split("=", 1) for o in reloptions or [])
        params: dict[str, Any] = {k: _int(v) if _int(v) is not None else v for k, v in given.items()}
        defaulted = [k for k in INDEX_DEFAULTS.get(method, {}) if k not in params]
        params.update({k: INDEX_DEFAULTS[method][k] for k in defaulted})
        cast = re.search(r"halfvec\((\d+)\)", expression or "")
        where = re.fullmatch(r"\(?\s*dimension\s*=\s*(\d+)\s*\)?", predicate or "")
        out.append({"name": name, "method": method, "opclass": opclass, "expression": expression,
                    "predicate": predicate, "dimension": int(cast.group(1)) if cast else None,
                    "predicate_dimension": int(where.group(1)) if where else None,
                    "cosine": bool(opclass and opclass.endswith("cosine_ops")), "valid": bool(valid),
                    "parameters": params, "defaulted": defaulted, "size_bytes": int(size),
                    "definition": definition})
    return out


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The nodes of an EXPLAIN (FORMAT JSON) plan, depth first: node type and index name."""
    yield {"node": node.get("Node Type", "?"), "index": node.get("Index Name")}
    for child in node.get("Plans", []) or []:
        yield from plan_nodes(child)


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None
