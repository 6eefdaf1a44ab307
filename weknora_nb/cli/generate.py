"""``weknora-nb testset generate``: a test set before there is traffic: questions written by an OpenAI-compatible LLM
from a knowledge base's chunks, of several types, under quotas per document and chunk type, in the knowledge base's
language, filtered (unanswerable, near-duplicates, round trip), each counted, every query ``source: synthetic``
with its lexical overlap (docs/method.md section 17). Cached, resumable, costed, with a dry run, as the judge."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from weknora_nb.cli.options import (
    Subparsers,
    base_url,
    int_at_least,
    non_negative,
    output_file,
    positive,
    positive_seconds,
)
from weknora_nb.core.errors import Interrupted, UsageError


def add_testset_generate(ts: Subparsers) -> None:
    at_least_0, at_least_1 = int_at_least(0), int_at_least(1)
    g = ts.add_parser(
        "generate", help="generate a test set from a knowledge base's chunks with an LLM (before there is traffic)",
        description="Write questions from the chunks of a knowledge base with an OpenAI-compatible chat-completions "
        "server (the key from $WEKNORA_NB_JUDGE_API_KEY by default; WeKnora's from $WEKNORA_API_KEY), of the types "
        "factual, procedural, comparison, multi-chunk and vague, at most a quota per document, in the knowledge "
        "base's language; drop the unanswerable ones (the LLM asked again) and near-duplicates, search each back "
        "(hybrid-search at --depth) and keep, flag or drop those that miss their source chunk. Every query carries "
        "source: synthetic, its source chunk (grade 3) and its lexical overlap with it. Exit 0 when --n questions "
        "are kept, 1 when fewer (the closing note says why) or --max-cost stopped the run, 2 for bad input.")
    g.add_argument("--base-url", required=True, type=base_url, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
    g.add_argument("--kb-id", required=True, help="the knowledge base whose chunks the questions are written from")
    g.add_argument("--n", type=at_least_1, default=300, help="questions to keep (default 300)")
    g.add_argument("--out", type=output_file, required=True,
                   help="the test set (.jsonl); its closing note beside it (<out>.summary.json), its log and "
                        "manifest in <out>.generation/")
    g.add_argument("--llm-base-url", type=base_url, default=None,
                   help="the LLM API's base URL, e.g. https://dashscope.aliyuncs.com/compatible-mode/v1, or "
                        "http://127.0.0.1:8080/v1 (the sandbox) (default $WEKNORA_NB_JUDGE_BASE_URL)")
    g.add_argument("--model", default=None,
                   help="model name, e.g. qwen-plus, or sandbox-rule-generator (default $WEKNORA_NB_JUDGE_MODEL)")
    g.add_argument("--llm-api-key-env", default="WEKNORA_NB_JUDGE_API_KEY",
                   help="environment variable holding the LLM's key")
    g.add_argument("--types", default=None, metavar="TYPE=SHARE,...",
                   help="shares of the question types (default factual=0.3,procedural=0.2,comparison=0.15,"
                        "multi-chunk=0.15,vague=0.2)")
    g.add_argument("--per-chunk", type=at_least_1, default=1, help="questions a chunk may source (default 1)")
    g.add_argument("--language", default="auto", choices=["auto", "zh", "en"],
                   help="language of the prompts and questions (default auto: the knowledge base's)")
    g.add_argument("--round-trip", default="flag", choices=["keep", "flag", "drop"],
                   help="a question whose source chunk is not in hybrid-search's top --depth: keep it, keep it "
                        "tagged round-trip-miss (default), or drop it (dropping flatters retrieval further)")
    g.add_argument("--depth", type=at_least_1, default=10, help="depth K of the round trip (default 10)")
    g.add_argument("--max-rounds", type=at_least_1, default=4,
                   help="rounds that may replace the questions the filters drop (default 4)")
    g.add_argument("--seed", type=at_least_0, default=0, help="seed of the plan and of the LLM calls (default 0)")
    g.add_argument("--temperature", type=non_negative, default=0.7, help="sampling temperature (default 0.7)")
    g.add_argument("--max-tokens", type=int_at_least(16), default=400, help="longest reply, tokens (default 400)")
    g.add_argument("--concurrency", type=at_least_1, default=4, help="requests in flight (default 4)")
    g.add_argument("--parse-retries", type=at_least_0, default=2, help="asks again after an invalid reply (default 2)")
    g.add_argument("--price-in", type=non_negative, default=0.0, help="price per million prompt tokens (default 0)")
    g.add_argument("--price-out", type=non_negative, default=0.0,
                   help="price per million completion tokens (default 0)")
    g.add_argument("--max-cost", type=positive, default=None, metavar="AMOUNT",
                   help="stop before the next call would take the cost past AMOUNT (in the prices' currency)")
    g.add_argument("--dry-run", action="store_true",
                   help="list the chunks, estimate the first round's calls, tokens and cost; call no LLM")
    g.add_argument("--cache", default=None, help="cache file (default <out's folder>/.generate-cache.sqlite)")
    g.add_argument("--retry-failed", action="store_true", help="make the failed calls again")
    g.add_argument("--replace", action="store_true", help="discard the work of another generator and start over")
    g.add_argument("--llm-timeout", type=positive_seconds, default=120.0, help="read timeout per LLM request, seconds")
    g.add_argument("--timeout", type=positive_seconds, default=30.0, help="read timeout per WeKnora request, seconds")
    g.add_argument("--max-attempts", type=at_least_1, default=4, help="attempts per request (retries + 1)")
    g.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding WeKnora's key")
    g.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    g.add_argument("--json", action="store_true", help="print the closing note as one JSON object")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.set_defaults(func=cmd_testset_generate)


def cmd_testset_generate(args: argparse.Namespace) -> int:
    """Generate a test set. Exit 1 when fewer than --n questions were kept or --max-cost stopped the run; Ctrl-C
    keeps what was done (exit 130, the same command goes on)."""
    from weknora_nb.collect.http.redact import install_log_redaction

    install_log_redaction(handlers=logging.getLogger().handlers)  # no URL's secret in any log line
    try:
        return _generate_from_args(args)
    except KeyboardInterrupt:
        import shlex

        from weknora_nb.collect.http.redact import redact_command

        command = shlex.join(["weknora-nb", *redact_command(list(getattr(args, "argv", None) or sys.argv[1:]))])
        raise Interrupted(f"interrupted: the calls finished are kept in {args.out}.generation; to go on, run: "
                          f"{command}") from None


def _generate_from_args(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.synthetic.curate import SyntheticCurator
    from weknora_nb.analysis.synthetic.describe import describe_note
    from weknora_nb.collect.generate.run import generate_testset
    from weknora_nb.collect.http.client import ClientSettings
    from weknora_nb.collect.judge.llm import LLMSettings
    from weknora_nb.collect.judge.options import JudgeOptions
    from weknora_nb.core.synthetic import DEFAULT_MIX, GenerateOptions, parse_mix

    mix = parse_mix(args.types) if args.types else DEFAULT_MIX
    options = GenerateOptions(n=args.n, mix=tuple(mix.items()), per_chunk=args.per_chunk, seed=args.seed,
                              language=args.language, round_trip=args.round_trip, depth=args.depth,
                              max_rounds=args.max_rounds)
    url = args.llm_base_url or os.environ.get("WEKNORA_NB_JUDGE_BASE_URL")
    model = args.model or os.environ.get("WEKNORA_NB_JUDGE_MODEL")
    if not (url and model) and not args.dry_run:
        raise UsageError("testset generate needs --llm-base-url and --model (or $WEKNORA_NB_JUDGE_BASE_URL and "
                         "$WEKNORA_NB_JUDGE_MODEL); only --dry-run goes without")
    llm = LLMSettings(url, model, api_key_env=args.llm_api_key_env, timeout_s=args.llm_timeout,
                      max_attempts=args.max_attempts, max_connections=max(4, args.concurrency)) if url and model \
        else None
    calls = JudgeOptions(repeats=1, temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                         language=args.language, concurrency=args.concurrency, parse_retries=args.parse_retries,
                         price_in=args.price_in, price_out=args.price_out, max_cost=args.max_cost,
                         retry_failed=args.retry_failed, replace=args.replace, cache=args.cache,
                         progress=not args.quiet and not args.json)
    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout, max_attempts=args.max_attempts)
    outcome = generate_testset(settings, args.kb_id, llm, calls, options, args.out, SyntheticCurator,
                               dry_run=args.dry_run)
    if outcome.estimate is not None:
        print(json.dumps({"dry_run": True, "estimate": outcome.estimate}, ensure_ascii=False) if args.json else
              "dry run (nothing called, nothing written): " + json.dumps(outcome.estimate, ensure_ascii=False,
                                                                          indent=2))
        return 0
    print(json.dumps(outcome.note, ensure_ascii=False) if args.json else
          describe_note(outcome.note) + f"\nwrote {args.out} and {outcome.summary_path}")
    return 0 if outcome.reached and not outcome.note.get("stopped_by_max_cost") else 1
