"""A knowledge base served from a chunk listing: the chunks as a WeKnora lists them, in place of the sandbox's own
chunking of ``docs/``, so that the sandbox and that WeKnora search the same chunks (docs/sandbox-vs-weknora.md).

A data folder's ``versions.yaml`` names the file at its top level, relative to the folder::

    chunks: lite-flat.chunks.jsonl

One JSON object a line, the fields of WeKnora's chunk JSON (``GET /api/v1/chunks/{knowledge_id}``, C55):

- required: ``id``, ``knowledge_id``, ``chunk_index`` (an integer), ``content``, ``chunk_type`` (a searchable type:
  ``text``, ``summary``, ``table_summary``, ``table_column``, ``image_ocr``, ``image_caption``; C24);
- optional: ``knowledge_title`` (the knowledge's ``title``: C76's index text starts with it), ``start_at``,
  ``end_at``, ``parent_chunk_id`` (listed and returned as given: a flat knowledge base's ``summary`` chunks name
  their document's first ``text`` chunk, FINDINGS a/C24), ``matched_content`` (the text WeKnora indexed for the
  chunk, as its search results return it, C76: it holds the heading breadcrumb WeKnora's chunker adds, which no
  listing field carries; without it the sandbox indexes ``title + "\\n" + content``).

Every chunk goes to the document knowledge base, in file order (the order of ties in a listing, C124); ids must be
unique. A bad line is an :class:`~weknora_nb.core.errors.InputError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from weknora_nb.core.errors import ConfigError, InputError, Problem
from weknora_nb.sandbox.chunking import Chunk

#: the top-level key of ``versions.yaml`` naming a chunk listing
LISTING_KEY = "chunks"
#: C24: the chunk types search returns, those a listing may hold
SEARCHABLE_TYPES = ("text", "summary", "table_summary", "table_column", "image_ocr", "image_caption")
_REQUIRED = {"id": str, "knowledge_id": str, "chunk_index": int, "content": str, "chunk_type": str}
_OPTIONAL = {"knowledge_title": str, "start_at": int, "end_at": int, "parent_chunk_id": str, "matched_content": str}


def listing_path(data_dir: str | Path) -> Path | None:
    """The chunk listing ``<data_dir>/versions.yaml`` names (``chunks:``), or None when it names none.

    Raises :class:`ConfigError` when the key is not a file name or the file does not exist."""
    import yaml

    d = Path(data_dir)
    versions = d / "versions.yaml"
    if not versions.is_file():
        return None
    try:
        data = yaml.safe_load(versions.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(versions, f"not valid YAML: {exc}") from exc
    name = data.get(LISTING_KEY) if isinstance(data, dict) else None
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(versions, [Problem(str(versions), None, LISTING_KEY,
                                             f"must name a JSONL file of chunks, got {name!r}")])
    path = d / name
    if not path.is_file():
        raise ConfigError(versions, [Problem(str(versions), None, LISTING_KEY, f"no such file: {path}")])
    return path


def load_listing(path: str | Path) -> tuple[list[Chunk], dict[str, str]]:
    """The chunks of a listing file and the indexed texts it gives (``matched_content``, by chunk id).

    Raises :class:`InputError` naming every bad line and field at once."""
    p = Path(path)
    chunks: list[Chunk] = []
    texts: dict[str, str] = {}
    problems: list[Problem] = []
    seen: set[str] = set()
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        got = _chunk(line, str(p), n, seen)
        if isinstance(got, list):
            problems += got
            continue
        chunk, text = got
        seen.add(chunk.id)
        chunks.append(chunk)
        if text:
            texts[chunk.id] = text
    if not chunks and not problems:
        problems.append(Problem(str(p), None, None, "holds no chunk"))
    if problems:
        raise InputError(p, problems)
    return chunks, texts


def _chunk(line: str, where: str, n: int, seen: set[str]) -> tuple[Chunk, str] | list[Problem]:
    """One line as a chunk and its indexed text, or its problems."""
    try:
        rec = json.loads(line)
    except ValueError as exc:
        return [Problem(where, n, None, f"not JSON: {exc}")]
    if not isinstance(rec, dict):
        return [Problem(where, n, None, "must be a JSON object (one chunk)")]
    problems = []
    for name, kind in (*_REQUIRED.items(), *_OPTIONAL.items()):
        value = rec.get(name)
        if value is None and name in _OPTIONAL:
            continue
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is str and name in _REQUIRED
                                                                        and name != "content" and not value):
            what = "an integer" if kind is int else "a non-empty string" if name in _REQUIRED else "a string"
            problems.append(Problem(where, n, name, f"must be {what}, got {value!r}"))
    if problems:
        return problems
    if rec["chunk_type"] not in SEARCHABLE_TYPES:
        return [Problem(where, n, "chunk_type", f"{rec['chunk_type']!r} is not one of {', '.join(SEARCHABLE_TYPES)}")]
    if rec["id"] in seen:
        return [Problem(where, n, "id", f"chunk {rec['id']!r} is listed twice")]
    chunk = Chunk(id=rec["id"], knowledge_id=rec["knowledge_id"],
                  knowledge_title=rec.get("knowledge_title") or "", chunk_index=rec["chunk_index"],
                  content=rec["content"], heading_path=(), start_at=rec.get("start_at", 0),
                  end_at=rec.get("end_at", 0), chunk_type=rec["chunk_type"],
                  parent_chunk_id=rec.get("parent_chunk_id") or "")
    return chunk, rec.get("matched_content") or ""
