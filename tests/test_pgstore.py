"""The sandbox's vector path in a real Postgres + pgvector (weknora_nb/sandbox/pgstore.py): WeKnora's tables,
its HNSW index, its vector query, and the seeded integrity faults (docs/weknora-contract.md C70-C72, C75,
C89-C95), on the 8-chunk mini corpus (tests/fixtures/mini_kb)."""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import psycopg
import pytest

from weknora_nb.core.errors import ConfigError
from weknora_nb.sandbox.chunking import corpus_chunks
from weknora_nb.sandbox.engine import RetrievalEngine
from weknora_nb.sandbox.index import SandboxIndex
from weknora_nb.sandbox.pgstore import ef_search_for, expanded_top_k, halfvec_text
from weknora_nb.sandbox.runner import SandboxServer
from weknora_nb.sandbox.versions import load_versions

MINI = Path(__file__).parent / "fixtures" / "mini_kb"
KEY = "sk-test-pgstore-0123456789"
QUERY = "忘记管理员密码怎么办"
GONE, NO_VECTOR, COPY, ORIGINAL = "guide.01-passwords:000", "guide.03-vpn:001", "guide.02-rate-limit:002", \
    "guide.01-passwords:001"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return SandboxIndex(corpus_chunks(MINI), cache_dir=tmp_path_factory.mktemp("emb"), seed_dir=MINI / "cache")


@pytest.fixture(scope="module")
def versions():
    return load_versions(MINI / "versions.yaml")


@pytest.fixture(scope="module")
def faulty(versions):
    return replace(versions["baseline"], name="faulty", integrity_without_vectors=(NO_VECTOR,),
                   integrity_duplicated_vectors=((COPY, ORIGINAL),), integrity_deleted_chunks=(GONE,))


def rows(engine: RetrievalEngine, sql: str, *args) -> list[tuple]:
    with psycopg.connect(engine.vectors.dsn()) as conn:
        return conn.execute(sql, args or None).fetchall()


@pytest.mark.contract("C70", "C71")
def test_the_tables_have_weknoras_columns_and_types(index, versions):
    engine = RetrievalEngine(index, versions["baseline"])
    cols = {(t, c): d for t, c, d in rows(engine, "SELECT table_name, column_name, data_type FROM "
                                                  "information_schema.columns WHERE table_schema = 'public'")}
    for col in ("id", "knowledge_base_id", "knowledge_id", "content", "chunk_index", "is_enabled", "chunk_type",
                "deleted_at"):
        assert ("chunks", col) in cols
    assert cols[("embeddings", "embedding")] == "USER-DEFINED" and cols[("embeddings", "dimension")] == "integer"
    assert cols[("embeddings", "source_type")] == "integer" and ("embeddings", "deleted_at") not in cols
    unique = rows(engine, "SELECT indexdef FROM pg_indexes WHERE indexname = 'embeddings_unique_source'")
    assert "(source_id, source_type)" in unique[0][0]
    typ = rows(engine, "SELECT pg_typeof(embedding)::text FROM embeddings LIMIT 1")
    assert typ == [("halfvec",)]


@pytest.mark.contract("C72")
def test_the_vector_index_is_a_partial_hnsw_expression_index_with_the_versions_m(index, versions):
    engine = RetrievalEngine(index, replace(versions["baseline"], hnsw_m=4, hnsw_ef_construction=40))
    (name, definition), = rows(engine, "SELECT indexname, indexdef FROM pg_indexes WHERE indexdef LIKE '%hnsw%'")
    assert name == "embeddings_embedding_idx_512"
    assert "USING hnsw (((embedding)::halfvec(512)) halfvec_cosine_ops)" in definition
    assert "m='4'" in definition and "ef_construction='40'" in definition and "WHERE (dimension = 512)" in definition
    assert rows(engine, "SELECT current_setting('hnsw.ef_search')") == [("16",)]  # the database's default


def test_a_vector_is_written_as_text_that_reads_back_to_its_float32_values():
    rng = np.random.default_rng(4)
    for vector in (rng.standard_normal(512), rng.standard_normal(384) * 1e-8, np.array([0.0, -0.0, 1e30, 0.1]),
                   rng.standard_normal(8).astype(np.float32)[::2]):          # float64, tiny, huge, not contiguous
        text = halfvec_text(vector)
        assert text.startswith("[") and text.endswith("]") and " " not in text
        assert np.array_equal(np.array(text[1:-1].split(","), dtype=np.float32), vector.astype(np.float32))


@pytest.mark.contract("C75")
def test_the_query_sets_weknoras_ef_search_and_returns_cosine_best_first(index, versions):
    assert [expanded_top_k(k) for k in (1, 50, 60, 100, 150, 250)] == [100, 100, 120, 200, 200, 250]
    assert [ef_search_for(k) for k in (1, 50, 250)] == [100, 100, 250]
    engine = RetrievalEngine(index, versions["baseline"])
    qv = index.embedder(engine.version.embedding_model).query(QUERY)
    got = engine.vectors.search(qv, ["document"], top_k=5, threshold=0.0)
    exact = rows(engine, "SELECT chunk_id, 1 - (embedding::halfvec(512) <=> %s::halfvec(512)) FROM embeddings "
                         "ORDER BY 2 DESC LIMIT 5", halfvec_text(qv))
    assert [c for c, _ in got] == [c for c, _ in exact]
    assert np.allclose([s for _, s in got], [s for _, s in exact], atol=1e-6)
    # against the numpy cosine of the same float32 vectors: halfvec rounds to 3 decimals or so
    vecs = index.row_vectors(engine.version.embedding_model, "document")
    sims = dict(zip([index.chunks[p].id for p in index.rows("document")], vecs @ qv, strict=True))
    assert all(abs(sims[c] - s) < 2e-3 for c, s in got)
    high = got[1][1]
    assert [c for c, _ in engine.vectors.search(qv, ["document"], top_k=5, threshold=high)] == [c for c, _ in got[:2]]


@pytest.mark.contract("C89", "C92")
def test_a_soft_deleted_chunk_keeps_its_vector_is_not_served_and_shortens_the_answer(index, faulty, versions):
    engine = RetrievalEngine(index, faulty)
    assert rows(engine, "SELECT deleted_at IS NOT NULL FROM chunks WHERE id = %s", GONE) == [(True,)]
    assert rows(engine, "SELECT count(*) FROM embeddings WHERE chunk_id = %s", GONE) == [(1,)]
    qv = index.embedder(engine.version.embedding_model).query(QUERY)
    assert GONE in [c for c, _ in engine.vectors.search(qv, ["document"], 5, 0.0)]  # the row is still found
    clean = RetrievalEngine(index, versions["baseline"]).hybrid_search(QUERY, match_count=3, skip_enrichment=True)
    hits = engine.hybrid_search(QUERY, match_count=3, skip_enrichment=True)
    assert GONE in [index.chunks[h.idx].id for h in clean]
    assert GONE not in [index.chunks[h.idx].id for h in hits] and len(hits) == len(clean) - 1  # cut, then dropped
    with SandboxServer(faulty, data_dir=MINI, api_key=KEY) as sb, \
            httpx.Client(base_url=sb.base_url, headers={"X-API-Key": KEY}) as c:
        assert c.get(f"/api/v1/chunks/by-id/{GONE}").status_code == 404
        listed = c.get("/api/v1/chunks/guide.01-passwords", params={"page_size": 100}).json()
        assert GONE not in [x["id"] for x in listed["data"]] and listed["total"] == 2


@pytest.mark.contract("C90", "C91")
def test_rows_per_chunk_follow_weknoras_source_ids_and_seeded_faults_change_only_what_they_name(index, faulty):
    engine = RetrievalEngine(index, faulty)
    got = dict(rows(engine, "SELECT source_id, source_type FROM embeddings"))
    assert set(got.values()) == {0}
    assert set(got) == {c.id for c in index.chunks if c.chunk_type == "text"} - {NO_VECTOR}
    dims = rows(engine, "SELECT DISTINCT dimension, vector_dims(embedding) FROM embeddings")
    assert dims == [(512, 512)]
    same = rows(engine, "SELECT a.embedding = b.embedding FROM embeddings a, embeddings b "
                        "WHERE a.chunk_id = %s AND b.chunk_id = %s", COPY, ORIGINAL)
    assert same == [(True,)]
    # a chunk without a row is found by neither path (WeKnora's keyword path reads the same table, C74)
    hits = engine.hybrid_search("ZL-201 连接失败", match_count=8, skip_enrichment=True)
    assert NO_VECTOR not in [index.chunks[h.idx].id for h in hits]
    assert NO_VECTOR in [index.chunks[h.idx].id for h in RetrievalEngine(index, replace(
        faulty, integrity_without_vectors=())).hybrid_search("ZL-201 连接失败", match_count=8, skip_enrichment=True)]


@pytest.mark.contract("C90")
def test_an_faq_entry_in_separate_mode_has_one_row_per_question_named_chunk_dash_n(tmp_path, embedding_cache):
    from tests.test_contract_search import FAQ_SMALL  # the FAQ fixture of the search contract

    data = tmp_path / "kb"
    (data / "docs").mkdir(parents=True)
    (data / "docs" / "a.md").write_text("# 标题\n\n正文一段。\n", encoding="utf-8")
    (data / "faq").mkdir()
    (data / "faq" / "faq.jsonl").write_text(FAQ_SMALL.read_text(encoding="utf-8"), encoding="utf-8")
    (data / "versions.yaml").write_text("versions:\n  f:\n    faq: {enabled: true, question_index_mode: separate}\n",
                                        encoding="utf-8")
    with SandboxServer("f", data_dir=data, cache_dir=embedding_cache, api_key=KEY) as sb:   # never ~/.cache
        engine = sb.sandbox.engine
        faq = [c for c in engine.index.chunks if c.chunk_type == "faq" and c.faq.similar_questions]
        assert faq
        ids = [r[0] for r in rows(engine, "SELECT source_id FROM embeddings WHERE chunk_id = %s ORDER BY id",
                                  faq[0].id)]
        assert ids == [faq[0].id] + [f"{faq[0].id}-{n}" for n in range(1, len(faq[0].faq.similar_questions) + 1)]


@pytest.mark.contract("C93", "C94")
def test_knowledge_is_completed_and_the_model_row_holds_the_dimension(index, versions):
    engine = RetrievalEngine(index, versions["baseline"])
    assert rows(engine, "SELECT DISTINCT parse_status FROM knowledges") == [("completed",)]
    (params, kb_model), = rows(engine, "SELECT m.parameters, kb.embedding_model_id FROM models m JOIN "
                                       "knowledge_bases kb ON kb.embedding_model_id = m.id")
    assert params["embedding_parameters"]["dimension"] == 512 and kb_model == "use-multilingual-v3"


@pytest.mark.contract("C95")
def test_the_embeddings_endpoint_speaks_openais_format_with_the_versions_model(index):
    with SandboxServer("baseline", data_dir=MINI, api_key=KEY) as sb, httpx.Client(base_url=sb.embeddings_url) as c:
        auth = {"Authorization": f"Bearer {KEY}"}
        r = c.post("/embeddings", json={"model": "use-multilingual-v3", "input": [QUERY, "限流"],
                                        "encoding_format": "float"}, headers=auth)
        assert r.status_code == 200
        data = r.json()["data"]
        assert [d["index"] for d in data] == [0, 1] and len(data[0]["embedding"]) == 512
        want = sb.sandbox.engine.index.embedder("use-multilingual-v3").query(QUERY)
        assert np.allclose(data[0]["embedding"], want, atol=1e-6)
        assert c.post("/embeddings", json={"model": "use-multilingual-v3", "input": "x"}).status_code == 401
        assert c.post("/embeddings", json={"model": "other", "input": "x"}, headers=auth).status_code == 404
        assert c.post("/embeddings", json={"model": "use-multilingual-v3", "input": []}, headers=auth).status_code \
            == 400


def test_a_reader_role_reads_with_its_password_and_cannot_write(index):
    password = secrets.token_hex(8)
    with SandboxServer("baseline", data_dir=MINI, api_key=KEY) as sb:
        dsn = sb.reader_dsn(password)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 8
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("DELETE FROM embeddings")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(dsn.replace(password, "wrong"))
    with pytest.raises(psycopg.OperationalError):  # the role is dropped with the server
        psycopg.connect(dsn)


def test_reader_roles_made_and_dropped_at_once_on_one_database_all_work(index):
    # servers of one database (the demo's baseline and rerank) hand out roles at the same time: grants on one
    # schema from two sessions at once can fail ("tuple concurrently updated") unless they take turns
    from concurrent.futures import ThreadPoolExecutor

    from weknora_nb.sandbox.pgcluster import cluster

    with SandboxServer("baseline", data_dir=MINI, api_key=KEY) as sb:
        dbname, pg = sb.sandbox.engine.vectors.dbname, cluster()
        roles = [f"weknora_nb_test_race_{secrets.token_hex(3)}_{i}" for i in range(12)]
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda r: pg.ensure_reader(dbname, r, "pw-" + r), roles))
        for r in roles:
            with psycopg.connect(sb.sandbox.engine.vectors.dsn(user=r, password="pw-" + r)) as conn:
                assert conn.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 8
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda r: pg.drop_role(dbname, r), roles))
        with pg.connect() as admin:
            assert admin.execute("SELECT count(*) FROM pg_roles WHERE rolname = ANY(%s)", (roles,)).fetchone()[0] == 0


def test_a_fault_naming_an_unknown_chunk_is_a_config_error(index, versions):
    with pytest.raises(ConfigError, match="integrity names unknown chunks: nope"):
        _ = RetrievalEngine(index, replace(versions["baseline"], integrity_deleted_chunks=("nope",))).vectors
    with pytest.raises(ConfigError, match="integrity.duplicated_vectors must be a list of"):
        load_versions(_write(index, "versions:\n  v:\n    integrity: {duplicated_vectors: [a, b]}\n"))


def _write(index, text: str) -> Path:
    path = Path(index.cache_dir) / "versions.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_sandbox_serve_prints_a_dsn_that_works_with_the_password_from_the_environment(monkeypatch, capsys):
    from weknora_nb.cli.sandbox import PG_PASSWORD_ENV, print_sandbox_database

    password = "pw-" + secrets.token_hex(6)
    monkeypatch.setenv(PG_PASSWORD_ENV, password)
    with SandboxServer("baseline", data_dir=MINI, api_key=KEY) as sb:
        print_sandbox_database(sb)
        out = capsys.readouterr().out
        assert password not in out
        dsn = out.split('WEKNORA_NB_PG_DSN="', 1)[1].split('"', 1)[0].replace(f"${PG_PASSWORD_ENV}", password)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 8
        assert f"--embeddings-url {sb.embeddings_url}" in out
