"""The chat sessions a collection created, deleted at its end (docs/weknora-contract.md C58/C59).

WeKnora keeps every session forever and lists it in the tenant's history; each ``citations``
request runs in a session of its own (history would change the next answer, C66), so a run
creates one per chat attempt. :func:`delete_sessions` deletes them (``DELETE
/api/v1/sessions/{id}``, whose answer has no ``data``, C10) unless they are to be kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from weknora_nb.collect.http.client import WeKnoraClient
from weknora_nb.core.errors import RequestFailed

log = logging.getLogger(__name__)


async def delete_sessions(clients: Sequence[WeKnoraClient], *, keep: bool, in_flight: int = 8,
                          before: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Delete the sessions ``clients`` created (unless ``keep``); the manifest's ``sessions`` entry.

    ``{"created": n, "deleted": n, "kept": keep}`` (plus ``"failed": n`` when some deletions
    failed), counted over this collection and ``before`` (the entry of the run's earlier
    collections, when resumed). ``in_flight`` deletions run at a time; a failure is logged.
    """
    pairs = [(c, sid) for c in clients for sid in c.sessions]
    gate = asyncio.Semaphore(max(1, in_flight))

    async def delete(client: WeKnoraClient, sid: str) -> bool:
        async with gate:
            try:
                await client.delete_session(sid)
                return True
            except RequestFailed as exc:
                log.warning("session %s not deleted: %s", sid, exc)
                return False
    deleted = 0 if keep else sum(await asyncio.gather(*(delete(c, s) for c, s in pairs)))
    for c in clients:
        c.sessions.clear()
    prev = before or {}
    entry: dict[str, Any] = {"created": int(prev.get("created", 0)) + len(pairs),
                             "deleted": int(prev.get("deleted", 0)) + deleted, "kept": keep}
    failed = int(prev.get("failed", 0)) + (0 if keep else len(pairs) - deleted)
    if failed:
        entry["failed"] = failed
    if keep and pairs:
        log.info("%d chat session(s) kept (--keep-sessions)", len(pairs))
    return entry
