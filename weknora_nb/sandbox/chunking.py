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

What both retrieval paths index is not the chunk's content alone but WeKnora's index text
(:func:`index_text`, C76): the document title, a line break, the chunk content.

An FAQ knowledge base (``<data>/faq/faq.jsonl``, :func:`load_faq`) gives one ``chunk_type:
faq`` chunk per entry, built as WeKnora builds FAQ chunks (see :func:`load_faq`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import InputError, Problem

#: where a data folder keeps its FAQ entries (one JSON object a line)
FAQ_FILE = Path("faq") / "faq.jsonl"

MAX_CHARS = 420
HARD_MAX = 900
HEADING = re.compile(r"^(#{1,4})\s+(.+?)\s*#*\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SENTENCE_END = re.compile(r"(?<=[。！？!?；;])|(?<=\.)\s+")


@dataclass(frozen=True)
class FaqEntry:
    """One FAQ entry (WeKnora's ``FAQChunkMetadata``, internal/types/faq.go:17-25 @ v0.7.2) and its group."""

    group: str
    standard_question: str
    similar_questions: tuple[str, ...]
    answers: tuple[str, ...]
    negative_questions: tuple[str, ...] = ()
    source: str = ""


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document (or one FAQ entry), with WeKnora's chunk fields."""

    id: str
    knowledge_id: str
    knowledge_title: str
    chunk_index: int
    content: str
    heading_path: tuple[str, ...]
    start_at: int
    end_at: int
    #: C54: ``text`` for document chunks, ``faq`` for FAQ entries
    chunk_type: str = "text"
    #: the entry an FAQ chunk holds (None for document chunks)
    faq: FaqEntry | None = None
    #: C110: the ``parent_text`` chunk a child chunk belongs to ("" for a flat chunk, a parent, a child whose parent
    #: was not stored)
    parent_chunk_id: str = ""
    #: C110: what is indexed before the content: a child's heading path (WeKnora's ``ContextHeader``); "" for a
    #: flat chunk, whose heading path is the first line of its content
    context_header: str = ""
    #: C110: embedded and keyword-indexed (False: a ``parent_text`` chunk, a child without parent in a parent-child
    #: document)
    indexed: bool = True
    #: C110: linked to the previous and next chunk of its type by ``pre_chunk_id`` / ``next_chunk_id`` (False:
    #: the children of a parent-child document)
    linked: bool = True

    @property
    def body(self) -> str:
        """The chunk's text without its heading-path line (a child's or a parent's: the content itself)."""
        if self.context_header or self.chunk_type == "parent_text":
            return self.content
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


def markdown_lines(text: str) -> Iterator[tuple[int, str, re.Match[str] | None]]:
    """Each line of a Markdown text: its offset (characters), the line without its newline, and its heading match
    (None for a line that is no heading, or inside fenced code)."""
    offset, in_code = 0, False
    for line in text.splitlines(keepends=True):
        raw = line.rstrip("\n")
        if raw.strip().startswith("```"):
            in_code = not in_code
        yield offset, raw, (None if in_code else HEADING.match(raw))
        offset += len(line)


def chunk_markdown(text: str, doc_id: str, *, max_chars: int = MAX_CHARS, hard_max: int = HARD_MAX) -> list[Chunk]:
    """Chunk one Markdown document (see the module docstring for the rules)."""
    title = doc_id
    sections: list[tuple[tuple[str, ...], list[tuple[int, str]]]] = []
    path: list[tuple[int, str]] = []
    body: list[tuple[int, str]] = []

    def close() -> None:
        if body:
            sections.append((tuple(h for _, h in path), list(body)))
        body.clear()

    for offset, raw, m in markdown_lines(text):
        if m:
            close()
            level, heading = len(m.group(1)), m.group(2).strip()
            if level == 1 and title == doc_id:
                title = heading
            path = [(lv, h) for lv, h in path if lv < level] + [(level, heading)]
        else:
            body.append((offset, raw))
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


def index_text(chunk: Chunk) -> str:
    """What WeKnora indexes for a chunk (both the vector and the keyword path).

    Document chunk (C76): ``knowledge title + "\\n" + content`` (``buildKnowledgeIndexContent``,
    internal/application/service/knowledge_index_content.go:12-21 @ v0.7.2; knowledge_process.go:526-543
    @ v0.6.x). FAQ chunk: ``buildFAQIndexContent`` in the FAQ knowledge base's default modes
    (``index_mode`` question_answer, ``question_index_mode`` combined; ``EnsureDefaults``,
    internal/types/knowledgebase.go:619-645 @ v0.7.2): the standard question, each similar
    question and each answer on its own line (knowledge_faq.go:2006-2020 and the combined branch
    :2048-2063 @ v0.7.2; :1821-1836 @ v0.6.2). No title for FAQ entries.
    """
    if chunk.faq is not None:
        f = chunk.faq
        return "\n".join((f.standard_question, *f.similar_questions, *f.answers))
    content = f"{chunk.context_header}\n{chunk.content}" if chunk.context_header else chunk.content
    title = chunk.knowledge_title.strip()
    return f"{title}\n{content}" if title else content


#: C49 ``faq_config``: ``index_mode`` (are answers indexed) and ``question_index_mode`` (one index entry per
#: entry, or one per question); WeKnora's defaults for a knowledge base created through the API
FAQ_INDEX_MODES = ("question_answer", "question_only")
FAQ_QUESTION_INDEX_MODES = ("combined", "separate")


def faq_index_texts(chunk: Chunk, index_mode: str = "question_answer",
                    question_index_mode: str = "combined") -> list[str]:
    """The index entries of an FAQ chunk (``buildFAQIndexInfoList``, knowledge_faq.go:2023-2120 @ v0.7.2,
    :1838 @ v0.6.x): ``combined`` gives one entry, the questions (and, in ``question_answer`` mode,
    the answers) one per line (:func:`index_text`); ``separate`` one entry per question (standard
    first), each followed by the answers on their own lines in ``question_answer`` mode."""
    f = chunk.faq
    if f is None:
        return [index_text(chunk)]
    answers = f.answers if index_mode == "question_answer" else ()
    if question_index_mode == "combined":
        return ["\n".join((f.standard_question, *f.similar_questions, *answers))]
    return ["\n".join((q, *answers)) for q in (f.standard_question, *f.similar_questions)]


def faq_answer_content(chunk: Chunk) -> str:
    """What knowledge-search returns as an FAQ result's content after CHUNK_MERGE: ``Q: <question>``,
    ``Answer:`` and one ``- <answer>`` line each, trimmed (``populateFAQAnswers`` /
    ``buildFAQAnswerContent``, internal/application/service/chat_pipeline/merge_faq.go:10-131, all four tags)."""
    if chunk.faq is None:
        return chunk.content
    lines = [f"Q: {chunk.faq.standard_question}"] if chunk.faq.standard_question else []
    if chunk.faq.answers:
        lines += ["Answer:", *(f"- {a}" for a in chunk.faq.answers)]
    return "\n".join(lines).strip()


def _faq_chunk_content(entry: FaqEntry) -> str:
    """``buildFAQChunkContent`` in question_answer mode (knowledge_faq.go:1754-1772 @ v0.7.2, :1637 @ v0.6.2):
    ``Q: ...``, ``Similar Questions:`` and ``Answers:`` with ``- `` items; negative questions never."""
    out = f"Q: {entry.standard_question}\n"
    if entry.similar_questions:
        out += "Similar Questions:\n" + "".join(f"- {q}\n" for q in entry.similar_questions)
    if entry.answers:
        out += "Answers:\n" + "".join(f"- {a}\n" for a in entry.answers)
    return out


def _strings(value: Any) -> tuple[str, ...] | None:
    """``SanitizeStrings`` (internal/types/faq.go:147-168): trimmed, empty and repeated ones dropped.

    None if ``value`` is not a list of strings."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    out: list[str] = []
    for v in value:
        v = v.strip()
        if v and v not in out:
            out.append(v)
    return tuple(out)


def _faq_entry(rec: Any, where: str, line: int) -> tuple[str, FaqEntry] | list[Problem]:
    """The (id, entry) of one FAQ line, or the problems that make it unusable."""
    if not isinstance(rec, dict):
        return [Problem(where, line, None, "an FAQ line must be a JSON object")]
    problems: list[Problem] = []
    for key in ("id", "group", "standard_question"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            problems.append(Problem(where, line, key, f"{key} must be a non-empty string"))
    lists = {k: _strings(rec.get(k)) for k in ("similar_questions", "answers", "negative_questions")}
    for key, value in lists.items():
        if value is None:
            problems.append(Problem(where, line, key, f"{key} must be a list of strings"))
    if lists["answers"] == ():
        problems.append(Problem(where, line, "answers", "an FAQ entry needs at least one answer"))
    if problems:
        return problems
    entry = FaqEntry(group=rec["group"].strip(), standard_question=rec["standard_question"].strip(),
                     similar_questions=lists["similar_questions"] or (), answers=lists["answers"] or (),
                     negative_questions=lists["negative_questions"] or (), source=str(rec.get("source") or ""))
    return rec["id"].strip(), entry


def load_faq(path: str | Path) -> list[Chunk]:
    """The FAQ chunks of a ``faq.jsonl`` file (one entry a line: ``id``, ``group``, ``standard_question``,
    ``similar_questions``, ``answers``, optional ``negative_questions`` and ``source``), in file order.

    Each entry is one ``chunk_type: faq`` chunk: id = the entry id, knowledge id ``faq.<group>``,
    knowledge title the group, ``chunk_index`` 0 as WeKnora leaves it for FAQ chunks
    (knowledge_faq_import.go:1523 @ v0.7.2), content = :func:`_faq_chunk_content`. Raises
    :class:`InputError` naming every bad line (not JSON, a missing field, no answer, a repeated id).
    """
    p = Path(path)
    problems: list[Problem] = []
    chunks: list[Chunk] = []
    seen: set[str] = set()
    for n, raw in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            got = _faq_entry(json.loads(raw), str(p), n)
        except ValueError as exc:
            got = [Problem(str(p), n, None, f"not valid JSON: {exc}")]
        if isinstance(got, list):
            problems.extend(got)
            continue
        cid, entry = got
        if cid in seen:
            problems.append(Problem(str(p), n, "id", f"FAQ id {cid!r} is used twice"))
            continue
        seen.add(cid)
        chunks.append(Chunk(id=cid, knowledge_id=f"faq.{entry.group}", knowledge_title=entry.group, chunk_index=0,
                            content=_faq_chunk_content(entry), heading_path=(), start_at=0, end_at=0,
                            chunk_type="faq", faq=entry))
    if problems:
        raise InputError(p, problems)
    return chunks


def corpus_chunks(data_dir: str | Path) -> list[Chunk]:
    """The chunks of a data folder: its documents (``docs/``, :func:`chunk_corpus`), then its FAQ
    entries (``faq/faq.jsonl``, :func:`load_faq`) when the file exists."""
    d = Path(data_dir)
    chunks = chunk_corpus(d / "docs")
    faq = d / FAQ_FILE
    return chunks + load_faq(faq) if faq.is_file() else chunks
