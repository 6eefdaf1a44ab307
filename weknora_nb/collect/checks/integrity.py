"""``weknora-nb check``: the integrity checks of a knowledge base, over the API and, when a read-only DSN is
given, in its Postgres tables (docs/method.md section 1).

:func:`run_checks` runs the API checks of :mod:`weknora_nb.core.integrity_api` on a fresh listing (with a
test set: its labels too), then, with a DSN, :func:`~weknora_nb.collect.checks.database.check_database`
(psycopg is imported only then) and, with an embeddings endpoint too, the vector-store trace
(:mod:`weknora_nb.collect.checks.vectortrace`); the outcome is a :class:`CheckResult`. (The same API checks
run at the end of a collection: :mod:`weknora_nb.collect.run.snapshot`.)

The DSN is never written or shown: its password is masked in everything a result holds (:func:`scrub`), and
only :func:`~weknora_nb.collect.http.redact.redact_dsn` of it ever reaches a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weknora_nb.collect.http.client import ClientSettings, WeKnoraClient, server_address
from weknora_nb.collect.http.redact import MASK, redact_dsn
from weknora_nb.collect.http.retry import run_to_end
from weknora_nb.collect.run.inventory import list_inventory
from weknora_nb.collect.run.preflight import read_server
from weknora_nb.core.errors import AuthFailed, NotFound, UsageError, writing
from weknora_nb.core.integrity import DATABASE_CHECKS, PROBLEM, Finding, describe_findings, findings_from_json
from weknora_nb.core.integrity_api import api_checks, checks_applied, inventory_fingerprint
from weknora_nb.core.testset import TestSet, load_testset

log = logging.getLogger(__name__)


#: the environment variable ``check --dsn`` falls back to
DSN_ENV = "WEKNORA_NB_PG_DSN"


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

    @property
    def incomplete(self) -> dict[str, str]:
        """The database steps that could not run (step -> why: ``timeout``, or the error), and an API listing that
        fell short: a check that did not run is never reported as clean."""
        steps = ((self.facts.get("database") or {}).get("steps") or {}).items()
        out = {name: st.get("error") or st.get("status", "") for name, st in steps if st.get("status") != "ok"}
        if self.fingerprint is None and self.facts.get("api") is not None:
            out["listing"] = "the knowledge base's chunk listing fell short: its checks saw only part of it"
        return out

    def to_json(self) -> dict[str, Any]:
        """Everything as JSON (``check --json``, a run folder's ``check.json``)."""
        return {"target": self.target, "checks": self.checks, "problems": len(self.problems),
                "incomplete": self.incomplete, "findings": [f.to_json() for f in self.findings], "facts": self.facts,
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
            lines.append(f"  {kb}: {f['knowledge']} knowledge, {f['chunks']} chunks ({f['disabled']} disabled, "
                         f"{f.get('unsearchable', 0)} never searchable; types: {types})")
        labels = (self.facts.get("api") or {}).get("labels")
        if labels:
            lines.append(f"  labels: {labels['n']} ({labels['relevant']} relevant) on {labels['chunks']} chunks, "
                         f"{labels['in_inventory']} of them listed")
        lines.append(describe_findings(self.findings, checks=self.checks, first=first))
        if self.incomplete:
            lines.append(f"INCOMPLETE: {len(self.incomplete)} step(s) could not run, so the verdict is not clean: "
                         + "; ".join(f"{k} ({v})" for k, v in self.incomplete.items()))
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
    :class:`~weknora_nb.core.errors.TestSetError`); ``embeddings``: an ``embeddings.EmbeddingSettings`` (an
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
    """Add ``database.check_database``'s findings and facts (and with ``embeddings`` the vector-store trace's
    summary, the trace itself in ``result.trace``) to ``result``, every text with the DSN's password masked.
    A refused password or role is a :class:`UsageError` (as a refused API key is). Blocking."""
    from weknora_nb.collect.checks.database import check_database  # psycopg: only with a DSN
    from weknora_nb.collect.checks.vectortrace import trace_queries

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
