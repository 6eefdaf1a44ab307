"""Command line: ``weknora-nb <command> ...`` (also ``python -m weknora_nb``).

Exit codes: 0 success, 1 the work ran but its verdict is negative (e.g. an incomplete
run), 2 unusable input (a file that fails validation, an unknown metric).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from weknora_nb._version import __version__
from weknora_nb.core.errors import WeknoraNbError

log = logging.getLogger("weknora_nb")


def _cmd_score(args: argparse.Namespace) -> int:
    from weknora_nb.core.scoring import score
    from weknora_nb.core.testset import load_testset
    from weknora_nb.reports.text import format_scores

    ts = load_testset(args.testset)
    sc = score(ts, args.results, args.metrics, stages=args.stage or None, domain_adjustment=args.domain_adjustment,
               source=args.results)
    if args.json:
        print(json.dumps(sc.to_json_dict(), ensure_ascii=False, indent=None if args.compact else 2))
    else:
        print(format_scores(sc))
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from weknora_nb.collect.client import ClientSettings
    from weknora_nb.collect.collector import collect

    system = None
    if args.system:
        system = yaml.safe_load(Path(args.system).read_text(encoding="utf-8"))
    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout, max_attempts=args.max_attempts,
                              max_connections=max(args.concurrency, 1))
    stages = args.stages
    extra = None
    if args.stages_file:
        from weknora_nb.collect.stages import load_stage_file, resolve_stages
        extra = load_stage_file(args.stages_file)
        stages = resolve_stages(args.stages, extra)
    summary = collect(settings, args.kb_id, args.testset, args.out, stages=stages, repeats=args.repeats,
                      concurrency=args.concurrency, warmup=args.warmup, system=system, resume=args.resume,
                      retry_failed=args.retry_failed, inventory=not args.no_inventory, progress=not args.quiet)
    print(summary.describe())
    return 0 if summary.complete else 1


def _cmd_gate(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.compare import NotComparableError
    from weknora_nb.analysis.gate import gate, parse_bounds

    try:
        result = gate(args.run, baseline=args.baseline, stage=args.stage, minimums=parse_bounds(args.min),
                      max_drops=parse_bounds(args.max_drop), allow_incomplete=args.allow_incomplete)
    except (ValueError, NotComparableError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.describe())
    return 0 if result.passed else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from weknora_nb.reports.render import ReportError, render_report

    try:
        report = render_report(args.run, args.baseline or [], out_root=args.out, no_input=args.no_input)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.index)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from weknora_nb.demo import run_demo
    from weknora_nb.reports.render import ReportError

    try:
        result = run_demo(args.out, repeats=args.repeats, no_input=args.no_input, progress=not args.quiet)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    print(f"demo finished ({phases}). Open: {result.index}")
    return 0


def _cmd_sandbox_serve(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from weknora_nb.sandbox import SandboxServer

    if not os.environ.get("WEKNORA_API_KEY"):
        print("error: set WEKNORA_API_KEY first (any value, e.g. export WEKNORA_API_KEY=sk-sandbox-local): the "
              "sandbox accepts that key and clients read it from the same variable", file=sys.stderr)
        return 2
    faults = json.loads(args.faults) if args.faults else None
    server = SandboxServer(args.version, host=args.host, port=args.port, data_dir=args.data, faults=faults,
                           allow_fault_control=args.allow_fault_control, show_progress=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(f"sandbox version {server.version.name!r} serving knowledge base {server.kb_id!r} on "
              f"{server.base_url} (API key: the value of $WEKNORA_API_KEY). Ctrl-C stops it.", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0


def _cmd_sandbox_build(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from weknora_nb.sandbox import build_index, demo_dir, load_demo_versions

    t0 = time.perf_counter()
    index = build_index(args.data, show_progress=True)
    for v in load_demo_versions(args.data).values():
        index.warm(v)
    docs = len({c.knowledge_id for c in index.chunks})
    print(f"{len(index.chunks)} chunks from {docs} documents; index built in {time.perf_counter() - t0:.1f} s")
    if args.write_seed:
        folder = Path(args.data or demo_dir()) / "cache"
        for model in sorted(index._embedders):
            f = index.embedder(model).write_seed([c.content for c in index.chunks], folder)
            print(f"wrote {f}")
    return 0


def _cmd_sandbox_versions(args: argparse.Namespace) -> int:
    from weknora_nb.sandbox import load_demo_versions

    for name, v in load_demo_versions(args.data).items():
        print(f"{name:16s} {v.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="weknora-nb", description="Measure how well a WeKnora knowledge base retrieves.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("score", help="score a results file against a test set")
    s.add_argument("testset", help="test set: .jsonl, .csv, .parquet or a WeKnora dataset folder")
    s.add_argument("results", help="results table: .parquet, .csv or .jsonl")
    s.add_argument("--metrics", nargs="+", default=None,
                   help="metric names, e.g. recall@5 ndcg@10 ndcg@10:linear (default: the METHOD.md set)")
    s.add_argument("--stage", action="append", help="score only this stage (repeatable)")
    s.add_argument("--domain-adjustment", type=float, default=0.0,
                   help="lower acceptance thresholds by this fraction (0.05-0.10) for a specialised domain")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    s.add_argument("--compact", action="store_true", help="with --json: no indentation")
    s.set_defaults(func=_cmd_score)

    c = sub.add_parser("collect", help="collect ranked results from WeKnora into a resumable run folder")
    c.add_argument("--base-url", required=True, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
    c.add_argument("--kb-id", required=True, action="append", help="knowledge base id (repeatable)")
    c.add_argument("--testset", required=True, help="test set file or WeKnora dataset folder")
    c.add_argument("--stages", default="vector,keyword,hybrid,final",
                   help="comma-separated stages: vector, keyword, hybrid, final, citations (default: the first four)")
    c.add_argument("--stages-file", default=None, help="YAML file defining more stages")
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    c.add_argument("--warmup", type=int, default=5, help="warm-up queries per stage, not recorded (default 5)")
    c.add_argument("--out", required=True, help="run folder, e.g. outputs/runs/NAME")
    c.add_argument("--system", default=None, help="YAML system description recorded in the manifest")
    c.add_argument("--resume", action="store_true", help="continue the run in --out")
    c.add_argument("--retry-failed", action="store_true", help="with --resume: request failed ones again")
    c.add_argument("--timeout", type=float, default=30.0, help="read timeout per request, seconds")
    c.add_argument("--max-attempts", type=int, default=4, help="attempts per request (retries + 1)")
    c.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding the API key")
    c.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    c.add_argument("--no-inventory", action="store_true", help="do not fetch the chunk listing")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=_cmd_collect)

    g = sub.add_parser("gate", help="exit 1 when a run breaks quality bounds (for CI)")
    g.add_argument("--run", required=True, help="run folder to check")
    g.add_argument("--baseline", default=None, help="run folder to compare with (same test set)")
    g.add_argument("--stage", default=None, help="stage (default: final when the run has it, else its only stage)")
    g.add_argument("--min", action="append", default=[], metavar="METRIC=VALUE", help="minimum mean, repeatable")
    g.add_argument("--max-drop", action="append", default=[], metavar="METRIC=VALUE",
                   help="largest allowed drop from the baseline, repeatable")
    g.add_argument("--allow-incomplete", action="store_true", help="do not fail on failed or missing requests")
    g.set_defaults(func=_cmd_gate)

    r = sub.add_parser("report", help="execute the notebooks for a run and write HTML reports")
    r.add_argument("--run", required=True, help="run folder")
    r.add_argument("--baseline", action="append", help="run folder to compare with (repeatable)")
    r.add_argument("--out", default=None, help="reports folder (default: <runs>/../reports)")
    r.add_argument("--no-input", action="store_true", help="hide code cells in the HTML")
    r.set_defaults(func=_cmd_report)

    d = sub.add_parser("demo", help="the whole workbench on the embedded sandbox, end to end")
    d.add_argument("--out", default="outputs", help="output folder (default outputs)")
    d.add_argument("--repeats", type=int, default=3)
    d.add_argument("--no-input", action="store_true", help="hide code cells in the HTML reports")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=_cmd_demo)

    sb = sub.add_parser("sandbox", help="the embedded knowledge base that speaks WeKnora's API")
    sbs = sb.add_subparsers(dest="sandbox_command", required=True)
    serve = sbs.add_parser("serve", help="serve one system version on loopback")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--version", default="baseline", help="system version from versions.yaml")
    serve.add_argument("--data", default=None, help="demo folder (default: data/demo of this checkout)")
    serve.add_argument("--faults", default=None,
                       help='faults to inject, as JSON, e.g. \'{"latency_ms": 50, "error_rate": 0.05}\'')
    serve.add_argument("--allow-fault-control", action="store_true", help="expose PUT /_sandbox/faults")
    serve.set_defaults(func=_cmd_sandbox_serve)
    build = sbs.add_parser("build", help="chunk the documents and build every index (embeddings are cached)")
    build.add_argument("--data", default=None)
    build.add_argument("--write-seed", action="store_true",
                       help="also write the chunk embeddings to <data>/cache (shipped so a fresh clone starts fast)")
    build.set_defaults(func=_cmd_sandbox_build)
    vers = sbs.add_parser("versions", help="list the system versions")
    vers.add_argument("--data", default=None)
    vers.set_defaults(func=_cmd_sandbox_versions)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if getattr(args, "metrics", None):
        args.metrics = [m for part in args.metrics for m in part.split(",") if m.strip()]
    try:
        return int(args.func(args) or 0)
    except (WeknoraNbError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
