"""The chunks a result shows besides itself: the results table's ``shown_chunk_ids`` (docs/method.md section 14).

Knowledge bases created in WeKnora's web UI chunk parent-child: search matches the ``text`` children, and the
merge step of knowledge-search and chat (C100) gives a child hit its ``parent_text`` parent's content (the whole
parent, which contains the child), keeps the child's id and lists the merged children, the hit's own id
included, in ``sub_chunk_id``; an image OCR or caption hit shows its text parent (and that one's parent). So
the user sees the parent and every child of it, while the result names one child. For a result of those
endpoints, :meth:`Families.shown` is

    WeKnora's ``sub_chunk_id`` without the result's own id, then, for the result and each merged chunk shown
    with its parent's content, the parent's id and the parent's other children in ``chunk_index`` order;
    each id once.

The families come from the run's chunk inventory (:class:`Families`, its ``parent_chunk_id`` and ``chunk_type``
columns, the parents listed too, C101); without one, a child's parent id is still known from the result
(``parent_chunk_id``), its siblings are not. hybrid-search and FAQ search merge nothing: their results show
their own content only (``sub_chunk_id`` without the own id, normally nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

#: the endpoints whose results went through WeKnora's merge step (C100)
MERGED_ENDPOINTS = ("knowledge-search", "chat")
PARENT = "parent_text"
_IMAGE = ("image_ocr", "image_caption")


@dataclass
class Families:
    """Parent-child families of an inventory: each chunk's type and parent, each parent's children in
    ``chunk_index`` order. ``known``: an inventory was given (else only what results carry is known)."""

    type_of: dict[str, str] = field(default_factory=dict)
    parent_of: dict[str, str] = field(default_factory=dict)
    children_of: dict[str, list[str]] = field(default_factory=dict)
    known: bool = False

    @classmethod
    def of(cls, inventory: pd.DataFrame | None) -> Families:
        """From a chunk inventory (``chunks.parquet``'s columns); an empty one without the inventory or without
        a ``parent_chunk_id`` column (an inventory of an older collector)."""
        if inventory is None or "parent_chunk_id" not in inventory.columns:
            return cls()
        frame = inventory[["chunk_id", "chunk_type", "parent_chunk_id", "chunk_index"]].drop_duplicates("chunk_id")
        ids = frame["chunk_id"].astype(str).tolist()
        types = [None if pd.isna(t) else str(t) for t in frame["chunk_type"]]
        parents = [None if pd.isna(p) or p == "" else str(p) for p in frame["parent_chunk_id"]]
        index = [None if pd.isna(i) else int(i) for i in frame["chunk_index"]]
        out = cls(known=True)
        out.type_of = {c: t for c, t in zip(ids, types, strict=True) if t}
        out.parent_of = {c: p for c, p in zip(ids, parents, strict=True) if p}
        kids: dict[str, list[tuple[int, int, str]]] = {}
        for at, (c, p, i) in enumerate(zip(ids, parents, index, strict=True)):
            if p is not None:
                kids.setdefault(p, []).append((i if i is not None else 1 << 62, at, c))
        out.children_of = {p: [c for _, _, c in sorted(v)] for p, v in kids.items()}
        return out

    def shown(self, endpoint: str, chunk_id: str, chunk_type: str | None, parent_id: str | None,
              sub_ids: Iterable[str]) -> list[str]:
        """The chunks a result of ``endpoint`` shows besides itself (see the module docstring)."""
        out: list[str] = []
        seen = {chunk_id}

        def add(ids: Iterable[str]) -> None:
            for x in ids:
                if x and x not in seen:
                    seen.add(x)
                    out.append(x)
        subs = [str(x) for x in sub_ids if x]
        add(subs)
        if endpoint not in MERGED_ENDPOINTS:
            return out
        add(self._context(chunk_id, chunk_type, parent_id))
        for x in subs:
            add(self._context(x, self.type_of.get(x), self.parent_of.get(x)))
        return out

    def _context(self, chunk_id: str, chunk_type: str | None, parent_id: str | None) -> list[str]:
        """What the merge step shows of a chunk's parents (C100): a text child's parent and its children; an
        image chunk's text parent, and that one's parent family when it is a ``parent_text``."""
        if not parent_id:
            return []
        kind = chunk_type or self.type_of.get(chunk_id)
        if kind in _IMAGE:
            grand = self.parent_of.get(parent_id)
            return [parent_id, *(self._family(grand) if grand and self.type_of.get(grand) == PARENT else [])]
        if kind in ("text", None) and self.type_of.get(parent_id, PARENT) == PARENT:   # a text chunk's parent is one
            return self._family(parent_id)
        return []

    def _family(self, parent_id: str) -> list[str]:
        """A parent and its children in document order."""
        return [parent_id, *self.children_of.get(parent_id, [])]
