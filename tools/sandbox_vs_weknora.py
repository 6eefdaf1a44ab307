"""How far two runs of the same test set agree, stage by stage: the table of docs/sandbox-vs-weknora.md.

It reads two run folders of ``weknora-nb collect`` (their ``results.parquet`` and ``manifest.json``; nothing else,
and it builds, starts or calls nothing) and, for every stage both ran, compares each query's ranked list of result
ids, cut to the first ``k`` (default 10):

- **same ids**: the share of queries whose two lists hold the same ids (as sets);
- **same order**: the share whose two lists are equal (same ids at the same ranks);
- **Jaccard@k**: the mean of ``|A ∩ B| / |A ∪ B|`` over queries;
- **RBO@k**: the mean rank-biased overlap, ``sum_{d=1..D} p^(d-1) |A:d ∩ B:d| / d`` over ``sum_{d=1..D} p^(d-1)``
  with ``p = 0.9`` and ``D = min(k, max(|A|, |B|))`` (truncated and normalised so that two equal lists score 1,
  however short; Webber, Moffat and Zobel 2010 with the prefixes ``A:d`` of the lists as returned).

Two empty lists agree (1 on every measure), one empty list against a non-empty one scores 0. A query whose request
failed in either run is left out of that stage and counted in ``failed``: a failure is not an empty list.
Only the first repeat of each run is read.

    python tools/sandbox_vs_weknora.py RUN_A RUN_B [--k 10] [--p 0.9] [--names weknora,sandbox]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from weknora_nb.core.errors import WeknoraNbError
from weknora_nb.core.results import read_results
from weknora_nb.core.run import read_manifest

#: the stages in pipeline order (others follow, by name)
ORDER = ("vector", "keyword", "hybrid", "final", "faq", "citations")


@dataclass(frozen=True)
class Agreement:
    """One stage's agreement between the two runs (see the module docstring)."""

    stage: str
    queries: int
    failed: int
    same_ids: float
    same_order: float
    jaccard: float
    rbo: float


def rbo(a: list[str], b: list[str], p: float = 0.9, k: int = 10) -> float:
    """Truncated, normalised rank-biased overlap of two ranked lists (module docstring); 1 for two empty lists."""
    depth = min(k, max(len(a), len(b)))
    if depth == 0:
        return 1.0
    num = den = 0.0
    seen_a: set[str] = set()
    seen_b: set[str] = set()
    for d in range(1, depth + 1):
        if d <= len(a):
            seen_a.add(a[d - 1])
        if d <= len(b):
            seen_b.add(b[d - 1])
        weight = p ** (d - 1)
        num += weight * len(seen_a & seen_b) / d
        den += weight
    return num / den


def jaccard(a: list[str], b: list[str]) -> float:
    """``|A ∩ B| / |A ∪ B|`` of the lists' ids; 1 for two empty lists."""
    sa, sb = set(a), set(b)
    return 1.0 if not sa | sb else len(sa & sb) / len(sa | sb)


def ranked_lists(results: pd.DataFrame, stage: str, k: int) -> tuple[dict[str, list[str]], set[str]]:
    """Per query of ``stage`` (first repeat), its first ``k`` result ids by rank, and the queries whose request
    failed."""
    rows = results[(results["stage"] == stage) & (results["repeat"] == 1)]
    failed = set(rows.loc[rows["status"] != "ok", "query_id"].astype(str))
    ok = rows[rows["status"] == "ok"].sort_values(["query_id", "rank"])
    lists: dict[str, list[str]] = {str(q): [] for q in ok["query_id"].unique()}
    for q, chunk in zip(ok["query_id"].astype(str), ok["chunk_id"], strict=True):
        if pd.notna(chunk) and len(lists[q]) < k:
            lists[q].append(str(chunk))
    return {q: v for q, v in lists.items() if q not in failed}, failed


def compare(results_a: pd.DataFrame, results_b: pd.DataFrame, *, k: int = 10, p: float = 0.9) -> list[Agreement]:
    """The agreement of every stage both results tables hold, in pipeline order."""
    stages = set(results_a["stage"].astype(str)) & set(results_b["stage"].astype(str))
    out = []
    for stage in sorted(stages, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s)):
        a, failed_a = ranked_lists(results_a, stage, k)
        b, failed_b = ranked_lists(results_b, stage, k)
        queries = sorted(set(a) & set(b))
        if not queries:
            continue
        n = len(queries)
        out.append(Agreement(
            stage=stage, queries=n, failed=len(failed_a | failed_b),
            same_ids=sum(set(a[q]) == set(b[q]) for q in queries) / n,
            same_order=sum(a[q] == b[q] for q in queries) / n,
            jaccard=sum(jaccard(a[q], b[q]) for q in queries) / n,
            rbo=sum(rbo(a[q], b[q], p, k) for q in queries) / n))
    return out


def table(rows: list[Agreement], k: int = 10) -> str:
    """The agreement as a Markdown table (shares and means with 3 decimals)."""
    head = (f"| stage | queries | failed | same ids (top {k}) | same ids, same order | mean Jaccard@{k} "
            f"| mean RBO@{k} (p 0.9) |\n|---|---|---|---|---|---|---|\n")
    return head + "".join(f"| {r.stage} | {r.queries} | {r.failed} | {r.same_ids:.3f} | {r.same_order:.3f} | "
                          f"{r.jaccard:.3f} | {r.rbo:.3f} |\n" for r in rows)


def describe(run: Path) -> str:
    """One line naming what a run measured: its server (version, edition, commit) and its knowledge bases."""
    m = read_manifest(run)
    server = m.get("server") or {}
    kbs = ", ".join(m.get("target", {}).get("knowledge_base_ids", []))
    return (f"{run.name}: {server.get('edition', '?')} {server.get('version', '?')} ({server.get('commit_id', '?')}), "
            f"knowledge base {kbs}, test set {m.get('testset', {}).get('hash', '?')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--p", type=float, default=0.9)
    args = ap.parse_args(argv)
    if args.k < 1 or not 0 < args.p < 1:
        print(f"sandbox_vs_weknora: --k must be >= 1 (got {args.k}) and --p in (0, 1) (got {args.p})",
              file=sys.stderr)
        return 2
    try:
        for run in (args.run_a, args.run_b):
            print(describe(run))
        rows = compare(read_results(args.run_a / "results.parquet"), read_results(args.run_b / "results.parquet"),
                       k=args.k, p=args.p)
    except (WeknoraNbError, OSError) as exc:
        print(f"sandbox_vs_weknora: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print()
    print(table(rows, args.k), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
