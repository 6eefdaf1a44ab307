"""``weknora-nb report`` and ``weknora-nb demo``: the notebooks executed into HTML reports, for a run and its
baselines, or (the demo) for the whole workbench measured end to end on the embedded sandbox."""

from __future__ import annotations

import argparse
import sys

from weknora_nb.cli.options import Subparsers, check_run_folder, domain_adjustment, int_at_least, notebook_names
from weknora_nb.core.errors import Interrupted, UsageError


def add_report(sub: Subparsers) -> None:
    r = sub.add_parser("report", help="execute the notebooks for a run and write HTML reports")
    r.add_argument("--run", required=True, help="run folder")
    r.add_argument("--baseline", action="append", help="run folder to compare with (repeatable)")
    r.add_argument("--out", default=None, help="reports folder (default: <runs>/../reports)")
    _code_options(r)
    r.add_argument("--stage", default=None,
                   help="focus stage (default: final when the run has it, else the last stage of the pipeline)")
    r.add_argument("--domain-adjustment", type=domain_adjustment, default=0.0,
                   help="lower acceptance thresholds by this fraction (0.05-0.10) for a specialised domain")
    r.add_argument("--jobs", type=int_at_least(1), default=None, metavar="N",
                   help="notebooks executed at once (default: one per core; 1: one after another)")
    r.add_argument("--notebooks", type=notebook_names, default=None, metavar="NAMES",
                   help="only these notebooks, comma-separated, e.g. 02_metrics,05_compare (default: every one "
                        "the run has data for)")
    r.set_defaults(func=cmd_report)


def _code_options(p: argparse.ArgumentParser) -> None:
    """``--show-code``, and ``--no-input``, which hid the code before it was hidden by default (kept so that
    scripts using it still run)."""
    p.add_argument("--show-code", action="store_true",
                   help="show the notebooks' code cells in the HTML (default: hidden, a report is read, not run)")
    p.add_argument("--no-input", action="store_true",
                   help="deprecated, no effect: code cells are hidden unless --show-code is given")


def _warn_no_input(args: argparse.Namespace) -> None:
    if args.no_input:
        print("weknora-nb: --no-input is deprecated and has no effect: code cells are hidden unless --show-code "
              "is given", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from weknora_nb.reports.render import NEEDS, NOTEBOOKS, notebooks_for, render_report

    check_run_folder("--run", args.run)
    for baseline in args.baseline or []:
        check_run_folder("--baseline", baseline)
    notebooks = args.notebooks or NOTEBOOKS
    missing = [n for n in notebooks if n not in notebooks_for(args.run, notebooks)] if args.notebooks else []
    if missing:   # asked for by name, not just skipped as the default set skips them
        raise UsageError(f"--notebooks: {', '.join(missing)} needs {', '.join(sorted({NEEDS[n] for n in missing}))} "
                         f"in {args.run} (a run collected with a chat stage)")
    parameters = {"stage": args.stage, "domain_adjustment": args.domain_adjustment}
    _warn_no_input(args)
    try:
        report = render_report(args.run, args.baseline or [], out_root=args.out, show_code=args.show_code,
                               notebooks=notebooks, parameters=parameters, jobs=args.jobs)
    except KeyboardInterrupt:
        raise Interrupted("interrupted: the pages rendered so far are kept, the index page is not written; "
                          "run the command again to render the report") from None
    print(report.index)
    return 0


def add_demo(sub: Subparsers) -> None:
    d = sub.add_parser("demo", help="the whole workbench on the embedded sandbox, end to end")
    d.add_argument("--out", default="outputs", help="output folder (default outputs)")
    d.add_argument("--repeats", type=int_at_least(1), default=3, help="repeats of every query (default 3)")
    d.add_argument("--limit", type=int_at_least(1), default=None, metavar="N",
                   help="only the first N queries of the demo test set (quick runs; default all)")
    _code_options(d)
    d.add_argument("--jobs", type=int_at_least(1), default=None, metavar="N",
                   help="versions measured (each in a process of its own) and notebooks rendered at a time "
                        "(default: one per core; 1: one after another in this process)")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from weknora_nb.core.extras import require

    require("sandbox", "weknora-nb demo")
    from weknora_nb.demo import run_demo

    _warn_no_input(args)
    result = run_demo(args.out, repeats=args.repeats, show_code=args.show_code, progress=not args.quiet,
                      limit=args.limit, jobs=args.jobs)
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    print(f"demo finished ({phases}). Open: {result.index}")
    return 0

