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

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from weknora_nb.collect.judge.store import Key
from weknora_nb.collect.run.lock import RunLock
from weknora_nb.core.errors import RunLockedError, reading, writing
from weknora_nb.core.files import atomic_path

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


class GenerateLock(RunLock):
    """One generation per output: the run-folder lock on ``<out>.generation/.generate.lock``."""

    def __init__(self, folder: str | Path, command: list[str] | None = None):
        super().__init__(folder, command)
        self.path = self.run_dir / LOCK_FILE

    def acquire(self) -> None:
        try:
            super().acquire()
        except RunLockedError as exc:
            h = exc.holder
            who = f"pid {h.get('pid', '?')} on host {h.get('host', '?')}" if h else "another process"
            raise RunLockedError(f"{self.run_dir} is being written by {who}; wait until it ends, or stop it, then "
                                 "run the command again (it goes on where it stopped)", h) from None


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` ({} when there is none yet)."""
    if not path.is_file():
        return {}
    with reading(path):
        data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` atomically."""
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, ensure_ascii=False, indent=2)


def command_line() -> list[str]:
    """This process's command line with its URLs' secrets redacted."""
    from weknora_nb.collect.http.redact import redact_command

    return redact_command(sys.argv)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
