"""Collection throughput against the sandbox with a fixed 50 ms added latency.

For 1, 8 and 32 requests in flight, runs the real collector (``weknora_nb.collect``) on
the demo test set's queries (after one unmeasured pass that warms the server's query
caches) against a sandbox server in its own process, and prints the
throughput as a fraction of the ideal, in_flight / latency (at 50 ms: 20, 160, 640
requests per second). Goal: >= 0.9 of ideal at 32 in flight on a 2-core machine.
Throughput is measured over the request phase (first request sent to last one recorded
in the checkpoint, ``RunSummary.request_seconds``); "end to end" also counts the run's
set-up and the final Parquet and manifest writes.
As a reference measured in the same run, a bare httpx loop sends the same requests
(knowledge-search, the ``final`` stage) at the same concurrency, on the collector's HTTP stack
(httpx over aiohttp, :mod:`weknora_nb.collect.http.transport`) and on httpx's own transport (httpcore
on anyio): their fractions of ideal are the ceilings of each stack on this machine, and the last
column is the collector's throughput relative to the first. Every loop runs as ``weknora-nb collect`` runs
its collection: on :func:`weknora_nb.collect.http.retry.run_on_new_loop` (uvloop where it is installed).

    python benchmarks/bench_collect.py [--latency-ms 50] [--stage final] [--levels 1,8,32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from weknora_nb.collect import collect_async
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.collect.http.retry import run_on_new_loop
from weknora_nb.collect.http.transport import async_client
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.sandbox import demo_dir


def start_server(latency_ms: float, port: int, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "weknora_nb", "sandbox", "serve", "--port", str(port),
                             "--faults", json.dumps({"latency_ms": latency_ms})], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise SystemExit(f"the sandbox did not start: {proc.stderr.read()}")
    raise SystemExit("the sandbox did not start within 120 s")


async def plain_httpx(base_url: str, key: str, queries: list[str], in_flight: int, stage_path: str, *,
                      own_transport: bool = False) -> float:
    """Reference: the same requests from a bare httpx loop (no retries, no checkpoint) on the collector's transport
    (``own_transport``: on httpx's own); seconds."""
    queue: asyncio.Queue = asyncio.Queue()
    for q in queries:
        queue.put_nowait(q)
    make = httpx.AsyncClient if own_transport else async_client
    async with make(base_url=base_url, headers={"X-API-Key": key},
                    limits=httpx.Limits(max_connections=in_flight)) as client:
        async def worker() -> None:
            while not queue.empty():
                q = queue.get_nowait()
                (await client.post(stage_path, json={"query": q, "knowledge_base_id": "kb-demo"})).json()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--stage", default="final")
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()
    env = {**os.environ, "WEKNORA_API_KEY": os.environ.get("WEKNORA_API_KEY", "sk-bench-local")}
    os.environ["WEKNORA_API_KEY"] = env["WEKNORA_API_KEY"]
    ts_path = demo_dir() / "testset.jsonl"
    ts = load_testset(ts_path)
    proc = start_server(args.latency_ms, args.port, env)
    try:
        settings = ClientSettings(f"http://127.0.0.1:{args.port}")
        print(f"sandbox with {args.latency_ms:.0f} ms added latency, stage {args.stage!r}, "
              f"{os.cpu_count()} CPU(s)")
        # one unmeasured pass warms the server's per-query caches (query embeddings), so that
        # what is measured is the collector's concurrency, not the first embedding of each query
        with tempfile.TemporaryDirectory() as tmp:
            run_on_new_loop(collect_async(settings, "kb-demo", ts, Path(tmp) / "warm", stages=args.stage, repeats=1,
                                          concurrency=8, warmup=0, inventory=False, progress=False))
        print(f"{'in flight':>9}  {'requests':>8}  {'seconds':>7}  {'req/s':>7}  {'ideal':>7}  {'fraction':>8}  "
              f"{'end to end':>10}  {'bare httpx':>10}  {'httpcore':>8}  {'vs bare httpx':>13}")
        for level in (int(x) for x in args.levels.split(",")):
            n = max(100, 80 * level)
            records = [dict(r, query_id=f"{r['query_id']}-{k}") for k in range(n // len(ts) + 1) for r in ts.records()]
            sub = TestSet.from_records(records[:n])
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                s = run_on_new_loop(collect_async(settings, "kb-demo", sub, Path(tmp) / "run", stages=args.stage,
                                                  repeats=1, concurrency=level, warmup=0, inventory=False,
                                                  progress=False))
                secs = time.perf_counter() - t0
            assert s.complete, s.describe()
            rate = n / s.request_seconds  # the request phase: every request sent, answered and checkpointed
            ideal = level / (args.latency_ms / 1000.0)
            bare = [n / run_on_new_loop(plain_httpx(settings.base_url, env["WEKNORA_API_KEY"],
                                                    [r["query"] for r in records[:n]], level,
                                                    "/api/v1/knowledge-search", own_transport=own))
                    for own in (False, True)]
            print(f"{level:>9}  {n:>8}  {s.request_seconds:>7.2f}  {rate:>7.1f}  {ideal:>7.1f}  {rate / ideal:>8.2f}  "
                  f"{n / secs / ideal:>10.2f}  {bare[0] / ideal:>10.2f}  {bare[1] / ideal:>8.2f}  "
                  f"{rate / bare[0]:>13.2f}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
