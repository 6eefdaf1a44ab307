"""Integrity checks of a knowledge base before (and while) it is measured: orchestration over the API and,
when a read-only DSN is given, the Postgres tables (docs/method.md section 1).

- :func:`run_checks` (``weknora-nb check``): the API checks of :mod:`weknora_nb.core.integrity_api` on a
  fresh listing (with a test set: its labels too), then, with a DSN, ``weknora_nb.collect.pgcheck``'s
  :func:`check_database` (imported only then); a :class:`CheckResult`.
- For ``collect``: :func:`take_snapshot` lists the inventory and reads the retrieval config (C57) and the
  knowledge bases' configuration (C49) at one moment; :func:`integrity_entry` checks the end snapshot and
  compares it with the start one (the method forbids changing content, index or ranking parameters during
  a test): the manifest's ``integrity`` entry.

The DSN is never written or shown: its password is masked in everything a result holds
(:func:`scrub`), and only :func:`~weknora_nb.collect.redact.redact_dsn` of it ever reaches a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from weknora_nb.collect.client import ClientSettings, WeKnoraClient, server_address
from weknora_nb.collect.inventory import Inventory, list_inventory
from weknora_nb.collect.preflight import read_server
from weknora_nb.collect.redact import MASK, redact_dsn
from weknora_nb.collect.retry import run_to_end
from weknora_nb.core.errors import AuthFailed, NotFound, RequestFailed, UsageError, writing
from weknora_nb.core.integrity import (
    DATABASE_CHECKS,
    PROBLEM,
    RUN_CHECKS,
    Finding,
    describe_findings,
    findings_from_json,
)
from weknora_nb.core.integrity_api import api_checks, checks_applied, inventory_changes, inventory_fingerprint
from weknora_nb.core.testset import TestSet, load_testset

__all__ = ["CheckResult", "run_checks", "run_checks_async", "Snapshot", "take_snapshot", "integrity_entry",
           "kb_config", "scrub", "DSN_ENV", "CONFIG_FIELDS"]

log = logging.getLogger(__name__)

#: the environment variable ``check --dsn`` falls back to
DSN_ENV = "WEKNORA_NB_PG_DSN"
#: C49: the knowledge base fields that are configuration (counts change with content, which the fingerprint sees)
CONFIG_FIELDS = ("type", "chunking_config", "embedding_model_id", "summary_model_id", "indexing_strategy",
                 "faq_config", "vector_store_id")


# -- check: the command ---------------------------------------------------------------------------------
@dataclass
class CheckResult:
    """The outcome of :func:`run_checks`: what was checked (``target``: base URL without secrets, knowledge
    bases, whether a database and a test set were used), the ``checks`` applied, the ``findings``, the
    ``facts`` (``api``, and ``database`` with a DSN) and the inventory's ``fingerprint``."""

    target: dict[str, Any]
    checks: list[str]
    findings: list[Finding]
    facts: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None
    #: the vector-store trace (``vectortrace.VectorTrace``: per query and chunk), when one ran
    trace: Any = None

    @property
    def problems(self) -> list[Finding]:
        """The findings that fail the check (severity ``problem``)."""
        return [f for f in self.findings if f.severity == PROBLEM]

    def to_json(self) -> dict[str, Any]:
        """Everything as JSON (``check --json``, a run folder's ``check.json``)."""
        return {"target": self.target, "checks": self.checks, "problems": len(self.problems),
                "findings": [f.to_json() for f in self.findings], "facts": self.facts,
                "fingerprint": self.fingerprint}

    def write(self, folder: str | Path) -> list[Path]:
        """``check.json`` (:meth:`to_json`) and, when a trace ran, its files, into ``folder`` (e.g. the run folder,
        whose reports then show them); the paths written. The DSN is in none of them (:func:`scrub`)."""
        from weknora_nb.core.files import atomic_path
        from weknora_nb.core.run import CHECK

        folder = Path(folder)
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / CHECK
        with writing(path), atomic_path(path) as tmp:
            tmp.write_text(json.dumps(self.to_json(), ensure_ascii=False, indent=2), encoding="utf-8")
        return [path, *(self.trace.write(folder).values() if self.trace is not None else [])]

    def describe(self, first: int = 5) -> str:
        """A readable report: the target, findings grouped by check (counts, first ``first`` subjects), facts."""
        t = self.target
        lines = [f"checked {', '.join(t['knowledge_base_ids'])} on {t['base_url']}"
                 + (" and its database" if t.get("database") else "")
                 + (f" against test set {t['testset']}" if t.get("testset") else " (no test set: labels not checked)")]
        for kb, f in ((self.facts.get("api") or {}).get("knowledge_bases") or {}).items():
            types = ", ".join(f"{k} {v}" for k, v in f["chunk_types"].items()) or "none"
            lines.append(f"  {kb}: {f['knowledge']} knowledge, {f['chunks']} chunks ({f['disabled']} disabled; "
                         f"types: {types})")
        labels = (self.facts.get("api") or {}).get("labels")
        if labels:
            lines.append(f"  labels: {labels['n']} ({labels['relevant']} relevant) on {labels['chunks']} chunks, "
                         f"{labels['in_inventory']} of them listed")
        lines.append(describe_findings(self.findings, checks=self.checks, first=first))
        return "\n".join(lines)


def run_checks(settings: ClientSettings, kb_ids: list[str] | str, *, testset: TestSet | str | Path | None = None,
               dsn: str | None = None, embeddings: Any = None, progress: bool | None = None) -> CheckResult:
    """Synchronous :func:`run_checks_async` (also where an event loop already runs, e.g. Jupyter)."""
    return run_to_end(lambda: run_checks_async(settings, kb_ids, testset=testset, dsn=dsn, embeddings=embeddings,
                                               progress=progress), name="weknora-nb-check")


async def run_checks_async(settings: ClientSettings, kb_ids: list[str] | str, *,
                           testset: TestSet | str | Path | None = None, dsn: str | None = None,
                           embeddings: Any = None, progress: bool | None = None) -> CheckResult:
    """The API checks on a fresh listing of ``kb_ids``, then with ``dsn`` the database checks.

    ``testset``: a TestSet or a path (its labels are checked; an unreadable file is a
    :class:`~weknora_nb.core.errors.TestSetError`); ``embeddings``: a ``vectortrace.EmbeddingSettings`` (an
    OpenAI-compatible endpoint serving the knowledge base's model): with ``dsn`` and ``testset``, the test set's
    queries are traced into the vector store (``vectortrace.trace_queries``; its summary in ``facts["trace"]``;
    ``progress``: its bar, None: when there are more than 50 queries).
    Raises :class:`UsageError` for a knowledge base the server does not have or a key it refuses (as ``collect``
    does), a refused database password or role, or a database step that is not available;
    :class:`RequestFailed` when the server or the database cannot be reached.
    """
    ids = [kb_ids] if isinstance(kb_ids, str) else list(kb_ids)
    if not ids or not all(isinstance(k, str) and k for k in ids):
        raise UsageError(argument="--kb-id", allowed="one or more non-empty knowledge base ids", got=kb_ids)
    if embeddings is not None and not dsn:
        raise UsageError("the vector-store trace needs a database: give --dsn (or $WEKNORA_NB_PG_DSN)")
    ts = testset if isinstance(testset, TestSet) or testset is None else await asyncio.to_thread(load_testset, testset)
    async with WeKnoraClient(settings) as client:
        try:
            facts = await read_server(client, ids)
        except (AuthFailed, NotFound) as exc:
            raise UsageError(str(exc)) from None
        inventory = await list_inventory(client, ids, server_version=facts.version)
    findings, api = api_checks(inventory.chunks, inventory.knowledge, labels=None if ts is None else ts.qrels,
                               unavailable=inventory.unavailable)
    checks = checks_applied(labels=ts is not None)
    result = CheckResult({"base_url": server_address(settings.base_url), "knowledge_base_ids": ids,
                          "database": bool(dsn), "testset": None if ts is None else ts.source},
                         checks, findings, {"api": api},
                         inventory_fingerprint(inventory.chunks) if inventory.complete else None)
    if dsn:
        await asyncio.to_thread(_database_checks, result, dsn, ids, ts, embeddings, progress)
    return result


def _database_checks(result: CheckResult, dsn: str, kb_ids: list[str], testset: TestSet | None,
                     embeddings: Any, progress: bool | None = None) -> None:
    """Add ``pgcheck.check_database``'s findings and facts (and with ``embeddings`` the vector-store trace's
    summary, the trace itself in ``result.trace``) to ``result``, every text with the DSN's password masked.
    A refused password or role is a :class:`UsageError` (as a refused API key is). Blocking."""
    from weknora_nb.collect.pgcheck import check_database  # psycopg: only with a DSN
    from weknora_nb.collect.vectortrace import trace_queries

    if embeddings is not None and testset is None:
        raise UsageError("the vector-store trace needs a test set: give --testset")
    try:
        got = check_database(dsn, kb_ids)
        if embeddings is not None:
            trace = trace_queries(dsn, kb_ids, testset, embeddings, progress=progress)
            result.trace = trace
            result.facts["trace"] = scrub(trace.summary, dsn)
    except AuthFailed as exc:
        raise UsageError(scrub(str(exc), dsn)) from None
    got = scrub(got, dsn)
    result.findings += findings_from_json(got.get("findings"))
    result.checks += [c for c in got.get("checks") or DATABASE_CHECKS if c not in result.checks]
    result.facts["database"] = got.get("facts") or {}
    log.info("database checks done on %s", redact_dsn(dsn))


def scrub(obj: Any, dsn: str | None) -> Any:
    """``obj`` (JSON-like) with the DSN's password replaced by ``***`` in every string, keys included."""
    secret = _password(dsn) if dsn else None
    if not secret:
        return obj

    def walk(x: Any) -> Any:
        if isinstance(x, str):
            return x.replace(secret, MASK)
        if isinstance(x, dict):
            return {walk(k): walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x
    return walk(obj)


def _password(dsn: str) -> str | None:
    """The password a libpq connection string (key=value or URI) carries, None when it has none."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # no psycopg: the database step cannot run either
        return None
    try:
        value = conninfo_to_dict(dsn).get("password")
    except Exception:  # a malformed DSN: the database step names the problem (redacted)
        return None
    return str(value) if value else None


# -- collect: snapshots at the start and at the end ----------------------------------------------------
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
