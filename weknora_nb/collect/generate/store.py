"""What a generation keeps on disk, beside the test set it writes (``<out>``), with the judge's machinery.

- ``<out>.generation/log.jsonl``: one record per finished call (the judge's
  :class:`~weknora_nb.collect.judge.store.JudgementLog`: appended, flushed and ``fsync``-ed one at a time, a torn
  last line dropped), of three kinds: ``generate`` (a task's question, or the failure), ``check`` (whether the
  question is answerable from its chunks, or the failure), ``search`` (the round trip: the source chunk's rank in
  hybrid-search at depth K, or the failure). A rerun makes only the calls whose record is not there.
- ``<out>.generation/generation.json``: the manifest: the knowledge base, the generator (model, server, prompts
  and their sha256, parameters, and the ``identity`` hash of what decides its replies, so that records of another
  generator are told apart), the options, the counts, the ledger of tokens and cost, how the run ended.
- ``<out>.generation/.generate.lock``: one generation per output at a time (the collector's lock).
- the cache of replies (default ``<out's folder>/.generate-cache.sqlite``, the judge's
  :class:`~weknora_nb.collect.judge.store.JudgeCache`): only replies that passed the strict reading.

Records hold no key and no secret: the texts of questions and replies, token counts and costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weknora_nb.collect.judge.store import Key

#: the kinds of records, in the order a question meets them
KINDS = ("generate", "check", "search")
LOG_FILE, MANIFEST_FILE, LOCK_FILE = "log.jsonl", "generation.json", ".generate.lock"
CACHE_FILE = ".generate-cache.sqlite"


def work_folder(out: str | Path) -> Path:
    """Where the generation of the test set ``out`` keeps its work: ``<out>.generation``."""
    p = Path(out)
    return p.with_name(p.name + ".generation")


def record_key(rec: dict[str, Any]) -> Key:
    """A log record's key (``kind``, ``key``, 0, 0); TypeError for a line that is no generation record."""
    kind, key = rec["kind"], rec["key"]
    if kind not in KINDS or not isinstance(key, str) or rec.get("status") not in ("ok", "failed"):
        raise TypeError("not a generation record")
    return (kind, key, 0, 0)
