"""Hardening, round three (issue 46), over HTTP: servers that answer with items WeKnora never sends, bodies and
streams that never end. A real server on loopback (starlette on uvicorn) lies; the collector records each such
request as failed, never as a result, and never hangs."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from weknora_nb import cli
from weknora_nb.collect import collect, read_checkpoint
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.core.testset import TestSet

KEY = "sk-lying-server-46"
KB = "kb-lie"

#: what hybrid-search answers for each query text: the items of ``data``
LIES: dict[str, list[dict[str, Any]]] = {
    "null id": [{"id": None, "score": 0.9, "match_type": 0}],
    "boolean id": [{"id": True, "score": 0.9, "match_type": 0}],
    "object id": [{"id": {"a": 1}, "score": 0.9, "match_type": 0}],
    "empty id": [{"id": "", "score": 0.9, "match_type": 0}],
    "padded id": [{"id": " c1\t", "score": 0.9, "match_type": 0}],
    "word match type": [{"id": "c1", "score": 0.9, "match_type": "vector"}],
    "huge chunk index": [{"id": "c1", "score": 0.9, "match_type": 0, "chunk_index": 2 ** 70}],
    "string score": [{"id": "c1", "score": "0.9", "match_type": 0}],
    "truthful": [{"id": "c1", "score": 0.9, "match_type": 0, "chunk_index": 3, "knowledge_id": "k1"}],
}
SAID = {"null id": "field 'id' is null", "boolean id": "field 'id' is true", "object id": "field 'id' is {\"a\": 1}",
        "empty id": "field 'id' is \"\"", "padded id": "field 'id' is \" c1\\t\"",
        "word match type": "field 'match_type' is \"vector\"",
        "huge chunk index": f"field 'chunk_index' is {2 ** 70}", "string score": "field 'score' is \"0.9\""}


def ok(data: Any) -> JSONResponse:
    return JSONResponse({"success": True, "data": data})


async def hybrid(request: Request) -> Response:
    body = await request.json()
    query = body["query_text"]
    if query == "trickle":   # a byte every 0.3 s: each read is quick, the body never ends in time
        async def slow() -> Any:
            for b in b'{"success": true, "data": [' + b" " * 1000:
                yield bytes([b])
                await asyncio.sleep(0.3)
        return StreamingResponse(slow(), media_type="application/json")
    return ok(LIES[query])


async def chat(request: Request) -> Response:
    async def endless() -> Any:   # progress events, then nothing more and no "complete", for ever
        yield b'event:message\ndata:{"response_type": "tool_call", "done": false, "content": "x"}\n\n'
        for _ in range(600):
            await asyncio.sleep(0.5)
            yield b": keep-alive\n\n"
    return StreamingResponse(endless(), media_type="text/event-stream")


ROUTES = [
    Route("/api/v1/system/info", lambda r: ok({"version": "0.7.2", "edition": "standard"})),
    Route("/api/v1/tenants/kv/retrieval-config", lambda r: ok({})),
    Route("/api/v1/tenants/kv/memory-config", lambda r: ok({})),
    Route("/api/v1/knowledge-bases/{kb}", lambda r: ok({"id": KB, "type": "document", "embedding_model_id": ""})),
    Route("/api/v1/knowledge-bases/{kb}/hybrid-search", hybrid, methods=["POST"]),
    Route("/api/v1/sessions", lambda r: JSONResponse({"success": True, "data": {"id": "s1"}}, status_code=201),
          methods=["POST"]),
    Route("/api/v1/sessions/{sid}", lambda r: ok(None), methods=["DELETE"]),
    Route("/api/v1/knowledge-chat/{sid}", chat, methods=["POST"]),
]


@pytest.fixture(scope="module")
def liar() -> Iterator[str]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=ROUTES), log_level="warning", lifespan="off",
                                           access_log=False, timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


def write_testset(path: Path, queries: list[str]) -> Path:
    TestSet.from_records([{"query_id": f"q{i}", "query": q, "relevant": {"c1": 1}}
                          for i, q in enumerate(queries)]).to_jsonl(path)
    return path


def test_items_that_are_not_what_weknora_sends_fail_their_request_naming_the_field(liar, tmp_path, monkeypatch):
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    ts = write_testset(tmp_path / "t.jsonl", list(LIES))
    summary = collect(ClientSettings(liar), KB, ts, tmp_path / "run", stages="vector", repeats=1, warmup=0,
                      progress=False, inventory=False, integrity=False)
    assert not summary.complete
    records = read_checkpoint(tmp_path / "run" / "checkpoint.jsonl")
    by_query = {r["query_id"]: r for r in records.values()}
    for i, query in enumerate(LIES):
        rec = by_query[f"q{i}"]
        if query == "truthful":
            assert rec["status"] == "ok" and rec["rows"][0][1] == "c1"
            continue
        assert rec["status"] == "protocol" and rec["rows"] == [], query
        assert SAID[query] in rec["error"] and "not what WeKnora sends" in rec["error"], rec["error"]
    import pandas as pd

    results = pd.read_parquet(tmp_path / "run" / "results.parquet")
    assert set(results["chunk_id"].dropna()) == {"c1"}   # no "None", "True", "{'a': 1}" or "" stored


def test_an_old_checkpoint_with_a_chunk_index_beyond_int64_resumes(liar, tmp_path, monkeypatch):
    """A checkpoint written before the check (a row holding 2**70) resumes: that request counts as failed and
    --retry-failed asks it again; nothing overflows."""
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    ts = write_testset(tmp_path / "t.jsonl", ["truthful"])
    out = tmp_path / "run"
    collect(ClientSettings(liar), KB, ts, out, stages="vector", repeats=1, warmup=0, progress=False, inventory=False,
            integrity=False)
    ckpt = out / "checkpoint.jsonl"
    rec = json.loads(ckpt.read_text(encoding="utf-8").splitlines()[0])
    rec["rows"][0][4] = 2 ** 70
    ckpt.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    summary = collect(ClientSettings(liar), KB, ts, out, stages="vector", repeats=1, warmup=0, progress=False,
                      inventory=False, integrity=False, resume=True)
    assert not summary.complete   # the damaged request is a failed one
    summary = collect(ClientSettings(liar), KB, ts, out, stages="vector", repeats=1, warmup=0, progress=False,
                      inventory=False, integrity=False, resume=True, retry_failed=True)
    assert summary.complete


@pytest.mark.parametrize("stage, query", [("vector", "trickle"), ("citations", "anything")])
def test_a_body_that_trickles_and_a_stream_that_never_ends_time_out_at_the_deadline(liar, tmp_path, monkeypatch,
                                                                                   stage, query):
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    ts = write_testset(tmp_path / "t.jsonl", [query])
    t0 = time.monotonic()
    code = cli.main(["collect", "--base-url", liar, "--kb-id", KB, "--testset", str(ts), "--out", str(tmp_path / "r"),
                     "--stages", stage, "--repeats", "1", "--warmup", "0", "--timeout", "2", "--deadline", "3",
                     "--max-attempts", "1", "--no-inventory", "--quiet"])
    assert time.monotonic() - t0 < 30 and code == 1
    (rec,) = read_checkpoint(tmp_path / "r" / "checkpoint.jsonl").values()
    assert rec["status"] == "timeout" and "deadline of 3 s" in rec["error"]
