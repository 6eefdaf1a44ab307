"""Results other tools read: the gate's Markdown and JUnit reports, runs as ranx or TREC files,
metric tables as Markdown and LaTeX.

::

    write_text("summary.md", gate_markdown(result))    # a PR comment, $GITHUB_STEP_SUMMARY
    write_text("gate.xml", gate_junit(result))         # CI test reports: one test case per bound
    export_run("outputs/runs/rerank", "exports/rerank", fmt="ranx")  # qrels.json, run.final.1.json, ...
    print(latex_table(run.scores.summary_wide().reset_index()))

**Runs** (:func:`export_run`): one file per (stage, repeat), the lists as the method scores them
(docs/method.md section 2): merged results unfolded (``sub_chunk_ids``), a chunk id given twice
kept at its first position, ranks renumbered 1..n, scores ``n - position + 1`` so that a tool
that sorts by score (ranx, trec_eval) keeps the returned order. Failed requests are left out
(they are excluded from every mean, not scored 0); a successful empty list is an empty entry in
ranx JSON (it scores 0) and no line in a TREC run. Qrels hold every label of the valid queries
(grade 0 included). To get weknora-nb's figure of a (stage, repeat) from ranx, evaluate over
the queries of the run file (``{q: qrels[q] for q in run}``): ranx's ``make_comparable`` would
score a failed query 0. Metric names: :func:`ranx_metric_name` (``ndcg@5`` is ranx's
``ndcg_burges@5``, exponential gain; ``ndcg@5:linear`` is ranx's ``ndcg@5``; ``hit@5`` is
``hit_rate@5``).

**Tables** (:func:`markdown_table`, :func:`latex_table`): plain writers (no ``tabulate`` or
``jinja2``), numbers to ``digits`` decimals, NaN as an empty cell, special characters escaped.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.gate import GateResult
from weknora_nb.core.errors import UsageError, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.metrics import parse_metric
from weknora_nb.core.results import write_trec_run
from weknora_nb.core.run import Run, load_run
from weknora_nb.core.testset import TestSet
from weknora_nb.core.unfold import expand_sub_chunks

#: the run formats :func:`export_run` writes
FORMATS = ("ranx", "trec")


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all; a :class:`StorageError` when it cannot."""
    p = Path(path)
    with writing(p), atomic_path(p) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return p


# ---------------------------------------------------------------------------------------
# the gate
# ---------------------------------------------------------------------------------------
def _gate_rows(result: GateResult) -> pd.DataFrame:
    t = result.table.copy()
    t.insert(0, "result", np.where(t["passed"], "PASS", "FAIL"))
    t["value"] = [("" if pd.isna(v) else f"{v:+.4f}" if c in ("non-inferior", "not-worse") else f"{v:.4f}")
                  for c, v in zip(t["check"], t["value"], strict=True)]
    return t[["result", "check", "metric", "value", "bound"]]


def gate_markdown(result: GateResult) -> str:
    """The gate as Markdown: the verdict, a table of checks, the effect sizes, the warnings and the rule."""
    verdict = "passed" if result.passed else "FAILED"
    against = f" against baseline `{result.baseline}`" if result.baseline else ""
    lines = [f"## weknora-nb gate {verdict}", "", f"Run `{result.run}`{against}, stage `{result.stage}`.", "",
             markdown_table(_gate_rows(result)), ""]
    if result.effects is not None and len(result.effects):
        eff = result.effects[["metric", "n", "delta", "d_z", "share_improved", "mde", "detect", "n_needed"]].rename(
            columns={"share_improved": f"improved > {result.improve_by:g}", "n_needed": "queries needed",
                     "mde": f"MDE ({100 * result.power:g} % power)"})
        lines += [f"Effect sizes (run minus baseline, paired per-query differences, level {100 * result.level:g} %):",
                  "", markdown_table(eff, digits=4), ""]
    lines += [f"> warning: {w}" for w in result.warnings]
    if result.rule:
        lines += ["", result.rule[0].upper() + result.rule[1:]]
    return "\n".join(lines).rstrip() + "\n"


def gate_junit(result: GateResult) -> str:
    """The gate as JUnit XML: one ``testcase`` per check, a ``failure`` element for each broken bound
    (``type`` ``fail``, or ``inconclusive`` for a non-inferiority bound the data cannot show)."""
    t = result.table
    failures = int((~t["passed"]).sum())
    suite_name = f"weknora-nb gate {result.run}" + (f" vs {result.baseline}" if result.baseline else "")
    root = ET.Element("testsuites", name="weknora-nb gate", tests=str(len(t)), failures=str(failures), errors="0")
    suite = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(t)), failures=str(failures),
                          errors="0", skipped="0")
    props = ET.SubElement(suite, "properties")
    for name, value in (("run", result.run), ("baseline", result.baseline or ""), ("stage", result.stage),
                        ("rule", result.rule), ("level", f"{result.level:g}")):
        ET.SubElement(props, "property", name=name, value=value)
    for r in t.to_dict("records"):
        case = ET.SubElement(suite, "testcase", classname=f"weknora_nb.gate.{result.stage}",
                             name=f"{r['check']} {r['metric']}")
        detail = f"{r['check']} {r['metric']}: value {_num(r['value'])}; {r['bound']}"
        if not r["passed"]:
            kind = r.get("verdict") if isinstance(r.get("verdict"), str) else "fail"
            failure = ET.SubElement(case, "failure", message=str(r["bound"]), type=kind)
            failure.text = detail
        else:
            ET.SubElement(case, "system-out").text = detail
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _num(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


# ---------------------------------------------------------------------------------------
# runs for ranx and trec_eval
# ---------------------------------------------------------------------------------------
_RANX_FAMILIES = {"recall": "recall", "precision": "precision", "hit": "hit_rate", "mrr": "mrr", "map": "map"}


def ranx_metric_name(metric: str) -> str:
    """ranx's name of a metric of the registry (``ndcg@5`` -> ``ndcg_burges@5``); a :class:`UsageError`
    for one ranx lacks (``judged@K``, ``ndcg@K:binary``)."""
    m = parse_metric(metric)
    if m.family == "ndcg" and m.variant in (None, "linear"):
        return f"{'ndcg_burges' if m.variant is None else 'ndcg'}@{m.k}"
    if m.family in _RANX_FAMILIES:
        return f"{_RANX_FAMILIES[m.family]}@{m.k}"
    raise UsageError(argument="metric", allowed="a metric ranx computes (recall, precision, hit, mrr, map, "
                                                "ndcg, ndcg:linear)", got=metric)


def ranx_qrels(testset: TestSet) -> dict[str, dict[str, int]]:
    """``{query_id: {chunk_id: grade}}`` for the valid queries (every label, grade 0 included)."""
    valid = set(testset.valid_ids)
    out: dict[str, dict[str, int]] = {}
    for q, c, g in testset.qrels[["query_id", "chunk_id", "grade"]].itertuples(index=False):
        if q in valid:
            out.setdefault(str(q), {})[str(c)] = int(g)
    return out


def returned_lists(results: pd.DataFrame, stage: str, repeat: int) -> tuple[pd.DataFrame, list[str]]:
    """The successful lists of one (stage, repeat) as the method scores them (module docstring):
    rows ``query_id``, ``rank`` (1..n), ``chunk_id``, ``score`` (n - rank + 1), and the ids of the
    queries whose successful list was empty."""
    sub = results[(results["stage"].astype("string") == stage) & (results["repeat"] == repeat)]
    status = sub["status"].astype("string").fillna("ok") if "status" in sub else pd.Series("ok", index=sub.index)
    ok = sub[(status == "ok").to_numpy()]
    ok, _ = expand_sub_chunks(ok)
    ok = ok.assign(query_id=ok["query_id"].astype("string"), chunk_id=ok["chunk_id"].astype("string"))
    rows = ok[ok["chunk_id"].notna()].sort_values(["query_id", "rank"], kind="stable")
    rows = rows.drop_duplicates(["query_id", "chunk_id"], keep="first")
    rank = rows.groupby("query_id", sort=False).cumcount() + 1
    n = rows.groupby("query_id", sort=False)["chunk_id"].transform("size")
    lists = pd.DataFrame({"query_id": rows["query_id"].to_numpy(), "rank": rank.to_numpy(dtype=np.int64),
                          "chunk_id": rows["chunk_id"].to_numpy(),
                          "score": (n - rank + 1).to_numpy(dtype=np.float64)})
    empty = sorted(set(ok["query_id"].dropna()) - set(lists["query_id"]))
    return lists, empty


def ranx_run(results: pd.DataFrame, stage: str, repeat: int, *, queries: Iterable[str] | None = None
             ) -> dict[str, dict[str, float]]:
    """``{query_id: {chunk_id: score}}`` of one (stage, repeat) (:func:`returned_lists`); ``queries``:
    keep only these (the valid ones)."""
    lists, empty = returned_lists(results, stage, repeat)
    keep = None if queries is None else set(queries)
    out: dict[str, dict[str, float]] = {q: {} for q in empty if keep is None or q in keep}
    for q, c, s in lists[["query_id", "chunk_id", "score"]].itertuples(index=False):
        if keep is None or q in keep:
            out.setdefault(q, {})[c] = float(s)
    return out


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _file_part(text: str) -> str:
    return _UNSAFE.sub("_", text) or "_"


def export_run(run: str | Path | Run, out: str | Path, *, fmt: str = "ranx", stages: Iterable[str] | None = None,
               repeats: Iterable[int] | None = None) -> list[Path]:
    """Write a run's qrels and one run file per (stage, repeat) into the folder ``out``; returns the paths.

    ``fmt="ranx"``: ``qrels.json`` and ``run.<stage>.<repeat>.json`` (ranx's ``Qrels`` / ``Run`` JSON, read
    back with ``Qrels.from_file`` / ``Run.from_file``); ``fmt="trec"``: ``qrels.txt`` and
    ``run.<stage>.<repeat>.trec`` (trec_eval). ``stages`` / ``repeats`` default to every one of the run.
    """
    if fmt not in FORMATS:
        raise UsageError(argument="format", allowed=list(FORMATS), got=fmt)
    r = run if isinstance(run, Run) else load_run(run)
    chosen = list(stages) if stages is not None else r.stages
    unknown = [s for s in chosen if s not in r.stages]
    if unknown:
        raise UsageError(argument="stage", allowed=r.stages, got=unknown[0])
    held = [int(x) for x in r.scores.counts.repeats]
    reps = list(dict.fromkeys(repeats)) if repeats is not None else held
    absent = [x for x in reps if x not in held]
    if absent:
        raise UsageError(argument="--repeat", allowed=f"a repeat the run holds: {held}", got=absent[0])
    chosen = list(dict.fromkeys(chosen))
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise UsageError(argument="--out", allowed="a folder (made when missing)", got=f"{out} (a file)")
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    written = [_write_qrels(r.testset, folder, fmt)]
    valid = set(r.testset.valid_ids)
    for st in chosen:
        for rep in reps:
            written.append(_write_run(r.results, st, rep, folder, fmt, valid))
    return written


def _write_qrels(testset: TestSet, folder: Path, fmt: str) -> Path:
    if fmt == "ranx":
        return write_text(folder / "qrels.json", json.dumps(ranx_qrels(testset), ensure_ascii=False) + "\n")
    path = folder / "qrels.txt"
    with writing(path), atomic_path(path) as tmp:
        testset.subset(testset.valid_ids).to_trec_qrels(tmp)
    return path


def _write_run(results: pd.DataFrame, stage: str, repeat: int, folder: Path, fmt: str, valid: set[str]) -> Path:
    name = f"run.{_file_part(stage)}.{repeat}"
    if fmt == "ranx":
        data = ranx_run(results, stage, repeat, queries=valid)
        return write_text(folder / f"{name}.json", json.dumps(data, ensure_ascii=False) + "\n")
    lists, _ = returned_lists(results, stage, repeat)
    lists = lists[lists["query_id"].isin(valid)]
    frame = lists.assign(stage=stage, repeat=repeat, status="ok")
    path = folder / f"{name}.trec"
    with writing(path), atomic_path(path) as tmp:
        write_trec_run(frame, tmp, stage=stage, repeat=repeat, tag=_file_part(stage), score_mode="original")
    return path


# ---------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------
def _cell(x: Any, digits: int) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA or x is pd.NaT:
        return ""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.{digits}f}"
    return str(x)


def _frame(df: pd.DataFrame, index: bool) -> pd.DataFrame:
    return df.reset_index() if index else df


def markdown_table(df: pd.DataFrame, *, digits: int = 4, index: bool = False) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (numbers right-aligned, ``|`` escaped)."""
    f = _frame(df, index)
    head = [str(c).replace("|", "\\|") for c in f.columns]
    numeric = [pd.api.types.is_numeric_dtype(f[c]) and not pd.api.types.is_bool_dtype(f[c]) for c in f.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for row in f.itertuples(index=False):
        cells = [" ".join(_cell(x, digits).split()).replace("|", "\\|") for x in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in " ".join(text.split()))


def latex_table(df: pd.DataFrame, *, digits: int = 4, index: bool = False, caption: str | None = None,
                label: str | None = None) -> str:
    """A LaTeX ``tabular`` of ``df`` (in a ``table`` float when ``caption`` or ``label`` is given),
    numbers right-aligned, special characters escaped; needs no LaTeX package."""
    f = _frame(df, index)
    numeric = [pd.api.types.is_numeric_dtype(f[c]) and not pd.api.types.is_bool_dtype(f[c]) for c in f.columns]
    body = [r"\begin{tabular}{" + "".join("r" if n else "l" for n in numeric) + "}", r"\hline",
            " & ".join(_latex_escape(str(c)) for c in f.columns) + r" \\", r"\hline"]
    for row in f.itertuples(index=False):
        body.append(" & ".join(_latex_escape(_cell(x, digits)) for x in row) + r" \\")
    body += [r"\hline", r"\end{tabular}"]
    if caption is None and label is None:
        return "\n".join(body) + "\n"
    wrapped = [r"\begin{table}[ht]", r"\centering", *body]
    if caption is not None:
        wrapped.append(r"\caption{" + _latex_escape(caption) + "}")
    if label is not None:
        wrapped.append(r"\label{" + label + "}")
    return "\n".join([*wrapped, r"\end{table}"]) + "\n"
