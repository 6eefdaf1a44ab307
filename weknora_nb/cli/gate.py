"""``weknora-nb gate`` and ``weknora-nb export``: a run folder read back, to check it against quality bounds (exit 1
when one breaks, for CI) or to write its qrels and result lists for ranx or trec_eval."""

from __future__ import annotations

import argparse

from weknora_nb.cli.options import (
    Subparsers,
    bound,
    check_run_folder,
    effect,
    finite_number,
    int_at_least,
    margin,
    output_file,
)
from weknora_nb.core.errors import MetricError, UsageError


def add_gate(sub: Subparsers) -> None:
    g = sub.add_parser("gate", help="exit 1 when a run breaks quality bounds (for CI)")
    g.add_argument("--run", required=True, help="run folder to check")
    g.add_argument("--baseline", default=None, help="run folder to compare with (same test set)")
    g.add_argument("--stage", default=None,
                   help="stage (default: final when the run has it, else the last stage of the pipeline)")
    g.add_argument("--min", action="append", default=[], type=bound, metavar="METRIC=VALUE",
                   help="minimum mean, repeatable")
    g.add_argument("--max-drop", action="append", default=[], type=bound, metavar="METRIC=VALUE",
                   help="largest allowed drop from the baseline, repeatable")
    g.add_argument("--non-inferior", action="append", default=[], type=margin, metavar="METRIC=MARGIN",
                   help="pass only when the 95 %% interval of the delta lies above -MARGIN (inconclusive fails); "
                        "repeatable, needs --baseline")
    g.add_argument("--not-worse", action="append", default=[], type=margin, metavar="METRIC=MARGIN",
                   help="fail only when the 95 %% interval of the delta lies entirely below -MARGIN (inconclusive "
                        "passes); repeatable, needs --baseline")
    g.add_argument("--detect", action="append", default=[], type=effect, metavar="METRIC=EFFECT",
                   help="print the valid queries needed to detect EFFECT at 80 %% power; repeatable")
    g.add_argument("--improve-by", type=finite_number, default=0.0, metavar="AMOUNT",
                   help="report the share of queries improving by more than AMOUNT (default 0: strictly better)")
    g.add_argument("--adjust", choices=("none", "bonferroni", "holm"), default="none",
                   help="adjust the evidence bounds for their number (default none: each interval at 95 %%)")
    g.add_argument("--resamples", type=int_at_least(100), default=10_000,
                   help="paired-bootstrap resamples (default 10000)")
    g.add_argument("--seed", type=int_at_least(0), default=0, help="bootstrap seed (default 0)")
    g.add_argument("--summary-md", type=output_file, default=None, metavar="FILE",
                   help="write a Markdown summary (a PR comment, $GITHUB_STEP_SUMMARY)")
    g.add_argument("--junit", type=output_file, default=None, metavar="FILE",
                   help="write a JUnit XML report (one test case per bound)")
    g.add_argument("--grades", default=None, metavar="FILE",
                   help="use the figures corrected by a human sample for the ranking metrics' bounds: the LLM's grades "
                        "(`weknora-nb testset grade`), people's labels of the test set and --labels (section 16)")
    g.add_argument("--labels", nargs="+", default=None, metavar="FILE",
                   help="with --grades: more labels of people (labels logs or filled worksheets)")
    g.add_argument("--allow-incomplete", action="store_true", help="do not fail on failed or missing requests")
    g.set_defaults(func=cmd_gate)


def cmd_gate(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.gate import gate, parse_bounds

    check_run_folder("--run", args.run)
    if args.baseline:
        check_run_folder("--baseline", args.baseline)
    result = gate(args.run, baseline=args.baseline, stage=args.stage, minimums=parse_bounds(args.min),
                  max_drops=parse_bounds(args.max_drop), allow_incomplete=args.allow_incomplete,
                  non_inferior=parse_bounds(args.non_inferior, what="margin", minimum=0.0),
                  not_worse=parse_bounds(args.not_worse, what="margin", minimum=0.0),
                  detect=parse_bounds(args.detect, what="effect"), improve_by=args.improve_by,
                  resamples=args.resamples, seed=args.seed, adjust=args.adjust, corrected=_corrected(args))
    print(result.describe())
    if args.summary_md or args.junit:
        from weknora_nb.analysis.export import gate_junit, gate_markdown, write_text

        if args.summary_md:
            print(f"wrote {write_text(args.summary_md, gate_markdown(result))}")
        if args.junit:
            print(f"wrote {write_text(args.junit, gate_junit(result))}")
    return 0 if result.passed else 1


def _corrected(args: argparse.Namespace) -> object:
    """The corrected figures of --baseline and --run (None without --grades)."""
    if not args.grades:
        if args.labels:
            raise UsageError("--labels goes with --grades (the corrected figures)")
        return None
    from weknora_nb.analysis.corrected import corrected_estimates, human_testset
    from weknora_nb.analysis.gate import parse_bounds
    from weknora_nb.analysis.worksheet import read_judgements
    from weknora_nb.core.metrics import parse_metric

    names = {m for items in (args.min, args.max_drop, args.non_inferior, args.not_worse)
             for m in parse_bounds(items, what="bound")}
    ranking = []
    for m in sorted(names):
        try:
            ranking.append(parse_metric(m).name)
        except MetricError:   # an answer metric: not corrected here
            continue
    runs = [args.baseline, args.run] if args.baseline else [args.run]
    labels = [j for p in args.labels for j in read_judgements(p)] if args.labels else None
    return corrected_estimates(runs, args.grades, testset=human_testset(runs, None, labels), stage=args.stage,
                               metrics=ranking or None)


def add_export(sub: Subparsers) -> None:
    e = sub.add_parser("export", help="write a run's qrels and result lists for ranx or trec_eval")
    e.add_argument("--run", required=True, help="run folder")
    e.add_argument("--format", required=True, choices=("ranx", "trec"), help="ranx JSON or TREC files")
    e.add_argument("--out", required=True, help="folder to write into")
    e.add_argument("--stage", action="append", default=None, help="only this stage (repeatable; default: every one)")
    e.add_argument("--repeat", action="append", default=None, type=int_at_least(1),
                   help="only this repeat (repeatable; default: every one)")
    e.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.export import export_run

    check_run_folder("--run", args.run)
    for path in export_run(args.run, args.out, fmt=args.format, stages=args.stage, repeats=args.repeat):
        print(f"wrote {path}")
    return 0

