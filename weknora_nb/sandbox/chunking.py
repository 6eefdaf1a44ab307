"""Structure-aware Markdown chunking for the sandbox knowledge base.

Rules (deterministic; the same file always gives the same chunks and ids):

- a document is split at every heading (``#`` .. ``####``); each heading's own body is a
  section, and a section with an empty body gives no chunk;
- a body is made of blocks: paragraphs, lists, tables and fenced code blocks; tables,
  lists and code blocks are never cut, unless one alone exceeds ``hard_max`` characters
  (then it is cut between rows / items / lines, a table's header repeated);
- a body longer than ``max_chars`` is packed greedily into several chunks at block
  boundaries; a paragraph longer than ``max_chars`` is cut between sentences
  (never inside one);
- each chunk's text starts with its heading path (``title › section › subsection``), so it
  reads on its own, as WeKnora's structure-aware chunking keeps titles;
- knowledge id = the document's path relative to the corpus root, without suffix, with
  ``.`` for ``/`` (``user-guide.03-routes``); chunk id = ``<knowledge_id>:<chunk_index:03d>``
  (``user-guide.03-routes:004``): derived from the document and the position, stable while
  the document is unchanged, safe in URLs and TREC files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Chunk", "chunk_markdown", "chunk_corpus", "MAX_CHARS"]

MAX_CHARS = 420
HARD_MAX = 900
_HEADING = re.compile(r"^(#{1,4})\s+(.+?)\s*#*\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SENTENCE_END = re.compile(r"(?<=[。！？!?；;])|(?<=\.)\s+")


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document, with WeKnora's chunk fields."""

    id: str
    knowledge_id: str
    knowledge_title: str
    chunk_index: int
    content: str
    heading_path: tuple[str, ...]
    start_at: int
    end_at: int

    @property
    def body(self) -> str:
        """The chunk's text without its heading-path line."""
        return self.content.split("\n", 1)[1] if "\n" in self.content else ""


@dataclass
class _Block:
    kind: str  # paragraph | list | table | code
    text: str
    start: int
    end: int


def _blocks(lines: list[tuple[int, str]]) -> list[_Block]:
    """Group (offset, line) pairs of one section body into blocks."""
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        off, line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            continue
        if stripped.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j][1].strip().startswith("```"):
                j += 1
            j = min(j + 1, len(lines))
            kind = "code"
        elif stripped.startswith("|"):
            j = i
            while j < len(lines) and lines[j][1].strip().startswith("|"):
                j += 1
            kind = "table"
        elif _LIST_ITEM.match(line):
            j = i
            while j < len(lines) and lines[j][1].strip() and (
                    _LIST_ITEM.match(lines[j][1]) or lines[j][1].startswith((" ", "\t"))):
                j += 1
            kind = "list"
        else:
            j = i
            while j < len(lines) and lines[j][1].strip() and not lines[j][1].strip().startswith(("```", "|")) \
                    and not _LIST_ITEM.match(lines[j][1]):
                j += 1
            kind = "paragraph"
        text = "\n".join(raw for _, raw in lines[i:j]).strip("\n")
        end = lines[j - 1][0] + len(lines[j - 1][1])
        blocks.append(_Block(kind, text, off, end))
        i = j
    return blocks


def _split_block(b: _Block, max_chars: int, hard_max: int) -> list[_Block]:
    """Cut one oversized block: paragraphs between sentences; others only past ``hard_max``."""
    if b.kind == "paragraph" and len(b.text) > max_chars:
        sentences = [s for s in _SENTENCE_END.split(b.text) if s and s.strip()]
        return [_Block("paragraph", t, b.start, b.end) for t in _pack([s for s in sentences], max_chars, "")]
    if len(b.text) <= hard_max:
        return [b]
    rows = b.text.split("\n")
    if b.kind == "table" and len(rows) > 3:
        head, body = rows[:2], rows[2:]
        parts = _pack(body, hard_max - len("\n".join(head)), "\n")
        return [_Block("table", "\n".join(head) + "\n" + p, b.start, b.end) for p in parts]
    if b.kind == "code" and len(rows) > 2:
        fence_open, fence_close, body = rows[0], rows[-1], rows[1:-1]
        parts = _pack(body, hard_max - len(fence_open) - len(fence_close), "\n")
        return [_Block("code", f"{fence_open}\n{p}\n{fence_close}", b.start, b.end) for p in parts]
    return [_Block(b.kind, p, b.start, b.end) for p in _pack(rows, hard_max, "\n")]


def _pack(pieces: list[str], limit: int, sep: str) -> list[str]:
    """Greedy packing of pieces (in order) into strings of at most ``limit`` characters."""
    out: list[str] = []
    cur = ""
    for p in pieces:
        cand = p if not cur else cur + sep + p
        if cur and len(cand) > limit:
            out.append(cur)
            cur = p
        else:
            cur = cand
    if cur:
        out.append(cur)
    return out


def chunk_markdown(text: str, doc_id: str, *, max_chars: int = MAX_CHARS, hard_max: int = HARD_MAX) -> list[Chunk]:
    """Chunk one Markdown document (see the module docstring for the rules)."""
    title = doc_id
    sections: list[tuple[tuple[str, ...], list[tuple[int, str]]]] = []
    path: list[tuple[int, str]] = []
    body: list[tuple[int, str]] = []
    in_code = False
    offset = 0

    def close() -> None:
        if body:
            sections.append((tuple(h for _, h in path), list(body)))
        body.clear()

    for line in text.splitlines(keepends=True):
        raw = line.rstrip("\n")
        if raw.strip().startswith("```"):
            in_code = not in_code
        m = None if in_code else _HEADING.match(raw)
        if m:
            close()
            level, heading = len(m.group(1)), m.group(2).strip()
            if level == 1 and title == doc_id:
                title = heading
            path = [(lv, h) for lv, h in path if lv < level] + [(level, heading)]
        else:
            body.append((offset, raw))
        offset += len(line)
    close()

    chunks: list[Chunk] = []
    for hpath, lines in sections:
        blocks = _blocks(lines)
        if not blocks:
            continue
        pieces: list[_Block] = []
        for b in blocks:
            pieces.extend(_split_block(b, max_chars, hard_max) if len(b.text) > max_chars else [b])
        groups: list[list[_Block]] = []
        size = 0
        for b in pieces:
            if groups and size + len(b.text) + 2 <= max_chars:
                groups[-1].append(b)
                size += len(b.text) + 2
            else:
                groups.append([b])
                size = len(b.text)
        crumbs = " › ".join(hpath if hpath and hpath[0] == title else (title, *hpath))
        for g in groups:
            content = crumbs + "\n" + "\n\n".join(b.text for b in g)
            idx = len(chunks)
            chunks.append(Chunk(id=f"{doc_id}:{idx:03d}", knowledge_id=doc_id, knowledge_title=title,
                                chunk_index=idx, content=content, heading_path=hpath,
                                start_at=g[0].start, end_at=g[-1].end))
    return chunks


def chunk_corpus(root: str | Path, *, max_chars: int = MAX_CHARS) -> list[Chunk]:
    """Chunk every ``*.md`` under ``root`` (sorted by path; README/notes files excluded)."""
    root = Path(root)
    out: list[Chunk] = []
    for p in sorted(root.rglob("*.md")):
        if p.name.upper() == p.name or p.name.startswith("_"):
            continue  # README.md and the like
        doc_id = p.relative_to(root).with_suffix("").as_posix().replace("/", ".")
        out.extend(chunk_markdown(p.read_text(encoding="utf-8"), doc_id, max_chars=max_chars))
    return out
