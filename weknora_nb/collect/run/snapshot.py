"""The knowledge base at the start and at the end of a collection, compared: the manifest's ``integrity``.

The method forbids changing content, index or ranking parameters during a test (docs/method.md section 1).
:func:`take_snapshot` lists the inventory and reads the tenant retrieval config (C57) and the knowledge
bases' configuration (C49) at one moment; :func:`integrity_entry` runs the API checks of
:mod:`weknora_nb.core.integrity_api` on the end snapshot and compares it with the start one: a change is a
``changed_during_run`` finding and a note for the reader of the figures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from weknora_nb.collect.http.client import WeKnoraClient
from weknora_nb.collect.run.inventory import Inventory, list_inventory
from weknora_nb.core.errors import RequestFailed
from weknora_nb.core.integrity import RUN_CHECKS, Finding
from weknora_nb.core.integrity_api import api_checks, checks_applied, inventory_changes, inventory_fingerprint

#: C49: the knowledge base fields that are configuration (counts change with content, which the fingerprint sees)
CONFIG_FIELDS = ("type", "chunking_config", "embedding_model_id", "summary_model_id", "indexing_strategy",
                 "faq_config", "vector_store_id")


@dataclass
class Snapshot:
    """The knowledge base at one moment: its ``inventory``, its ``fingerprint`` (None when a listing was not
    complete: nothing to compare), the tenant ``retrieval_config`` as stored (C57; ``{"error"}`` when it could
    not be read) and each knowledge base's configuration (:data:`CONFIG_FIELDS`)."""

    at: str
    inventory: Inventory
    fingerprint: str | None
    retrieval_config: dict[str, Any]
    knowledge_bases: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """What the manifest keeps of it (no chunk content): time, fingerprint, chunk count, configs."""
        return {"at": self.at, "fingerprint": self.fingerprint, "chunks": len(self.inventory.chunks),
                "complete": self.inventory.complete, "retrieval_config": self.retrieval_config,
                "knowledge_bases": self.knowledge_bases}


def kb_config(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration part of a knowledge base object (:data:`CONFIG_FIELDS`), or its ``error``."""
    if "error" in entry:
        return {"error": entry["error"]}
    return {k: entry[k] for k in CONFIG_FIELDS if k in entry}


async def take_snapshot(client: WeKnoraClient, kb_ids: list[str], *, server_version: str | None, in_flight: int = 8,
                        retrieval_config: dict[str, Any] | None = None,
                        knowledge_bases: Mapping[str, Mapping[str, Any]] | None = None) -> Snapshot:
    """List the inventory and read the configs now (the configs given are used instead: the start of a
    collection has just read them). A config that cannot be read is ``{"error"}``, never raised."""
    inventory = await list_inventory(client, kb_ids, server_version=server_version, in_flight=in_flight)
    if retrieval_config is None:
        retrieval_config = await _read(client.retrieval_config())
    if knowledge_bases is None:
        knowledge_bases = {kb: await _read(client.knowledge_base(kb)) for kb in kb_ids}
    fingerprint = inventory_fingerprint(inventory.chunks) if inventory.complete else None
    return Snapshot(_now(), inventory, fingerprint, retrieval_config,
                    {kb: kb_config(e) for kb, e in knowledge_bases.items()})


async def _read(call: Any) -> dict[str, Any]:
    try:
        return dict(await call)
    except RequestFailed as exc:
        return {"error": f"{exc.kind}: {exc}"}


def integrity_entry(start: Mapping[str, Any], end: Snapshot, *, labels: pd.DataFrame | None = None,
                    start_chunks: pd.DataFrame | None = None) -> tuple[dict[str, Any], list[str]]:
    """The manifest's ``integrity`` entry of a collection, and the notes a reader must see.

    ``start``: :meth:`Snapshot.to_json` of the start (kept from the first collection of a resumed run);
    ``end``: the end snapshot, whose inventory is checked (with ``labels``: the test set's); ``start_chunks``:
    the start inventory when this process took it (then a change names the chunks that changed).
    Entry: ``checks``, ``findings``, ``facts``, ``fingerprint`` {start, end}, ``content_changed``,
    ``retrieval_config_changed`` and ``knowledge_base_config_changed`` (True, False, or None when one side
    could not be read), ``snapshots`` {start, end}.
    """
    findings, facts = api_checks(end.inventory.chunks, end.inventory.knowledge, labels=labels,
                                 unavailable=end.inventory.unavailable)
    changed = _changes(start, end, start_chunks)
    findings += changed.findings
    notes = []
    if changed.findings:
        what = ", ".join(f.subject for f in changed.findings)
        notes.append(f"the knowledge base changed during the run ({what}): the method forbids changing content, "
                     "index or ranking parameters mid-test; the figures mix two states (see integrity)")
    entry = {"checks": [*checks_applied(labels=labels is not None), *RUN_CHECKS],
             "findings": [f.to_json() for f in findings], "facts": facts,
             "fingerprint": {"start": start.get("fingerprint"), "end": end.fingerprint},
             "content_changed": changed.content, "retrieval_config_changed": changed.retrieval_config,
             "knowledge_base_config_changed": changed.kb_config,
             "snapshots": {"start": dict(start), "end": end.to_json()}}
    return entry, notes


@dataclass
class _Changes:
    findings: list[Finding]
    content: bool | None
    retrieval_config: bool | None
    kb_config: bool | None


def _changes(start: Mapping[str, Any], end: Snapshot, start_chunks: pd.DataFrame | None) -> _Changes:
    """What differs between the start and the end: ``changed_during_run`` findings (content, retrieval config,
    each knowledge base's configuration) and whether each changed (None: not comparable)."""
    out: list[Finding] = []
    a, b = start.get("fingerprint"), end.fingerprint
    content = None if a is None or b is None else a != b
    if content:
        diff: dict[str, Any] = (inventory_changes(start_chunks, end.inventory.chunks) if start_chunks is not None else
                {"note": "which chunks changed is not known: the start was listed by an earlier collection"})
        tally: dict[str, int] = diff.get("counts") or {}  # absent without the start inventory
        counts = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in tally.items() if n)
        out.append(Finding("changed_during_run", "chunks", "the chunk inventory changed between the start and the "
                           f"end of the run{': ' + counts if counts else ''}", data={**diff, "start": a, "end": b}))
    rc_a, rc_b = start.get("retrieval_config") or {"error": "not recorded"}, end.retrieval_config
    retrieval = None if "error" in rc_a or "error" in rc_b else _canonical(rc_a) != _canonical(rc_b)
    if retrieval:
        keys = sorted(k for k in set(rc_a) | set(rc_b) if rc_a.get(k) != rc_b.get(k))
        out.append(Finding("changed_during_run", "retrieval_config", "the tenant retrieval config changed during "
                           f"the run (C57): {', '.join(keys)}", data={"keys": keys, "start": rc_a, "end": rc_b}))
    kb_changed: bool | None = False
    for kb, cfg in end.knowledge_bases.items():
        before = (start.get("knowledge_bases") or {}).get(kb)
        if before is None or "error" in before or "error" in cfg:
            kb_changed = None if kb_changed is False else kb_changed
            continue
        keys = sorted(k for k in set(before) | set(cfg) if _canonical(before.get(k)) != _canonical(cfg.get(k)))
        if keys:
            kb_changed = True
            out.append(Finding("changed_during_run", kb, f"knowledge base {kb}'s configuration changed during the "
                               f"run (C49): {', '.join(keys)}", knowledge_base_id=kb,
                               data={"keys": keys, "start": {k: before.get(k) for k in keys},
                                     "end": {k: cfg.get(k) for k in keys}}))
    return _Changes(out, content, retrieval, kb_changed)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
