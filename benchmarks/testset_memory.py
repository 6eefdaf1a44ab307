"""Test-set loading at scale: seconds and peak memory for 1,000,000 queries.

Writes one test set of ``--n`` queries (each with ~3 labels, a query text of ~30 characters
of mixed Chinese and English, a ``query_type`` and one tag) as JSONL, CSV (``relevant`` as
JSON text) and Parquet (``relevant`` a map column, ``tags`` a list column) in a temporary
folder, then loads each file with ``weknora_nb.load_testset`` in a fresh Python process
and prints the seconds to load, the seconds to compute ``TestSet.hash``, and the peak
resident memory of that process (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the
interpreter and its imports included; their share is printed on its own line). The files
are written by child processes too, so that this process stays small: on Linux a child's
``ru_maxrss`` starts from the size of the process that started it.
Goal: peak memory under 1 GB for each format at 1,000,000 queries.

    python benchmarks/testset_memory.py [--n 1000000] [--formats jsonl,csv,parquet] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_MB = 1024

#: what the child process runs: load, hash, report (ru_maxrss is KiB on Linux)
CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from weknora_nb.core.testset import load_testset
t1 = time.perf_counter()
if sys.argv[1] != "-":
    ts = load_testset(sys.argv[1])
    t2 = time.perf_counter()
    h = ts.hash
    t3 = time.perf_counter()
    n, n_labels = len(ts), len(ts.qrels)
else:
    t2 = t3 = t1
    h, n, n_labels = "", 0, 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "hash_s": t3 - t2, "rss_mb": rss, "hash": h,
                  "n": n, "n_labels": n_labels}))
"""

TYPES = ("factual", "procedural", "troubleshooting", "comparison", "definition")
TAGS = ("frequent", "long-tail", "english", "vague", "multi-hop", "no-answer")
ZH = ("如何配置网关节点的证书轮换", "生产环境需要什么服务器", "管理员密码忘了怎么办", "访问申请多久会被审批",
      "集群扩容时要注意哪些事项", "日志保留多少天")
EN = ("How do I rotate TLS keys", "What does DG-1003 mean", "reset admin password", "quota per tenant",
      "backup schedule", "SSO login fails")


def make_records(n: int, seed: int):
    """Yield ``n`` test-set records: ~3 labels each (1-5), grades 0-3 with at least one >= 1."""
    rng = random.Random(seed)
    for i in range(n):
        k = rng.randint(1, 5)
        relevant = {f"doc{rng.randrange(20_000):05d}.{rng.randrange(40):02d}-section:{j:03d}": rng.randint(0, 3)
                    for j in range(k)}
        first = next(iter(relevant))
        relevant[first] = max(1, relevant[first])
        text = f"{rng.choice(ZH)}？{rng.choice(EN)} #{i}"
        yield {"query_id": f"q{i:07d}", "query": text, "relevant": relevant,
               "query_type": rng.choice(TYPES), "tags": [rng.choice(TAGS)]}


def write_jsonl(path: Path, n: int, seed: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for rec in make_records(n, seed):
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


def write_csv(path: Path, n: int, seed: int) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["query_id", "query", "relevant", "query_type", "tags"])
        for rec in make_records(n, seed):
            w.writerow([rec["query_id"], rec["query"], json.dumps(rec["relevant"], ensure_ascii=False),
                        rec["query_type"], ";".join(rec["tags"])])


def write_parquet(path: Path, n: int, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("query_id", pa.string()), ("query", pa.string()),
                        ("relevant", pa.map_(pa.string(), pa.int8())), ("query_type", pa.string()),
                        ("tags", pa.list_(pa.string()))])
    with pq.ParquetWriter(path, schema) as writer:
        batch: list[dict] = []
        for rec in make_records(n, seed):
            batch.append(dict(rec, relevant=list(rec["relevant"].items())))
            if len(batch) == 100_000:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))


WRITERS = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet}


def measure(path: str) -> dict:
    """Load ``path`` (``-``: imports only) in a fresh interpreter; its figures."""
    out = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"loading {path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="queries in the test set")
    ap.add_argument("--formats", default="jsonl,csv,parquet", help="comma-separated: jsonl, csv, parquet")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", nargs=2, metavar=("FORMAT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:   # a child: write one file and leave
        WRITERS[args.write[0]](Path(args.write[1]), args.n, args.seed)
        return
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for fmt in formats:
            path = Path(tmp) / f"testset.{fmt}"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--write", fmt, str(path), "--n", str(args.n),
                            "--seed", str(args.seed)], check=True)
            files[fmt] = path
            print(f"wrote {fmt:8s} {path.stat().st_size / 2**20:8.1f} MB in {time.perf_counter() - t0:5.1f} s",
                  flush=True)
        base = measure("-")
        print(f"\n{args.n:,} queries; interpreter + imports alone: {base['rss_mb']:,.0f} MB")
        print(f"{'format':8s} {'load s':>8s} {'hash s':>8s} {'peak RSS':>11s}   goal < {GOAL_MB:,} MB")
        hashes = set()
        for fmt, path in files.items():
            m = measure(str(path))
            hashes.add(m["hash"])
            verdict = "PASS" if m["rss_mb"] < GOAL_MB else "MISS"
            print(f"{fmt:8s} {m['load_s']:8.2f} {m['hash_s']:8.2f} {m['rss_mb']:8,.0f} MB   {verdict}"
                  f"   ({m['n']:,} queries, {m['n_labels']:,} labels)", flush=True)
        print(f"same hash from every format: {'yes' if len(hashes) == 1 else 'NO: ' + ', '.join(sorted(hashes))}")


if __name__ == "__main__":
    main()
