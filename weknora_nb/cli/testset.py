"""``weknora-nb testset <command>``: building and versioning test sets. ``sample`` draws candidate queries from
WeKnora's conversation history, ``generate`` writes questions from a knowledge base's chunks with an LLM before
there is traffic (:mod:`weknora_nb.cli.generate`), ``pool`` gathers the unlabelled top chunks of runs into a
worksheet to judge, ``merge-labels`` makes a new test-set version of the judgements (with its lineage),
``carry-over`` moves labels to a re-chunked knowledge base, ``agreement`` measures how far assessors agree;
``grade``, ``calibration`` and ``label-next`` (:mod:`.grading`) grade pools with an LLM, measure it against people
and say what to label next."""

from __future__ import annotations

import argparse
import json

from weknora_nb.cli.grading import add_testset_calibration, add_testset_grade, add_testset_label_next
from weknora_nb.cli.options import Subparsers, base_url, int_at_least, output_file, positive_seconds, since
from weknora_nb.core.errors import Interrupted, UsageError


def add_testset(sub: Subparsers) -> None:
    """``weknora-nb testset <command>``: one ``add_testset_*`` function per command, listed here."""
    t = sub.add_parser("testset", help="build and version test sets: pool, label, merge, carry labels over")
    ts = t.add_subparsers(dest="testset_command", required=True)
    from weknora_nb.cli.generate import add_testset_generate

    for add in (add_testset_sample, add_testset_generate, add_testset_pool, add_testset_merge_labels,
                add_testset_carry_over, add_testset_agreement, add_testset_grade, add_testset_calibration,
                add_testset_label_next):
        add(ts)


def add_testset_sample(ts: Subparsers) -> None:
    s = ts.add_parser("sample", help="sample candidate queries from WeKnora's conversation history")
    s.add_argument("--base-url", required=True, type=base_url, help="WeKnora base URL, e.g. http://127.0.0.1:8080")
    s.add_argument("--kb-id", default=None,
                   help="only questions tied to this knowledge base (by their answer's references, an @-mention, "
                        "else the session's last request)")
    s.add_argument("--since", type=since, default=None, metavar="DATE",
                   help="only questions asked at or after DATE (2025-12-01 is midnight UTC; or 2025-12-01T00:00+08:00)")
    s.add_argument("--n", type=int_at_least(1), default=300, help="candidates to sample (default 300)")
    s.add_argument("--seed", type=int_at_least(0), default=0, help="random seed of the sample (default 0)")
    s.add_argument("--out", type=output_file, required=True,
                   help="candidates (.jsonl, a loadable test set); summary beside it")
    s.add_argument("--concurrency", type=int_at_least(1), default=4, help="sessions read at a time (default 4)")
    s.add_argument("--timeout", type=positive_seconds, default=30.0, help="read timeout per request, seconds")
    s.add_argument("--deadline", type=positive_seconds, default=300.0,
                    help="longest one request may take, its retries and a chat's stream included, seconds "
                         "(default 300)")
    s.add_argument("--max-attempts", type=int_at_least(1), default=4, help="attempts per request (retries + 1)")
    s.add_argument("--api-key-env", default="WEKNORA_API_KEY", help="environment variable holding the API key")
    s.add_argument("--tenant-id", default=None, help="X-Tenant-ID for platform keys")
    s.set_defaults(func=cmd_testset_sample)


def cmd_testset_sample(args: argparse.Namespace) -> int:
    """Sample candidate queries from WeKnora's conversation history. A key that may not read sessions is
    unusable input (exit 2, one line); sessions or listing pages that could not be read make exit 1 (the
    files are written all the same, their summary counts what is missing); Ctrl-C writes nothing (130)."""
    from weknora_nb.analysis.sampling import sample_candidates, write_candidates
    from weknora_nb.collect.history import fetch_history
    from weknora_nb.collect.http.client import ClientSettings
    from weknora_nb.core.errors import AuthFailed, NotFound

    settings = ClientSettings(base_url=args.base_url, api_key_env=args.api_key_env, tenant_id=args.tenant_id,
                              timeout_s=args.timeout, deadline_s=args.deadline, max_attempts=args.max_attempts)
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


def add_testset_pool(ts: Subparsers) -> None:
    p = ts.add_parser("pool", help="pool the unlabelled top chunks of runs into a worksheet to judge")
    p.add_argument("--testset", required=True, help="test set file or WeKnora dataset folder")
    p.add_argument("--runs", required=True, nargs="+", metavar="DIR", help="run folders to pool from")
    p.add_argument("--depth", type=int_at_least(1), default=10, help="top chunks of each stage (default 10)")
    p.add_argument("--out", type=output_file, required=True, help="worksheet: .csv (UTF-8 with BOM) or .xlsx")
    p.add_argument("--assessor", default=None, help="assessor id written in every row")
    p.set_defaults(func=cmd_testset_pool)


def cmd_testset_pool(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.pooling import pool
    from weknora_nb.analysis.worksheet import check_worksheet_path, write_worksheet

    check_worksheet_path(args.out)   # before any work: the worksheet is written in the format its name says
    result = pool(args.testset, args.runs, depth=args.depth, assessor=args.assessor)
    write_worksheet(result.rows, args.out)
    print(result.describe())
    print(f"wrote {args.out} ({result.n_pooled} rows to judge)")
    return 0


def add_testset_merge_labels(ts: Subparsers) -> None:
    m = ts.add_parser("merge-labels", help="a new test-set version: the test set plus judgements, with its lineage")
    m.add_argument("--testset", required=True, help="the test set the judgements were made on")
    m.add_argument("--labels", required=True, nargs="+", metavar="FILE",
                   help="labels logs (.jsonl) or filled worksheets (.csv, .xlsx)")
    m.add_argument("--out", type=output_file, required=True,
                   help="the new test set (.jsonl); its lineage goes beside it")
    m.add_argument("--adjudicator", default=None, help="assessor whose grade settles a disagreement")
    m.add_argument("--assessor", default=None, help="assessor of worksheet rows whose assessor cell is blank")
    m.set_defaults(func=cmd_testset_merge_labels)


def cmd_testset_merge_labels(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.worksheet import label_file
    from weknora_nb.core.lineage import merge_labels

    files = [label_file(p, args.assessor) for p in args.labels]
    print(merge_labels(args.testset, files, args.out, adjudicator=args.adjudicator).describe())
    return 0


def add_testset_carry_over(ts: Subparsers) -> None:
    c = ts.add_parser("carry-over", help="carry labels to a re-chunked knowledge base by content overlap")
    c.add_argument("--testset", required=True, help="the test set labelled on the old chunks")
    c.add_argument("--old-chunks", required=True, help="chunk inventory the labels were made on (chunks.parquet)")
    c.add_argument("--new-chunks", required=True, help="chunk inventory after re-chunking (chunks.parquet)")
    c.add_argument("--out", type=output_file, required=True,
                   help="the new test set (.jsonl); lineage and review worksheet beside it")
    c.add_argument("--match-by", default="knowledge_id", choices=["knowledge_id", "knowledge_title"],
                   help="what makes an old and a new chunk the same document (default knowledge_id)")
    c.add_argument("--rule", default="strict", choices=["strict", "lenient"],
                   help="strict (default): a relevant chunk's grade goes only to a new chunk holding nearly all of "
                        "it; lenient: also to pieces holding >= 30%% of it, and to relevant chunks merged whole")
    c.set_defaults(func=cmd_testset_carry_over)


def cmd_testset_carry_over(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.carryover import carry_over_files, review_path
    from weknora_nb.core.lineage import lineage_path

    result, _ = carry_over_files(args.testset, args.old_chunks, args.new_chunks, args.out, by=args.match_by,
                                 rule=args.rule)
    print(result.describe())
    print(f"wrote {args.out}, {lineage_path(args.out)} and {review_path(args.out)} "
          f"({len(result.review)} pairs to judge)")
    return 0


def add_testset_agreement(ts: Subparsers) -> None:
    a = ts.add_parser("agreement", help="agreement between assessors (weighted Cohen's, Fleiss' kappa)")
    a.add_argument("--labels", required=True, nargs="+", metavar="FILE",
                   help="labels logs (.jsonl) or filled worksheets (.csv, .xlsx) of several assessors")
    a.add_argument("--assessor", default=None, help="assessor of worksheet rows whose assessor cell is blank")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=cmd_testset_agreement)


def cmd_testset_agreement(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.agreement import agreement
    from weknora_nb.analysis.worksheet import read_judgements

    result = agreement(j for p in args.labels for j in read_judgements(p, args.assessor))
    print(json.dumps(result.to_json_dict(), ensure_ascii=False, indent=2) if args.json else result.describe())
    return 0

