"""The sandbox on the demo data: build time, serving time, and what each stage retrieves.

Prints (and with ``--write-card`` writes into ``data/demo/README.md``):

1. index build time in a fresh process: cold (no embedding cache at all: every chunk
   embedded by both models) and as a fresh clone runs it (the shipped embedding seed);
2. the time to serve the whole test set once at one stage (``final`` of ``rerank``,
   through the collector, 8 in flight);
3. recall@10 of the vector, keyword, hybrid and final stages, and NDCG@5 of the final
   stage without and with the reranker, on the demo test set (one repeat).

    python benchmarks/bench_sandbox.py [--write-card] [--skip-cold]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from weknora_nb import score
from weknora_nb.collect import collect_async
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.core.results import read_results
from weknora_nb.core.testset import load_testset
from weknora_nb.sandbox import SandboxServer, demo_dir

BUILD = """
import time, sys
t0 = time.perf_counter()
from weknora_nb.sandbox import build_index, load_demo_versions
idx = build_index(cache_dir=sys.argv[1])
t1 = time.perf_counter()
for v in load_demo_versions().values():
    idx.warm(v)
print(f"{len(idx.chunks)} {t1 - t0:.2f} {time.perf_counter() - t0:.2f}")
"""


def build_in_fresh_process(cache: str, data_dir: Path | None) -> tuple[int, float]:
    env = dict(os.environ)
    if data_dir is not None:
        env["WEKNORA_NB_DEMO"] = str(data_dir)
    out = subprocess.run([sys.executable, "-c", BUILD, cache], env=env, capture_output=True, text=True, check=True)
    n, _, total = out.stdout.split()
    return int(n), float(total)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-card", action="store_true")
    ap.add_argument("--skip-cold", action="store_true", help="skip the cold build (about 2 minutes)")
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_cold:
            # a copy of the demo folder without the shipped embedding seed
            bare = Path(tmp) / "demo"
            bare.mkdir()
            for name in ("docs", "versions.yaml"):
                src = demo_dir() / name
                (bare / name).symlink_to(src, target_is_directory=src.is_dir())
            n, cold = build_in_fresh_process(str(Path(tmp) / "cold-cache"), bare)
            lines.append(f"- index build, cold (no embedding cache, {n} chunks embedded by both models): {cold:.1f} s")
        n, seeded = build_in_fresh_process(str(Path(tmp) / "seeded-cache"), None)
        lines.append(f"- index build from a fresh clone (shipped embedding seed): {seeded:.1f} s")

        os.environ.setdefault("WEKNORA_API_KEY", "sk-bench-local")
        ts = load_testset(demo_dir() / "testset.jsonl")
        runs = {}
        for version, stages in (("baseline", "vector,keyword,hybrid,final"), ("rerank", "final")):
            with SandboxServer(version, cache_dir=Path(tmp) / "seeded-cache") as sb:
                out = Path(tmp) / version
                t0 = time.perf_counter()
                asyncio.run(collect_async(ClientSettings(sb.base_url), sb.kb_id, ts, out, stages=stages, repeats=1,
                                          concurrency=8, warmup=0, inventory=False, progress=False))
                secs = time.perf_counter() - t0
                if version == "rerank":
                    lines.append(f"- serving the full test set once ({len(ts)} queries) at stage final of "
                                 f"'rerank', 8 in flight: {secs:.1f} s")
                runs[version] = score(ts, read_results(out / "results.parquet"),
                                      ["recall@10", "ndcg@5", "hit@5", "mrr@20"])
    base, rr = runs["baseline"].summary_wide(), runs["rerank"].summary_wide()
    table = ["| stage | recall@10 | ndcg@5 | hit@5 | mrr@20 |", "|---|---|---|---|---|"]
    for stage in ("vector", "keyword", "hybrid", "final"):
        r = base.loc[stage]
        table.append(f"| baseline {stage} | {r['recall@10']:.3f} | {r['ndcg@5']:.3f} | {r['hit@5']:.3f} | "
                     f"{r['mrr@20']:.3f} |")
    r = rr.loc["final"]
    table.append(f"| rerank final | {r['recall@10']:.3f} | {r['ndcg@5']:.3f} | {r['hit@5']:.3f} | {r['mrr@20']:.3f} |")
    gain = rr.loc["final", "ndcg@5"] - base.loc["final", "ndcg@5"]
    lines.append(f"- NDCG@5 of the final stage: {base.loc['final', 'ndcg@5']:.3f} without rerank, "
                 f"{rr.loc['final', 'ndcg@5']:.3f} with rerank ({gain:+.3f})")
    text = "\n".join(lines + ["", *table])
    print(text)
    if args.write_card:
        card = demo_dir() / "README.md"
        body = card.read_text(encoding="utf-8")
        new = re.sub(r"(<!-- bench:start -->\n).*?(\n<!-- bench:end -->)", lambda m: m.group(1) + text + m.group(2),
                     body, flags=re.S)
        card.write_text(new, encoding="utf-8")
        print(f"wrote {card}")


if __name__ == "__main__":
    main()
