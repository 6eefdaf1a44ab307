"""Parent-child chunking, as WeKnora's web UI creates knowledge bases (docs/weknora-contract.md C110).

A knowledge base made in WeKnora's web UI chunks its documents twice (``enable_parent_child``, parents
of 4096 and children of 384 characters: KnowledgeBaseEditorModal.vue:746-761 @ v0.7.2): large
``parent_text`` chunks are stored for what the user is shown, small ``text`` children are what
search finds. The sandbox does it over its own chunker (:mod:`.chunking`), as WeKnora's does
(paths relative to the WeKnora repository, at v0.7.2):

- **parents** (``SplitParentChild``, internal/infrastructure/chunker/strategy.go:148-186, its heading
  tier heading_splitter.go:32-121): the document is cut at its *primary* headings, those of a level
  at most the smallest level used at least three times (else the deepest level used:
  ``DominantHeadingLevel``, profiler.go:63-78; ``findHeadingBoundaries`` :209-249), the first section
  starting at the document's start; consecutive sections are joined while the parent so far is
  shorter than ``max(parent_chunk_size / 2, 200)`` and both fit in ``parent_chunk_size``
  (``coalesceTinyChunks`` :139-176). A parent's content is the document's text from its first section
  to the next parent, as written. A section longer than ``parent_chunk_size`` is cut between its
  children (WeKnora cuts it with its plain splitter).
- **children**: the sandbox's flat chunks (:func:`~weknora_nb.sandbox.chunking.chunk_markdown`) at
  ``child_chunk_size``, each inside one parent; a child's content is its text without its heading path,
  which is its context header (WeKnora's ``ContextHeader``): what is indexed of it is what the flat chunk
  of the same text indexes (:func:`~weknora_nb.sandbox.chunking.index_text`). WeKnora's children overlap by
  ``child_chunk_size / 5`` characters (``DeriveParentChildConfigs``, strategy.go:218-236) and start with their
  heading line; the sandbox's, like its flat chunks, do neither.
- **what is stored** (knowledge_process.go:370-467): a parent is kept only when it has more than one child
  (one child is the whole parent: strategy.go:171-175); children carry their parent's id in
  ``parent_chunk_id``; kept parents are linked by ``pre_chunk_id`` / ``next_chunk_id``, children are not
  linked at all. A child whose parent was not kept has no parent and, in a document that has parents, is
  **neither embedded nor keyword-indexed** (only children with a parent and the chunks of a document without
  parents are: :446-455, :512-532): it is listed, and search never finds it. A document none of whose parents
  is kept is chunked flat: its children are linked and indexed.
- **ids and indexes**: children ``<knowledge id>:c<chunk_index:03d>`` with the flat chunks' ``chunk_index``
  (0, 1, ... over the document); parents ``<knowledge id>:p<n:03d>`` where ``n`` counts every parent made,
  kept or not (their ``chunk_index``, from 0 again: a parent's ``Seq``, :382). A document's chunks are in
  ``chunk_index`` order, a parent before the child of the same index, as WeKnora lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from weknora_nb.sandbox.chunking import FAQ_FILE, Chunk, chunk_markdown, load_faq, markdown_lines

#: the web UI's parent and child sizes (KnowledgeBaseEditorModal.vue:754-755 @ v0.7.2; DeriveParentChildConfigs's
#: defaults, strategy.go:219-224)
PARENT_CHUNK_SIZE, CHILD_CHUNK_SIZE = 4096, 384
#: coalesceTinyChunks: a running chunk is joined with the next while shorter than max(size / 2, this)
COALESCE_FLOOR = 200


@dataclass(frozen=True)
class ParentChild:
    """The knowledge base's parent-child chunking (C49 ``chunking_config``: ``parent_chunk_size``,
    ``child_chunk_size``), in characters."""

    parent_chunk_size: int = PARENT_CHUNK_SIZE
    child_chunk_size: int = CHILD_CHUNK_SIZE


@dataclass
class _Span:
    """A parent in the making: the document's text ``[start, end)`` and the children that start in it."""

    start: int
    end: int
    children: list[Chunk]

    @property
    def size(self) -> int:
        return self.end - self.start


def primary_boundaries(text: str) -> list[int]:
    """Where the primary sections start (see the module docstring): 0, then the offset of each heading of a level
    at most the primary one, outside fenced code."""
    headings = [(offset, len(m.group(1))) for offset, _, m in markdown_lines(text) if m]   # (offset, level)
    if not headings:
        return [0]
    counts = {lv: sum(1 for _, x in headings if x == lv) for lv in {lv for _, lv in headings}}
    primary = next((lv for lv in sorted(counts) if counts[lv] >= 3), max(counts))
    return [0] + [off for off, lv in headings if lv <= primary and off > 0]


def _sections(text: str, children: list[Chunk], size: int) -> list[_Span]:
    """The primary sections as spans with their children, a section longer than ``size`` cut between children."""
    bounds = primary_boundaries(text) + [len(text)]
    out: list[_Span] = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        members = [c for c in children if start <= c.start_at < end]
        if end - start <= size or len(members) <= 1:
            out.append(_Span(start, end, members))
            continue
        cur = _Span(start, end, [])
        for c in members:
            if cur.children and c.end_at - cur.start > size:
                cur.end = c.start_at
                out.append(cur)
                cur = _Span(c.start_at, end, [])
            cur.children.append(c)
        out.append(cur)
    return out


def _coalesced(spans: list[_Span], size: int) -> list[_Span]:
    """``coalesceTinyChunks``: a span joins the running one while that is shorter than the target and both fit."""
    target = max(size // 2, COALESCE_FLOOR)
    out: list[_Span] = []
    for s in spans:
        if out and out[-1].size < target and out[-1].size + s.size <= size:
            out[-1] = _Span(out[-1].start, s.end, out[-1].children + s.children)
        else:
            out.append(s)
    return out


def parent_child_chunks(text: str, doc_id: str, cfg: ParentChild = ParentChild()) -> list[Chunk]:
    """The parents and children of one Markdown document (see the module docstring), in listing order."""
    flat = chunk_markdown(text, doc_id, max_chars=cfg.child_chunk_size)
    if not flat:
        return []
    title = flat[0].knowledge_title
    spans = _coalesced(_sections(text, flat, cfg.parent_chunk_size), cfg.parent_chunk_size)
    parent_of: dict[str, str] = {}
    parents: list[Chunk] = []
    for n, s in enumerate(spans):
        if len(s.children) > 1:
            pid = f"{doc_id}:p{n:03d}"
            parents.append(Chunk(id=pid, knowledge_id=doc_id, knowledge_title=title, chunk_index=n,
                                 content=text[s.start:s.end], heading_path=(), start_at=s.start, end_at=s.end,
                                 chunk_type="parent_text", indexed=False))
            parent_of.update(dict.fromkeys((c.id for c in s.children), pid))
    split = bool(parents)
    children = [replace(c, id=f"{doc_id}:c{c.chunk_index:03d}", content=c.body,
                        context_header=c.content.split("\n", 1)[0], parent_chunk_id=parent_of.get(c.id, ""),
                        indexed=not split or c.id in parent_of, linked=not split) for c in flat]
    return sorted(parents + children, key=lambda c: (c.chunk_index, c.chunk_type != "parent_text"))


def parent_child_corpus(data_dir: str | Path, cfg: ParentChild = ParentChild()) -> list[Chunk]:
    """The chunks of a data folder with its documents chunked parent-child (``docs/*.md``, sorted by path, README and
    ``_`` files left out, as :func:`~weknora_nb.sandbox.chunking.chunk_corpus` reads them), then its FAQ entries."""
    d = Path(data_dir)
    out: list[Chunk] = []
    for p in sorted((d / "docs").rglob("*.md")):
        if p.name.upper() == p.name or p.name.startswith("_"):
            continue
        doc_id = p.relative_to(d / "docs").with_suffix("").as_posix().replace("/", ".")
        out.extend(parent_child_chunks(p.read_text(encoding="utf-8"), doc_id, cfg))
    faq = d / FAQ_FILE
    return out + load_faq(faq) if faq.is_file() else out
