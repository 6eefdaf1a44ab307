"""Build the judging pools for the demo test set (TREC-style pooling).

For every draft query: the union of the top 5 chunks of four retrieval paths — the
vector path (USE + HNSW), the keyword path (BM25), their RRF merge, and an exhaustive
multilingual-e5-small ranking — plus the author's intended sections and the neighbours
of those sections. Candidates are written in chunk-id order (not by system) so that the
judge cannot tell which system found what.

    python data/demo/labelling/make_pools.py    # writes labelling/worksheets/<folder>.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from weknora_nb.sandbox import RetrievalEngine, build_index, load_demo_versions

HERE = Path(__file__).resolve().parent
DEPTH = 5


def load_drafts() -> list[dict]:
    out = []
    n = 0
    for f in sorted((HERE / "drafts").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                n += 1
                d = json.loads(line)
                d["folder"] = f.stem
                d["query_id"] = f"q{n:04d}"
                out.append(d)
    return out


def main() -> None:
    index = build_index(show_progress=True)
    engine = RetrievalEngine(index, load_demo_versions()["baseline"])
    by_heading: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(index.chunks):
        by_heading.setdefault((c.knowledge_id, c.heading_path[-1]), []).append(i)
    e5 = index.passage_vectors("multilingual-e5-small-q4")
    e5q = index.embedder("multilingual-e5-small-q4")
    sheets: dict[str, list[dict]] = {}
    sizes = []
    for d in load_drafts():
        q = d["query"]
        pool: set[int] = set()
        for t in d["targets"]:
            kid = f"{d['folder']}.{t['doc'].removesuffix('.md')}"
            hits = by_heading.get((kid, t["heading"]))
            if not hits:
                raise SystemExit(f"{d['draft_id']}: no chunk for {kid} / {t['heading']!r}")
            for i in hits:
                pool.add(i)
                for off in (-1, 1):
                    j = index.neighbour(i, off)
                    if j is not None:
                        pool.add(j)
        for hits in (engine.vector(q, DEPTH, 0.0), engine.keyword(q, DEPTH, 0.0),
                     engine.hybrid_search(q, match_count=DEPTH, skip_enrichment=True)):
            pool.update(h.idx for h in hits)
        pool.update(int(i) for i in np.argsort(-(e5 @ e5q.query(q)))[:DEPTH])
        cands = sorted(pool, key=lambda i: index.chunks[i].id)
        sizes.append(len(cands))
        sheets.setdefault(d["folder"], []).append({
            "query_id": d["query_id"], "draft_id": d["draft_id"], "query": q, "answer": d.get("answer", ""),
            "no_answer": "no-answer" in d.get("tags", []),
            "candidates": [{"chunk_id": index.chunks[i].id, "content": index.chunks[i].content} for i in cands],
        })
    out = HERE / "worksheets"
    out.mkdir(exist_ok=True)
    for folder, rows in sheets.items():
        with open(out / f"{folder}.jsonl", "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{sum(len(v) for v in sheets.values())} queries, pool size mean {np.mean(sizes):.1f}, "
          f"max {max(sizes)}, total judgments {sum(sizes)}")


if __name__ == "__main__":
    main()
