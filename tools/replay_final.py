"""Run the sandbox's knowledge-search pipeline after CHUNK_SEARCH on the candidates a run collected, and count the
queries whose final list it reproduces: does the sandbox rerank, merge and cut as that server did?

The candidates are a run's custom stage ``candidates``: hybrid-search with the body knowledge-search's CHUNK_SEARCH
sends (``match_count`` = embedding_top_k, the tenant's vector and keyword thresholds, no context enrichment;
chat_pipeline/search.go:469-478 @ v0.7.2), collected with a stages file such as::

    stages:
      candidates:
        endpoint: hybrid-search
        params: {match_count: 50, vector_threshold: 0.15, keyword_threshold: 0.3, skip_context_enrichment: true}
        keep_match_types: null

Each query's candidates (ids, scores and match types, in their order) replace the sandbox's own CHUNK_SEARCH; the
rest is the sandbox's (CHUNK_RERANK with the version's rerank model, CHUNK_MERGE, FILTER_TOP_K, the version's tenant
settings). The sandbox's data folder must hold the same chunks, e.g. the run's knowledge base's chunk listing
(weknora_nb/sandbox/listing.py). It builds and runs nothing of WeKnora's::

    python tools/replay_final.py --data LISTING_FOLDER --version lite-flat --testset TESTSET \\
        CANDIDATES_RUN FINAL_RUN
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import WeknoraNbError
from weknora_nb.core.results import read_results
from weknora_nb.core.testset import load_testset


def replay(data: Path, version: str, testset: Path, candidates: Path, final: Path) -> list[tuple[str, bool]]:
    """Per query of the final run, whether the sandbox's pipeline on its collected candidates gives its final list."""
    from weknora_nb.sandbox import RetrievalEngine, build_index, load_demo_versions
    from weknora_nb.sandbox.pipeline import Hit, knowledge_search

    index = build_index(data)
    engine = RetrievalEngine(index, load_demo_versions(data)[version])
    settings = engine.tenant_settings()
    queries = load_testset(testset).queries.set_index("query_id")["query"]
    found = read_results(candidates / "results.parquet")
    found = found[(found["stage"] == "candidates") & (found["status"] == "ok") & (found["repeat"] == 1)]
    done = read_results(final / "results.parquet")
    done = done[(done["stage"] == "final") & (done["status"] == "ok") & (done["repeat"] == 1)]
    out = []
    for q, rows in found.sort_values(["query_id", "rank"]).groupby("query_id", sort=True):
        hits = [Hit(index.by_id[c], float(s), int(m)) for c, s, m in zip(rows["chunk_id"], rows["score"],
                                                                         rows["match_type"], strict=True)]

        def collected(query: str, _hits: list[Any] = hits, **_: Any) -> list[Any]:
            return [Hit(h.idx, h.score, h.match_type) for h in _hits]
        engine.primary_search = collected  # type: ignore[method-assign]
        got = [index.chunks[h.idx].id for h in knowledge_search(engine, str(queries[q]), settings=settings)]
        want = list(done[done["query_id"] == q].sort_values("rank")["chunk_id"].astype(str))
        out.append((str(q), got == want))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="the sandbox's data folder (the same chunks)")
    ap.add_argument("--version", required=True, help="its version (rerank model, tenant settings)")
    ap.add_argument("--testset", type=Path, required=True)
    ap.add_argument("candidates", type=Path, help="run folder with a 'candidates' stage")
    ap.add_argument("final", type=Path, help="run folder with the 'final' stage")
    args = ap.parse_args(argv)
    try:
        rows = replay(args.data, args.version, args.testset, args.candidates, args.final)
    except (WeknoraNbError, OSError, KeyError) as exc:
        print(f"replay_final: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    same = [q for q, ok in rows if ok]
    print(f"{len(same)}/{len(rows)} queries: the sandbox's pipeline on {args.candidates.name}'s candidates gives "
          f"{args.final.name}'s final list")
    differ = [q for q, ok in rows if not ok]
    if differ:
        print("differ: " + ", ".join(differ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
