"""The read-only Postgres/pgvector checks (weknora_nb.collect.checks.database) against a real Postgres 18 + pgvector:
crafted databases in WeKnora's table shapes, one with every fault and one clean, checked as a read-only role."""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weknora_nb.collect.checks.database import check_database
from weknora_nb.collect.checks.vector_search import vector_query_sql, weknora_top_k, weknora_vector_limits
from weknora_nb.collect.http.redact import redact_dsn, redact_text
from weknora_nb.core.errors import AuthFailed, UsageError

pytest.importorskip("psycopg")
pgcluster = pytest.importorskip("weknora_nb.sandbox.pgcluster")

SCHEMA = Path(__file__).resolve().parents[1] / "weknora_nb" / "sandbox" / "weknora_schema.sql"
DIM = 16
#: one database name per content version of the builders below (a changed builder needs a new name)
VERSION = "v4"
PASSWORD = f"pw-{uuid.uuid4().hex}"  # the reader's password: must show up nowhere
#: this process's roles, named for it: another run at the same time (the cluster is shared by every process of
#: the machine, pytest-xdist's workers too) that gave the same role its own password would lock this one out;
#: dropped when the module's tests are done
READER = f"wknb_test_pgcheck_reader_{PASSWORD[3:11]}"
NOINDEX = f"wknb_test_pgcheck_noindex_{PASSWORD[3:11]}"


def vec(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


class Builder:
    """Rows of WeKnora's tables written into one database."""

    def __init__(self, db: Any, seed: int = 0):
        self.db, self.rng = db, np.random.default_rng(seed)
        db.execute(SCHEMA.read_text(encoding="utf-8"))
        db.execute("ALTER TABLE chunks ADD COLUMN status INT NOT NULL DEFAULT 0")  # WeKnora's 000001 has it

    def model(self, mid: str, dim: int) -> None:
        self.db.execute("INSERT INTO models (id, tenant_id, name, type, source, parameters) VALUES "
                        "(%s, 1, %s, 'Embedding', 'remote', %s)",
                        (mid, f"model-{mid}", json.dumps({"embedding_parameters": {"dimension": dim}})))

    def kb(self, kb: str, model: str) -> None:
        self.db.execute("INSERT INTO knowledge_bases (id, name, tenant_id, embedding_model_id) VALUES (%s, %s, 1, %s)",
                        (kb, kb, model))

    def knowledge(self, kid: str, kb: str, status: str = "completed", deleted: bool = False) -> None:
        self.db.execute("INSERT INTO knowledges (id, tenant_id, knowledge_base_id, type, title, source, parse_status,"
                        " deleted_at) VALUES (%s, 1, %s, 'file', %s, 'upload', %s, %s)",
                        (kid, kb, kid, status, "now" if deleted else None))

    def chunk(self, cid: str, kb: str, kid: str, *, ctype: str = "text", enabled: bool = True,
              deleted: bool = False, status: int = 2) -> None:
        self.db.execute("INSERT INTO chunks (id, tenant_id, knowledge_base_id, knowledge_id, content, chunk_index,"
                        " is_enabled, start_at, end_at, chunk_type, deleted_at, status) VALUES"
                        " (%s, 1, %s, %s, %s, 0, %s, 0, 1, %s, %s, %s)",
                        (cid, kb, kid, f"content of {cid}", enabled, ctype, "now" if deleted else None, status))

    def row(self, chunk: str, kb: str, v: np.ndarray | None = None, *, source: str | None = None,
            dim: int | None = None, enabled: bool | None = True) -> np.ndarray:
        v = self.rng.normal(size=DIM) if v is None else v
        self.db.execute("INSERT INTO embeddings (source_id, source_type, chunk_id, knowledge_id, knowledge_base_id,"
                        " content, dimension, embedding, is_enabled) VALUES (%s, 0, %s, 'k', %s, 'x', %s, %s, %s)",
                        (source or chunk, chunk, kb, dim or len(v), vec(v), enabled))
        return v

    def index(self, dim: int = DIM, m: int = 16, ef_construction: int = 64) -> None:
        self.db.execute(f"CREATE INDEX embeddings_embedding_idx_{dim} ON embeddings USING hnsw"
                        f" ((embedding::halfvec({dim})) halfvec_cosine_ops) WITH (m = {m}, ef_construction ="
                        f" {ef_construction}) WHERE (dimension = {dim})")

    def healthy(self, kb: str, kid: str, n: int, prefix: str) -> None:
        """``n`` text chunks with one row each; every fifth with two generated-question rows (one of them
        identical to the chunk's own vector: several rows of one chunk are legitimate)."""
        for i in range(n):
            cid = f"{prefix}{i:04d}"
            self.chunk(cid, kb, kid)
            v = self.row(cid, kb)
            if i % 5 == 0:
                self.row(cid, kb, v, source=f"{cid}-q{i}a")
                self.row(cid, kb, source=f"{cid}-q{i}b")


def build_faulty(db: Any) -> None:
    """kb-f (model dimension 16): every fault the check knows, next to healthy chunks and legitimate cases."""
    b = Builder(db, seed=1)
    b.model("m16", DIM)
    b.kb("kb-f", "m16")
    b.knowledge("k1", "kb-f")
    b.knowledge("k-gone", "kb-f", deleted=True)
    b.knowledge("k-busy", "kb-f", status="processing")
    b.healthy("kb-f", "k1", 300, "ok-")
    # chunk_without_embedding (problem), and cases that are not: parent_text, disabled, soft-deleted chunks
    b.chunk("c-noemb", "kb-f", "k1")
    b.chunk("c-disabled-row", "kb-f", "k1")
    b.row("c-disabled-row", "kb-f", enabled=False)
    b.chunk("c-parent", "kb-f", "k1", ctype="parent_text")
    b.chunk("c-off-noemb", "kb-f", "k1", enabled=False)
    b.chunk("c-del-noemb", "kb-f", "k1", deleted=True)
    b.chunk("c-busy", "kb-f", "k-busy")  # its knowledge is still processing: info
    # embedding_orphan: chunk missing, soft-deleted, knowledge soft-deleted
    b.row("c-gone", "kb-f")
    b.chunk("c-softdel", "kb-f", "k1", deleted=True)
    b.row("c-softdel", "kb-f")
    b.chunk("c-of-gone-k", "kb-f", "k-gone")
    b.row("c-of-gone-k", "kb-f")
    # embedding_of_disabled_chunk
    b.chunk("c-off", "kb-f", "k1", enabled=False)
    b.row("c-off", "kb-f")
    # duplicate_vector and near_duplicate_vector
    same = b.rng.normal(size=DIM)
    for cid in ("c-dup-a", "c-dup-b"):
        b.chunk(cid, "kb-f", "k1")
        b.row(cid, "kb-f", same)
    near = b.rng.normal(size=DIM)
    b.chunk("c-near-a", "kb-f", "k1")
    b.row("c-near-a", "kb-f", near)
    b.chunk("c-near-b", "kb-f", "k1")
    b.row("c-near-b", "kb-f", near + b.rng.normal(size=DIM) * 0.02 * np.abs(near).mean())
    # dimension_mismatch: 12-dimensional rows (no index for them: no_vector_index, info at this size), one of
    # which holds an 11-dimensional vector (WeKnora's cast fails on it)
    for i in range(3):
        b.chunk(f"c-dim{i}", "kb-f", "k1")
        b.row(f"c-dim{i}", "kb-f", b.rng.normal(size=12))
    b.chunk("c-len", "kb-f", "k1")
    b.row("c-len", "kb-f", b.rng.normal(size=11), dim=12)
    # kb-h: its model row is missing: the majority dimension is expected (a heuristic, said so)
    b.kb("kb-h", "m-missing")
    b.knowledge("kh", "kb-h")
    for i in range(6):
        b.chunk(f"h{i}", "kb-h", "kh")
        b.row(f"h{i}", "kb-h", b.rng.normal(size=DIM if i else 8))
    b.index()
    db.execute("ANALYZE")


def build_clean(db: Any) -> None:
    """kb-c (model dimension 16): 2,000 healthy chunks (some with generated questions), an HNSW index, statistics."""
    b = Builder(db, seed=2)
    b.model("m16", DIM)
    b.kb("kb-c", "m16")
    b.knowledge("k1", "kb-c")
    b.healthy("kb-c", "k1", 2000, "c-")
    b.chunk("c-parent", "kb-c", "k1", ctype="parent_text")  # stored, never embedded: not a finding
    b.index()
    db.execute("ANALYZE")


def reader_dsn(name: str, build) -> str:
    cluster = pgcluster.cluster()
    db = f"wknb_test_pgcheck_{name}_{VERSION}"
    cluster.ensure_database(db, build)
    cluster.ensure_reader(db, READER, PASSWORD)
    return cluster.dsn(db, user=READER, password=PASSWORD)


@pytest.fixture(scope="module")
def roles() -> Iterator[None]:
    """Drops this process's roles (their privileges in the test databases first) when the module is done."""
    from psycopg import sql

    yield
    cluster = pgcluster.cluster()
    with cluster.connect() as admin:
        dbs = [r[0] for r in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'wknb_test_pgcheck_%'")]
        for role in (READER, NOINDEX):
            if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                continue
            for db in dbs:
                with cluster.connect(db) as conn:
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture(scope="module")
def faulty_dsn(roles) -> str:
    return reader_dsn("faulty", build_faulty)


@pytest.fixture(scope="module")
def clean_dsn(roles) -> str:
    return reader_dsn("clean", build_clean)


@pytest.fixture(scope="module")
def faulty(faulty_dsn) -> dict[str, Any]:
    return check_database(faulty_dsn, ["kb-f"], sample=1000)


def by_check(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in result["findings"]:
        out.setdefault(f["check"], []).append(f)
    return out


# ------------------------------------------------------------------------------------------ findings
def test_a_clean_database_checked_as_a_read_only_role_has_no_finding(clean_dsn):
    result = check_database(clean_dsn, ["kb-c"])
    assert result["findings"] == []
    facts = result["facts"]
    assert all(step["status"] == "ok" for step in facts["steps"].values()), facts["steps"]
    assert facts["database"]["user"] == READER and facts["read_only"]
    assert facts["knowledge_bases"]["kb-c"]["expected_dimension"] == DIM
    assert facts["knowledge_bases"]["kb-c"]["dimension_source"] == "model"
    assert facts["planner"]["kb-c"][str(DIM)]["uses_vector_index"]
    assert facts["near_duplicates"]["kb-c"][str(DIM)]["sampled"] == 200  # a sample, and it says how big


def test_chunks_without_a_usable_embedding_row_are_found_and_legitimate_cases_are_not(faulty):
    found = {f["subject"]: f for f in by_check(faulty)["chunk_without_embedding"]}
    assert set(found) == {"c-noemb", "c-disabled-row", "c-busy"}  # not parent_text, disabled or deleted chunks
    assert found["c-noemb"]["severity"] == "problem" and "has no embeddings row" in found["c-noemb"]["detail"]
    assert "only a disabled embeddings row" in found["c-disabled-row"]["detail"]
    assert found["c-busy"]["severity"] == "info" and "processing" in found["c-busy"]["detail"]


def test_orphan_rows_and_rows_of_disabled_chunks_are_found(faulty):
    checks = by_check(faulty)
    orphans = {f["data"]["chunk_id"]: f["data"]["reason"] for f in checks["embedding_orphan"]}
    assert orphans == {"c-gone": "chunk_missing", "c-softdel": "chunk_deleted",
                       "c-of-gone-k": "knowledge_deleted"}
    assert [f["data"]["chunk_id"] for f in checks["embedding_of_disabled_chunk"]] == ["c-off"]


def test_identical_and_near_identical_vectors_of_different_chunks_are_found_not_those_of_one_chunk(faulty):
    checks = by_check(faulty)
    assert [f["data"]["chunk_ids"] for f in checks["duplicate_vector"]] == [["c-dup-a", "c-dup-b"]]
    near = checks["near_duplicate_vector"]
    assert [{f["subject"], f["data"]["other_chunk_id"]} for f in near] == [{"c-near-a", "c-near-b"}]
    assert near[0]["data"]["cosine"] >= 0.995
    facts = faulty["facts"]["near_duplicates"]["kb-f"][str(DIM)]
    assert facts["method"] == "index" and facts["sampled"] == facts["of_rows"]  # small KB: every row sampled


def test_dimensions_that_differ_from_the_model_and_vectors_longer_than_their_dimension_are_found(faulty):
    kinds = Counter((f["subject"], f["data"].get("kind", "model")) for f in by_check(faulty)["dimension_mismatch"])
    assert kinds == {("kb-f/dimension=12", "model"): 1, ("kb-f/dimension=12", "vector_length"): 1}
    model = next(f for f in by_check(faulty)["dimension_mismatch"] if "kind" not in f["data"])
    assert model["data"]["rows"] == 4 and model["data"]["expected"] == DIM
    assert "cast embedding::halfvec(12) fails" in next(
        f["detail"] for f in by_check(faulty)["dimension_mismatch"] if f["data"].get("kind"))


def test_without_a_model_row_the_majority_dimension_is_expected_and_called_a_heuristic(faulty_dsn):
    result = check_database(faulty_dsn, ["kb-h"], sample=5)
    (odd,) = by_check(result)["dimension_mismatch"]
    assert odd["subject"] == "kb-h/dimension=8" and odd["data"]["expected"] == DIM
    assert odd["data"]["expected_from"].startswith("majority (heuristic")
    assert result["facts"]["knowledge_bases"]["kb-h"]["dimension_source"].startswith("majority (heuristic")
    assert {f["check"] for f in result["findings"]} <= {"dimension_mismatch", "no_vector_index", "index_not_used"}


def test_every_step_of_the_faulty_check_ran(faulty):
    assert {name: step["status"] for name, step in faulty["facts"]["steps"].items()} == dict.fromkeys(
        ["settings", "indexes", "row_counts", "dimensions", "chunks", "embedding_rows", "duplicates",
         "near_duplicates", "vector_index", "planner"], "ok")


def test_a_dimension_without_an_index_is_found_and_the_failing_query_is_recorded(faulty):
    (missing,) = by_check(faulty)["no_vector_index"]
    assert missing["subject"] == "kb-f/dimension=12" and missing["severity"] == "info"  # 4 rows: exact is cheap
    planner = faulty["facts"]["planner"]["kb-f"]
    assert "expected 12 dimensions, not 11" in planner["12"]["error"]  # WeKnora's query fails the same way
    # ~430 rows of dimension 16: the planner prefers a sequential scan to the HNSW index, shown as info
    assert not planner[str(DIM)]["uses_vector_index"] and "Seq Scan" in planner[str(DIM)]["nodes"]
    (unused,) = by_check(faulty)["index_not_used"]
    assert unused["subject"] == f"kb-f/dimension={DIM}" and unused["severity"] == "info"


def test_index_definitions_and_search_settings_are_reported(faulty):
    facts = faulty["facts"]
    (ix,) = facts["indexes"]
    assert ix["method"] == "hnsw" and ix["opclass"] == "halfvec_cosine_ops" and ix["valid"]
    assert ix["parameters"] == {"m": 16, "ef_construction": 64} and ix["predicate_dimension"] == DIM
    assert facts["settings"]["hnsw.ef_search"] == "40"
    assert facts["weknora_query"] == {**facts["weknora_query"], "top_k": 50, "inner_limit": 100, "ef_search": 100,
                                      "iterative_scan": "strict_order"}


def test_an_index_the_planner_does_not_use_is_found(clean_dsn):
    """With enable_indexscan off for the role's sessions, the planner seq-scans: index_not_used."""
    cluster = pgcluster.cluster()
    role = NOINDEX
    db = f"wknb_test_pgcheck_clean_{VERSION}"
    cluster.ensure_reader(db, role, PASSWORD)
    with cluster.connect() as admin:
        admin.execute(f"ALTER ROLE {role} SET enable_indexscan = off")
        admin.execute(f"ALTER ROLE {role} SET enable_bitmapscan = off")
    result = check_database(cluster.dsn(db, user=role, password=PASSWORD), ["kb-c"], sample=5)
    (unused,) = by_check(result)["index_not_used"]
    assert unused["data"]["index"] == f"embeddings_embedding_idx_{DIM}" and unused["severity"] == "info"
    assert "Seq Scan" in " ".join(unused["data"]["plan"])


def test_findings_are_capped_and_the_full_count_is_kept(faulty_dsn):
    result = check_database(faulty_dsn, ["kb-f"], max_findings=1)
    assert len(by_check(result)["embedding_orphan"]) == 1
    assert result["facts"]["truncated"]["embedding_orphan"] == 3


# ------------------------------------------------------------------------------------------ the DSN
def test_the_password_appears_in_no_result_or_log(faulty_dsn, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    result = check_database(faulty_dsn, ["kb-f"], sample=5)
    text = json.dumps(result, default=str)
    assert PASSWORD not in text and PASSWORD not in caplog.text
    assert "password=***" in caplog.text  # the DSN was logged, redacted
    with pytest.raises(AuthFailed) as refused:
        check_database(faulty_dsn.replace(PASSWORD, PASSWORD[::-1]), ["kb-f"])
    assert PASSWORD[::-1] not in str(refused.value) and "password authentication failed" in str(refused.value)
    assert not list(tmp_path.iterdir())  # nothing written
    server_log = pgcluster.cluster().pgdata / "log"  # nor in the server's log (the refused login is there)
    if server_log.is_file():
        text = server_log.read_text(encoding="utf-8", errors="replace")
        assert PASSWORD not in text and PASSWORD[::-1] not in text


def test_redact_dsn_masks_both_forms():
    assert redact_dsn("host=/tmp/s port=5432 dbname=kb user=r password='a b\\' c'") == \
        "host=/tmp/s port=5432 dbname=kb user=r password=***"
    assert redact_dsn("postgresql://r:s3cr3t@h:5432/kb?sslpassword=x&sslmode=require") == \
        "postgresql://r:***@h:5432/kb?sslpassword=***&sslmode=require"
    assert redact_text("failed: host=h password=s3cr3t user=r") == "failed: host=h password=*** user=r"


def test_unusable_input_is_a_usage_error_without_the_password(faulty_dsn):
    with pytest.raises(UsageError, match="not in the database"):
        check_database(faulty_dsn, ["no-such-kb"])
    with pytest.raises(UsageError) as bad:
        check_database(f"host=h password = {PASSWORD} oops", ["kb-f"])  # not a connection string
    assert PASSWORD not in str(bad.value)


def test_the_check_never_writes_and_cannot(faulty_dsn):
    """The session is read-only: a write through it fails (so does the role, which may only SELECT)."""
    import psycopg

    from weknora_nb.collect.checks.postgres import connect_readonly

    s = connect_readonly(faulty_dsn)
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            s.conn.execute("CREATE TEMP TABLE t (x int)")
    finally:
        s.conn.close()


def test_weknora_query_shape_and_budgets():
    assert weknora_top_k(10) == 50 and weknora_top_k(30) == 150 and weknora_top_k(200, 3) == 500
    assert weknora_vector_limits(50) == (100, 100) and weknora_vector_limits(150) == (200, 200)
    assert weknora_vector_limits(500) == (500, 500)
    sql = vector_query_sql(1024)
    assert "ORDER BY embedding::halfvec(1024) <=> %(vector)s::halfvec(1024) LIMIT %(inner_limit)s" in sql
    assert "(is_enabled IS NULL OR is_enabled = true)" in sql


def build_vector_typed(db: Any) -> None:
    """A knowledge base like the clean one whose embeddings column is ``vector``, not WeKnora's ``halfvec``."""
    b = Builder(db, seed=3)
    b.model("m16", DIM)
    b.kb("kb-v", "m16")
    b.knowledge("k1", "kb-v")
    b.healthy("kb-v", "k1", 50, "v-")
    db.execute("ALTER TABLE embeddings ALTER COLUMN embedding TYPE vector USING embedding::vector")
    db.execute("ANALYZE")


def test_a_check_whose_steps_could_not_run_is_incomplete_never_clean(roles):
    """Embeddings stored as ``vector``: some steps of the database check fail; the result says which and is not
    clean (``weknora-nb check`` exits 1), whatever the findings (issue 46)."""
    from weknora_nb.collect.checks.integrity import CheckResult

    got = check_database(reader_dsn("vector_typed", build_vector_typed), ["kb-v"])
    failed = {k for k, v in got["facts"]["steps"].items() if v["status"] != "ok"}
    assert failed, got["facts"]["steps"]
    result = CheckResult({"base_url": "http://x", "knowledge_base_ids": ["kb-v"], "database": True},
                         [], [], {"api": {}, "database": got["facts"]}, fingerprint="f")
    assert set(result.incomplete) == failed and not result.problems
    assert f"INCOMPLETE: {len(failed)} step(s) could not run" in result.describe()
    assert result.to_json()["incomplete"] == result.incomplete
