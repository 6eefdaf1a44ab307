"""``weknora-nb judge``: a run's answers rated 1-5 by an LLM judge (or two runs' answers compared answer by answer,
``--pairwise``), with the cost estimated (``--dry-run``) and bounded (``--max-cost``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from weknora_nb.cli.options import (
    Subparsers,
    base_url,
    check_run_folder,
    int_at_least,
    non_negative,
    positive,
    positive_seconds,
)
from weknora_nb.core.errors import Interrupted, UsageError


def add_judge(sub: Subparsers) -> None:
    j = sub.add_parser("judge", help="rate a run's answers with an LLM judge (correctness, faithfulness, relevance)",
                       description="Rate every answer of a run (its answers.jsonl) 1-5 for correctness, faithfulness "
                       "and relevance with an OpenAI-compatible chat-completions server; the key is read from "
                       "$WEKNORA_NB_JUDGE_API_KEY. Counts are of judgements (answers x repeats). Exit 0 when every "
                       "judgement was made, 1 when some failed or --max-cost stopped the run, 2 for bad input.")
    j.add_argument("--run", required=True, help="run folder whose answers are judged")
    j.add_argument("--pairwise", action="store_true", help="compare --run with --baseline answer by answer")
    j.add_argument("--baseline", default=None, help="with --pairwise: the run folder to compare with")
    add_llm_options(j, what="judge", repeats=3, temperature=0.5, max_tokens=400, prompt="v1; pairwise-v1 with "
                    "--pairwise", model_example="qwen-plus, or sandbox-rule-judge")
    j.add_argument("--stage", action="append", help="judge only this stage's answers (repeatable)")
    j.add_argument("--ratings", default=None, metavar="FILE",
                   help="human ratings (.jsonl: query_id, stage?, repeat?, correctness, faithfulness, relevance): "
                        "the judge's agreement with them (Spearman, quadratic-weighted kappa)")
    j.add_argument("--json", action="store_true", help="print one JSON object")
    j.add_argument("--quiet", action="store_true", help="no progress bar")
    j.set_defaults(func=cmd_judge)


def add_llm_options(p: argparse.ArgumentParser, *, what: str, repeats: int, temperature: float, max_tokens: int,
                    prompt: str, model_example: str) -> None:
    """The options of an LLM's calls, shared by ``judge`` and ``testset grade``: the server and model (the key from
    the environment), repeats, sampling, prompt, prices and cost limit, dry run, cache, retries."""
    at_least_0, at_least_1 = int_at_least(0), int_at_least(1)
    p.add_argument("--base-url", type=base_url, default=None,
                   help="the API's base URL, e.g. http://127.0.0.1:8080/v1 (the sandbox) or "
                        "https://dashscope.aliyuncs.com/compatible-mode/v1 (default $WEKNORA_NB_JUDGE_BASE_URL)")
    p.add_argument("--model", default=None, help=f"model name, e.g. {model_example} (default $WEKNORA_NB_JUDGE_MODEL)")
    p.add_argument("--api-key-env", default="WEKNORA_NB_JUDGE_API_KEY", help="environment variable holding the key")
    p.add_argument("--repeats", type=at_least_1, default=repeats, help=f"{what}s of every item (default {repeats})")
    p.add_argument("--concurrency", type=at_least_1, default=4, help="requests in flight (default 4)")
    p.add_argument("--temperature", type=non_negative, default=temperature,
                   help=f"sampling temperature (default {temperature:g})")
    p.add_argument("--max-tokens", type=int_at_least(16), default=max_tokens,
                   help=f"longest reply, tokens (default {max_tokens})")
    p.add_argument("--seed", type=at_least_0, default=0, help="first seed (repeat r sends seed + 1000 (r - 1))")
    p.add_argument("--language", default="auto", choices=["auto", "zh", "en"],
                   help="prompt language (default auto: Chinese when the question holds Chinese)")
    p.add_argument("--prompt-version", default=None, help=f"prompt version (default {prompt})")
    p.add_argument("--price-in", type=non_negative, default=0.0, help="price per million prompt tokens (default 0)")
    p.add_argument("--price-out", type=non_negative, default=0.0,
                   help="price per million completion tokens (default 0)")
    p.add_argument("--max-cost", type=positive, default=None, metavar="AMOUNT",
                   help="stop before the next call would take the cost past AMOUNT (in the prices' currency)")
    p.add_argument("--dry-run", action="store_true", help="estimate the calls, tokens and cost; call nothing")
    p.add_argument("--cache", default=None, help="cache file (default <runs folder>/.judge-cache.sqlite)")
    p.add_argument("--retry-failed", action="store_true", help=f"make the failed {what}s again")
    p.add_argument("--replace", action="store_true", help=f"discard {what}s made by another model or prompt and start "
                                                            "over")
    p.add_argument("--parse-retries", type=at_least_0, default=2, help="asks again after an invalid reply (default 2)")
    p.add_argument("--timeout", type=positive_seconds, default=120.0, help="read timeout per request, seconds")
    p.add_argument("--max-attempts", type=at_least_1, default=4, help="attempts per request (retries + 1)")


def llm_from_args(args: argparse.Namespace, what: str, **extra: Any) -> tuple[Any, Any]:
    """The :class:`~weknora_nb.collect.judge.llm.LLMSettings` (None for a dry run without a server) and the
    :class:`~weknora_nb.collect.judge.options.JudgeOptions` of :func:`add_llm_options`' arguments."""
    import os

    from weknora_nb.collect.judge.llm import LLMSettings
    from weknora_nb.collect.judge.options import JudgeOptions

    url = args.base_url or os.environ.get("WEKNORA_NB_JUDGE_BASE_URL")
    model = args.model or os.environ.get("WEKNORA_NB_JUDGE_MODEL")
    if not (url and model) and not args.dry_run:
        raise UsageError(f"the {what} needs --base-url and --model (or $WEKNORA_NB_JUDGE_BASE_URL and "
                         "$WEKNORA_NB_JUDGE_MODEL); only --dry-run goes without")
    settings = LLMSettings(url, model, api_key_env=args.api_key_env, timeout_s=args.timeout,
                           max_attempts=args.max_attempts, max_connections=max(4, args.concurrency)) \
        if url and model else None
    options = JudgeOptions(repeats=args.repeats, temperature=args.temperature, max_tokens=args.max_tokens,
                           seed=args.seed, language=args.language, prompt_version=args.prompt_version,
                           concurrency=args.concurrency, parse_retries=args.parse_retries, price_in=args.price_in,
                           price_out=args.price_out, max_cost=args.max_cost, retry_failed=args.retry_failed,
                           replace=args.replace, cache=args.cache, progress=not args.quiet and not args.json, **extra)
    return settings, options


def cmd_judge(args: argparse.Namespace) -> int:
    """Judge a run's answers (or two runs' answers, ``--pairwise``). Exit 1 when a judgement failed or
    ``--max-cost`` stopped the run; Ctrl-C keeps what was judged (exit 130, the same command goes on)."""
    from weknora_nb.collect.http.redact import install_log_redaction

    install_log_redaction(handlers=logging.getLogger().handlers)  # no URL's secret in any log line
    try:
        return _judge_from_args(args)
    except KeyboardInterrupt:
        raise interrupted(args, f"the judgements finished are kept in {args.run}") from None


def interrupted(args: argparse.Namespace, kept: str) -> Interrupted:
    """The error of a command stopped by Ctrl-C: what is kept, and the same command (URLs redacted) to go on."""
    import shlex

    from weknora_nb.collect.http.redact import redact_command

    command = shlex.join(["weknora-nb", *redact_command(list(getattr(args, "argv", None) or sys.argv[1:]))])
    return Interrupted(f"interrupted: {kept}; to go on, run: {command}")


def _judge_from_args(args: argparse.Namespace) -> int:
    import os

    from weknora_nb.analysis.answers import format_judge_summary, judge_summary, pairwise_summary, read_ratings
    from weknora_nb.collect.judge.pairwise import judge_pairwise
    from weknora_nb.collect.judge.pointwise import judge_run

    check_run_folder("--run", args.run)
    if args.pairwise != bool(args.baseline):
        raise UsageError("--pairwise and --baseline DIR go together (the run to compare --run with)")
    if args.baseline:
        check_run_folder("--baseline", args.baseline)
    ratings = read_ratings(args.ratings) if args.ratings else None  # a bad file stops it before anything is spent
    settings, options = llm_from_args(args, "judge", stages=tuple(args.stage) if args.stage else None)
    model = args.model or os.environ.get("WEKNORA_NB_JUDGE_MODEL")
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

