"""The vector-store trace (weknora_nb.collect.checks.vectortrace) against a real Postgres + pgvector: an HNSW index with
a tiny m / ef_construction misses chunks exact search finds (index_miss), a far chunk is an embedding_miss, and
with the index disabled the recall against exact search is 1.0. Queries are embedded by a real loopback HTTP
server returning fixed vectors."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from weknora_nb.collect.checks.embeddings import EMBEDDINGS_API_KEY_ENV, EmbeddingSettings, embed_texts
from weknora_nb.collect.checks.vectortrace import trace_queries
from weknora_nb.core.errors import AuthFailed, ProtocolFailed, UsageError
from weknora_nb.core.testset import TestSet

pytest.importorskip("psycopg")
pgcluster = pytest.importorskip("weknora_nb.sandbox.pgcluster")

SCHEMA = Path(__file__).resolve().parents[1] / "weknora_nb" / "sandbox" / "weknora_schema.sql"
N, DIM, M, EF_CONSTRUCTION = 3000, 32, 2, 4  # a graph this sparse misses most neighbours (measured: ~70% at K=10)
DB = "wknb_test_vectortrace_v1"
PASSWORD = "vt-reader-pw-6d1f"
KEY = "sk-test-embeddings-key-93a1"
ROWS = np.random.default_rng(7).normal(size=(N, DIM)).astype(np.float16)
QUERIES = np.random.default_rng(8).normal(size=(12, DIM))


def _vec(v: np.ndarray) -> str:
    return "[" + ",".join(repr(float(x)) for x in v) + "]"


def _build(db: Any) -> None:
    db.execute(SCHEMA.read_text(encoding="utf-8"))
    with db.cursor().copy("COPY embeddings (source_id, source_type, chunk_id, knowledge_id, knowledge_base_id,"
                          " content, dimension, embedding) FROM STDIN") as copy:
        for i, v in enumerate(ROWS):
            copy.write_row((f"c{i}", 0, f"c{i}", "k1", "kb-t", "x", DIM, _vec(v)))
    db.execute(f"CREATE INDEX embeddings_embedding_idx_{DIM} ON embeddings USING hnsw ((embedding::halfvec({DIM}))"
               f" halfvec_cosine_ops) WITH (m = {M}, ef_construction = {EF_CONSTRUCTION}) WHERE (dimension = {DIM})")
    db.execute("ANALYZE")


class _Embeddings(BaseHTTPRequestHandler):
    vectors: dict[str, list[float]] = {}
    seen_keys: list[str] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen_keys.append(self.headers.get("Authorization", ""))
        if type(self).status != 200:
            payload = {"error": {"message": "bad key", "type": "auth"}}
        else:  # in reverse order, with their index: the client must put them back in order
            data = [{"index": i, "embedding": self.vectors[t]} for i, t in enumerate(body["input"])]
            payload = {"object": "list", "model": body["model"], "data": data[::-1]}
        raw = json.dumps(payload).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Embeddings)
    # it looks for shutdown() every poll interval: 0.5 s by default, the module's end waited for it
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def dsn() -> str:
    cluster = pgcluster.cluster()
    cluster.ensure_database(DB, _build)
    cluster.ensure_reader(DB, "wknb_test_vectortrace_reader", PASSWORD)
    return cluster.dsn(DB, user="wknb_test_vectortrace_reader", password=PASSWORD)


def _exact(q: np.ndarray) -> np.ndarray:
    """Row numbers by cosine distance to ``q`` (numpy, over the halfvec values): the truth, independent of SQL."""
    x = ROWS.astype(np.float64)
    qh = q.astype(np.float16).astype(np.float64)
    return np.argsort(1 - (x @ qh) / (np.linalg.norm(x, axis=1) * np.linalg.norm(qh)), kind="stable")


def _indexed_top10(dsn: str, q: np.ndarray) -> list[str]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as db, db.transaction():
        db.execute("SET LOCAL hnsw.ef_search = 100")
        db.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        rows = db.execute(f"SELECT chunk_id FROM embeddings WHERE dimension = {DIM} ORDER BY embedding::halfvec({DIM})"
                          f" <=> %s::halfvec({DIM}) LIMIT 100", (_vec(q),)).fetchall()
    return [r[0] for r in rows[:10]]


@pytest.fixture(scope="module")
def testset(dsn, server) -> list[dict[str, Any]]:
    """Per query: a chunk the index finds (when there is one), one it misses that exact search ranks in its top
    10, and the farthest chunk of all."""
    _Embeddings.vectors = {f"query {i}": [float(x) for x in q] for i, q in enumerate(QUERIES)}
    records = []
    for i, q in enumerate(QUERIES):
        order = [f"c{j}" for j in _exact(q)]
        indexed = _indexed_top10(dsn, q)
        relevant = {c: 2 for c in order[:10] if c not in indexed}  # index misses
        relevant.update({c: 1 for c in order[:10] if c in indexed})  # hits
        relevant[order[-1]] = 3  # the farthest: an embedding miss
        records.append({"query_id": f"q{i}", "query": f"query {i}", "relevant": relevant})
    return records


@pytest.fixture(scope="module")
def trace(dsn, server, testset, monkeypatch_module):
    return _trace(dsn, server, testset, monkeypatch_module)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _reader_with(name: str, setting: str) -> str:
    """The DSN of a reader role of the test database (``wknb_test_vectortrace_<name>``) whose sessions start with
    ``setting`` (``parameter = value``)."""
    cluster = pgcluster.cluster()
    role = f"wknb_test_vectortrace_{name}"
    cluster.ensure_reader(DB, role, PASSWORD)
    with cluster.connect() as admin:
        admin.execute(f"ALTER ROLE {role} SET {setting}")
    return cluster.dsn(DB, user=role, password=PASSWORD)


def _trace(dsn: str, server: str, testset: list[dict[str, Any]], mp: pytest.MonkeyPatch) -> Any:
    """``testset`` traced through ``dsn`` at ef_search 10, 40 and 400 (the ``trace`` fixture's; the queries' fixed
    vectors put back first: a test may have changed them)."""
    mp.setenv(EMBEDDINGS_API_KEY_ENV, KEY)
    _Embeddings.vectors = {f"query {i}": [float(x) for x in q] for i, q in enumerate(QUERIES)}
    return trace_queries(dsn, ["kb-t"], testset, EmbeddingSettings(server, "fixed"), ef_sweep=(10, 40, 400))


def test_index_misses_embedding_misses_and_hits_are_told_apart(trace, testset):
    at10 = trace.chunks[trace.chunks["k"] == 10].set_index(["query_id", "chunk_id"])
    expected = {(r["query_id"], c): {1: "hit", 2: "index_miss", 3: "embedding_miss"}[g]
                for r in testset for c, g in r["relevant"].items()}
    assert {key: at10.loc[key, "status"] for key in expected} == expected
    assert sum(s == "index_miss" for s in expected.values()) > 0  # the sparse graph missed some
    far = at10[at10["status"] == "embedding_miss"]
    assert far["has_vector"].all() and (far["exact_distance"] > 1).all() and far["exact_rank"].isna().all()
    assert set(trace.chunks["k"]) == {50, 10}  # WeKnora's TopK at match_count 10, and 10


def test_recall_against_exact_search_is_below_one_for_the_sparse_index_and_reported_per_ef(trace):
    summary = trace.summary
    assert summary["weknora"] == {**summary["weknora"], "top_k": 50, "inner_limit": 100, "ef_search": 100,
                                  "iterative_scan": "strict_order"}
    assert 0 < summary["recall"]["10"] < 1
    sweep = {row["ef_search"]: row["recall"]["10"] for row in summary["sweep"]}
    assert set(sweep) == {10, 40, 100, 400} and sweep[400] >= sweep[10]
    counts = summary["status_counts"]["10"]
    assert summary["index_miss_share"]["10"] == counts["index_miss"] / (counts["index_miss"] + counts["embedding_miss"])
    per_query = trace.queries[(trace.queries["weknora"]) & (trace.queries["k"] == 10)]
    assert len(per_query) == len(QUERIES) and abs(per_query["recall"].mean() - summary["recall"]["10"]) < 1e-12
    # 3,000 rows: the planner uses the index, so WeKnora's query as planned is the index's search
    assert summary["planner_uses_index"] == {str(DIM): True}
    assert trace.chunks["status"].tolist() == trace.chunks["status_index"].tolist()
    assert summary["recall_as_planned"] == summary["recall"]


def test_with_index_scans_off_weknoras_query_is_exact_and_the_forced_index_still_misses(dsn, server, testset,
                                                                             monkeypatch_module):
    monkeypatch_module.setenv(EMBEDDINGS_API_KEY_ENV, KEY)
    result = trace_queries(_reader_with("noindex", "enable_indexscan = off"), ["kb-t"], TestSet.from_records(testset),
                           EmbeddingSettings(server, "fixed"), ef_sweep=(10,))
    # WeKnora's query as planned is then an exact search: what it returns is what exact search returns
    assert result.summary["planner_uses_index"] == {str(DIM): False}
    assert result.summary["recall_as_planned"] == {"50": 1.0, "10": 1.0}
    assert "index_miss" not in set(result.chunks["status"])
    # through the index (forced), the sparse graph still misses what it missed with the index in use
    assert result.summary["recall"]["10"] < 1 and "index_miss" in set(result.chunks["status_index"])
    assert result.summary["warnings"] == []


def test_every_search_is_planned_with_its_own_values_whatever_the_plan_cache_would_do(dsn, server, testset, trace,
                                                                                    monkeypatch_module):
    # a prepared statement's generic plan cannot prove `dimension = $2` for the index's `WHERE dimension = 32`:
    # through it the "forced index" search is a sort of every row (an exact search) and WeKnora's query as planned
    # never uses the index; Postgres takes such a plan after a statement's fifth run when it looks cheaper, and
    # always with plan_cache_mode = force_generic_plan (here on the role). The trace's figures must not change.
    generic = _reader_with("generic", "plan_cache_mode = force_generic_plan")
    result = _trace(generic, server, testset, monkeypatch_module)
    pd.testing.assert_frame_equal(result.queries, trace.queries)
    pd.testing.assert_frame_equal(result.chunks, trace.chunks)
    assert result.summary["recall"]["10"] < 1 and "index_miss" in set(result.chunks["status_index"])


def test_without_pipeline_mode_the_trace_is_the_same(dsn, server, testset, trace, monkeypatch, monkeypatch_module):
    # a libpq older than 14 has no pipeline mode: each statement then waits for the server, with the same rows
    import psycopg

    monkeypatch.setattr(psycopg.Pipeline, "is_supported", classmethod(lambda cls: False))
    result = _trace(dsn, server, testset, monkeypatch_module)
    pd.testing.assert_frame_equal(result.queries, trace.queries)
    pd.testing.assert_frame_equal(result.chunks, trace.chunks)


def test_in_pipeline_mode_each_search_has_its_settings_in_a_transaction_of_its_own(dsn):
    # BEGIN and COMMIT go into the pipeline as statements (no wait for the server per search): each search's
    # SET LOCAL values hold for it alone, and once the pipeline is synced the session is as it was
    from weknora_nb.collect.checks.postgres import connect_readonly
    from weknora_nb.collect.checks.vector_search import weknora_search_settings
    from weknora_nb.collect.checks.vectortrace import _pipeline

    s = connect_readonly(dsn)
    try:
        show = "SELECT current_setting('hnsw.ef_search'), current_setting('enable_seqscan'), current_setting(" \
               "'plan_cache_mode')"
        s.conn.execute("SELECT '[1]'::vector")  # pgvector's library loaded: its settings known to the session
        before = s.conn.execute(show).fetchone()
        with _pipeline(s.conn):
            assert s.conn.info.pipeline_status.name == "ON"
            seen = []
            for ef, knobs in ((41, {"enable_seqscan": "off"}), (400, None)):
                with weknora_search_settings(s, ef, "strict_order", knobs):
                    seen.append(s.conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting("
                                               "'enable_seqscan'), current_setting('plan_cache_mode'), now()"))
            after = s.conn.execute(show)
        rows = [c.fetchone() for c in seen]
        assert [r[:3] for r in rows] == [("41", "off", "force_custom_plan"), ("400", "on", "force_custom_plan")]
        assert before[0] not in ("41", "400") and before[2] != "force_custom_plan"
        assert rows[0][3] != rows[1][3]  # two transactions (now() is the start of its transaction)
        assert after.fetchone() == before and s.conn.info.transaction_status.name == "IDLE"
    finally:
        s.conn.close()


def test_a_search_failing_in_the_pipeline_raises_its_error_and_leaves_the_session_usable(dsn):
    import psycopg

    from weknora_nb.collect.checks.postgres import connect_readonly
    from weknora_nb.collect.checks.vector_search import weknora_search_settings
    from weknora_nb.collect.checks.vectortrace import _pipeline

    s = connect_readonly(dsn)
    try:
        s.conn.execute("SELECT '[1]'::vector")
        before = s.conn.execute("SELECT current_setting('hnsw.ef_search')").fetchone()
        with pytest.raises(psycopg.errors.DivisionByZero), _pipeline(s.conn):
            with weknora_search_settings(s, 41, "strict_order"):
                s.conn.execute("SELECT 1 / 0")
            with weknora_search_settings(s, 400, "strict_order"):
                s.conn.execute("SELECT 1")
        assert s.conn.info.transaction_status.name == "IDLE"  # the aborted transaction was rolled back
        assert s.conn.execute("SELECT current_setting('hnsw.ef_search')").fetchone() == before != ("41",)
    finally:
        s.conn.close()


@pytest.mark.parametrize(("vector", "said"), [
    ([1.0] * 8, f"answers vectors of dimension 8, but the knowledge bases' embeddings have dimension {DIM}"),
    ([0.0] * DIM, "answers an all-zero vector for 1 of 1 queries"),
    ([1e308] * DIM, "answers values up to 1e+308, beyond the +-65504 WeKnora's halfvec embeddings hold"),
])
def test_an_embeddings_model_that_cannot_be_the_knowledge_bases_is_refused(dsn, server, monkeypatch_module, vector,
                                                                          said):
    """A model of another dimension, one that answers zeros or values a halfvec cannot hold would make every
    labelled chunk an embedding miss (issue 46): refused, naming what the knowledge base has."""
    monkeypatch_module.setenv(EMBEDDINGS_API_KEY_ENV, KEY)
    _Embeddings.vectors = {"wrong": vector}
    with pytest.raises(UsageError, match=re.escape(said)):
        trace_queries(dsn, ["kb-t"], [{"query_id": "s", "query": "wrong", "relevant": {"c1": 1}}],
                      EmbeddingSettings(server, "other-model"), ef_sweep=())


def test_the_trace_is_written_and_holds_no_secret(trace, tmp_path):
    paths = trace.write(tmp_path / "trace")
    assert pd.read_parquet(paths["chunks"]).shape == trace.chunks.shape
    assert json.loads(paths["summary"].read_text(encoding="utf-8"))["queries"] == len(QUERIES)
    for p in paths.values():
        raw = p.read_bytes()
        assert KEY.encode() not in raw and PASSWORD.encode() not in raw
    assert f"Bearer {KEY}" in _Embeddings.seen_keys  # the key went to the server, and only there


def test_embedding_failures_are_request_failures_without_the_key(server, monkeypatch):
    monkeypatch.setenv(EMBEDDINGS_API_KEY_ENV, KEY)
    _Embeddings.vectors = {"a": [1.0, 0.0], "b": [0.0, 1.0]}
    assert embed_texts(EmbeddingSettings(server, "fixed", batch_size=1), ["b", "a"]) == [[0.0, 1.0], [1.0, 0.0]]
    _Embeddings.status = 401
    try:
        with pytest.raises(AuthFailed, match=EMBEDDINGS_API_KEY_ENV) as refused:
            embed_texts(EmbeddingSettings(server, "fixed"), ["a"])
    finally:
        _Embeddings.status = 200
    assert KEY not in str(refused.value)
    _Embeddings.vectors = {"a": []}
    with pytest.raises(ProtocolFailed):
        embed_texts(EmbeddingSettings(server, "fixed"), ["a"])


@pytest.mark.parametrize("kwargs, argument", [
    ({"base_url": "ftp://x"}, "--embeddings-url"), ({"model": " "}, "--embeddings-model"),
    ({"timeout_s": 0}, "timeout_s"), ({"max_attempts": 0}, "max_attempts"), ({"batch_size": True}, "batch_size"),
])
def test_embedding_and_judge_settings_are_checked_alike_naming_their_own_options(kwargs, argument):
    from weknora_nb.collect.judge.llm import LLMSettings
    from weknora_nb.core.errors import UsageError

    with pytest.raises(UsageError) as err:
        EmbeddingSettings(**{"base_url": "http://127.0.0.1:9/v1", "model": "m", **kwargs})
    assert err.value.argument == argument
    judge_option = {"--embeddings-url": "--base-url", "--embeddings-model": "--model", "timeout_s": "--timeout",
                    "max_attempts": "--max-attempts"}.get(argument)
    if judge_option is not None:
        with pytest.raises(UsageError) as err:
            LLMSettings(**{"base_url": "http://127.0.0.1:9/v1", "model": "m", **kwargs})
        assert err.value.argument == judge_option


def test_settings_show_their_url_redacted_and_keep_their_defaults():
    from weknora_nb.collect.http.client import ClientSettings
    from weknora_nb.collect.judge.llm import JUDGE_API_KEY_ENV, LLMSettings

    url = "http://user:secret@127.0.0.1:9/v1?api_key=secret"
    for settings in (EmbeddingSettings(url, "m"), LLMSettings(url, "m"), ClientSettings(url)):
        shown = repr(settings)
        assert shown.startswith(type(settings).__name__ + "(base_url=") and "secret" not in shown
    e, j = EmbeddingSettings(url, "m"), LLMSettings(url, "m")
    assert (e.api_key_env, e.timeout_s, e.max_connections, e.batch_size) == (EMBEDDINGS_API_KEY_ENV, 60.0, 4, 32)
    assert (j.api_key_env, j.timeout_s, j.max_connections, j.backoff_base_s) == (JUDGE_API_KEY_ENV, 120.0, 16, 1.0)
