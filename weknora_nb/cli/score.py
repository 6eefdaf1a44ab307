"""``weknora-nb score``: a results file scored against a test set, printed as a table or as JSON (the per-query
figures, on request, written to a file of their own)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from weknora_nb.cli.options import Subparsers, domain_adjustment, metric_names, output_file


def add_score(sub: Subparsers) -> None:
    s = sub.add_parser("score", help="score a results file against a test set")
    s.add_argument("testset", help="test set: .jsonl, .csv, .parquet or a WeKnora dataset folder")
    s.add_argument("results", help="results table: .parquet, .csv or .jsonl")
    s.add_argument("--metrics", nargs="+", default=None, type=metric_names,
                   help="metric names, e.g. recall@5 ndcg@10 ndcg@10:linear "
                        "(default: the set of docs/method.md section 3)")
    s.add_argument("--stage", action="append", help="score only this stage (repeatable)")
    s.add_argument("--domain-adjustment", type=domain_adjustment, default=0.0,
                   help="lower acceptance thresholds by this fraction (0.05-0.10) for a specialised domain")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    s.add_argument("--compact", action="store_true", help="with --json: no indentation")
    s.add_argument("--grades", default=None, metavar="FILE",
                   help="score with an LLM's relevance grades (`weknora-nb testset grade`) in place of missing labels: "
                        "every figure then says `grades: LLM` (docs/method.md section 16)")
    s.add_argument("--per-query-out", type=output_file, metavar="PATH",
                   help="write the per-query figures (each metric per query and stage, averaged over repeats) to "
                        "PATH: .parquet, .csv or .jsonl (then --json leaves them out)")
    s.set_defaults(func=cmd_score)


def cmd_score(args: argparse.Namespace) -> int:
    """Print the scores; exit 1 when nothing could be scored (a results file with no row, or none
    for a query of the test set): the figures would be empty, not zero. Failed or missing requests
    of a partial run are counted and listed in the output, and the exit stays 0."""
    from weknora_nb.core.scoring import per_query_format, score_files
    from weknora_nb.reports.text import format_scores

    metrics = [m for part in args.metrics for m in part.split(",") if m.strip()] if args.metrics else None
    if args.per_query_out:
        per_query_format(args.per_query_out)   # a suffix it cannot write is refused before any work
    if args.grades:
        sc = _score_with_grades(args, metrics)
    else:
        sc = score_files(args.testset, args.results, metrics, stages=args.stage or None,
                         domain_adjustment=args.domain_adjustment)
    if args.per_query_out:
        sc.write_per_query(args.per_query_out)
    if args.json:
        _print_bytes(sc.json_pieces(per_query=not args.per_query_out, indent=not args.compact))
    else:
        print(format_scores(sc))
    if sc.counts.nothing_scored is not None:
        print(f"error: nothing was scored: {sc.counts.nothing_scored}", file=sys.stderr)
        return 1
    return 0


def _score_with_grades(args: argparse.Namespace, metrics: list[str] | None) -> Any:
    """The results scored against the test set filled with the grades' fill grades, the grades' marker the first
    warning (in the table and in ``--json``)."""
    from weknora_nb.core.grades import read_grades
    from weknora_nb.core.scoring import score
    from weknora_nb.core.testset import load_testset

    grades = read_grades(args.grades)
    sc = score(grades.filled(load_testset(args.testset)), args.results, metrics, stages=args.stage or None,
               domain_adjustment=args.domain_adjustment)
    sc.warnings.insert(0, f"{grades.marker()}: chunks without a label carry the LLM's grade in these figures, not a "
                          "person's; the human-only figures are those without --grades")
    return sc


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

