"""Write a WeKnora knowledge base's chunks as the chunk listing the sandbox serves (weknora_nb/sandbox/listing.py).

It lists the knowledge base over WeKnora's API, as any client does: its knowledge (``GET
/api/v1/knowledge-bases/{id}/knowledge``, for the titles) and each knowledge's chunks of the searchable types
(``GET /api/v1/chunks/{knowledge_id}?chunk_type=...``, 100 a page). No API gives the text WeKnora indexed for a
chunk unless search returns it (``matched_content``, C76: the heading breadcrumb WeKnora's chunker prepends is in
no listing field), so ``--index-texts`` may name the WeKnora Lite database file to read it from, read-only (its
``lite_embeddings`` table, one row per chunk); without it the sandbox indexes ``title + "\\n" + content``.

    WEKNORA_API_KEY=sk-... python tools/chunk_listing.py --base-url http://127.0.0.1:18080 \\
        --kb-id 3aa46978-16ee-4cb1-bd79-72a0ff83cb49 --out lite-flat.chunks.jsonl \\
        [--index-texts /path/to/weknora.db]

It builds and runs nothing of WeKnora's: it reads a running one. Lines are written in listing order (knowledge
in the list's order, chunks by ``chunk_index``), one JSON object each.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx

#: the chunk types search returns (C24), all listed
TYPES = ("text", "summary", "table_summary", "table_column", "image_ocr", "image_caption")
PAGE = 100


def _pages(client: httpx.Client, path: str, params: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Every row of a paged listing, page by page until ``total`` rows came."""
    rows: list[dict[str, Any]] = []
    page = 1
    while True:
        r = client.get(path, params=[*params, ("page", str(page)), ("page_size", str(PAGE))])
        r.raise_for_status()
        body = r.json()
        rows += body.get("data") or []
        if len(rows) >= int(body.get("total") or 0) or not body.get("data"):
            return rows
        page += 1


def index_texts(db: Path, kb_id: str) -> dict[str, str]:
    """The text WeKnora Lite indexed for each chunk of ``kb_id`` (its ``lite_embeddings`` rows), read-only."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT chunk_id, content FROM lite_embeddings WHERE knowledge_base_id = ?", (kb_id,))
        return {chunk: text for chunk, text in rows}
    finally:
        con.close()


def listing(client: httpx.Client, kb_id: str, texts: dict[str, str]) -> list[dict[str, Any]]:
    """The knowledge base's chunks as listing records (weknora_nb/sandbox/listing.py's fields)."""
    out = []
    for k in _pages(client, f"/api/v1/knowledge-bases/{kb_id}/knowledge", []):
        for c in _pages(client, f"/api/v1/chunks/{k['id']}", [("chunk_type", t) for t in TYPES]):
            rec = {"id": c["id"], "knowledge_id": c["knowledge_id"], "knowledge_title": k.get("title") or "",
                   "chunk_index": c["chunk_index"], "content": c["content"], "chunk_type": c["chunk_type"],
                   "parent_chunk_id": c.get("parent_chunk_id") or "", "start_at": c.get("start_at", 0),
                   "end_at": c.get("end_at", 0)}
            if c["id"] in texts:
                rec["matched_content"] = texts[c["id"]]
            out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--kb-id", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--index-texts", type=Path, default=None, help="WeKnora Lite's SQLite file, read-only")
    ap.add_argument("--api-key-env", default="WEKNORA_API_KEY")
    args = ap.parse_args(argv)
    key = os.environ.get(args.api_key_env)
    if not key:
        print(f"chunk_listing: set {args.api_key_env} (the WeKnora API key)", file=sys.stderr)
        return 2
    texts = index_texts(args.index_texts, args.kb_id) if args.index_texts else {}
    with httpx.Client(base_url=args.base_url, headers={"X-API-Key": key}, timeout=60) as client:
        rows = listing(client, args.kb_id, texts)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    with_text = sum("matched_content" in r for r in rows)
    print(f"{len(rows)} chunks ({with_text} with their indexed text) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
