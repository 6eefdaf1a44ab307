"""``weknora-nb collect`` and ``weknora-nb check``: the commands that put requests to a WeKnora server about its
knowledge bases, to collect their ranked results into a resumable run folder or to check their integrity before
measuring them. Both mask the secrets of URLs in every log line; a knowledge base, key or tenant the server refuses
is unusable input (exit 2), not a run of failed requests."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from weknora_nb.cli.options import Subparsers, base_url, int_at_least, positive_seconds
from weknora_nb.core.errors import Interrupted, UsageError
from weknora_nb.core.weknora import UI_CHAT_AGENT

log = logging.getLogger("weknora_nb")


def add_collect(sub: Subparsers) -> None:
    at_least_1, at_least_0 = int_at_least(1), int_at_least(0)
    c = sub.add_parser("collect", help="collect ranked results from WeKnora into a resumable run folder")
    c.add_argument("--base-url", required=True, type=base_url, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
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
    c.add_argument("--timeout", type=positive_seconds, default=30.0, help="read timeout per request, seconds")
    c.add_argument("--deadline", type=positive_seconds, default=300.0,
                    help="longest one request may take, its retries and a chat's stream included, seconds "
                         "(default 300)")
    c.add_argument("--max-attempts", type=at_least_1, default=4, help="attempts per request (retries + 1)")
    c.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding the API key")
    c.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    c.add_argument("--no-inventory", action="store_true", help="do not fetch the chunk listing (nor check it)")
    c.add_argument("--no-check", action="store_true",
                   help="no integrity checks (by default the knowledge base is listed at the start and the end, "
                        "checked, and a change during the run is recorded)")
    c.add_argument("--keep-sessions", action="store_true",
                   help="keep the chat sessions the run creates (default: deleted at the end)")
    c.add_argument("--chat-agent", default=UI_CHAT_AGENT, metavar="ID",
                   help=f"the agent chat stages name, as WeKnora's web UI does (default {UI_CHAT_AGENT}: the "
                        "UI's normal chat, with that agent's retrieval settings); 'none' sends no agent_id "
                        "(config.yaml's conversation settings)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_collect)


def cmd_collect(args: argparse.Namespace) -> int:
    """Collect; a knowledge base the server does not have, or a key, tenant or capability it refuses, is
    unusable input (exit 2, one line saying what to do) rather than a run of failed requests. Ctrl-C
    stops it cleanly: :class:`Interrupted` (exit 130) says what was kept and the command that resumes."""
    from weknora_nb.collect.http.redact import install_log_redaction

    install_log_redaction(handlers=logging.getLogger().handlers)  # no URL's secret in any log line
    try:
        return _collect_from_args(args)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(args)) from None


def _collect_from_args(args: argparse.Namespace) -> int:
    from weknora_nb.collect.http.client import ClientSettings
    from weknora_nb.collect.run.collector import collect
    from weknora_nb.collect.run.system import load_system_description
    from weknora_nb.core.errors import AuthFailed, NotFound

    system = load_system_description(args.system) if args.system else None
    stages = _collect_stages(args)
    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout, deadline_s=args.deadline, max_attempts=args.max_attempts,
                              max_connections=args.concurrency)
    try:
        summary = collect(settings, args.kb_id, args.testset, args.out, stages=stages, repeats=args.repeats,
                          concurrency=args.concurrency, warmup=args.warmup, system=system, resume=args.resume,
                          retry_failed=args.retry_failed, inventory=not args.no_inventory,
                          progress=not args.quiet, keep_sessions=args.keep_sessions, integrity=not args.no_check,
                          chat_agent=args.chat_agent)
    except (AuthFailed, NotFound) as exc:
        raise UsageError(str(exc)) from None
    print(summary.describe())
    return 0 if summary.complete else 1


def _collect_stages(args: argparse.Namespace) -> list[Any] | None:
    """The Stage objects named by ``--stages`` (the built-in ones, then those of ``--stages-file``);
    None without ``--stages``: the collector's defaults, fitted to the knowledge bases (a stage file is
    still checked)."""
    from weknora_nb.collect.run.stages import load_stage_file, resolve_stages

    extra = load_stage_file(args.stages_file) if args.stages_file else None
    return resolve_stages(args.stages, extra) if args.stages is not None else None


def _interrupted_message(args: argparse.Namespace) -> str:
    """What an interrupted collection kept, and the command that resumes it (this one plus ``--resume``,
    its URLs' secrets masked)."""
    import shlex
    from pathlib import Path

    from weknora_nb.collect.http.redact import redact_command
    from weknora_nb.collect.run.checkpoint import count_records
    from weknora_nb.core.run import CHECKPOINT

    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    command = shlex.join(["weknora-nb", *redact_command(argv), *([] if "--resume" in argv else ["--resume"])])
    n = count_records(Path(args.out) / CHECKPOINT)
    kept = (f"{n} finished request(s) are kept in {Path(args.out) / CHECKPOINT}" if n
            else "no request had finished")
    return f"interrupted: {kept}; to go on, run: {command}"


def add_check(sub: Subparsers) -> None:
    c = sub.add_parser("check", help="check a knowledge base's integrity before measuring it (exit 1: problems)",
                       description="Through the API: labelled chunks that are missing, disabled, of a knowledge "
                       "whose parse failed or that search can never return (index not ready, a parent_text chunk) "
                       "(with --testset), knowledge without chunks or not parsed, chunks with "
                       "identical content, listings that fell short; with --dsn (a read-only Postgres role) the "
                       "vectors too. Exit 0 when clean, 1 when a problem is found or a check could not run, 2 on "
                       "unusable input.")
    c.add_argument("--base-url", required=True, type=base_url, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
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
    c.add_argument("--first", type=int_at_least(1), default=5, help="subjects shown per check (default 5)")
    c.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding the API key")
    c.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    c.add_argument("--timeout", type=positive_seconds, default=30.0, help="read timeout per request, seconds")
    c.add_argument("--deadline", type=positive_seconds, default=300.0,
                    help="longest one request may take, its retries and a chat's stream included, seconds "
                         "(default 300)")
    c.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    """Check a knowledge base's integrity through the API (and with ``--dsn`` its Postgres tables): the report,
    or ``--json`` the whole result; exit 1 when a problem is found. The DSN comes from ``--dsn`` or
    ``$WEKNORA_NB_PG_DSN`` and is never shown (its password is masked in everything printed)."""
    import os

    from weknora_nb.collect.checks.integrity import DSN_ENV, run_checks
    from weknora_nb.collect.http.client import ClientSettings
    from weknora_nb.collect.http.redact import install_log_redaction

    install_log_redaction(handlers=logging.getLogger().handlers)
    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout, deadline_s=args.deadline)
    dsn = args.dsn or os.environ.get(DSN_ENV) or None
    embeddings = None
    if args.embeddings_url or args.embeddings_model:
        if not (args.embeddings_url and args.embeddings_model and dsn and args.testset):
            raise UsageError("the vector-store trace needs --embeddings-url, --embeddings-model, --dsn (or "
                             f"${DSN_ENV}) and --testset together")
        from weknora_nb.collect.checks.embeddings import EmbeddingSettings

        embeddings = EmbeddingSettings(args.embeddings_url, args.embeddings_model)
    result = run_checks(settings, args.kb_id, testset=args.testset, dsn=dsn, embeddings=embeddings)
    if args.out:
        for path in result.write(args.out):
            log.info("wrote %s", path)
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False, indent=2))
    else:
        print(result.describe(first=args.first))
    return 1 if result.problems or result.incomplete else 0

