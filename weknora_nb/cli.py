"""Command line: ``weknora-nb <command> ...`` (also ``python -m weknora_nb``).

Exit codes (only :func:`main` maps errors to them, through :data:`EXIT_CODES`):

- 0 success;
- 1 the work ran but its verdict is negative: a gate bound broken, an incomplete run, a
  notebook that failed (:class:`ReportError`), a request that failed (:class:`RequestFailed`),
  a sandbox that could not serve (:class:`SandboxError`), a file that could not be written
  (:class:`StorageError`: a read-only folder, a full disk);
- 2 unusable input: a bad option (argparse, :class:`UsageError`, :class:`MetricError`), a
  file that fails validation (:class:`InputError`), a folder that is not a run, a run
  folder already used, runs that cannot be compared, or a file named on the command line
  that cannot be opened;
- 130 interrupted (Ctrl-C, :class:`Interrupted`): what was done is kept and the message gives
  the command that resumes;
- 141 the output's reader stopped reading (``weknora-nb score ... | head``), silently, as a
  program ended by SIGPIPE (:func:`run`).

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
    Interrupted,
    NotComparableError,
    ReportError,
    RequestFailed,
    RunExistsError,
    RunFolderError,
    SandboxError,
    StorageError,
    UsageError,
)

log = logging.getLogger("weknora_nb")
#: ``sandbox serve``: the password of the read-only Postgres role it makes (never printed)
PG_PASSWORD_ENV = "WEKNORA_NB_PG_PASSWORD"
T = TypeVar("T")

#: error class -> exit code, checked in order (the first class the error is an instance of wins)
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (RequestFailed, 1),
    (ReportError, 1),
    (SandboxError, 1),
    (StorageError, 1),
    (Interrupted, 130),
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


def _number(text: str) -> float:
    """``text`` as a float; NaN when it is not a number (the argparse types below refuse NaN)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _positive_seconds(text: str) -> float:
    """An argparse ``type`` accepting a finite number of seconds > 0."""
    value = _number(text)
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


@_argument_type
def _notebook_names(text: str) -> tuple[str, ...]:
    """An argparse ``type`` for comma-separated notebook names (``NOTEBOOKS`` of weknora_nb/reports/render.py),
    each once, in the order given."""
    from weknora_nb.reports.render import NOTEBOOKS

    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(n not in NOTEBOOKS for n in names):
        raise UsageError(argument="each name", allowed=NOTEBOOKS, got=text)
    return names


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


@_argument_type
def _margin(text: str) -> str:
    """An argparse ``type`` for an evidence bound ``METRIC=MARGIN`` (a margin >= 0)."""
    from weknora_nb.analysis.gate import parse_bounds

    parse_bounds([text], what="margin", minimum=0.0)
    return text


@_argument_type
def _effect(text: str) -> str:
    """An argparse ``type`` for ``--detect METRIC=EFFECT`` (an effect other than 0)."""
    from weknora_nb.analysis.gate import parse_bounds

    if not any(parse_bounds([text], what="effect").values()):
        raise argparse.ArgumentTypeError(f"the effect to detect must not be 0, e.g. ndcg@5=0.02. Got {text!r} instead.")
    return text


def _finite_number(text: str) -> float:
    """An argparse ``type`` accepting a finite number."""
    value = _number(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number. Got {text!r} instead.")
    return value


def _base_url(text: str) -> str:
    """An argparse ``type`` for WeKnora's base URL: http or https, with a host."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != -1
    except ValueError:  # a port that is not a number or out of range, a bracket that is not closed
        ok = False
    if not ok:
        from weknora_nb.collect.redact import redact_url  # only now: it loads the collect package

        raise argparse.ArgumentTypeError("must be an http:// or https:// URL with a host, e.g. "
                                         f"http://127.0.0.1:8080. Got {redact_url(text)!r} instead.")
    return text


def _faults(text: str) -> dict[str, Any]:
    """An argparse ``type`` for the sandbox's faults: a JSON object of fault settings, each checked by
    ``FaultConfig.from_dict`` (a rate in [0, 1], any other number in its range, ``seed`` an integer or null)."""
    from weknora_nb.sandbox.faults import FaultConfig

    example = '{"latency_ms": 50, "error_rate": 0.05}'
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got {text!r} instead "
                                         f"({exc.msg} at column {exc.colno}).") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got a JSON text nested "
                                         "too deeply instead.") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got {text!r} instead.")
    try:
        FaultConfig.from_dict(data)  # every setting checked there: its name, type and range
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
    """Print the scores; exit 1 when nothing could be scored (a results file with no row, or none
    for a query of the test set): the figures would be empty, not zero. Failed or missing requests
    of a partial run are counted and listed in the output, and the exit stays 0."""
    from weknora_nb.core.scoring import NO_ROWS, NO_TESTSET_ROW, per_query_format, score_files
    from weknora_nb.reports.text import format_scores

    metrics = [m for part in args.metrics for m in part.split(",") if m.strip()] if args.metrics else None
    if args.per_query_out:
        per_query_format(args.per_query_out)   # a suffix it cannot write is refused before any work
    sc = score_files(args.testset, args.results, metrics, stages=args.stage or None,
                     domain_adjustment=args.domain_adjustment)
    if args.per_query_out:
        sc.write_per_query(args.per_query_out)
    if args.json:
        _print_bytes(sc.json_pieces(per_query=not args.per_query_out, indent=not args.compact))
    else:
        print(format_scores(sc))
    if sc.counts.incomplete_reason in (NO_ROWS, NO_TESTSET_ROW):
        print(f"error: nothing was scored: {sc.counts.incomplete_reason}", file=sys.stderr)
        return 1
    return 0


def _print_bytes(pieces: list[bytes | memoryview]) -> None:
    """Print UTF-8 text given as pieces of bytes (and a newline) on stdout, without decoding it when stdout takes
    bytes."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        print(b"".join(pieces).decode("utf-8"))
        return
    sys.stdout.flush()
    out.writelines(pieces)
    out.write(b"\n")
    out.flush()


def _collect_stages(args: argparse.Namespace) -> list[Any] | None:
    """The Stage objects named by ``--stages`` (the built-in ones, then those of ``--stages-file``);
    None without ``--stages``: the collector's defaults, fitted to the knowledge bases (a stage file is
    still checked)."""
    from weknora_nb.collect.stages import load_stage_file, resolve_stages

    extra = load_stage_file(args.stages_file) if args.stages_file else None
    return resolve_stages(args.stages, extra) if args.stages is not None else None


def _cmd_collect(args: argparse.Namespace) -> int:
    """Collect; a knowledge base the server does not have, or a key, tenant or capability it refuses, is
    unusable input (exit 2, one line saying what to do) rather than a run of failed requests. Ctrl-C
    stops it cleanly: :class:`Interrupted` (exit 130) says what was kept and the command that resumes."""
    from weknora_nb.collect.redact import install_log_redaction

    install_log_redaction(handlers=logging.getLogger().handlers)  # no URL's secret in any log line
    try:
        return _collect_from_args(args)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(args)) from None


def _collect_from_args(args: argparse.Namespace) -> int:
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
                          progress=not args.quiet, keep_sessions=args.keep_sessions, integrity=not args.no_check)
    except (AuthFailed, NotFound) as exc:
        raise UsageError(str(exc)) from None
    print(summary.describe())
    return 0 if summary.complete else 1


def _cmd_check(args: argparse.Namespace) -> int:
    """Check a knowledge base's integrity through the API (and with ``--dsn`` its Postgres tables): the report,
    or ``--json`` the whole result; exit 1 when a problem is found. The DSN comes from ``--dsn`` or
    ``$WEKNORA_NB_PG_DSN`` and is never shown (its password is masked in everything printed)."""
    import os

    from weknora_nb.collect.client import ClientSettings
    from weknora_nb.collect.integrity import DSN_ENV, run_checks
    from weknora_nb.collect.redact import install_log_redaction

    install_log_redaction(handlers=logging.getLogger().handlers)
    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout)
    dsn = args.dsn or os.environ.get(DSN_ENV) or None
    embeddings = None
    if args.embeddings_url or args.embeddings_model:
        if not (args.embeddings_url and args.embeddings_model and dsn and args.testset):
            raise UsageError("the vector-store trace needs --embeddings-url, --embeddings-model, --dsn (or "
                             f"${DSN_ENV}) and --testset together")
        from weknora_nb.collect.vectortrace import EmbeddingSettings

        embeddings = EmbeddingSettings(args.embeddings_url, args.embeddings_model)
    result = run_checks(settings, args.kb_id, testset=args.testset, dsn=dsn, embeddings=embeddings)
    if args.out:
        for path in result.write(args.out):
            log.info("wrote %s", path)
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False, indent=2))
    else:
        print(result.describe(first=args.first))
    return 1 if result.problems else 0


def _add_check(sub: Subparsers) -> None:
    c = sub.add_parser("check", help="check a knowledge base's integrity before measuring it (exit 1: problems)",
                       description="Through the API: labelled chunks that are missing, disabled or of a knowledge "
                       "whose parse failed (with --testset), knowledge without chunks or not parsed, chunks with "
                       "identical content, listings that fell short; with --dsn (a read-only Postgres role) the "
                       "vectors too. Exit 0 when clean, 1 when a problem is found, 2 on unusable input.")
    c.add_argument("--base-url", required=True, type=_base_url, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
    c.add_argument("--kb-id", required=True, action="append", help="knowledge base id (repeatable)")
    c.add_argument("--testset", default=None, help="test set whose labels are checked against the knowledge base")
    c.add_argument("--dsn", default=None, help="read-only Postgres DSN of WeKnora's database (default: "
                                                "$WEKNORA_NB_PG_DSN); never printed or written")
    c.add_argument("--embeddings-url", default=None, help="with --dsn and --testset: an OpenAI-compatible "
                   "embeddings endpoint serving the knowledge base's model (e.g. http://host/v1); the test set's "
                   "queries are traced into the vector store (index miss / embedding miss, the index's recall)")
    c.add_argument("--embeddings-model", default=None, help="the knowledge base's embedding model at that endpoint "
                                                             "(key: $WEKNORA_NB_EMBEDDINGS_API_KEY)")
    c.add_argument("--out", default=None, help="folder for check.json and the trace's files (vector_trace*.parquet, "
                                                "vector_trace.json): give the run folder and its reports show them")
    c.add_argument("--json", action="store_true", help="print the whole result as JSON")
    c.add_argument("--first", type=_int_at_least(1), default=5, help="subjects shown per check (default 5)")
    c.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding the API key")
    c.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    c.add_argument("--timeout", type=_positive_seconds, default=30.0, help="read timeout per request, seconds")
    c.set_defaults(func=_cmd_check)


def _interrupted_message(args: argparse.Namespace) -> str:
    """What an interrupted collection kept, and the command that resumes it (this one plus ``--resume``,
    its URLs' secrets masked)."""
    import shlex
    from pathlib import Path

    from weknora_nb.collect.checkpoint import count_records
    from weknora_nb.collect.redact import redact_command
    from weknora_nb.core.run import CHECKPOINT

    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    command = shlex.join(["weknora-nb", *redact_command(argv), *([] if "--resume" in argv else ["--resume"])])
    n = count_records(Path(args.out) / CHECKPOINT)
    kept = (f"{n} finished request(s) are kept in {Path(args.out) / CHECKPOINT}" if n
            else "no request had finished")
    return f"interrupted: {kept}; to go on, run: {command}"


def _cmd_gate(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.gate import gate, parse_bounds

    _check_run_folder("--run", args.run)
    if args.baseline:
        _check_run_folder("--baseline", args.baseline)
    result = gate(args.run, baseline=args.baseline, stage=args.stage, minimums=parse_bounds(args.min),
                  max_drops=parse_bounds(args.max_drop), allow_incomplete=args.allow_incomplete,
                  non_inferior=parse_bounds(args.non_inferior, what="margin", minimum=0.0),
                  not_worse=parse_bounds(args.not_worse, what="margin", minimum=0.0),
                  detect=parse_bounds(args.detect, what="effect"), improve_by=args.improve_by,
                  resamples=args.resamples, seed=args.seed, adjust=args.adjust)
    print(result.describe())
    if args.summary_md or args.junit:
        from weknora_nb.analysis.export import gate_junit, gate_markdown, write_text

        if args.summary_md:
            print(f"wrote {write_text(args.summary_md, gate_markdown(result))}")
        if args.junit:
            print(f"wrote {write_text(args.junit, gate_junit(result))}")
    return 0 if result.passed else 1


def _cmd_export(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.export import export_run

    _check_run_folder("--run", args.run)
    for path in export_run(args.run, args.out, fmt=args.format, stages=args.stage, repeats=args.repeat):
        print(f"wrote {path}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from weknora_nb.reports.render import NEEDS, NOTEBOOKS, notebooks_for, render_report

    _check_run_folder("--run", args.run)
    for baseline in args.baseline or []:
        _check_run_folder("--baseline", baseline)
    notebooks = args.notebooks or NOTEBOOKS
    missing = [n for n in notebooks if n not in notebooks_for(args.run, notebooks)] if args.notebooks else []
    if missing:   # asked for by name, not just skipped as the default set skips them
        raise UsageError(f"--notebooks: {', '.join(missing)} needs {', '.join(sorted({NEEDS[n] for n in missing}))} "
                         f"in {args.run} (a run collected with a chat stage)")
    parameters = {"stage": args.stage, "domain_adjustment": args.domain_adjustment}
    try:
        report = render_report(args.run, args.baseline or [], out_root=args.out, no_input=args.no_input,
                               notebooks=notebooks, parameters=parameters, jobs=args.jobs)
    except KeyboardInterrupt:
        raise Interrupted("interrupted: the pages rendered so far are kept, the index page is not written; "
                          "run the command again to render the report") from None
    print(report.index)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from weknora_nb.demo import run_demo

    result = run_demo(args.out, repeats=args.repeats, no_input=args.no_input, progress=not args.quiet,
                      limit=args.limit, jobs=args.jobs)
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
        _print_sandbox_database(server)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0


def _print_sandbox_database(server: Any) -> None:
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
        from weknora_nb.core.testset import load_testset

        data = Path(args.data or demo_dir())
        queries = [q for ts in (data / "testset.jsonl", data / "faq" / "testset.jsonl") if ts.exists()
                   for q in load_testset(ts).queries["query"].tolist()]
        # each model's texts: index texts (vector), passages (reranker), and the test sets' queries
        for f in index.write_seed(data / "cache", queries):
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
    s.add_argument("--per-query-out", metavar="PATH",
                   help="write the per-query figures (each metric per query and stage, averaged over repeats) to "
                        "PATH: .parquet, .csv or .jsonl (then --json leaves them out)")
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
    c.add_argument("--no-inventory", action="store_true", help="do not fetch the chunk listing (nor check it)")
    c.add_argument("--no-check", action="store_true",
                   help="no integrity checks (by default the knowledge base is listed at the start and the end, "
                        "checked, and a change during the run is recorded)")
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
    g.add_argument("--non-inferior", action="append", default=[], type=_margin, metavar="METRIC=MARGIN",
                   help="pass only when the 95 %% interval of the delta lies above -MARGIN (inconclusive fails); "
                        "repeatable, needs --baseline")
    g.add_argument("--not-worse", action="append", default=[], type=_margin, metavar="METRIC=MARGIN",
                   help="fail only when the 95 %% interval of the delta lies entirely below -MARGIN (inconclusive "
                        "passes); repeatable, needs --baseline")
    g.add_argument("--detect", action="append", default=[], type=_effect, metavar="METRIC=EFFECT",
                   help="print the valid queries needed to detect EFFECT at 80 %% power; repeatable")
    g.add_argument("--improve-by", type=_finite_number, default=0.0, metavar="AMOUNT",
                   help="report the share of queries improving by more than AMOUNT (default 0: strictly better)")
    g.add_argument("--adjust", choices=("none", "bonferroni", "holm"), default="none",
                   help="adjust the evidence bounds for their number (default none: each interval at 95 %%)")
    g.add_argument("--resamples", type=_int_at_least(100), default=10_000,
                   help="paired-bootstrap resamples (default 10000)")
    g.add_argument("--seed", type=_int_at_least(0), default=0, help="bootstrap seed (default 0)")
    g.add_argument("--summary-md", default=None, metavar="FILE",
                   help="write a Markdown summary (a PR comment, $GITHUB_STEP_SUMMARY)")
    g.add_argument("--junit", default=None, metavar="FILE", help="write a JUnit XML report (one test case per bound)")
    g.add_argument("--allow-incomplete", action="store_true", help="do not fail on failed or missing requests")
    g.set_defaults(func=_cmd_gate)


def _add_export(sub: Subparsers) -> None:
    e = sub.add_parser("export", help="write a run's qrels and result lists for ranx or trec_eval")
    e.add_argument("--run", required=True, help="run folder")
    e.add_argument("--format", required=True, choices=("ranx", "trec"), help="ranx JSON or TREC files")
    e.add_argument("--out", required=True, help="folder to write into")
    e.add_argument("--stage", action="append", default=None, help="only this stage (repeatable; default: every one)")
    e.add_argument("--repeat", action="append", default=None, type=_int_at_least(1),
                   help="only this repeat (repeatable; default: every one)")
    e.set_defaults(func=_cmd_export)


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
    r.add_argument("--jobs", type=_int_at_least(1), default=None, metavar="N",
                   help="notebooks executed at once (default: one per core; 1: one after another)")
    r.add_argument("--notebooks", type=_notebook_names, default=None, metavar="NAMES",
                   help="only these notebooks, comma-separated, e.g. 02_metrics,05_compare (default: every one "
                        "the run has data for)")
    r.set_defaults(func=_cmd_report)


def _add_demo(sub: Subparsers) -> None:
    d = sub.add_parser("demo", help="the whole workbench on the embedded sandbox, end to end")
    d.add_argument("--out", default="outputs", help="output folder (default outputs)")
    d.add_argument("--repeats", type=_int_at_least(1), default=3, help="repeats of every query (default 3)")
    d.add_argument("--limit", type=_int_at_least(1), default=None, metavar="N",
                   help="only the first N queries of the demo test set (quick runs; default all)")
    d.add_argument("--no-input", action="store_true", help="hide code cells in the HTML reports")
    d.add_argument("--jobs", type=_int_at_least(1), default=None, metavar="N",
                   help="versions measured (each in a process of its own) and notebooks rendered at a time "
                        "(default: one per core; 1: one after another in this process)")
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
                       help="also write the chunk embeddings and tokens to <data>/cache (shipped so a fresh clone "
                            "starts fast)")
    build.set_defaults(func=_cmd_sandbox_build)
    vers = sbs.add_parser("versions", help="list the system versions")
    vers.add_argument("--data", default=None)
    vers.set_defaults(func=_cmd_sandbox_versions)


# ---------------------------------------------------------------- testset: pooling, labels, versions

def _cmd_testset_pool(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.pooling import pool, write_worksheet

    result = pool(args.testset, args.runs, depth=args.depth, assessor=args.assessor)
    write_worksheet(result.rows, args.out)
    print(result.describe())
    print(f"wrote {args.out} ({result.n_pooled} rows to judge)")
    return 0


def _cmd_testset_merge_labels(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.pooling import label_file
    from weknora_nb.core.lineage import merge_labels

    files = [label_file(p, args.assessor) for p in args.labels]
    print(merge_labels(args.testset, files, args.out, adjudicator=args.adjudicator).describe())
    return 0


def _cmd_testset_carry_over(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.carryover import carry_over_files, review_path
    from weknora_nb.core.lineage import lineage_path

    result, _ = carry_over_files(args.testset, args.old_chunks, args.new_chunks, args.out, by=args.match_by,
                                 rule=args.rule)
    print(result.describe())
    print(f"wrote {args.out}, {lineage_path(args.out)} and {review_path(args.out)} "
          f"({len(result.review)} pairs to judge)")
    return 0


def _cmd_testset_agreement(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.agreement import agreement
    from weknora_nb.analysis.pooling import read_judgements

    result = agreement(j for p in args.labels for j in read_judgements(p, args.assessor))
    print(json.dumps(result.to_json_dict(), ensure_ascii=False, indent=2) if args.json else result.describe())
    return 0


def _add_testset_pool(ts: Subparsers) -> None:
    p = ts.add_parser("pool", help="pool the unlabelled top chunks of runs into a worksheet to judge")
    p.add_argument("--testset", required=True, help="test set file or WeKnora dataset folder")
    p.add_argument("--runs", required=True, nargs="+", metavar="DIR", help="run folders to pool from")
    p.add_argument("--depth", type=_int_at_least(1), default=10, help="top chunks of each stage (default 10)")
    p.add_argument("--out", required=True, help="worksheet: .csv (UTF-8 with BOM) or .xlsx")
    p.add_argument("--assessor", default=None, help="assessor id written in every row")
    p.set_defaults(func=_cmd_testset_pool)


def _add_testset_merge_labels(ts: Subparsers) -> None:
    m = ts.add_parser("merge-labels", help="a new test-set version: the test set plus judgements, with its lineage")
    m.add_argument("--testset", required=True, help="the test set the judgements were made on")
    m.add_argument("--labels", required=True, nargs="+", metavar="FILE",
                   help="labels logs (.jsonl) or filled worksheets (.csv, .xlsx)")
    m.add_argument("--out", required=True, help="the new test set (.jsonl); its lineage goes beside it")
    m.add_argument("--adjudicator", default=None, help="assessor whose grade settles a disagreement")
    m.add_argument("--assessor", default=None, help="assessor of worksheet rows whose assessor cell is blank")
    m.set_defaults(func=_cmd_testset_merge_labels)


def _add_testset_carry_over(ts: Subparsers) -> None:
    c = ts.add_parser("carry-over", help="carry labels to a re-chunked knowledge base by content overlap")
    c.add_argument("--testset", required=True, help="the test set labelled on the old chunks")
    c.add_argument("--old-chunks", required=True, help="chunk inventory the labels were made on (chunks.parquet)")
    c.add_argument("--new-chunks", required=True, help="chunk inventory after re-chunking (chunks.parquet)")
    c.add_argument("--out", required=True, help="the new test set (.jsonl); lineage and review worksheet beside it")
    c.add_argument("--match-by", default="knowledge_id", choices=["knowledge_id", "knowledge_title"],
                   help="what makes an old and a new chunk the same document (default knowledge_id)")
    c.add_argument("--rule", default="strict", choices=["strict", "lenient"],
                   help="strict (default): a relevant chunk's grade goes only to a new chunk holding nearly all of "
                        "it; lenient: also to pieces holding >= 30%% of it, and to relevant chunks merged whole")
    c.set_defaults(func=_cmd_testset_carry_over)


def _add_testset_agreement(ts: Subparsers) -> None:
    a = ts.add_parser("agreement", help="agreement between assessors (weighted Cohen's, Fleiss' kappa)")
    a.add_argument("--labels", required=True, nargs="+", metavar="FILE",
                   help="labels logs (.jsonl) or filled worksheets (.csv, .xlsx) of several assessors")
    a.add_argument("--assessor", default=None, help="assessor of worksheet rows whose assessor cell is blank")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=_cmd_testset_agreement)


@_argument_type
def _since(text: str) -> Any:
    """An argparse ``type`` for ``--since``: a date or a date and time (``parse_since``)."""
    from weknora_nb.collect.history import parse_since

    return parse_since(text)


def _cmd_testset_sample(args: argparse.Namespace) -> int:
    """Sample candidate queries from WeKnora's conversation history. A key that may not read sessions is
    unusable input (exit 2, one line); sessions or listing pages that could not be read make exit 1 (the
    files are written all the same, their summary counts what is missing); Ctrl-C writes nothing (130)."""
    from weknora_nb.analysis.sampling import sample_candidates, write_candidates
    from weknora_nb.collect.client import ClientSettings
    from weknora_nb.collect.history import fetch_history
    from weknora_nb.core.errors import AuthFailed, NotFound

    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout, max_attempts=args.max_attempts)
    try:
        crawl = fetch_history(settings, kb_id=args.kb_id, since=args.since, in_flight=args.concurrency)
    except (AuthFailed, NotFound) as exc:
        raise UsageError(f"cannot read the conversation history: {exc}") from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted while reading the history: nothing was written; run the command again") from None
    if not crawl.queries:
        raise UsageError(f"no question to sample: {crawl.user_messages} user message(s) read in "
                         f"{crawl.sessions_read} session(s), {crawl.before_since} before --since, "
                         f"{sum(crawl.other_kb.values())} not naming --kb-id; nothing was written")
    sample = sample_candidates(crawl.queries, n=args.n, seed=args.seed)
    summary = write_candidates(args.out, sample, crawl.summary())
    print(json.dumps(json.loads(summary.read_text(encoding="utf-8")), ensure_ascii=False, indent=2))
    missing = "" if crawl.complete else (f"; incomplete: {sum(crawl.sessions_failed.values())} session(s) and "
                                         f"{crawl.pages_failed} listing page(s) could not be read")
    print(f"wrote {args.out} ({len(sample.records)} candidates) and {summary}{missing}")
    return 0 if crawl.complete else 1


def _add_testset_sample(ts: Subparsers) -> None:
    s = ts.add_parser("sample", help="sample candidate queries from WeKnora's conversation history")
    s.add_argument("--base-url", required=True, type=_base_url, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
    s.add_argument("--kb-id", default=None,
                   help="only questions tied to this knowledge base (by their answer's references, an @-mention, "
                        "else the session's last request)")
    s.add_argument("--since", type=_since, default=None, metavar="DATE",
                   help="only questions asked at or after DATE (2025-12-01 is midnight UTC; or 2025-12-01T00:00+08:00)")
    s.add_argument("--n", type=_int_at_least(1), default=300, help="candidates to sample (default 300)")
    s.add_argument("--seed", type=_int_at_least(0), default=0, help="random seed of the sample (default 0)")
    s.add_argument("--out", required=True, help="candidates (.jsonl, a loadable test set); summary beside it")
    s.add_argument("--concurrency", type=_int_at_least(1), default=4, help="sessions read at a time (default 4)")
    s.add_argument("--timeout", type=_positive_seconds, default=30.0, help="read timeout per request, seconds")
    s.add_argument("--max-attempts", type=_int_at_least(1), default=4, help="attempts per request (retries + 1)")
    s.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding the API key")
    s.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    s.set_defaults(func=_cmd_testset_sample)


def _add_testset(sub: Subparsers) -> None:
    """``weknora-nb testset <command>``: one ``_add_testset_*`` function per command, listed here."""
    t = sub.add_parser("testset", help="build and version test sets: pool, label, merge, carry labels over")
    ts = t.add_subparsers(dest="testset_command", required=True)
    for add in (_add_testset_sample, _add_testset_pool, _add_testset_merge_labels, _add_testset_carry_over,
                _add_testset_agreement):
        add(ts)


# ---------------------------------------------------------------- judge: the LLM judge of answers

def _non_negative(text: str) -> float:
    """An argparse ``type`` for a finite number >= 0 (a price, a temperature)."""
    value = _number(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0. Got {text!r} instead.")
    return value


def _positive(text: str) -> float:
    """An argparse ``type`` for a finite number > 0 (a cost limit)."""
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0. Got {text!r} instead.")
    return value


def _cmd_judge(args: argparse.Namespace) -> int:
    """Judge a run's answers (or two runs' answers, ``--pairwise``). Exit 1 when a judgement failed or
    ``--max-cost`` stopped the run; Ctrl-C keeps what was judged (exit 130, the same command goes on)."""
    from weknora_nb.collect.redact import install_log_redaction

    install_log_redaction(handlers=logging.getLogger().handlers)  # no URL's secret in any log line
    try:
        return _judge_from_args(args)
    except KeyboardInterrupt:
        import shlex

        from weknora_nb.collect.redact import redact_command

        command = shlex.join(["weknora-nb", *redact_command(list(getattr(args, "argv", None) or sys.argv[1:]))])
        raise Interrupted(f"interrupted: the judgements finished are kept in {args.run}; to go on, run: "
                          f"{command}") from None


def _judge_from_args(args: argparse.Namespace) -> int:
    import os

    from weknora_nb.analysis.answers import format_judge_summary, judge_summary, pairwise_summary, read_ratings
    from weknora_nb.collect.judge import JudgeOptions, judge_pairwise, judge_run
    from weknora_nb.collect.llm import LLMSettings

    _check_run_folder("--run", args.run)
    if args.pairwise != bool(args.baseline):
        raise UsageError("--pairwise and --baseline DIR go together (the run to compare --run with)")
    if args.baseline:
        _check_run_folder("--baseline", args.baseline)
    ratings = read_ratings(args.ratings) if args.ratings else None  # a bad file stops it before anything is spent
    base_url = args.base_url or os.environ.get("WEKNORA_NB_JUDGE_BASE_URL")
    model = args.model or os.environ.get("WEKNORA_NB_JUDGE_MODEL")
    if not (base_url and model) and not args.dry_run:
        raise UsageError("the judge needs --base-url and --model (or $WEKNORA_NB_JUDGE_BASE_URL and "
                         "$WEKNORA_NB_JUDGE_MODEL); only --dry-run goes without")
    settings = LLMSettings(base_url, model, api_key_env=args.api_key_env, timeout_s=args.timeout,
                           max_attempts=args.max_attempts, max_connections=max(4, args.concurrency)) \
        if base_url and model else None
    options = JudgeOptions(repeats=args.repeats, temperature=args.temperature, max_tokens=args.max_tokens,
                           seed=args.seed, language=args.language, prompt_version=args.prompt_version,
                           concurrency=args.concurrency, parse_retries=args.parse_retries, price_in=args.price_in,
                           price_out=args.price_out, max_cost=args.max_cost,
                           stages=tuple(args.stage) if args.stage else None, retry_failed=args.retry_failed,
                           replace=args.replace, cache=args.cache, progress=not args.quiet and not args.json)
    if args.pairwise:
        outcome = judge_pairwise(args.run, args.baseline, settings, options, dry_run=args.dry_run)
    else:
        outcome = judge_run(args.run, settings, options, dry_run=args.dry_run)
    judge = outcome.manifest.get("judge") or {}
    summary: dict[str, Any] = {
        "run": str(args.run), "mode": outcome.mode, "dry_run": outcome.dry_run,
        "judge": {"model": model, "server": settings.server if settings else None,
                  "served_models": outcome.manifest.get("served_models", []),
                  "rule_based": bool(outcome.manifest.get("rule_based")), "prompt_version": judge.get("prompt_version"),
                  "notes": outcome.manifest.get("notes", [])},
        **outcome.counts(), "ledger": outcome.manifest.get("ledger"), "judgements_file": str(outcome.log_path)}
    if outcome.estimate is not None:
        summary["estimate"] = outcome.estimate
    if args.pairwise:
        summary["baseline"] = str(args.baseline)
        summary["pairwise"] = pairwise_summary(outcome.records)
    else:
        summary.update(judge_summary(outcome.records, ratings=ratings))
    print(json.dumps(summary, ensure_ascii=False) if args.json else format_judge_summary(summary))
    return 0 if outcome.dry_run or outcome.complete else 1


def _add_judge(sub: Subparsers) -> None:
    at_least_0, at_least_1 = _int_at_least(0), _int_at_least(1)
    j = sub.add_parser("judge", help="rate a run's answers with an LLM judge (correctness, faithfulness, relevance)",
                       description="Rate every answer of a run (its answers.jsonl) 1-5 for correctness, faithfulness "
                       "and relevance with an OpenAI-compatible chat-completions server; the key is read from "
                       "$WEKNORA_NB_JUDGE_API_KEY. Counts are of judgements (answers x repeats). Exit 0 when every "
                       "judgement was made, 1 when some failed or --max-cost stopped the run, 2 for bad input.")
    j.add_argument("--run", required=True, help="run folder whose answers are judged")
    j.add_argument("--pairwise", action="store_true", help="compare --run with --baseline answer by answer")
    j.add_argument("--baseline", default=None, help="with --pairwise: the run folder to compare with")
    j.add_argument("--base-url", type=_base_url, default=None,
                   help="the API's base URL, e.g. http://127.0.0.1:8080/v1 (the sandbox) or "
                        "https://dashscope.aliyuncs.com/compatible-mode/v1 (default $WEKNORA_NB_JUDGE_BASE_URL)")
    j.add_argument("--model", default=None,
                   help="model name, e.g. qwen-plus, or sandbox-rule-judge (default $WEKNORA_NB_JUDGE_MODEL)")
    j.add_argument("--api-key-env", default="WEKNORA_NB_JUDGE_API_KEY", help="environment variable holding the key")
    j.add_argument("--repeats", type=at_least_1, default=3, help="judgements of every answer (default 3)")
    j.add_argument("--concurrency", type=at_least_1, default=4, help="requests in flight (default 4)")
    j.add_argument("--temperature", type=_non_negative, default=0.5, help="sampling temperature (default 0.5)")
    j.add_argument("--max-tokens", type=_int_at_least(16), default=400, help="longest reply, tokens (default 400)")
    j.add_argument("--seed", type=at_least_0, default=0, help="first seed (repeat r sends seed + 1000 (r - 1))")
    j.add_argument("--language", default="auto", choices=["auto", "zh", "en"],
                   help="prompt language (default auto: Chinese when the question holds Chinese)")
    j.add_argument("--prompt-version", default=None, help="prompt version (default v1; pairwise-v1 with --pairwise)")
    j.add_argument("--stage", action="append", help="judge only this stage's answers (repeatable)")
    j.add_argument("--price-in", type=_non_negative, default=0.0, help="price per million prompt tokens (default 0)")
    j.add_argument("--price-out", type=_non_negative, default=0.0,
                   help="price per million completion tokens (default 0)")
    j.add_argument("--max-cost", type=_positive, default=None, metavar="AMOUNT",
                   help="stop before the next call would take the cost past AMOUNT (in the prices' currency)")
    j.add_argument("--dry-run", action="store_true", help="estimate the calls, tokens and cost; call nothing")
    j.add_argument("--cache", default=None, help="cache file (default <runs folder>/.judge-cache.sqlite)")
    j.add_argument("--retry-failed", action="store_true", help="judge the failed judgements again")
    j.add_argument("--replace", action="store_true", help="discard judgements made by another judge and start over")
    j.add_argument("--parse-retries", type=at_least_0, default=2, help="asks again after an invalid reply (default 2)")
    j.add_argument("--timeout", type=_positive_seconds, default=120.0, help="read timeout per request, seconds")
    j.add_argument("--max-attempts", type=at_least_1, default=4, help="attempts per request (retries + 1)")
    j.add_argument("--ratings", default=None, metavar="FILE",
                   help="human ratings (.jsonl: query_id, stage?, repeat?, correctness, faithfulness, relevance): "
                        "the judge's agreement with them (Spearman, quadratic-weighted kappa)")
    j.add_argument("--json", action="store_true", help="print one JSON object")
    j.add_argument("--quiet", action="store_true", help="no progress bar")
    j.set_defaults(func=_cmd_judge)


def build_parser() -> ArgumentParser:
    """The ``weknora-nb`` parser: global options and one sub-parser per command."""
    p = ArgumentParser(prog="weknora-nb", description="Measure how well a WeKnora knowledge base retrieves.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_score, _add_collect, _add_check, _add_gate, _add_export, _add_report, _add_demo, _add_sandbox,
                _add_testset, _add_judge):
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


def run() -> int:
    """The ``weknora-nb`` program (and ``python -m weknora_nb``): :func:`main` of the process's arguments. A reader
    of stdout that stops reading (``weknora-nb score ... | head``) ends it silently with status 141, as SIGPIPE
    ends a command-line tool."""
    try:
        code = main()
        sys.stdout.flush()   # here, where a reader that stopped is caught, not in the interpreter's exit
        return code
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nothing more to flush at exit
        return 141


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argparse error already printed on one line
        return _exit_status(exc.code)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed: an interrupted command tells how to resume
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        code = int(args.func(args) or 0)
    except Exception as exc:
        error_code = exit_code(exc)
        if error_code is None:
            raise  # a bug, not a user's mistake: the traceback is wanted
        print(f"error: {error_message(exc)}", file=sys.stderr)
        return error_code
    return code
