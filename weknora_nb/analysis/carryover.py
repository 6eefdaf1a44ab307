"""Labels that survive re-chunking: map each labelled old chunk to the new chunks that hold its text.

When a knowledge base is chunked again (another chunk size, another splitter), chunk ids no
longer name the same text, and often the same id names other text. A label is about text, so
the mapping is made by content, never by id, and only inside one knowledge (document):

1. **text**: NFKC-normalised, case-folded, every run of whitespace one space; cut into
   character n-grams (``n`` = 3 for text that is at least 30 % CJK, else 5), counted with
   their repeats.
2. **pairs**: for an old chunk O and a new chunk N of the same knowledge, ``old_in_new`` = the
   share of O's n-grams found in N and ``new_from_old`` = the share of N's n-grams found in O.
   Text that several old chunks share (the heading line all chunks of a section start with, a
   boilerplate sentence) says nothing about where a new chunk's text came from, so O and N are
   *linked* on O's own n-grams (those no other old chunk of the knowledge has): N is linked to O
   when at least :data:`LINK_NEW` (20 %) of N's text is O's own, or at least :data:`LINK_OLD`
   (30 %) of O's own text is in N. ``coverage`` = the share of O's own text that N holds. An old
   chunk with almost no text of its own (fewer than :data:`MIN_OWN` n-grams or 10 % of them: a
   duplicate, a table of symbols) is linked only to a new chunk that is >= 80 % its text and holds
   >= 30 % of it, or that holds >= :data:`INSIDE` (95 %) of it; its ``coverage`` is then the share
   of all its text.
3. **carrying**, per query and new chunk N, over the old chunks linked to N that carry a label
   for that query (its *sources*): ``explained`` = the share of N's text found in its sources.

   - one source graded g, N mostly its text (``explained`` >= :data:`PURE`, 80 %): N gets g when
     it holds (nearly) all of it (``coverage`` >= :data:`WHOLE`, 80 %: the same chunk, or the old
     one inside a new one that is mostly its text), or whatever part of it when g is 0 (a part of
     a chunk that is not relevant is not relevant either);
   - several sources graded 0, each wholly in N (``coverage`` >= 80 %) and together >= 80 % of it
     (chunks merged whole): N gets 0;
   - everything else **needs a person**: a piece of a relevant chunk (the sentence that made it
     relevant may have gone to another piece), relevant chunks merged (together they may answer
     more than each did), sources with different grades (the highest is suggested), a new chunk
     that is mostly text nobody judged for this query.

   That is the ``strict`` rule, the default. The ``lenient`` rule also carries a grade 1-3 to a
   piece that is mostly the old chunk's text and holds >= :data:`COVERS` (30 %) of it, and the
   common grade of relevant chunks merged whole. Measured on the demo knowledge base chunked at
   half size (``benchmarks/carryover_demo.py``, checked by reading, ``tests/data/carryover-check-*.csv``),
   the lenient rule put the right grade on a piece of a relevant chunk in only about 6 cases of 10:
   the answer had often gone to the other piece.

   A new chunk linked to no labelled old chunk gets no label (it is unjudged, as new text is).
4. **old labels**: ``carried`` when every new chunk holding its text got a grade automatically,
   ``partly`` when some did, ``flagged`` when none did, ``lost`` when no new chunk holds its
   text. Labels on chunks the old inventory does not list are kept as they are.

The new test set holds the carried labels (and those kept); the ones that need a person are
written beside it as a worksheet (:mod:`weknora_nb.analysis.worksheet`'s columns plus
``old_chunk_ids`` and ``old_content``), to be graded with the same tools and merged with
``testset merge-labels``.
"""

from __future__ import annotations

import logging
import operator
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

import pandas as pd

from weknora_nb.analysis.worksheet import WORKSHEET_COLUMNS, write_worksheet
from weknora_nb.core.errors import InputError, UsageError, reading
from weknora_nb.core.lineage import check_new_version_path, file_sha256, write_version
from weknora_nb.core.testset import TestSet, load_testset

log = logging.getLogger(__name__)

#: N is linked to O when this share of N's text is O's own ...
LINK_NEW = 0.2
#: ... or this share of O's own text is in N
LINK_OLD = 0.3
#: a new chunk carries its sources' grade only when this share of its text is theirs
PURE = 0.8
#: a single source must have this share of its own text in the new chunk (grades 1-3)
COVERS = 0.3
#: several sources must each be (nearly) wholly in the new chunk; and, by the strict rule, a single
#: source of grade 1-3 too
WHOLE = 0.8
#: ``strict`` (the default) or ``lenient`` (see the module docstring)
RULES = ("strict", "lenient")
#: an old chunk with fewer n-grams of its own than this (or than 10 % of its n-grams) links only to near copies
MIN_OWN = 10
#: ... or to a new chunk that holds this share of all its text
INSIDE = 0.95
_SPACE = re.compile(r"\s+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


# ---------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------
def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace runs as one space, stripped."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def ngram_size(texts: Iterable[str]) -> int:
    """3 for text that is at least 30 % CJK characters (of its non-space characters), else 5."""
    cjk = total = 0
    for t in texts:
        cjk += len(_CJK.findall(t))
        total += len(t) - t.count(" ")
    return 3 if total and cjk / total >= 0.3 else 5


def ngrams(text: str, n: int) -> Counter[str]:
    """The character n-grams of normalised ``text`` with their counts (a text shorter than n is one gram)."""
    if len(text) <= n:
        return Counter([text]) if text else Counter()
    return Counter(text[i:i + n] for i in range(len(text) - n + 1))


# ---------------------------------------------------------------------------------------
# inventories and links
# ---------------------------------------------------------------------------------------
def read_inventory(path: str | Path, by: str = "knowledge_id") -> pd.DataFrame:
    """A chunk inventory (``chunks.parquet`` shape): chunk_id, ``by`` and content are needed. Its
    ``parent_text`` chunks are left out: labels belong to chunks search can return, and a parent holds its
    children's text (C100), so it would take their labels."""
    p = Path(path)
    with reading(p):
        inv = pd.read_parquet(p)
    _check_inventory(inv, str(p), by)
    if "chunk_type" in inv.columns:
        inv = inv[(inv["chunk_type"].astype("string") != "parent_text").fillna(True)].reset_index(drop=True)
    return inv


def _check_inventory(inv: pd.DataFrame, where: str, by: str) -> None:
    missing = [c for c in ("chunk_id", by, "content") if c not in inv.columns]
    if missing:
        raise InputError(where, f"a chunk inventory needs the column(s) {missing}")
    dup = inv["chunk_id"][inv["chunk_id"].duplicated()]
    if len(dup):
        raise InputError(where, f"chunk id {dup.iloc[0]!r} is listed {int((inv['chunk_id'] == dup.iloc[0]).sum())} "
                                "times")


@dataclass
class _Side:
    """The chunks of one inventory within one knowledge, as n-gram counts."""

    ids: list[str]
    grams: list[Counter[str]]
    sizes: list[int]


def _side(frame: pd.DataFrame, n: int) -> _Side:
    grams = [ngrams(normalise("" if pd.isna(t) else str(t)), n) for t in frame["content"]]
    return _Side([str(c) for c in frame["chunk_id"]], grams, [sum(g.values()) for g in grams])


def link_chunks(old: pd.DataFrame, new: pd.DataFrame, *, n: int | None = None,
                by: str = "knowledge_id") -> pd.DataFrame:
    """Every linked (old chunk, new chunk) pair of the same knowledge (see the module docstring).

    Columns: old_chunk_id, new_chunk_id, knowledge, old_in_new, new_from_old (shares of all
    n-grams), coverage (share of the old chunk's own n-grams in the new one), own_new (share of
    the new chunk's n-grams that are the old chunk's own).
    """
    return _linked(old, new, n=n, by=by)[0]


def _linked(old: pd.DataFrame, new: pd.DataFrame, *, n: int | None,
            by: str) -> tuple[pd.DataFrame, dict[tuple[str, str], Counter[str]]]:
    """:func:`link_chunks`, and the n-grams it counted, keyed ("old" | "new", chunk id): those of every chunk
    of a knowledge that both inventories hold."""
    _check_inventory(old, "old inventory", by)
    _check_inventory(new, "new inventory", by)
    n = n or ngram_size(normalise(str(t)) for t in pd.concat([old["content"], new["content"]]).dropna())
    rows: list[dict[str, Any]] = []
    grams: dict[tuple[str, str], Counter[str]] = {}
    new_groups = dict(iter(new.groupby(new[by].astype("string"), sort=False)))
    for k, old_k in old.groupby(old[by].astype("string"), sort=False):
        if k in new_groups:
            old_side, new_side = _side(old_k, n), _side(new_groups[k], n)
            rows += _links_in(str(k), old_side, new_side)
            for name, side in (("old", old_side), ("new", new_side)):
                grams.update(((name, c), g) for c, g in zip(side.ids, side.grams, strict=True))
    columns = ["old_chunk_id", "new_chunk_id", "knowledge", "old_in_new", "new_from_old", "coverage", "own_new"]
    return pd.DataFrame(rows, columns=columns), grams


def _links_in(knowledge: str, old: _Side, new: _Side) -> list[dict[str, Any]]:
    """The links between the old and the new chunks of one knowledge."""
    holders: dict[str, list[tuple[int, int]]] = {}   # n-gram -> (old chunk, its count of the n-gram)
    for i, g in enumerate(old.grams):
        for gram, c in g.items():
            holders.setdefault(gram, []).append((i, c))
    own_size = [0] * len(old.grams)
    for holding in holders.values():
        if len(holding) == 1:
            own_size[holding[0][0]] += holding[0][1]
    rows = []
    for j, ng in enumerate(new.grams):
        shared: dict[int, int] = {}   # old chunk -> n-grams in common, with counts (min of the two counts)
        own: dict[int, int] = {}      # ... of them, the old chunk's own
        for gram, c in ng.items():
            held = holders.get(gram)
            if held is None:
                continue
            for i, oc in held:
                shared[i] = shared.get(i, 0) + min(c, oc)
            if len(held) == 1:
                i, oc = held[0]
                own[i] = own.get(i, 0) + min(c, oc)
        for i, s in shared.items():
            if own_size[i] >= max(MIN_OWN, 0.1 * old.sizes[i]):
                coverage, own_new = own.get(i, 0) / own_size[i], own.get(i, 0) / new.sizes[j]
                linked = own_new >= LINK_NEW or coverage >= LINK_OLD
            else:  # (almost) no text of its own (a duplicate, a table of symbols): a near copy, or wholly inside
                coverage, own_new = s / old.sizes[i], s / new.sizes[j]
                linked = (own_new >= PURE and coverage >= COVERS) or coverage >= INSIDE
            if linked:
                rows.append({"old_chunk_id": old.ids[i], "new_chunk_id": new.ids[j], "knowledge": knowledge,
                             "old_in_new": s / old.sizes[i], "new_from_old": s / new.sizes[j],
                             "coverage": coverage, "own_new": own_new})
    return rows


# ---------------------------------------------------------------------------------------
# carrying labels
# ---------------------------------------------------------------------------------------
@dataclass
class CarryOver:
    """The outcome of :func:`carry_over`.

    ``carried``: the labels given automatically (query_id, chunk_id, grade, sources).
    ``review``: the (query, new chunk) pairs that need a person, as worksheet rows.
    ``old_labels``: every old label with its status (carried, partly, flagged, lost) and where it went.
    ``records``: the new test set's records. ``links``: the chunk links (:func:`link_chunks`).
    """

    records: list[dict[str, Any]]
    carried: pd.DataFrame
    review: pd.DataFrame
    old_labels: pd.DataFrame
    links: pd.DataFrame
    kept_unmapped: int
    n: int

    def counts(self) -> dict[str, Any]:
        """The figures: old labels by status (and shares), labels carried, pairs flagged."""
        status = self.old_labels["status"].value_counts()
        total = len(self.old_labels)
        by = {s: int(status.get(s, 0)) for s in ("carried", "partly", "flagged", "lost")}
        return {"old_labels": total, **by, "shares": {s: (v / total if total else 0.0) for s, v in by.items()},
                "labels_carried": len(self.carried), "pairs_flagged": len(self.review),
                "kept_unmapped": self.kept_unmapped}

    def describe(self) -> str:
        c = self.counts()
        sh = c["shares"]
        return "\n".join([
            f"{c['old_labels']} labels on chunks of the old inventory: carried automatically {c['carried']} "
            f"({sh['carried']:.1%}), partly {c['partly']} ({sh['partly']:.1%}), need a person {c['flagged']} "
            f"({sh['flagged']:.1%}), text gone {c['lost']} ({sh['lost']:.1%})",
            f"new labels carried: {c['labels_carried']}; (query, new chunk) pairs that need a person: "
            f"{c['pairs_flagged']}" + (f"; {c['kept_unmapped']} labels on chunks the old inventory does not list "
                                       "kept as they are" if c["kept_unmapped"] else "")])


def carry_over(testset: TestSet, old: pd.DataFrame, new: pd.DataFrame, *, n: int | None = None,
               by: str = "knowledge_id", rule: str = "strict") -> CarryOver:
    """Carry ``testset``'s labels from the chunks of inventory ``old`` to those of ``new`` (module docstring;
    ``rule``: one of :data:`RULES`)."""
    if rule not in RULES:
        raise UsageError(argument="--rule", allowed=list(RULES), got=rule)
    n = n or ngram_size(normalise(str(t)) for t in pd.concat([old["content"], new["content"]]).dropna())
    links, grams = _linked(old, new, n=n, by=by)
    old_ids = set(old["chunk_id"].astype(str))
    sources_of: dict[str, list[tuple[str, float]]] = {}
    for o, nw, cov in links[["old_chunk_id", "new_chunk_id", "coverage"]].itertuples(index=False):
        sources_of.setdefault(nw, []).append((o, float(cov)))
    targets_of: dict[str, list[str]] = {}
    for o, nw in links[["old_chunk_id", "new_chunk_id"]].itertuples(index=False):
        targets_of.setdefault(o, []).append(nw)
    texts = _texts(old, new)
    explained = _explained_once(grams)
    carried, review, status, records = [], [], [], []
    kept = 0
    for rec in testset.records():
        labels = {c: g for c, g in rec["relevant"].items() if c in old_ids}
        kept += len(rec["relevant"]) - len(labels)
        decided = _decide_query(labels, targets_of, sources_of, explained, rule)
        new_rel = {c: g for c, g in rec["relevant"].items() if c not in old_ids}
        for nw, (grade, sources, reason) in decided.items():
            if grade is not None:
                new_rel[nw] = grade
                carried.append({"query_id": rec["query_id"], "chunk_id": nw, "grade": grade,
                                "sources": _describe_sources(sources, labels)})
            else:
                review.append(_review_row(rec, nw, sources, labels, reason, texts))
        status += _old_status(rec["query_id"], labels, targets_of, decided)
        records.append(dict(rec, relevant=new_rel))
    return CarryOver(records, pd.DataFrame(carried, columns=["query_id", "chunk_id", "grade", "sources"]),
                     pd.DataFrame(review, columns=[*WORKSHEET_COLUMNS, "old_chunk_ids", "old_content"]),
                     pd.DataFrame(status, columns=["query_id", "old_chunk_id", "grade", "status", "new_chunk_ids"]),
                     links, kept, n)


def _texts(old: pd.DataFrame, new: pd.DataFrame) -> dict[tuple[str, str], tuple[str, str]]:
    """("old" | "new", chunk id) -> (knowledge title, content)."""
    out = {}
    for side, frame in (("old", old), ("new", new)):
        titles = frame["knowledge_title"] if "knowledge_title" in frame.columns else pd.Series([""] * len(frame))
        for c, t, x in zip(frame["chunk_id"].astype(str), titles, frame["content"], strict=True):
            out[(side, c)] = ("" if pd.isna(t) else str(t), "" if pd.isna(x) else str(x))
    return out


#: ``explained`` of (new chunk id, its sources' old chunk ids)
_ExplainedBy = Callable[[str, frozenset[str]], float]


def _decide_query(labels: dict[str, int], targets_of: dict[str, list[str]],
                  sources_of: dict[str, list[tuple[str, float]]], explained: _ExplainedBy,
                  rule: str) -> dict[str, tuple[int | None, list, str]]:
    """For one query: new chunk -> (grade or None when it needs a person, its sources, the reason)."""
    decided: dict[str, tuple[int | None, list, str]] = {}
    for nw in dict.fromkeys(t for o in labels for t in targets_of.get(o, [])):
        sources = [(o, cov) for o, cov in sources_of[nw] if o in labels]
        decided[nw] = _decide(nw, sources, labels, explained, rule)
    return decided


def _decide(nw: str, sources: list[tuple[str, float]], labels: dict[str, int], explained_by: _ExplainedBy,
            rule: str) -> tuple[int | None, list, str]:
    """The rule of the module docstring for one (query, new chunk): (grade or None, sources, why not)."""
    grades = {labels[o] for o, _ in sources}
    if len(grades) > 1:
        return None, sources, (f"its text comes from old chunks with different grades {sorted(grades)}: "
                               f"suggested {max(grades)} (the highest)")
    grade = next(iter(grades))
    explained = explained_by(nw, frozenset(o for o, _ in sources))
    if explained < PURE:
        return None, sources, (f"only {explained:.0%} of its text comes from chunks judged for this query "
                               f"(grade {grade}); the rest was never judged")
    piece = COVERS if rule == "lenient" else WHOLE
    if len(sources) == 1:
        cov = sources[0][1]
        if cov >= piece or grade == 0:
            return grade, sources, ""
        return None, sources, (f"it holds only {cov:.0%} of the old chunk's text (grade {grade}): what made that "
                               "chunk relevant may have gone to another piece")
    if not all(cov >= WHOLE for _, cov in sources):
        return None, sources, f"it holds pieces of {len(sources)} old chunks (grade {grade}), not each whole"
    if grade == 0 or rule == "lenient":
        return grade, sources, ""
    return None, sources, (f"it merges {len(sources)} old chunks graded {grade}: together they may answer more "
                           f"(at least {grade})")


def _explained(new: Counter[str], sources: list[Counter[str]]) -> float:
    """Share of a new chunk's n-grams found in the union of its sources' n-grams: with counts,
    ``sum over g of min(new[g], max over sources s of s[g]) / sum over g of new[g]``."""
    total = new.total()
    if not total:
        return 0.0
    union = sources[0] if len(sources) == 1 else reduce(operator.or_, sources)  # Counter | keeps the larger count
    return (new & union).total() / total


def _explained_once(grams: dict[tuple[str, str], Counter[str]]) -> _ExplainedBy:
    """:func:`_explained` of a new chunk and a set of its sources, each computed once: the queries that label
    the same old chunks ask for the same pair (the demo's three re-chunkings: 15,202 decisions, 3,238 pairs)."""
    memo: dict[tuple[str, frozenset[str]], float] = {}

    def explained(nw: str, olds: frozenset[str]) -> float:
        key = (nw, olds)
        if key not in memo:
            memo[key] = _explained(grams[("new", nw)], [grams[("old", o)] for o in sorted(olds)])
        return memo[key]
    return explained


def _describe_sources(sources: list[tuple[str, float]], labels: dict[str, int]) -> str:
    return "; ".join(f"{o} (grade {labels[o]}, {cov:.0%} of its own text)" for o, cov in sources)


def _review_row(rec: dict[str, Any], nw: str, sources: list[tuple[str, float]], labels: dict[str, int],
                reason: str, texts: dict[tuple[str, str], tuple[str, str]]) -> dict[str, Any]:
    title, content = texts[("new", nw)]
    return {"query_id": rec["query_id"], "query": rec["query"], "chunk_id": nw, "knowledge_title": title,
            "content": content, "found_in": "carry-over", "best_rank": None, "grade": None, "assessor": "",
            "note": reason, "old_chunk_ids": _describe_sources(sources, labels),
            "old_content": "\n\n----\n\n".join(texts[("old", o)][1] for o, _ in sources)}


def _old_status(qid: str, labels: dict[str, int], targets_of: dict[str, list[str]],
                decided: dict[str, tuple[int | None, list, str]]) -> list[dict[str, Any]]:
    out = []
    for o, g in labels.items():
        targets = targets_of.get(o, [])
        done = [decided[t][0] is not None for t in targets]
        status = "lost" if not targets else "carried" if all(done) else "partly" if any(done) else "flagged"
        out.append({"query_id": qid, "old_chunk_id": o, "grade": g, "status": status,
                    "new_chunk_ids": "; ".join(targets)})
    return out


# ---------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------
def review_path(out: str | Path) -> Path:
    """The worksheet of the pairs that need a person, beside the new test set: ``T2.jsonl.review.csv``."""
    p = Path(out)
    return p.with_name(p.name + ".review.csv")


def carry_over_files(testset: str | Path, old_chunks: str | Path, new_chunks: str | Path, out: str | Path, *,
                     n: int | None = None, by: str = "knowledge_id",
                     rule: str = "strict") -> tuple[CarryOver, dict[str, Any]]:
    """Carry the labels of the test set file ``testset`` over and write the new test set ``out``, its
    lineage (parent = ``testset``) and the review worksheet beside it; returns the outcome and the lineage."""
    if by not in ("knowledge_id", "knowledge_title"):
        raise UsageError(argument="--match-by", allowed=["knowledge_id", "knowledge_title"], got=by)
    check_new_version_path(out, [testset, old_chunks, new_chunks])
    if review_path(out).exists():
        raise UsageError(f"--out {out}: its review worksheet {review_path(out)} exists; name a new file (or remove "
                         "it first)")
    parent = load_testset(testset)
    old, new = read_inventory(old_chunks, by), read_inventory(new_chunks, by)
    if not len(new):
        raise InputError(new_chunks, "the new chunk inventory holds no chunk: every label would be lost (was the "
                                     "knowledge base listed before it was re-chunked?)")
    result = carry_over(parent, old, new, n=n, by=by, rule=rule)
    review = review_path(out)
    write_worksheet(result.review, review)
    c = result.counts()
    fields = {"kind": "carry-over", "labels_added": c["labels_carried"], "labels_changed": 0, "assessors": [],
              "carried_over_from": {"path": str(old_chunks), "sha256": file_sha256(old_chunks)},
              "carried_over_to": {"path": str(new_chunks), "sha256": file_sha256(new_chunks)},
              "old_labels": {k: c[k] for k in ("old_labels", "carried", "partly", "flagged", "lost")},
              "labels_carried": c["labels_carried"], "pairs_flagged": c["pairs_flagged"],
              "kept_unmapped": c["kept_unmapped"], "review_file": str(review),
              "rule": {"name": rule, "ngram": result.n, "match_by": by, "link_new": LINK_NEW, "link_old": LINK_OLD,
                       "pure": PURE, "covers": COVERS, "whole": WHOLE, "min_own": MIN_OWN, "inside": INSIDE}}
    _, lineage = write_version(result.records, out, parent, testset, fields)
    return result, lineage
