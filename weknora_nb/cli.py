"""Command line: ``weknora-nb <command> ...`` (also ``python -m weknora_nb``).

Exit codes (only :func:`main` maps errors to them, through :data:`EXIT_CODES`):

- 0 success;
- 1 the work ran but its verdict is negative: a gate bound broken, an incomplete run, a
  notebook that failed (:class:`ReportError`), a request that failed (:class:`RequestFailed`),
  a sandbox that could not serve (:class:`SandboxError`);
- 2 unusable input: a bad option (argparse, :class:`UsageError`, :class:`MetricError`), a
  file that fails validation (:class:`InputError`), a folder that is not a run, a run
  folder already used, runs that cannot be compared, or a file named on the command line
  that cannot be opened.

Each error is one line on stderr, ``error: <message>``, naming the argument, the allowed
values and what arrived (an :class:`InputError` lists its problems on the lines after its
first). A user's mistake never shows a traceback. Command functions return 0 or 1 or
raise; they import what they need when they run, so ``weknora-nb --help`` loads no
pandas, httpx or matplotlib.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from weknora_nb._version import __version__
from weknora_nb.core.errors import (
    InputError,
    NotComparableError,
    ReportError,
    RequestFailed,
    RunExistsError,
    RunFolderError,
    SandboxError,
    UsageError,
)

log = logging.getLogger("weknora_nb")
T = TypeVar("T")

#: error class -> exit code, checked in order (the first class the error is an instance of wins)
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (RequestFailed, 1),
    (ReportError, 1),
    (SandboxError, 1),
    (UsageError, 2),
    (InputError, 2),
    (RunFolderError, 2),
    (RunExistsError, 2),
    (NotComparableError, 2),
    (FileNotFoundError, 2),
    (IsADirectoryError, 2),
    (PermissionError, 2),
    (NotADirectoryError, 2),
)


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, ``<prog>: error: <message>``, and exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line with a pointer to ``--help`` and exit with status 2."""
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------- option types (checked at parse time)

def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}. Got {text!r} instead.")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _positive_seconds(text: str) -> float:
    """An argparse ``type`` accepting a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0. Got {text!r} instead.")
    return value


def _argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type``: the :class:`UsageError` it raises (a library's own check)
    becomes argparse's one-line message instead of argparse's generic "invalid value"."""
    @functools.wraps(parse)
    def checked(text: str) -> T:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return checked


@_argument_type
def _domain_adjustment(text: str) -> float:
    """An argparse ``type`` for the fraction the tier thresholds are lowered by (the rule of core/tiers.py)."""
    from weknora_nb.core.tiers import check_domain_adjustment

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number. Got {text!r} instead.") from None
    check_domain_adjustment(value)
    return value


def _port(text: str) -> int:
    """An argparse ``type`` for a TCP port, 0-65535 (0: a free one)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535 (0 picks a free one). Got {text!r} instead.")
    return value


@_argument_type
def _metric_names(text: str) -> str:
    """An argparse ``type`` for one or more comma-separated metric names, each checked by ``parse_metric``."""
    from weknora_nb.core.metrics import parse_metric

    names = [n for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"needs metric names such as ndcg@10 or recall@5,hit@5. Got {text!r} instead.")
    for name in names:
        parse_metric(name)  # a MetricError is a UsageError
    return text


@_argument_type
def _bound(text: str) -> str:
    """An argparse ``type`` for a gate bound ``METRIC=VALUE`` (checked by ``parse_bounds``)."""
    from weknora_nb.analysis.gate import parse_bounds

    parse_bounds([text])
    return text


def _base_url(text: str) -> str:
    """An argparse ``type`` for WeKnora's base URL: http or https, with a host."""
    from urllib.parse import urlsplit

    parts = urlsplit(text.strip())
    try:
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != -1
    except ValueError:  # a port that is not a number or out of range
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError("must be an http:// or https:// URL with a host, e.g. "
                                         f"http://127.0.0.1:8080. Got {text!r} instead.")
    return text


def _faults(text: str) -> dict[str, Any]:
    """An argparse ``type`` for the sandbox's faults: a JSON object of fault settings."""
    from weknora_nb.sandbox.server import FaultConfig

    example = '{"latency_ms": 50, "error_rate": 0.05}'
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got {text!r} instead "
                                         f"({exc.msg} at column {exc.colno}).") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got {text!r} instead.")
    try:
        FaultConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return data


# ---------------------------------------------------------------- commands

def _check_run_folder(argument: str, path: str) -> None:
    """Raise :class:`RunFolderError` naming ``argument`` when ``path`` holds no readable run manifest."""
    from weknora_nb.core.run import read_manifest

    try:
        read_manifest(path)
    except RunFolderError as exc:
        raise RunFolderError(f"{argument}: {exc}") from None


def _cmd_score(args: argparse.Namespace) -> int:
    from weknora_nb.core.scoring import score
    from weknora_nb.core.testset import load_testset
    from weknora_nb.reports.text import format_scores

    metrics = [m for part in args.metrics for m in part.split(",") if m.strip()] if args.metrics else None
    ts = load_testset(args.testset)
    sc = score(ts, args.results, metrics, stages=args.stage or None, domain_adjustment=args.domain_adjustment,
               source=args.results)
    if args.json:
        print(json.dumps(sc.to_json_dict(), ensure_ascii=False, indent=None if args.compact else 2))
    else:
        print(format_scores(sc))
    return 0


def _collect_stages(args: argparse.Namespace) -> list[Any] | None:
    """The Stage objects named by ``--stages`` (the built-in ones, then those of ``--stages-file``);
    None without ``--stages``: the collector's defaults, fitted to the knowledge bases (a stage file is
    still checked)."""
    from weknora_nb.collect.stages import load_stage_file, resolve_stages

    extra = load_stage_file(args.stages_file) if args.stages_file else None
    return resolve_stages(args.stages, extra) if args.stages is not None else None


def _cmd_collect(args: argparse.Namespace) -> int:
    """Collect; a knowledge base the server does not have, or a key, tenant or capability it refuses, is
    unusable input (exit 2, one line saying what to do) rather than a run of failed requests."""
    from weknora_nb.collect.client import ClientSettings
    from weknora_nb.collect.collector import collect
    from weknora_nb.collect.system import load_system_description
    from weknora_nb.core.errors import AuthFailed, NotFound

    system = load_system_description(args.system) if args.system else None
    stages = _collect_stages(args)
    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout, max_attempts=args.max_attempts,
                              max_connections=args.concurrency)
    try:
        summary = collect(settings, args.kb_id, args.testset, args.out, stages=stages, repeats=args.repeats,
                          concurrency=args.concurrency, warmup=args.warmup, system=system, resume=args.resume,
                          retry_failed=args.retry_failed, inventory=not args.no_inventory,
                          progress=not args.quiet, keep_sessions=args.keep_sessions)
    except (AuthFailed, NotFound) as exc:
        raise UsageError(str(exc)) from None
    print(summary.describe())
    return 0 if summary.complete else 1


def _cmd_gate(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.gate import gate, parse_bounds

    _check_run_folder("--run", args.run)
    if args.baseline:
        _check_run_folder("--baseline", args.baseline)
    result = gate(args.run, baseline=args.baseline, stage=args.stage, minimums=parse_bounds(args.min),
                  max_drops=parse_bounds(args.max_drop), allow_incomplete=args.allow_incomplete)
    print(result.describe())
    return 0 if result.passed else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from weknora_nb.reports.render import render_report

    _check_run_folder("--run", args.run)
    for baseline in args.baseline or []:
        _check_run_folder("--baseline", baseline)
    parameters = {"stage": args.stage, "domain_adjustment": args.domain_adjustment}
    report = render_report(args.run, args.baseline or [], out_root=args.out, no_input=args.no_input,
                           parameters=parameters)
    print(report.index)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from weknora_nb.demo import run_demo

    result = run_demo(args.out, repeats=args.repeats, no_input=args.no_input, progress=not args.quiet,
                      limit=args.limit)
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    print(f"demo finished ({phases}). Open: {result.index}")
    return 0


def _cmd_sandbox_serve(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from weknora_nb.sandbox import SandboxServer

    if not os.environ.get("WEKNORA_API_KEY"):
        raise UsageError("set WEKNORA_API_KEY first (any value, e.g. export WEKNORA_API_KEY=sk-sandbox-local): "
                         "the sandbox accepts that key and clients read it from the same variable")
    server = SandboxServer(args.version, host=args.host, port=args.port, data_dir=args.data, faults=args.faults,
                           allow_fault_control=args.allow_fault_control, show_progress=True,
                           weknora_version=args.weknora_version)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(f"sandbox version {server.version.name!r} (as WeKnora {server.release.name}) serving knowledge base "
              f"{server.kb_id!r} on {server.base_url} (API key: the value of $WEKNORA_API_KEY). Ctrl-C stops it.",
              flush=True)
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
        for f in index.write_seed(folder):  # each model's texts: index texts (vector), passages (reranker)
            print(f"wrote {f}")
    return 0


def _cmd_sandbox_versions(args: argparse.Namespace) -> int:
    from weknora_nb.sandbox import load_demo_versions

    for name, v in load_demo_versions(args.data).items():
        print(f"{name:16s} {v.description}")
    return 0


# ---------------------------------------------------------------- the parser, one function per command

Subparsers = Any  # argparse's _SubParsersAction (private)


def _add_score(sub: Subparsers) -> None:
    s = sub.add_parser("score", help="score a results file against a test set")
    s.add_argument("testset", help="test set: .jsonl, .csv, .parquet or a WeKnora dataset folder")
    s.add_argument("results", help="results table: .parquet, .csv or .jsonl")
    s.add_argument("--metrics", nargs="+", default=None, type=_metric_names,
                   help="metric names, e.g. recall@5 ndcg@10 ndcg@10:linear "
                        "(default: the set of docs/method.md section 3)")
    s.add_argument("--stage", action="append", help="score only this stage (repeatable)")
    s.add_argument("--domain-adjustment", type=_domain_adjustment, default=0.0,
                   help="lower acceptance thresholds by this fraction (0.05-0.10) for a specialised domain")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    s.add_argument("--compact", action="store_true", help="with --json: no indentation")
    s.set_defaults(func=_cmd_score)


def _add_collect(sub: Subparsers) -> None:
    at_least_1, at_least_0 = _int_at_least(1), _int_at_least(0)
    c = sub.add_parser("collect", help="collect ranked results from WeKnora into a resumable run folder")
    c.add_argument("--base-url", required=True, type=_base_url, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
    c.add_argument("--kb-id", required=True, action="append", help="knowledge base id (repeatable)")
    c.add_argument("--testset", required=True, help="test set file or WeKnora dataset folder")
    c.add_argument("--stages", default=None,
                   help="comma-separated stages: vector, keyword, hybrid, final, citations, faq (default: the "
                        "first four; on FAQ knowledge bases faq, and no keyword stage where none has that path)")
    c.add_argument("--stages-file", default=None, help="YAML file defining more stages")
    c.add_argument("--repeats", type=at_least_1, default=3, help="repeats of every query and stage (default 3)")
    c.add_argument("--concurrency", type=at_least_1, default=8, help="requests in flight (default 8)")
    c.add_argument("--warmup", type=at_least_0, default=5, help="warm-up queries per stage, not recorded (default 5)")
    c.add_argument("--out", required=True, help="run folder, e.g. outputs/runs/NAME")
    c.add_argument("--system", default=None, help="YAML system description recorded in the manifest")
    c.add_argument("--resume", action="store_true", help="continue the run in --out")
    c.add_argument("--retry-failed", action="store_true", help="with --resume: request failed ones again")
    c.add_argument("--timeout", type=_positive_seconds, default=30.0, help="read timeout per request, seconds")
    c.add_argument("--max-attempts", type=at_least_1, default=4, help="attempts per request (retries + 1)")
    c.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding the API key")
    c.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    c.add_argument("--no-inventory", action="store_true", help="do not fetch the chunk listing")
    c.add_argument("--keep-sessions", action="store_true",
                   help="keep the chat sessions the run creates (default: deleted at the end)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=_cmd_collect)


def _add_gate(sub: Subparsers) -> None:
    g = sub.add_parser("gate", help="exit 1 when a run breaks quality bounds (for CI)")
    g.add_argument("--run", required=True, help="run folder to check")
    g.add_argument("--baseline", default=None, help="run folder to compare with (same test set)")
    g.add_argument("--stage", default=None,
                   help="stage (default: final when the run has it, else the last stage of the pipeline)")
    g.add_argument("--min", action="append", default=[], type=_bound, metavar="METRIC=VALUE",
                   help="minimum mean, repeatable")
    g.add_argument("--max-drop", action="append", default=[], type=_bound, metavar="METRIC=VALUE",
                   help="largest allowed drop from the baseline, repeatable")
    g.add_argument("--allow-incomplete", action="store_true", help="do not fail on failed or missing requests")
    g.set_defaults(func=_cmd_gate)


def _add_report(sub: Subparsers) -> None:
    r = sub.add_parser("report", help="execute the notebooks for a run and write HTML reports")
    r.add_argument("--run", required=True, help="run folder")
    r.add_argument("--baseline", action="append", help="run folder to compare with (repeatable)")
    r.add_argument("--out", default=None, help="reports folder (default: <runs>/../reports)")
    r.add_argument("--no-input", action="store_true", help="hide code cells in the HTML")
    r.add_argument("--stage", default=None,
                   help="focus stage (default: final when the run has it, else the last stage of the pipeline)")
    r.add_argument("--domain-adjustment", type=_domain_adjustment, default=0.0,
                   help="lower acceptance thresholds by this fraction (0.05-0.10) for a specialised domain")
    r.set_defaults(func=_cmd_report)


def _add_demo(sub: Subparsers) -> None:
    d = sub.add_parser("demo", help="the whole workbench on the embedded sandbox, end to end")
    d.add_argument("--out", default="outputs", help="output folder (default outputs)")
    d.add_argument("--repeats", type=_int_at_least(1), default=3, help="repeats of every query (default 3)")
    d.add_argument("--limit", type=_int_at_least(1), default=None, metavar="N",
                   help="only the first N queries of the demo test set (quick runs; default all)")
    d.add_argument("--no-input", action="store_true", help="hide code cells in the HTML reports")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=_cmd_demo)


def _add_sandbox(sub: Subparsers) -> None:
    from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES

    sb = sub.add_parser("sandbox", help="the embedded knowledge base that speaks WeKnora's API")
    sbs = sb.add_subparsers(dest="sandbox_command", required=True)
    serve = sbs.add_parser("serve", help="serve one system version on loopback")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--version", default="baseline", help="system version from versions.yaml")
    serve.add_argument("--weknora-version", default=None, choices=list(RELEASES),
                       help=f"the WeKnora release whose API to emulate (default {DEFAULT_RELEASE}, the latest release)")
    serve.add_argument("--data", default=None, help="demo folder (default: the one shipped with the package)")
    serve.add_argument("--faults", type=_faults, default=None,
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


def build_parser() -> ArgumentParser:
    """The ``weknora-nb`` parser: global options and one sub-parser per command."""
    p = ArgumentParser(prog="weknora-nb", description="Measure how well a WeKnora knowledge base retrieves.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_score, _add_collect, _add_gate, _add_report, _add_demo, _add_sandbox):
        add(sub)
    return p


# ---------------------------------------------------------------- errors to exit codes

def exit_code(exc: BaseException) -> int | None:
    """The exit code :data:`EXIT_CODES` gives ``exc``, or None when it is not a user-facing error."""
    return next((code for cls, code in EXIT_CODES if isinstance(exc, cls)), None)


def error_message(exc: BaseException) -> str:
    """The text after ``error:``: one line (an :class:`InputError` keeps its problem lines)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.strerror}: {exc.filename}"  # e.g. "No such file or directory: 't.jsonl'"
    else:
        text = str(exc)
    if isinstance(exc, InputError):
        return text
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _exit_status(code: Any) -> int:
    """SystemExit's code as an int (None is 0; argparse passes ints)."""
    return code if isinstance(code, int) else 0 if code is None else 1


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argparse error already printed on one line
        return _exit_status(exc.code)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        code = exit_code(exc)
        if code is None:
            raise  # a bug, not a user's mistake: the traceback is wanted
        print(f"error: {error_message(exc)}", file=sys.stderr)
        return code
