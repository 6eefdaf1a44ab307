"""What a collection found out about the server and its answers, into the run's manifest, each with the note a
reader of the figures must see.

- :func:`record_findings`: hybrid-search's method (C15), the inline citations of chat stages (C65), HTML-escaped
  inventory content (C53), the requests' flags (:mod:`.flags`: ``flags`` per stage, a note per flag, the Redis
  rebuild of references said once, C106) and the chats whose server skipped retrieval (C104).
- :func:`shown_families`: the parent-child families ``shown_chunk_ids`` are made from (the start inventory,
  else the end one), and which one the manifest says (``shown_chunks``).
- :func:`record_inventory_counts`: each knowledge base's chunk and knowledge counts, from the inventory: the KB
  object's ``chunk_count`` is 0 for document knowledge bases and ``knowledge_count`` 0 for FAQ ones (C101).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from weknora_nb.collect.http.client import WeKnoraClient
from weknora_nb.collect.run.arguments import Arguments
from weknora_nb.collect.run.flags import REFERENCES_REBUILT, VECTOR_PATH_MISSING
from weknora_nb.collect.run.folder import RunFolder
from weknora_nb.collect.run.results import flag_counts
from weknora_nb.collect.run.shown import PARENT, Families
from weknora_nb.core.results import SKIPPED


def record_findings(run: RunFolder, args: Arguments, lanes: list[WeKnoraClient]) -> None:
    """What the run found out, into the manifest (see the module docstring)."""
    stages, notes = run.manifest["stages"], run.manifest.setdefault("notes", [])
    method = next((c.hybrid_method for c in lanes if c.hybrid_method), None)
    for s in args.stages:
        if s.endpoint == "hybrid-search" and method:
            stages[s.name]["method"] = method
        if s.endpoint == "chat":
            mine = [r for (_, name, _), r in run.done.items() if name == s.name]
            answers = [r for r in mine if r["status"] == "ok"]
            with_citations = sum(1 for r in answers if r.get("citations"))
            stages[s.name]["inline_citations"] = {"answers": len(answers), "with_citations": with_citations}
            if answers and not with_citations:
                notes.append(f"stage {s.name}: no inline citations in any answer (WeKnora writes them from v0.7.2, "
                             "C65); its figures rest on the references event")
            skipped = sum(r["status"] == SKIPPED for r in mine)
            if skipped:
                notes.append(f"stage {s.name}: {skipped} chat(s) skipped retrieval (the server's intent step took "
                             "the query for a greeting or chit-chat, C104): status skipped, neither scored nor "
                             "failed")
    if any(d.get("method") == "GET" for d in stages.values()):
        notes.append("hybrid-search is routed for GET only on this server (WeKnora v0.6.2, C15): sent by GET")
    content = (run.manifest.get("inventory") or {}).get("content") or {}
    if content.get("escaped"):
        notes.append("the chunk listing returned HTML-escaped content (WeKnora up to v0.6.3, C53): the inventory "
                     "holds it unescaped")
    _record_flags(run, args)


def _record_flags(run: RunFolder, args: Arguments) -> None:
    """``flags`` (stage -> flag -> requests) into the manifest, and a note per flag found (the Redis rebuild once)."""
    counts = flag_counts(run.done, args.stages)
    run.manifest["flags"] = counts
    notes = run.manifest.setdefault("notes", [])
    missing = {s: c[VECTOR_PATH_MISSING] for s, c in counts.items() if c.get(VECTOR_PATH_MISSING)}
    if missing:
        where = ", ".join(f"{s} {n}" for s, n in missing.items())
        notes.append(f"{VECTOR_PATH_MISSING} (a heuristic), requests per stage: {where}: every hit came from the "
                     "keyword path, as when the query's embedding fails and WeKnora drops the vector path without "
                     "saying so (C34); the figures of those requests are the keyword path's")
    rebuilt = {s: c[REFERENCES_REBUILT] for s, c in counts.items() if c.get(REFERENCES_REBUILT)}
    if rebuilt:
        where = ", ".join(f"{s} {n}" for s, n in rebuilt.items())
        notes.append(f"chat references were rebuilt by the server's Redis stream manager (C106; {REFERENCES_REBUILT}, "
                     f"a heuristic; requests per stage: {where}): match_type, sub_chunk_id and metadata are lost, so "
                     "keep_match_types was not applied to them and the chunks a reference shows are known only "
                     "through its parent_chunk_id")


def shown_families(run: RunFolder, start: pd.DataFrame | None, end: pd.DataFrame | None) -> Families:
    """The families of the start inventory (else the end one) for ``shown_chunk_ids``; the manifest's
    ``shown_chunks`` says which, and a note when there is none."""
    chosen, source = (start, "start inventory") if start is not None else (end, "end inventory")
    families = Families.of(chosen)
    if not families.known:
        run.manifest["shown_chunks"] = {"families_from": None}
        run.manifest.setdefault("notes", []).append(
            "no chunk inventory: a child shown with its parent's content credits its parent id, not its siblings "
            "(docs/method.md section 14)")
        return families
    parents = sum(1 for t in families.type_of.values() if t == PARENT)
    run.manifest["shown_chunks"] = {"families_from": source, "parents": parents}
    return families


def record_inventory_counts(run: RunFolder, chunks: pd.DataFrame | None) -> None:
    """Each knowledge base's ``chunk_count`` (searchable chunks listed), ``parent_chunk_count`` and
    ``knowledge_count`` from the inventory, in the manifest's ``knowledge_bases`` (C101: the server's counts are
    each filled for one type of knowledge base only); nothing without an inventory."""
    kbs: dict[str, Any] = run.manifest.get("knowledge_bases") or {}
    if chunks is None:
        return
    for kb, entry in kbs.items():
        if "error" in entry:
            continue
        mine = chunks[chunks["knowledge_base_id"].astype(str) == kb]
        parent = mine["chunk_type"].astype(str) == PARENT
        entry.update(chunk_count=int((~parent).sum()), parent_chunk_count=int(parent.sum()),
                     knowledge_count=int(mine["knowledge_id"].nunique()), counts_from="chunk inventory")
