"""The Postgres/pgvector check (weknora_nb.collect.checks.database) on a generated knowledge base of a million vectors.

Builds, in the sandbox's Postgres (weknora_nb.sandbox.pgcluster), a database in WeKnora's table shapes holding one
knowledge base of ``--rows`` embeddings rows of dimension ``--dim`` (clustered random vectors, written with a
binary COPY built by numpy), its chunks (generated in SQL), a few seeded faults (chunks without a row, orphan
rows, duplicated vectors), and a vector index (``--index``: HNSW with WeKnora's m = 16, ef_construction = 64,
built with ``maintenance_work_mem`` and parallel workers; or IVFFlat; or none). Then runs ``check_database`` as a
read-only role in a child process and prints its time, the client's peak RSS, the peak RSS of the server
backends serving it (the leader and parallel workers, sampled from /proc), and each step's time.

The database is dropped at the end unless ``--keep`` (a million rows of 256 dimensions are about 1.5 GB).

    python benchmarks/bench_pgcheck.py [--rows 1000000] [--dim 256] [--index hnsw|ivfflat|none] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from weknora_nb.sandbox.pgcluster import cluster

SCHEMA = Path(__file__).resolve().parents[1] / "weknora_nb" / "sandbox" / "weknora_schema.sql"
KB = "kb-bench"
N_MISSING, N_ORPHANS, N_DUP_PAIRS = 100, 100, 50
COLUMNS = "source_id, source_type, chunk_id, knowledge_id, knowledge_base_id, content, dimension, embedding, is_enabled"

CHILD = """
import json, sys, time
from weknora_nb.collect.checks.database import check_database
import psycopg  # loaded before the baseline, as the check loads it
# /proc's VmHWM, not getrusage's ru_maxrss: Linux carries the parent's peak over an exec into ru_maxrss
kb = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key + ":")).split()[1])
baseline_kb = kb("VmRSS")
t0 = time.perf_counter()
result = check_database(sys.argv[1], [sys.argv[2]], statement_timeout_s=float(sys.argv[3]))
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "maxrss_kb": kb("VmHWM"),
                  "baseline_kb": baseline_kb,
                  "findings": [[f["check"], f["severity"]] for f in result["findings"]], "facts": result["facts"]},
                 default=str))
"""


def copy_block(start: int, vectors: np.ndarray, *, chunk_prefix: str = "c") -> bytes:
    """Binary COPY rows for ``vectors`` (float16), chunk ids ``{prefix}{start + i:09d}``, 1,000 chunks a knowledge."""
    n, dim = vectors.shape
    dt = np.dtype([("nf", ">i2"), ("l1", ">i4"), ("source_id", "S10"), ("l2", ">i4"), ("source_type", ">i4"),
                   ("l3", ">i4"), ("chunk_id", "S10"), ("l4", ">i4"), ("knowledge_id", "S8"), ("l5", ">i4"),
                   ("kb", "S8"), ("l6", ">i4"), ("content", "S1"), ("l7", ">i4"), ("dimension", ">i4"),
                   ("l8", ">i4"), ("vdim", ">i2"), ("unused", ">i2"), ("vec", ">f2", (dim,)), ("l9", ">i4"),
                   ("enabled", "u1")])
    rows = np.zeros(n, dtype=dt)
    ids = np.array([f"{chunk_prefix}{start + i:09d}" for i in range(n)], dtype="S10")
    rows["nf"] = 9
    rows["l1"], rows["source_id"], rows["l2"], rows["source_type"] = 10, ids, 4, 0
    rows["l3"], rows["chunk_id"] = 10, ids
    rows["l4"] = 8
    rows["knowledge_id"] = np.array([f"k{(start + i) // 1000:07d}" for i in range(n)], dtype="S8")
    rows["l5"], rows["kb"], rows["l6"], rows["content"] = 8, KB.encode(), 1, b"x"
    rows["l7"], rows["dimension"] = 4, dim
    rows["l8"], rows["vdim"], rows["vec"] = 4 + 2 * dim, dim, vectors
    rows["l9"], rows["enabled"] = 1, 1
    return rows.tobytes()


def vectors_for(rng: np.random.Generator, n: int, dim: int, centres: np.ndarray) -> np.ndarray:
    """Clustered vectors (a centre plus noise), as real embeddings are, in float16."""
    pick = rng.integers(0, len(centres), size=n)
    return (centres[pick] + 0.35 * rng.normal(size=(n, dim))).astype(np.float16)


def load(db: Any, rows: int, dim: int, block: int = 50_000) -> dict[str, float]:
    """Schema, the knowledge base's rows and chunks, and the seeded faults; seconds per part."""
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    db.execute(SCHEMA.read_text(encoding="utf-8"))
    db.execute("ALTER TABLE chunks ADD COLUMN status INT NOT NULL DEFAULT 0")
    db.execute("INSERT INTO models VALUES ('m-bench', 1, 'bench', 'Embedding', 'remote', %s)",
               (json.dumps({"embedding_parameters": {"dimension": dim}}),))
    db.execute("INSERT INTO knowledge_bases (id, name, tenant_id, embedding_model_id) VALUES (%s, %s, 1, 'm-bench')",
               (KB, KB))
    n_chunks = rows - N_ORPHANS + N_MISSING  # chunks 0 .. n_chunks-1; the last N_MISSING get no row
    db.execute("INSERT INTO knowledges (id, tenant_id, knowledge_base_id, type, title, source, parse_status)"
               " SELECT 'k' || lpad(i::text, 7, '0'), 1, %s, 'file', 'doc ' || i, 'upload', 'completed'"
               " FROM generate_series(0, %s) i", (KB, n_chunks // 1000))
    db.execute("INSERT INTO chunks (id, tenant_id, knowledge_base_id, knowledge_id, content, chunk_index, is_enabled,"
               " start_at, end_at, chunk_type, status) SELECT 'c' || lpad(i::text, 9, '0'), 1, %s,"
               " 'k' || lpad((i / 1000)::text, 7, '0'), 'content of chunk ' || i, i %% 1000, true, 0, 1, 'text', 2"
               " FROM generate_series(0, %s) i", (KB, n_chunks - 1))
    t["chunks_sql"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(2000, dim))
    with_rows = n_chunks - N_MISSING
    dup_at = rng.choice(with_rows // 2, size=N_DUP_PAIRS, replace=False) * 2
    header, trailer = b"PGCOPY\n\xff\r\n\0" + b"\0" * 8, b"\xff\xff"
    with db.cursor().copy(f"COPY embeddings ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(header)
        for start in range(0, with_rows, block):
            v = vectors_for(rng, min(block, with_rows - start), dim, centres)
            for d in dup_at[(dup_at >= start) & (dup_at < start + len(v) - 1)] - start:
                v[d + 1] = v[d]  # a duplicated vector on two chunks
            copy.write(copy_block(start, v))
        copy.write(copy_block(0, vectors_for(rng, N_ORPHANS, dim, centres), chunk_prefix="o"))  # chunks not there
        copy.write(trailer)
    t["copy_binary"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    db.execute("ANALYZE")
    t["analyze"] = time.perf_counter() - t0
    return t


def build_index(db: Any, kind: str, dim: int, rows: int, maintenance_work_mem: str) -> float:
    """The vector index WeKnora's migrations create (HNSW m = 16, ef_construction = 64), or IVFFlat; seconds."""
    t0 = time.perf_counter()
    db.execute(f"SET maintenance_work_mem = '{maintenance_work_mem}'")
    db.execute("SET max_parallel_maintenance_workers = 2")
    expr = f"((embedding::halfvec({dim})) halfvec_cosine_ops)"
    if kind == "hnsw":
        db.execute(f"CREATE INDEX embeddings_embedding_idx_{dim} ON embeddings USING hnsw {expr}"
                   f" WITH (m = 16, ef_construction = 64) WHERE (dimension = {dim})")
    elif kind == "ivfflat":
        lists = max(10, int(rows ** 0.5))  # pgvector's advice: rows / 1000 up to 1M rows, sqrt(rows) above
        db.execute(f"CREATE INDEX embeddings_embedding_idx_{dim} ON embeddings USING ivfflat {expr}"
                   f" WITH (lists = {lists}) WHERE (dimension = {dim})")
    db.execute("ANALYZE embeddings")
    return time.perf_counter() - t0


class BackendPeak(threading.Thread):
    """Samples, every 0.1 s, the memory of the Postgres backends with ``application_name`` and of their parallel
    workers: the peak RSS (VmHWM, kB: shared buffers a backend touched included) and the largest private
    (anonymous) RSS seen (RssAnon, kB: its own sorts, hashes, plan)."""

    def __init__(self, admin_dsn: str, application_name: str = "weknora-nb check"):
        super().__init__(daemon=True)
        self.admin_dsn, self.app = admin_dsn, application_name
        self.peak_kb: dict[int, int] = {}
        self.anon_kb: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_dsn, autocommit=True) as db:
            while not self.stop.is_set():
                pids = [r[0] for r in db.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s OR leader_pid IN"
                    " (SELECT pid FROM pg_stat_activity WHERE application_name = %s)", (self.app, self.app))]
                for pid in pids:
                    status = _proc_status(pid)
                    for key, peaks in (("VmHWM", self.peak_kb), ("RssAnon", self.anon_kb)):
                        if key in status:
                            peaks[pid] = max(peaks.get(pid, 0), status[key])
                time.sleep(0.1)


def _proc_status(pid: int) -> dict[str, int]:
    """The kB fields of /proc/<pid>/status (empty when the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in lines) if v.strip().endswith("kB")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--index", choices=("hnsw", "ivfflat", "none"), default="hnsw")
    ap.add_argument("--maintenance-work-mem", default="4GB")
    ap.add_argument("--statement-timeout", type=float, default=120.0)
    ap.add_argument("--keep", action="store_true", help="keep the database (reused by the next run)")
    args = ap.parse_args()
    pg = cluster()
    name = f"wknb_bench_pgcheck_{args.rows}_{args.dim}_{args.index}"
    timings: dict[str, float] = {}

    def build(db: Any) -> None:
        timings.update(load(db, args.rows, args.dim))
        db.commit()
        if args.index != "none":
            timings["index"] = build_index(db, args.index, args.dim, args.rows, args.maintenance_work_mem)

    t0 = time.perf_counter()
    pg.ensure_database(name, build)
    print(f"database {name}: ready in {time.perf_counter() - t0:.1f} s "
          + (" ".join(f"{k}={v:.1f}s" for k, v in timings.items()) or "(reused)"))
    with pg.connect(name) as db:
        size = db.execute("SELECT pg_size_pretty(pg_total_relation_size('embeddings')),"
                          " (SELECT count(*) FROM embeddings)").fetchone()
    print(f"embeddings: {size[1]} rows, {size[0]} with indexes")
    password = secrets.token_hex(16)
    pg.ensure_reader(name, "wknb_bench_reader", password)
    try:
        run_check(pg, name, password, args.statement_timeout)
    finally:
        if not args.keep:
            with pg.connect() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            print(f"dropped {name}")


def run_check(pg: Any, name: str, password: str, statement_timeout: float) -> None:
    """check_database as the read-only role in a child process: its time, peak memories, per-step times."""
    monitor = BackendPeak(pg.dsn(name))
    monitor.start()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", CHILD, pg.dsn(name, user="wknb_bench_reader", password=password),
                          KB, str(statement_timeout)], capture_output=True, text=True, env=env)
    monitor.stop.set()
    monitor.join()
    if out.returncode:
        sys.exit(f"the check failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout)
    facts = res["facts"]
    print(f"check_database: {res['seconds']:.1f} s, client peak RSS {res['maxrss_kb'] / 1024:.0f} MB "
          f"({res['baseline_kb'] / 1024:.0f} MB after the imports, before the check), "
          f"{len(monitor.peak_kb)} server backends (leader and parallel workers): largest peak RSS "
          f"{max(monitor.peak_kb.values(), default=0) / 1024:.0f} MB (VmHWM: shared buffers touched included), "
          f"largest private RSS {max(monitor.anon_kb.values(), default=0) / 1024:.0f} MB (RssAnon, sampled)")
    for step, s in facts["steps"].items():
        print(f"  {step:16s} {s['seconds']:8.2f} s  {s['status']}")
    counts: dict[str, int] = {}
    for check, severity in res["findings"]:
        counts[f"{check} ({severity})"] = counts.get(f"{check} ({severity})", 0) + 1
    print("findings:", json.dumps(counts), "truncated:", json.dumps(facts.get("truncated", {})))
    print("near duplicates:", json.dumps(facts.get("near_duplicates")))
    print("planner:", json.dumps(facts.get("planner")))
    print("indexes:", json.dumps([{k: ix[k] for k in ("name", "method", "parameters", "size_bytes")}
                                  for ix in facts.get("indexes", [])]))


if __name__ == "__main__":
    main()
