"""Command line: ``weknora-nb <command> ...`` (also ``python -m weknora_nb``).

Exit codes: 0 success, 1 the work ran but its verdict is negative (e.g. an incomplete
run), 2 unusable input (a file that fails validation, an unknown metric).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from . import __version__
from .errors import WeknoraNbError

log = logging.getLogger("weknora_nb")


def _cmd_score(args: argparse.Namespace) -> int:
    from .report_text import format_scores
    from .results import read_results
    from .scoring import score
    from .testset import load_testset

    ts = load_testset(args.testset)
    res = read_results(args.results)
    sc = score(ts, res, args.metrics, stages=args.stage or None, domain_adjustment=args.domain_adjustment,
               source=args.results)
    if args.json:
        print(json.dumps(sc.to_json_dict(), ensure_ascii=False, indent=None if args.compact else 2))
    else:
        print(format_scores(sc))
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
