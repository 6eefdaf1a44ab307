"""``weknora-nb sandbox serve | build | versions``: the embedded knowledge base that speaks WeKnora's API, served on
loopback (with a read-only Postgres role on request), its indexes built, its system versions listed."""

from __future__ import annotations

import argparse
from typing import Any

from weknora_nb.cli.options import Subparsers, faults, port
from weknora_nb.core.errors import UsageError

#: ``sandbox serve``: the password of the read-only Postgres role it makes (never printed)
PG_PASSWORD_ENV = "WEKNORA_NB_PG_PASSWORD"


def add_sandbox(sub: Subparsers) -> None:
    from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES
    from weknora_nb.sandbox.versions import STREAM_MANAGERS

    sb = sub.add_parser("sandbox", help="the embedded knowledge base that speaks WeKnora's API")
    sbs = sb.add_subparsers(dest="sandbox_command", required=True)
    serve = sbs.add_parser("serve", help="serve one system version on loopback")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    serve.add_argument("--port", type=port, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--version", default="baseline", help="system version from versions.yaml")
    serve.add_argument("--weknora-version", default=None, choices=list(RELEASES),
                       help=f"the WeKnora release whose API to emulate (default {DEFAULT_RELEASE}, the latest release)")
    serve.add_argument("--data", default=None, help="demo folder (default: the one shipped with the package)")
    serve.add_argument("--faults", type=faults, default=None,
                       help='faults to inject, as JSON, e.g. \'{"latency_ms": 50, "error_rate": 0.05}\'')
    serve.add_argument("--allow-fault-control", action="store_true", help="expose PUT /_sandbox/faults")
    serve.add_argument("--stream-manager", default=None, choices=list(STREAM_MANAGERS),
                       help="how chat references reach the client: memory (WeKnora Lite's) or redis (rebuilt, "
                            "losing match_type, sub_chunk_id and metadata); default: the version's")
    serve.set_defaults(func=cmd_sandbox_serve)
    build = sbs.add_parser("build", help="chunk the documents and build every index (embeddings are cached)")
    build.add_argument("--data", default=None)
    build.add_argument("--write-seed", action="store_true",
                       help="also write the chunk embeddings and tokens to <data>/cache (shipped so a fresh clone "
                            "starts fast)")
    build.set_defaults(func=cmd_sandbox_build)
    vers = sbs.add_parser("versions", help="list the system versions")
    vers.add_argument("--data", default=None)
    vers.set_defaults(func=cmd_sandbox_versions)


def cmd_sandbox_serve(args: argparse.Namespace) -> int:
    _require_sandbox("weknora-nb sandbox serve")
    import os
    import signal
    import threading

    from weknora_nb.sandbox import SandboxServer

    if not os.environ.get("WEKNORA_API_KEY"):
        raise UsageError("set WEKNORA_API_KEY first (any value, e.g. export WEKNORA_API_KEY=sk-sandbox-local): "
                         "the sandbox accepts that key and clients read it from the same variable")
    server = SandboxServer(args.version, host=args.host, port=args.port, data_dir=args.data, faults=args.faults,
                           allow_fault_control=args.allow_fault_control, show_progress=True,
                           weknora_version=args.weknora_version, stream_manager=args.stream_manager)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(f"sandbox version {server.version.name!r} (as WeKnora {server.release.name}) serving knowledge base "
              f"{server.kb_id!r} on {server.base_url} (API key: the value of $WEKNORA_API_KEY). Ctrl-C stops it.",
              flush=True)
        print_sandbox_database(server)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0


def print_sandbox_database(server: Any) -> None:
    """With ``$WEKNORA_NB_PG_PASSWORD`` set: a read-only role of the served version's Postgres database with that
    password, and how to check the sandbox with it (the password itself is never printed)."""
    import os

    password = os.environ.get(PG_PASSWORD_ENV)
    if not password:
        print(f"(set {PG_PASSWORD_ENV} to get a read-only Postgres role for weknora-nb check --dsn)", flush=True)
        return
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = {k: str(v) for k, v in conninfo_to_dict(server.reader_dsn(password)).items() if k != "password"}
    print(f"Postgres (read-only): export WEKNORA_NB_PG_DSN=\"{make_conninfo('', **parts)} "
          f"password=${PG_PASSWORD_ENV}\"; "
          f"embeddings: --embeddings-url {server.embeddings_url} --embeddings-model "
          f"{server.version.embedding_model}", flush=True)


def cmd_sandbox_build(args: argparse.Namespace) -> int:
    _require_sandbox("weknora-nb sandbox build")
    import time
    from pathlib import Path

    from weknora_nb.sandbox import build_index, demo_dir, load_demo_versions

    t0 = time.perf_counter()
    index = build_index(args.data, show_progress=True)
    others: dict[Any, Any] = {}   # the indexes of another chunking (parent-child versions, C110)
    for v in load_demo_versions(args.data).values():
        if v.parent_child is None:
            index.warm(v)
        else:
            others.setdefault(v.parent_child, build_index(args.data, parent_child=v.parent_child)).warm(v)
    docs = len({c.knowledge_id for c in index.chunks})
    print(f"{len(index.chunks)} chunks from {docs} documents; index built in {time.perf_counter() - t0:.1f} s")
    if args.write_seed:
        from weknora_nb.core.testset import load_testset

        data = Path(args.data or demo_dir())
        queries = [q for ts in (data / "testset.jsonl", data / "faq" / "testset.jsonl") if ts.exists()
                   for q in load_testset(ts).queries["query"].tolist()]
        variants: list[str] = []
        if (data / "testset.jsonl").exists():  # the variants a chat searches when it finds too little (C115)
            from weknora_nb.sandbox.agent import chat_variants

            asked = load_testset(data / "testset.jsonl").queries["query"].tolist()
            versions = [v for v in load_demo_versions(args.data).values() if not v.faq_enabled]
            variants = chat_variants(asked, versions, lambda v: others.get(v.parent_child, index))
        # each model's texts: index texts (vector), passages (reranker), and the test sets' queries
        for f in index.write_seed(data / "cache", queries, also=list(others.values()), vector_queries=variants):
            print(f"wrote {f}")
    return 0


def cmd_sandbox_versions(args: argparse.Namespace) -> int:
    _require_sandbox("weknora-nb sandbox versions")
    from weknora_nb.sandbox import load_demo_versions

    for name, v in load_demo_versions(args.data).items():
        print(f"{name:16s} {v.description}")
    return 0


def _require_sandbox(what: str) -> None:
    """:class:`~weknora_nb.core.extras.MissingExtra` (exit 2) naming ``what`` when the sandbox extra is missing."""
    from weknora_nb.core.extras import require

    require("sandbox", what)
