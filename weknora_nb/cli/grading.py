"""LLM relevance grades and the figures corrected by a human sample (docs/method.md section 16):
``testset grade`` grades every unlabelled chunk of runs' pools, ``testset calibration`` measures the grader against
people, ``testset label-next`` writes the worksheet of the queries to label next, and ``corrected`` prints every
metric's mean and every version delta corrected by prediction-powered inference (``--answers``: the answer judge's
scores corrected by human ratings)."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

from weknora_nb.cli.judge import add_llm_options, interrupted, llm_from_args
from weknora_nb.cli.options import Subparsers, check_run_folder, int_at_least, metric_names, output_file
from weknora_nb.core.errors import UsageError

GRADE_HELP = ("grade every unlabelled chunk of runs' pools with an LLM (0-3), kept apart from people's labels")


def add_testset_grade(ts: Subparsers) -> None:
    g = ts.add_parser("grade", help=GRADE_HELP,
                      description="Grade with an OpenAI-compatible LLM (the key from $WEKNORA_NB_JUDGE_API_KEY) every "
                      "chunk without a label in the top --depth of the runs' stages, and --calibration labelled ones, "
                      "0-3 with the versioned relevance prompt; the grades go to their own file (never into the test "
                      "set), with the model and the prompt's sha256. Cached, resumable, costed (--dry-run, "
                      "--max-cost). Exit 0 when every chunk was graded, 1 when some failed or --max-cost stopped it.")
    g.add_argument("--runs", required=True, nargs="+", metavar="DIR", help="run folders whose pools are graded")
    g.add_argument("--testset", default=None, help="the test set (default: the one the first run names)")
    g.add_argument("--depth", type=int_at_least(1), default=10, help="top chunks of each stage (default 10)")
    g.add_argument("--stage", action="append", default=None, help="only this stage's lists (repeatable; default all)")
    g.add_argument("--calibration", type=int_at_least(0), default=100, metavar="N",
                   help="also grade N labelled chunks of the pool, drawn at random, to measure the grader (default "
                        "100; they never enter a figure)")
    g.add_argument("--sample-seed", type=int_at_least(0), default=0, help="seed of the calibration draw (default 0)")
    g.add_argument("--out", type=output_file, default=None,
                   help="grades file (.jsonl; default <runs folder>/relevance-grades.jsonl, its manifest beside it)")
    add_llm_options(g, what="grade", repeats=1, temperature=0.0, max_tokens=200, prompt="relevance-v1",
                    model_example="qwen-plus, or sandbox-rule-grader")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.set_defaults(func=cmd_testset_grade)


def _testset_of(args: argparse.Namespace, first_run: str) -> str:
    if args.testset:
        return str(args.testset)
    from weknora_nb.core.run import _recorded_testset, read_manifest

    return str(_recorded_testset(Path(first_run), read_manifest(first_run)))


def cmd_testset_grade(args: argparse.Namespace) -> int:
    """Pool, grade, and print the grading's cost line and each run's judged@K with and without the grades; Ctrl-C
    keeps what was graded (exit 130, the same command goes on)."""
    try:
        return _grade_from_args(args)
    except KeyboardInterrupt:
        raise interrupted(args, "the grades finished are kept") from None


def _grade_from_args(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.corrected import judged_table
    from weknora_nb.analysis.grade_pool import grading_items
    from weknora_nb.collect.http.redact import install_log_redaction
    from weknora_nb.collect.judge.relevance import grade_items
    from weknora_nb.core.grades import GRADES_FILE, read_grades

    install_log_redaction(handlers=logging.getLogger().handlers)
    for r in args.runs:
        check_run_folder("--runs", r)
    settings, options = llm_from_args(args, "grader")
    testset = _testset_of(args, args.runs[0])
    out = Path(args.out) if args.out else Path(args.runs[0]).resolve().parent / GRADES_FILE
    items, described, _ = grading_items(testset, args.runs, depth=args.depth, stages=args.stage,
                                        calibration=args.calibration, seed=args.sample_seed)
    outcome = grade_items(items, out, settings, options, pool=described, dry_run=args.dry_run)
    summary: dict[str, Any] = {"grades_file": str(out), "dry_run": outcome.dry_run, "pool": described,
                               "served_models": outcome.manifest.get("served_models", []),
                               "rule_based": bool(outcome.manifest.get("rule_based")),
                               "notes": outcome.manifest.get("notes", []), **outcome.counts(),
                               "ledger": outcome.manifest.get("ledger")}
    if outcome.estimate is not None:
        summary["estimate"] = outcome.estimate
    lines = [f"pooled the top {args.depth} of {', '.join(args.stage) if args.stage else 'every stage'} of "
             f"{len(args.runs)} run(s): {described['fill']} chunks without a label to grade, "
             f"{min(args.calibration, described['labelled_in_pool'])} labelled ones to calibrate (of "
             f"{described['labelled_in_pool']} in the pool)", cost_line(summary, options)]
    if not outcome.dry_run and out.is_file():
        grades = read_grades(out)
        table = judged_table(args.runs, grades, testset)
        summary["judged"] = table.to_dict("records")
        summary["marker"] = grades.marker()
        lines += [grades.marker(), "judged@10 of people's labels -> with the grades:"]
        lines += [f"  {r.run}/{r.stage}: {r.human:.3f} -> {r.with_grades:.3f}" for r in table.itertuples()]
    lines += [f"note: {n}" for n in summary["notes"]]
    print(json.dumps(summary, ensure_ascii=False, default=str) if args.json else "\n".join(lines))
    return 0 if outcome.dry_run or outcome.complete else 1


def cost_line(summary: dict[str, Any], options: Any) -> str:
    """The grading's cost in one line: a dry run's estimate, or what was graded, failed, called and spent."""
    prices = f"prices {options.price_in:g}/{options.price_out:g} per million tokens in/out"
    if summary.get("estimate") is not None:
        e = summary["estimate"]
        return (f"dry run: {e['judgements']} grades to make, {e['calls']} calls ({e['cached']} in the cache), "
                f"~{e['prompt_tokens']} prompt tokens and at most {e['completion_tokens_at_most']} completion tokens: "
                f"cost at most {e['cost_at_most']:.4f} ({prices})")
    failed = ", ".join(f"{k} {n}" for k, n in summary["failed_by_kind"].items())
    led = summary.get("ledger") or {}
    stopped = "; STOPPED by --max-cost" if summary["stopped_by_max_cost"] else ""
    return (f"graded {summary['judged']} of {summary['judgements_expected']} ({summary['failed']} failed"
            f"{': ' + failed if failed else ''}, {summary['not_judged']} not graded); this run: "
            f"{summary['calls_made']} calls, {summary['cache_hits']} from the cache, {summary['tokens']['prompt']} + "
            f"{summary['tokens']['completion']} tokens, cost {summary['cost']:.4f}; all grades so far: "
            f"{led.get('calls', 0)} calls, cost {float(led.get('cost') or 0):.4f} ({prices}){stopped}")


# ---------------------------------------------------------------------------------------
# calibration, label-next, corrected
# ---------------------------------------------------------------------------------------
def _labels_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--testset", default=None,
                   help="people's labels: the test set (default: the first run's, else the one the grades were made "
                        "on)")
    p.add_argument("--labels", nargs="+", default=None, metavar="FILE",
                   help="more labels of people laid over the test set: labels logs (.jsonl) or filled worksheets")
    p.add_argument("--assessor", default=None, help="assessor of worksheet rows whose assessor cell is blank")


def _human(args: argparse.Namespace, grades: Any) -> Any:
    """People's labels: --testset (else the first run's test set, else the one the grades were made on) with
    --labels laid over it."""
    from weknora_nb.analysis.worksheet import read_judgements
    from weknora_nb.core.grades import with_labels
    from weknora_nb.core.testset import load_testset

    runs = getattr(args, "runs", None)
    path = args.testset or (_testset_of(args, runs[0]) if runs else (grades.pool.get("testset") or {}).get("path"))
    if not path:
        raise UsageError("--testset is needed: the grades' manifest names no test set")
    ts = load_testset(path)
    if args.labels:
        ts = with_labels(ts, [j for p in args.labels for j in read_judgements(p, args.assessor)])
    return ts


def add_testset_calibration(ts: Subparsers) -> None:
    c = ts.add_parser("calibration", help="an LLM's relevance grades against people's labels: confusion, weighted "
                                          "kappa, bias, per query type")
    c.add_argument("--grades", required=True, help="grades file of `weknora-nb testset grade`")
    _labels_options(c)
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_testset_calibration)


def cmd_testset_calibration(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.calibration import calibration
    from weknora_nb.core.grades import read_grades

    grades = read_grades(args.grades)
    cal = calibration(grades, _human(args, grades))
    if args.json:
        print(json.dumps({"marker": cal.marker, "overall": cal.overall, "confusion": cal.confusion.values.tolist(),
                          "by_query_type": cal.by_type.to_dict("index"), "by_purpose": cal.by_purpose.to_dict("index")},
                         ensure_ascii=False, default=_plain))
    else:
        print(cal.describe())
    return 0


def _plain(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else (x.item() if hasattr(x, "item") else str(x))


def add_testset_label_next(ts: Subparsers) -> None:
    n = ts.add_parser("label-next", help="the worksheet of the graded queries to label next (in a fixed random "
                                         "order), with what each buys")
    n.add_argument("--runs", required=True, nargs="+", metavar="DIR", help="run folders, the baseline first")
    n.add_argument("--grades", required=True, help="grades file of `weknora-nb testset grade`")
    _labels_options(n)
    n.add_argument("--stage", default=None, help="the stage (default final when the runs have it)")
    n.add_argument("--run", default=None, help="the run whose delta against the first to shrink (default the last)")
    n.add_argument("--metric", default="ndcg@5", type=metric_names, help="the delta's metric (default ndcg@5)")
    n.add_argument("--queries", type=int_at_least(1), default=20, help="queries to list (default 20)")
    n.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the random order (default 0)")
    n.add_argument("--out", type=output_file, required=True, help="worksheet: .csv (UTF-8 with BOM) or .xlsx")
    n.set_defaults(func=cmd_testset_label_next)


def cmd_testset_label_next(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.corrected import corrected_estimates
    from weknora_nb.analysis.label_next import label_next
    from weknora_nb.analysis.worksheet import check_worksheet_path, write_worksheet
    from weknora_nb.core.grades import read_grades
    from weknora_nb.core.metrics import parse_metric

    check_worksheet_path(args.out)
    for r in args.runs:
        check_run_folder("--runs", r)
    grades = read_grades(args.grades)
    human = _human(args, grades)
    metric = parse_metric(args.metric).name
    out = corrected_estimates(args.runs, grades, testset=human, stage=args.stage, metrics=[metric])
    result = label_next(out, grades, human, run=args.run, metric=metric, queries=args.queries, seed=args.seed)
    write_worksheet(result.rows, args.out)
    print(result.describe())
    print(f"wrote {args.out} ({len(result.rows)} rows to judge; notebook 07_label reads it)")
    return 0


def add_corrected(sub: Subparsers) -> None:
    c = sub.add_parser("corrected", help="every metric's mean and version delta corrected by a human sample "
                                         "(prediction-powered inference over LLM grades)",
                       description="Print each metric's mean for every run and each run's delta against the first, "
                       "three ways: human-only (people's labels, unjudged = 0, with judged@10), LLM-filled (the "
                       "grades in place of missing labels) and corrected (prediction-powered inference, docs/method.md "
                       "section 16), with 95 %% intervals. --answers: the judge's scores corrected by human ratings.")
    c.add_argument("--runs", required=True, nargs="+", metavar="DIR", help="run folders, the baseline first")
    c.add_argument("--grades", default=None, help="grades file of `weknora-nb testset grade`")
    _labels_options(c)
    c.add_argument("--stage", default=None, help="the stage (default final when the runs have it)")
    c.add_argument("--metrics", nargs="+", default=None, type=metric_names, help="metric names (default: section 3's)")
    c.add_argument("--answers", action="store_true", help="the answer judge's scores corrected by --ratings instead")
    c.add_argument("--ratings", nargs="+", default=None, metavar="FILE",
                   help="with --answers: one human ratings file per run (.jsonl or .csv), in --runs' order")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_corrected)


def cmd_corrected(args: argparse.Namespace) -> int:
    for r in args.runs:
        check_run_folder("--runs", r)
    if args.answers:
        return _corrected_answers(args)
    from weknora_nb.analysis.corrected import corrected_estimates
    from weknora_nb.core.grades import read_grades

    if not args.grades:
        raise UsageError("corrected needs --grades (or --answers with --ratings)")
    grades = read_grades(args.grades)
    metrics = [m for part in args.metrics for m in part.split(",") if m.strip()] if args.metrics else None
    out = corrected_estimates(args.runs, grades, testset=_human(args, grades), stage=args.stage, metrics=metrics)
    if args.json:
        print(json.dumps({"marker": out.marker, "stage": out.stage, "means": out.means.to_dict("records"),
                          "deltas": out.deltas.to_dict("records"), "notes": out.notes,
                          "n_labelled": out.n_labelled, "n_graded": out.n_graded}, ensure_ascii=False, default=_plain))
    else:
        print(out.describe())
    return 0


def _corrected_answers(args: argparse.Namespace) -> int:
    from weknora_nb.analysis.answer_ppi import corrected_answers

    if not args.ratings:
        raise UsageError("--answers needs --ratings, one human ratings file per run")
    means, deltas, notes = corrected_answers(args.runs, args.ratings)
    if args.json:
        print(json.dumps({"means": means.to_dict("records"), "deltas": deltas.to_dict("records"), "notes": notes},
                         ensure_ascii=False, default=_plain))
        return 0
    cols = ["judge", "human", "human_low", "human_high", "corrected", "low", "high", "n", "n_rated"]
    print("means (1-5):\n" + means.set_index(["run", "criterion"])[cols].to_string(float_format=lambda x: f"{x:.3f}"))
    if len(deltas):
        print("deltas (run minus baseline):\n" + deltas.set_index(["run", "criterion"])[cols].to_string(
            float_format=lambda x: f"{x:+.3f}"))
    print("\n".join(f"note: {n}" for n in notes))
    return 0
