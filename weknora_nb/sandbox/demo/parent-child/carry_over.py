"""Carry the demo test set's labels over to the knowledge base chunked parent-child (``parent-child/testset.jsonl``).

The demo test set (``../testset.jsonl``) labels the flat chunks of the document knowledge base. Version
``parent-child`` of ``versions.yaml`` chunks the same documents as WeKnora's web UI does (parents stored and
shown, children searched: ``weknora_nb.sandbox.parentchild``), so its chunks have other ids. This script writes
both chunk inventories (``chunks-flat.parquet``: the flat chunks; ``chunks.parquet``: the children, the chunks
search returns and labels belong on) and moves the labels by content with ``weknora-nb testset carry-over``
(strict rule), writing ``testset.jsonl``, its lineage and the worksheet of the pairs that need a person
(``testset.jsonl.review.csv``). Run it from anywhere after the documents or either chunker change::

    python weknora_nb/sandbox/demo/parent-child/carry_over.py

``tests/test_parent_child_testset.py`` fails when the shipped files are out of date.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from weknora_nb.sandbox.chunking import corpus_chunks
from weknora_nb.sandbox.parentchild import parent_child_corpus

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent
#: the sandbox's document knowledge base id (an inventory's knowledge_base_id)
KB_ID = "kb-demo"


def inventory(chunks: list) -> pd.DataFrame:
    """The ``text`` chunks as a chunk inventory (the columns carry-over reads, and where a child's parent is)."""
    rows = [{"chunk_id": c.id, "knowledge_base_id": KB_ID, "knowledge_id": c.knowledge_id,
             "knowledge_title": c.knowledge_title, "chunk_index": c.chunk_index, "chunk_type": c.chunk_type,
             "parent_chunk_id": c.parent_chunk_id, "content": c.content} for c in chunks if c.chunk_type == "text"]
    return pd.DataFrame(rows)


def main() -> int:
    inventory(corpus_chunks(DEMO)).to_parquet(HERE / "chunks-flat.parquet", index=False)
    inventory(parent_child_corpus(DEMO)).to_parquet(HERE / "chunks.parquet", index=False)
    # relative paths, so that the lineage names the files as shipped
    return subprocess.run([sys.executable, "-m", "weknora_nb", "testset", "carry-over", "--testset",
                           "../testset.jsonl", "--old-chunks", "chunks-flat.parquet", "--new-chunks", "chunks.parquet",
                           "--out", "testset.jsonl"], cwd=HERE, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
