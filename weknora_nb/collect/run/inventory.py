"""The chunk inventory of a run (``chunks.parquet``): every chunk of every knowledge of the knowledge bases,
and the knowledge list (``knowledge.parquet``): every knowledge, those without chunks too, with its parse
status and how its chunk listing ended (the integrity checks, :mod:`weknora_nb.core.integrity_api`, need both).

Knowledge lists are paged by 1000 (C50: more is a 400), chunk listings by 100 (C52: the
server's cap), both until ``total``; chunk listings ask for every searchable chunk type and the
``parent_text`` chunks (C52/C54: without ``chunk_type`` only ``text`` chunks come back, so an FAQ
knowledge base would look empty; C101: parents come back only when asked for by name), so that the
family of a child is known. Pages are de-duplicated by chunk id and a listing whose distinct chunks
fall short of its ``total`` is read again from its first page, a bounded number of times (C101: the
server pages with OFFSET over ``ORDER BY chunk_index``, whose ties can repeat some rows and skip others:
every FAQ entry has index 0); one still short is recorded as incomplete (``incomplete``, and the
integrity check ``inventory_incomplete``), never silently. One row per chunk: ``chunk_id``,
``knowledge_base_id``, ``knowledge_id``, ``knowledge_title``, ``chunk_index``, ``chunk_type``,
``parent_chunk_id`` (a child's parent, C101), ``is_enabled`` (disabled chunks are listed, C52),
``index_status`` (v0.7.2+, C102: ``processing`` and ``failed`` chunks are not searchable; None before),
the knowledge's ``parse_status`` (C51) and ``content``.

Releases up to v0.6.3 return listed content HTML-escaped (C53); :func:`content_escaping`
decides from the server's version, or from the content when the version is unknown, and the
content is unescaped (what the server removed as XSS patterns cannot be restored).
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from weknora_nb.collect.http.client import Listing, WeKnoraClient
from weknora_nb.collect.run.preflight import server_release
from weknora_nb.core.errors import RequestFailed, writing
from weknora_nb.core.integrity_api import KNOWLEDGE_COLUMNS, unsearchable_chunks
from weknora_nb.core.results import write_results

log = logging.getLogger(__name__)

INVENTORY_COLUMNS = ["chunk_id", "knowledge_base_id", "knowledge_id", "knowledge_title", "chunk_index", "chunk_type",
                     "parent_chunk_id", "is_enabled", "index_status", "parse_status", "content"]
#: the knowledge list, written beside ``chunks.parquet``: every knowledge, those without chunks too
KNOWLEDGE_FILE = "knowledge.parquet"
#: Go's html.EscapeString: & < > ' "
_ENTITY = re.compile(r"&(?:lt|gt|amp|#39|#34);")
_RAW = re.compile(r"[<>\"']|&(?!(?:lt|gt|amp|#39|#34);)")


@dataclass
class Inventory:
    """What a listing of the knowledge bases found: ``chunks`` (:data:`INVENTORY_COLUMNS`), ``knowledge``
    (:data:`~weknora_nb.core.integrity_api.KNOWLEDGE_COLUMNS`: every knowledge, those without chunks too, and
    how its chunk listing ended), ``entry`` (the manifest's ``inventory`` entry, see :func:`take_inventory`)
    and ``unavailable`` (knowledge base id -> why its knowledge list could not be read)."""

    chunks: pd.DataFrame
    knowledge: pd.DataFrame
    entry: dict[str, Any]
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every knowledge list and every chunk listing was read to its total."""
        return not self.unavailable and bool((self.knowledge["listing"] == "ok").all())


async def take_inventory(client: WeKnoraClient, kb_ids: list[str], path: Path, *, server_version: str | None,
                         in_flight: int = 8) -> dict[str, Any]:
    """Write the chunk inventory to ``path`` (and the knowledge list beside it, :data:`KNOWLEDGE_FILE`);
    the manifest's ``inventory`` entry.

    ``{"chunks", "knowledge", "chunk_types": {type: n}, "disabled", "unsearchable", "content":
    <content_escaping>}`` (``unsearchable``: chunks search can never return, an ``index_status`` search drops
    or a ``parent_text`` chunk: :func:`~weknora_nb.core.integrity_api.unsearchable_chunks`), plus
    ``incomplete`` (knowledge id -> "listed n of total") and ``failed`` (knowledge id -> why) when some
    listing fell short, ``relisted`` (knowledge id -> passes) when a listing was read more than once;
    ``{"unavailable": ...}`` when a knowledge list cannot be read.
    ``in_flight`` chunk listings are requested at a time.
    """
    inventory = await list_inventory(client, kb_ids, server_version=server_version, in_flight=in_flight)
    await asyncio.to_thread(write_inventory, inventory, path)
    return inventory.entry


def write_inventory(inventory: Inventory, path: Path) -> None:
    """``chunks.parquet`` at ``path`` and ``knowledge.parquet`` beside it (atomic Parquet writes); nothing
    when a knowledge list could not be read. Blocking."""
    if inventory.unavailable:
        return
    for frame, where in ((inventory.chunks, path), (inventory.knowledge, path.with_name(KNOWLEDGE_FILE))):
        with writing(where):
            write_results(frame, where)  # any frame: an atomic Parquet write


async def list_inventory(client: WeKnoraClient, kb_ids: list[str], *, server_version: str | None,
                         in_flight: int = 8) -> Inventory:
    """List every knowledge and chunk of the knowledge bases (nothing is written): see :class:`Inventory`."""
    knowledge: list[tuple[str, dict[str, Any]]] = []
    lists: dict[str, Listing] = {}
    for kb in kb_ids:
        try:
            lists[kb] = await client.list_knowledge(kb)
        except RequestFailed as exc:
            why = f"{exc.kind}: {exc}"
            return Inventory(_frame([]), pd.DataFrame(columns=KNOWLEDGE_COLUMNS), {"unavailable": why}, {kb: why})
        knowledge += [(kb, k) for k in lists[kb].items]
    gate = asyncio.Semaphore(max(1, in_flight))

    async def chunks_of(k: dict[str, Any]) -> Listing | RequestFailed:
        async with gate:
            try:
                return await client.list_chunks(str(k["id"]))
            except RequestFailed as exc:
                return exc
    listings = await asyncio.gather(*(chunks_of(k) for _, k in knowledge))
    frame = _frame((kb, k, got) for (kb, k), got in zip(knowledge, listings, strict=True)
                   if isinstance(got, Listing))
    escaping = content_escaping(frame["content"].tolist(), server_version)
    if escaping["escaped"]:
        frame["content"] = [html.unescape(c) if isinstance(c, str) else c for c in frame["content"]]
    return Inventory(frame, _knowledge_frame(knowledge, listings), _entry(frame, knowledge, listings, lists, escaping))


def _entry(frame: pd.DataFrame, knowledge: list[tuple[str, dict[str, Any]]], listings: list[Listing | RequestFailed],
           lists: dict[str, Listing], escaping: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``inventory`` entry (see :func:`take_inventory`)."""
    entry: dict[str, Any] = {
        "chunks": len(frame), "knowledge": len(knowledge),
        "chunk_types": dict(Counter(frame["chunk_type"].tolist())), "disabled": int((~frame["is_enabled"]).sum()),
        "unsearchable": len(unsearchable_chunks(frame)), "content": escaping}
    relisted = {str(k["id"]): got.passes for (_, k), got in zip(knowledge, listings, strict=True)
                if isinstance(got, Listing) and got.passes > 1}
    incomplete = {str(k["id"]): f"listed {len(got.items)} of {got.total}" for (_, k), got in
                  zip(knowledge, listings, strict=True) if isinstance(got, Listing) and not got.complete}
    failed = {str(k["id"]): f"{got.kind}: {got}" for (_, k), got in zip(knowledge, listings, strict=True)
              if isinstance(got, RequestFailed)}
    short = {kb: f"listed {len(got.items)} of {got.total} knowledge" for kb, got in lists.items() if not got.complete}
    if relisted:
        entry["relisted"] = relisted
    if incomplete:
        entry["incomplete"] = incomplete
    if failed:
        entry["failed"] = failed
        log.warning("inventory: the chunks of %d knowledge could not be listed", len(failed))
    if short:
        entry["knowledge_lists_incomplete"] = short
    return entry


def _knowledge_frame(knowledge: list[tuple[str, dict[str, Any]]],
                     listings: list[Listing | RequestFailed]) -> pd.DataFrame:
    """One row per knowledge of :data:`KNOWLEDGE_COLUMNS`: its fields (C51) and how its chunk listing ended."""
    rows = []
    for (kb, k), got in zip(knowledge, listings, strict=True):
        listed = len(got.items) if isinstance(got, Listing) else None
        listing = "failed" if not isinstance(got, Listing) else "ok" if got.complete else "incomplete"
        rows.append({"knowledge_id": str(k.get("id")), "knowledge_base_id": kb, "knowledge_title": k.get("title"),
                     "parse_status": k.get("parse_status"), "enable_status": k.get("enable_status"),
                     "error_message": (k.get("error_message") or None) if isinstance(got, Listing)
                     else f"{got.kind}: {got}", "listing": listing, "listed": listed,
                     "total": got.total if isinstance(got, Listing) else None})
    frame = pd.DataFrame(rows, columns=KNOWLEDGE_COLUMNS)
    for col in ("listed", "total"):
        frame[col] = pd.array(frame[col], dtype="Int64")
    return frame


def _frame(listed: Iterable[tuple[str, dict[str, Any], Listing]]) -> pd.DataFrame:
    """One row per chunk of :data:`INVENTORY_COLUMNS` from (knowledge base id, knowledge, its chunk listing)."""
    rows = [{"chunk_id": str(c.get("id")), "knowledge_base_id": kb,
             "knowledge_id": str(c.get("knowledge_id") or k["id"]), "knowledge_title": k.get("title"),
             "chunk_index": c.get("chunk_index"), "chunk_type": str(c.get("chunk_type") or "text"),
             "parent_chunk_id": str(c["parent_chunk_id"]) if c.get("parent_chunk_id") else None,
             "is_enabled": bool(c.get("is_enabled", True)),
             "index_status": str(c["index_status"]) if c.get("index_status") else None,
             "parse_status": k.get("parse_status"), "content": c.get("content", "")}
            for kb, k, listing in listed for c in listing.items]
    frame = pd.DataFrame(rows, columns=INVENTORY_COLUMNS)
    frame["is_enabled"] = frame["is_enabled"].astype(bool)
    for col in ("parent_chunk_id", "index_status"):
        frame[col] = frame[col].astype("string")
    return frame


def content_escaping(contents: list[Any], server_version: str | None) -> dict[str, Any]:
    """Whether the listed content is HTML-escaped (C53), and how that was decided.

    A server version of 0.6.x says escaped, 0.7 or later raw. Without a version the content
    decides: escaped when some chunk holds an entity Go's ``html.EscapeString`` writes
    (``&lt;`` ``&gt;`` ``&amp;`` ``&#39;`` ``&#34;``) and none holds a raw ``<``, ``>``,
    ``"``, ``'`` or a bare ``&`` (escaping leaves none). ``unescaped`` says the inventory holds
    the content unescaped.
    """
    release = server_release(server_version)
    if release is not None:
        escaped = release < (0, 7)
        how = f"server version {server_version} (C53: v0.6.x escape listed content, v0.7.2 and later do not)"
    else:
        texts = [c for c in contents if isinstance(c, str)]
        escaped = any(_ENTITY.search(c) for c in texts) and not any(_RAW.search(c) for c in texts)
        how = ("the content: entities and no raw < > & ' \" (C53)" if escaped
               else "the content shows no HTML escaping (C53)")
    out: dict[str, Any] = {"escaped": escaped, "decided_by": how, "unescaped": escaped}
    if escaped:
        out["note"] = "unescaped by the collector; what the server removed as XSS patterns cannot be restored"
    return out
