"""The integrity checks a knowledge base's API listing allows (docs/method.md section 1): pure, on frames.

Inputs:

- the chunk inventory (``chunks.parquet``, the columns of ``collect.run.inventory.INVENTORY_COLUMNS``:
  ``chunk_id``, ``knowledge_base_id``, ``knowledge_id``, ``knowledge_title``, ``chunk_index``,
  ``chunk_type``, ``parent_chunk_id``, ``is_enabled``, ``index_status``, ``parse_status``, ``content``;
  inventories of older collectors lack ``parent_chunk_id`` and ``index_status``);
- the knowledge list (``knowledge.parquet``, :data:`KNOWLEDGE_COLUMNS`): every knowledge, those
  without chunks too, with how its chunk listing ended (``listing``: ``ok``, ``incomplete``,
  ``failed``);
- optionally a test set's labels (``query_id``, ``chunk_id``, ``grade``).

Findings (:class:`~weknora_nb.core.integrity.Finding`, rules in :data:`~weknora_nb.core.integrity.CHECKS`):

- ``label_chunk_missing`` / ``label_chunk_disabled`` / ``label_chunk_failed_parse`` /
  ``label_chunk_unsearchable``: one finding per labelled chunk (subject: the chunk id), the queries that
  label it in ``data`` (``queries``: grade >= 1, ``grade_0_queries``: grade 0). A **problem** when some
  query labels it relevant (grade >= 1): that query's relevant chunk cannot be retrieved (or, parse
  failed, may be stale), so its figures fall for a reason that is not retrieval's. **Info** when only
  grade-0 labels point at it: a chunk judged irrelevant that cannot come back changes no metric.
  Unsearchable (:func:`unsearchable_chunks`): an ``index_status`` search drops (``processing``,
  ``failed``: C102), or a ``parent_text`` chunk (search returns its children, never it: C100/C102; only
  the as-shown scoring of knowledge-search and chat credits it, through a child).
- ``knowledge_failed_parse`` (parse status ``failed`` or ``cancelled``, C51) and ``knowledge_not_ready``
  (``pending``, ``processing``, ``finalizing``, ``deleting``: its chunks are changing) per knowledge;
  ``knowledge_without_chunks`` for a knowledge whose listing was complete, with no chunk of a searchable
  type, and whose parse status says nothing else (a failed or unfinished one is reported as such, once).
- ``duplicate_content``: chunks of one knowledge base whose content has the same SHA-256 (distinct chunk
  ids, empty content and ``parent_text`` chunks left out: a parent of one child holds that child's text); one
  finding per group, every chunk id in ``data["chunk_ids"]`` (and the
  labelled ones among them, ``labelled``, when labels are given): relevance split between copies.
- ``inventory_incomplete``: a knowledge list or a chunk listing that fell short of its total, or failed.

:func:`api_facts`: counts per knowledge base (knowledge, chunks, enabled, chunk types, parse statuses,
chunks per knowledge) and of the labels. :func:`inventory_fingerprint` hashes the inventory's content
(independent of listing order) so that a change during a run can be seen; :func:`inventory_changes`
names what changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from weknora_nb.core.integrity import API_CHECKS, INFO, LABEL_CHECKS, PROBLEM, Finding
from weknora_nb.core.weknora import UNSEARCHABLE_INDEX_STATUSES

#: the knowledge list's columns (one row per knowledge of the knowledge bases)
KNOWLEDGE_COLUMNS = ["knowledge_id", "knowledge_base_id", "knowledge_title", "parse_status", "enable_status",
                     "error_message", "listing", "listed", "total"]
#: C51 parse statuses: parsing did not complete / the chunks are still changing
FAILED_PARSE = ("failed", "cancelled")
NOT_READY = ("pending", "processing", "finalizing", "deleting")
#: at most this many query ids per label finding (``n_queries`` counts them all)
MAX_IDS = 200
#: C100/C101: the chunk type search never returns (the parents of a parent-child knowledge base)
PARENT_TEXT = "parent_text"


def unsearchable_chunks(chunks: pd.DataFrame) -> dict[str, str]:
    """Chunk id -> why search can never return it: its ``index_status`` is one search drops (C102), or it is a
    ``parent_text`` chunk (C100/C102). Disabled chunks have a check of their own. Columns an older inventory
    lacks are read as nothing to say."""
    out: dict[str, str] = {}
    if "index_status" in chunks.columns:
        status = chunks["index_status"].astype("string")
        for c, st in zip(chunks["chunk_id"].astype(str), status, strict=True):
            if isinstance(st, str) and st in UNSEARCHABLE_INDEX_STATUSES:
                out[c] = f"its index_status is {st} (search drops it, C102)"
    if "chunk_type" in chunks.columns:
        for c in chunks.loc[chunks["chunk_type"].astype("string") == PARENT_TEXT, "chunk_id"].astype(str):
            out.setdefault(c, "it is a parent_text chunk (search returns its children, never it, C100)")
    return out


def checks_applied(labels: bool) -> list[str]:
    """The API checks that run: all of :data:`API_CHECKS`, the label checks only with a test set."""
    return [c for c in API_CHECKS if labels or c not in LABEL_CHECKS]


def api_checks(chunks: pd.DataFrame, knowledge: pd.DataFrame | None = None, *, labels: pd.DataFrame | None = None,
               unavailable: Mapping[str, str] | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Every API finding and the facts (see the module docstring).

    ``knowledge`` None: rebuilt from the chunks (a knowledge without chunks is then unknown, and the
    listing assumed complete); ``unavailable``: knowledge base id -> why its knowledge list could not
    be read (its knowledge and chunks are missing from both frames).
    """
    if knowledge is None:
        knowledge = _knowledge_from_chunks(chunks)
    complete = not unavailable and bool((knowledge["listing"] == "ok").all())
    findings = [*label_findings(chunks, labels, complete=complete)] if labels is not None else []
    findings += knowledge_findings(knowledge)
    findings += duplicate_findings(chunks, labelled=None if labels is None else set(labels["chunk_id"].astype(str)))
    findings += listing_findings(knowledge, unavailable)
    return findings, api_facts(chunks, knowledge, labels)


# -- labels -------------------------------------------------------------------------------------------
def label_findings(chunks: pd.DataFrame, labels: pd.DataFrame, *, complete: bool = True) -> list[Finding]:
    """One finding per labelled chunk that is missing, disabled or of a knowledge whose parse failed.

    ``complete`` False (some listing fell short): a missing chunk may be among the unlisted; its
    detail says so.
    """
    known = chunks.drop_duplicates("chunk_id")
    known.index = pd.Index(known["chunk_id"].astype(str))
    lab = labels[["query_id", "chunk_id", "grade"]].astype({"query_id": str, "chunk_id": str})
    in_kb = lab["chunk_id"].isin(known.index)
    enabled = ~lab["chunk_id"].isin(known.index[~known["is_enabled"].astype(bool).to_numpy()])
    status = lab["chunk_id"].map(known["parse_status"])
    unsearchable = unsearchable_chunks(known)
    rules = [("label_chunk_missing", ~in_kb), ("label_chunk_disabled", in_kb & ~enabled),
             ("label_chunk_failed_parse", in_kb & status.isin(FAILED_PARSE)),
             ("label_chunk_unsearchable", in_kb & lab["chunk_id"].isin(list(unsearchable)))]
    out: list[Finding] = []
    for check, mask in rules:
        for chunk_id, group in lab[mask].groupby("chunk_id", sort=True):
            row = known.loc[chunk_id] if chunk_id in known.index else None
            out.append(_label_finding(check, str(chunk_id), group, row, complete, unsearchable.get(str(chunk_id))))
    return out


def _label_finding(check: str, chunk_id: str, group: pd.DataFrame, row: pd.Series | None,
                   complete: bool, why: str | None = None) -> Finding:
    """The finding of one labelled chunk: a problem when some label is relevant (grade >= 1), else info
    (``why``: why an unsearchable chunk is one)."""
    positive = group.loc[group["grade"] > 0, "query_id"].drop_duplicates().tolist()
    zero = group.loc[group["grade"] <= 0, "query_id"].drop_duplicates().tolist()
    unlisted = "" if complete else " (the listing is incomplete: it may be unlisted)"
    what = {"label_chunk_missing": "is not in the knowledge base" + unlisted,
            "label_chunk_disabled": "is disabled",
            "label_chunk_failed_parse": f"belongs to knowledge {_value(row, 'knowledge_id')} whose parse status is "
                                        f"{_value(row, 'parse_status')}",
            "label_chunk_unsearchable": f"cannot be returned by search: {why}"}[check]
    whose = (f"labelled relevant by {len(positive)} query(ies), e.g. {', '.join(positive[:3])}" if positive else
             f"labelled irrelevant (grade 0) only, by {len(zero)} query(ies): no metric changes")
    data: dict[str, Any] = {"queries": positive[:MAX_IDS], "grade_0_queries": zero[:MAX_IDS],
                            "n_queries": len(positive) + len(zero)}
    if row is not None:
        data.update(knowledge_id=_value(row, "knowledge_id"), knowledge_title=_value(row, "knowledge_title"))
    if why is not None:
        data.update(reason=why, chunk_type=_value(row, "chunk_type"), index_status=_value(row, "index_status"))
    return Finding(check, chunk_id, f"chunk {chunk_id} {what}; {whose}", PROBLEM if positive else INFO,
                   None if row is None else _value(row, "knowledge_base_id"), data)


def _value(row: pd.Series | None, key: str) -> Any:
    """``row[key]`` as a JSON value (None for a missing row or value)."""
    if row is None or key not in row.index:
        return None
    v = row[key]
    return None if v is None or (isinstance(v, float) and v != v) else (str(v) if not isinstance(v, bool) else v)


# -- knowledge ----------------------------------------------------------------------------------------
def knowledge_findings(knowledge: pd.DataFrame) -> list[Finding]:
    """``knowledge_failed_parse``, ``knowledge_not_ready`` and ``knowledge_without_chunks``, one per knowledge."""
    out = []
    for k in knowledge.itertuples(index=False):
        kid, kb, status, title = str(k.knowledge_id), _text(k.knowledge_base_id), _text(k.parse_status), \
            _text(k.knowledge_title)
        data = {"title": title, "parse_status": status, "chunks": _int(k.listed)}
        name = f"knowledge {kid}" + (f" ({title})" if title else "")
        if status in FAILED_PARSE:
            why = f": {k.error_message}" if _text(k.error_message) else ""
            out.append(Finding("knowledge_failed_parse", kid, f"{name}: parse status {status}{why}; "
                               f"{_int(k.listed)} chunk(s) listed", PROBLEM, kb,
                               {**data, "error_message": _text(k.error_message)}))
        elif status in NOT_READY:
            out.append(Finding("knowledge_not_ready", kid, f"{name}: parse status {status}: its chunks may change "
                               "while the knowledge base is measured", PROBLEM, kb, data))
        elif k.listing == "ok" and _int(k.listed) == 0:
            out.append(Finding("knowledge_without_chunks", kid, f"{name} has no chunk of a searchable type "
                               f"(parse status {status or 'unknown'})", PROBLEM, kb, data))
    return out


def listing_findings(knowledge: pd.DataFrame, unavailable: Mapping[str, str] | None = None) -> list[Finding]:
    """``inventory_incomplete``: a knowledge base whose knowledge list could not be read, or a knowledge whose
    chunk listing fell short of the server's total (``incomplete``) or failed."""
    out = [Finding("inventory_incomplete", str(kb), f"the knowledge list of knowledge base {kb} could not be read "
                   f"({why}): none of its chunks was checked", PROBLEM, str(kb), {"reason": why})
           for kb, why in (unavailable or {}).items()]
    for k in knowledge[knowledge["listing"] != "ok"].itertuples(index=False):
        kid = str(k.knowledge_id)
        how = (f"listed {_int(k.listed)} of {_int(k.total)} chunks" if k.listing == "incomplete"
               else f"its chunks could not be listed ({_text(k.error_message) or 'failed'})")
        out.append(Finding("inventory_incomplete", kid, f"knowledge {kid}: {how}", PROBLEM,
                           _text(k.knowledge_base_id), {"listing": str(k.listing), "listed": _int(k.listed),
                                                        "total": _int(k.total)}))
    return out


def _knowledge_from_chunks(chunks: pd.DataFrame) -> pd.DataFrame:
    """A knowledge list from the chunks alone (each knowledge with its chunk count, listing assumed ok)."""
    g = chunks.groupby("knowledge_id", sort=False, dropna=False)
    firsts = g.first()
    return pd.DataFrame({"knowledge_id": firsts.index.astype(str),
                         "knowledge_base_id": firsts["knowledge_base_id"].values,
                         "knowledge_title": firsts["knowledge_title"].values,
                         "parse_status": firsts["parse_status"].values, "enable_status": None, "error_message": None,
                         "listing": "ok", "listed": g.size().values, "total": g.size().values},
                        columns=KNOWLEDGE_COLUMNS)


# -- duplicates ---------------------------------------------------------------------------------------
def duplicate_findings(chunks: pd.DataFrame, *, labelled: set[str] | None = None) -> list[Finding]:
    """One ``duplicate_content`` finding per group of distinct chunks of one knowledge base with the same content
    (SHA-256 of its UTF-8; empty or blank content is left out)."""
    text = chunks["content"].map(lambda c: c if isinstance(c, str) else "")
    keep = text.str.strip() != ""
    if "chunk_type" in chunks.columns:
        keep &= (chunks["chunk_type"].astype("string") != PARENT_TEXT).fillna(True)
    frame = chunks.loc[keep, ["chunk_id", "knowledge_base_id", "knowledge_id"]].astype(str).assign(
        sha=text[keep].map(_sha256))
    frame = frame.drop_duplicates(["knowledge_base_id", "chunk_id"])
    groups = frame[frame.duplicated(["knowledge_base_id", "sha"], keep=False)]
    out = []
    for (kb, sha), g in groups.groupby(["knowledge_base_id", "sha"], sort=True):
        ids = sorted(g["chunk_id"])
        preview = text[keep][chunks.loc[keep, "chunk_id"].astype(str) == ids[0]].iloc[0][:60]
        data: dict[str, Any] = {"chunk_ids": ids, "knowledge_ids": sorted(set(g["knowledge_id"])),
                                "content_sha256": sha, "content_preview": preview}
        where = f"{len(data['knowledge_ids'])} knowledge" if len(data["knowledge_ids"]) > 1 else "one knowledge"
        detail = f"{len(ids)} chunks with identical content in {where}: {', '.join(ids[:4])}"
        if labelled is not None:
            data["labelled"] = [c for c in ids if c in labelled]
            detail += f"; labelled: {', '.join(data['labelled']) or 'none'}"
        out.append(Finding("duplicate_content", ids[0], detail, PROBLEM, str(kb), data))
    return out


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- facts --------------------------------------------------------------------------------------------
def api_facts(chunks: pd.DataFrame, knowledge: pd.DataFrame, labels: pd.DataFrame | None = None) -> dict[str, Any]:
    """Counts per knowledge base: ``knowledge``, ``chunks``, ``enabled``, ``disabled``, ``unsearchable`` (parents and
    chunks whose index_status search drops, :func:`unsearchable_chunks`), ``chunk_types``
    {type: n}, ``parse_status`` {status: knowledge}, ``chunks_per_knowledge`` {min, median, max} and
    ``per_knowledge`` [{knowledge_id, title, chunks, chunk_types}]; with labels, ``labels`` {n, relevant,
    chunks, in_inventory} (``relevant``: labels of grade >= 1)."""
    kbs = {kb: _kb_facts(chunks[chunks["knowledge_base_id"].astype(str) == kb],
                         knowledge[knowledge["knowledge_base_id"].astype(str) == kb])
           for kb in sorted(set(knowledge["knowledge_base_id"].dropna().astype(str)) |
                            set(chunks["knowledge_base_id"].dropna().astype(str)))}
    facts: dict[str, Any] = {"knowledge_bases": kbs}
    if labels is not None:
        ids = set(chunks["chunk_id"].astype(str))
        facts["labels"] = {"n": int(len(labels)), "relevant": int((labels["grade"] > 0).sum()),
                           "chunks": int(labels["chunk_id"].nunique()),
                           "in_inventory": int(labels["chunk_id"].astype(str).drop_duplicates().isin(ids).sum())}
    return facts


def _kb_facts(mine: pd.DataFrame, ks: pd.DataFrame) -> dict[str, Any]:
    """The facts of one knowledge base from its chunks (``mine``) and its knowledge (``ks``)."""
    types = mine.astype({"knowledge_id": str}).groupby(["knowledge_id", "chunk_type"], sort=True).size()
    per_type: dict[str, dict[str, int]] = {}
    for (kid, t), n in types.items():
        per_type.setdefault(str(kid), {})[str(t)] = int(n)
    ids = list(dict.fromkeys([*ks["knowledge_id"].astype(str), *per_type]))
    counts = pd.Series([sum(per_type.get(k, {}).values()) for k in ids], dtype="int64")
    titles = dict(zip(ks["knowledge_id"].astype(str), ks["knowledge_title"], strict=True))
    return {
        "knowledge": len(ids), "chunks": int(len(mine)), "enabled": int(mine["is_enabled"].astype(bool).sum()),
        "disabled": int((~mine["is_enabled"].astype(bool)).sum()), "unsearchable": len(unsearchable_chunks(mine)),
        "chunk_types": {str(t): int(n) for t, n in mine["chunk_type"].value_counts().sort_index().items()},
        "parse_status": {str(s): int(n) for s, n in ks["parse_status"].fillna("unknown").value_counts()
                         .sort_index().items()},
        "chunks_per_knowledge": ({"min": int(counts.min()), "median": float(counts.median()), "max": int(counts.max())}
                                 if len(counts) else None),
        "per_knowledge": [{"knowledge_id": k, "title": _text(titles.get(k)), "chunks": int(n),
                           "chunk_types": per_type.get(k, {})} for k, n in zip(ids, counts, strict=True)]}


# -- the fingerprint ----------------------------------------------------------------------------------
def inventory_fingerprint(frame: pd.DataFrame) -> str:
    """``sha256:<hex>`` over the inventory's rows, sorted: chunk_id, is_enabled, parse_status, content, and
    (when the inventory has them) index_status, chunk_type, parent_chunk_id.

    The listing's order (pages, passes, ties) does not change it; any change of a chunk's content,
    enabled flag, index status, type or parent, or of its knowledge's parse status, or a chunk added
    or removed, does. Each field is length-prefixed (no two inventories share a byte stream) and a
    missing value is told from an empty one.
    """
    rows = sorted(_fields(frame))
    h = hashlib.sha256()
    for row in rows:
        for tag, text in row:
            b = text.encode("utf-8", "surrogatepass")
            h.update(bytes([tag]) + len(b).to_bytes(8, "little") + b)
    return "sha256:" + h.hexdigest()


#: the fields an inventory of this collector adds to the fingerprint (an older inventory's fingerprint lacks them)
_MORE_FIELDS = ("index_status", "chunk_type", "parent_chunk_id")


def _fields(frame: pd.DataFrame) -> Iterable[tuple[tuple[int, str], ...]]:
    """Each row's fields as (tag, text): tag 0 for a missing value, 1 for a present one."""
    cols = [frame[c].tolist() for c in ("chunk_id", "is_enabled", "parse_status", "content")]
    more = [frame[c].tolist() for c in _MORE_FIELDS] if all(c in frame.columns for c in _MORE_FIELDS) else []
    for i, (cid, enabled, status, content) in enumerate(zip(*cols, strict=True)):
        yield (_tagged(cid), (1, "1" if bool(enabled) else "0"), _tagged(status), _tagged(content),
               *(_tagged(m[i]) for m in more))


def _tagged(v: Any) -> tuple[int, str]:
    return (0, "") if v is None or (isinstance(v, float) and v != v) else (1, str(v))


def inventory_changes(before: pd.DataFrame, after: pd.DataFrame, *, first: int = 20) -> dict[str, Any]:
    """What changed from ``before`` to ``after`` (two inventories): chunk ids ``added``, ``removed``,
    ``content_changed``, ``enabled_changed``, ``parse_status_changed``, ``index_status_changed`` (the first
    ``first`` of each, sorted) and ``counts`` of each."""
    def keyed(f: pd.DataFrame) -> pd.DataFrame:
        f = f.drop_duplicates("chunk_id").astype({"chunk_id": str})
        if "index_status" not in f.columns:
            f = f.assign(index_status=None)
        return f.set_index("chunk_id")[["is_enabled", "parse_status", "content", "index_status"]]
    a, b = keyed(before), keyed(after)
    both = a.index.intersection(b.index)
    aa, bb = a.loc[both], b.loc[both]

    def differs(col: str) -> list[str]:
        x, y = aa[col].map(_tagged), bb[col].map(_tagged)
        return sorted(both[(x != y).to_numpy()])
    changes = {"added": sorted(b.index.difference(a.index)), "removed": sorted(a.index.difference(b.index)),
               "content_changed": differs("content"), "enabled_changed": differs("is_enabled"),
               "parse_status_changed": differs("parse_status"), "index_status_changed": differs("index_status")}
    return {**{k: v[:first] for k, v in changes.items()}, "counts": {k: len(v) for k, v in changes.items()}}


def _text(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and v != v) else str(v)


def _int(v: Any) -> int | None:
    try:
        return None if v is None or pd.isna(v) else int(v)
    except (TypeError, ValueError):
        return None
