"""Labelling pooled chunks in the notebook (docs/method.md section 10), one candidate at a time.

The input is a judging worksheet (``weknora-nb testset pool``: a CSV with the columns
``query_id, query, chunk_id, knowledge_title, content, found_in, best_rank, grade, assessor,
note``, UTF-8 with or without a BOM) or the same table as a DataFrame; the output is a labels
log (:class:`weknora_nb.core.labels.LabelsLog`), one JSON line per judgement.

:class:`LabellingSession` is the Python API, and the widget's buttons and keys call nothing
else: ``grade(g)`` appends the judgement to the log (flushed and fsynced before it returns)
and moves on, ``skip()`` appends a judgement without a grade, ``back()`` returns to the
previous candidate, whose new grade is appended and wins (:func:`~weknora_nb.core.labels.latest`).
Nothing is buffered, so a crash, a killed kernel or a closed tab loses no judgement the
assessor saw accepted; a new session on the same log starts at the first candidate this
assessor has not judged yet.

The widget (:meth:`LabellingSession.widget`) shows the query, one candidate chunk with its
title (every text escaped, then the query's terms marked), grade buttons 0-3 named by the
method's meanings, Skip, Back and the progress. Keys while the mouse pointer is over the
panel: ``0``-``3`` grade, ``s`` skip, ``b`` or Backspace back. Its parts carry stable CSS
classes (``wk-labelling``, ``wk-query``, ``wk-chunk``, ``wk-status``, ``wk-progress``,
``wk-progress-text``, ``wk-grade-0`` ... ``wk-grade-3``, ``wk-skip``, ``wk-back``, ``wk-help``).
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.core.errors import InputError, Problem, UsageError, WeknoraNbError, reading
from weknora_nb.core.labels import GRADES, LabelsLog, latest

if TYPE_CHECKING:
    import pandas as pd


log = logging.getLogger(__name__)

#: what each grade means (docs/method.md section 1), as the buttons say it
GRADE_MEANINGS = {0: "not relevant", 1: "partly relevant", 2: "highly relevant", 3: "fully relevant"}
#: what each grade asks of the chunk, shown as the buttons' tooltips
GRADE_HINTS = {0: "off topic, or only shares words with the query", 1: "on topic, but does not answer",
               2: "holds the core of the answer", 3: "answers the question"}
#: keyboard shortcuts (``KeyboardEvent.key``) -> action
KEYS = {"0": "grade 0", "1": "grade 1", "2": "grade 2", "3": "grade 3", "s": "skip", "b": "back", "Backspace": "back"}
KEY_HELP = ("Keys (while the mouse pointer is over this panel): <b>0</b>-<b>3</b> grade, <b>s</b> skip, "
            "<b>b</b> or <b>Backspace</b> back. Every grade is saved to the labels log at once.")

REQUIRED = ("query_id", "query", "chunk_id", "content")
_WORD = re.compile(r"[0-9A-Za-z]+")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_ENTITY = r"&(?:#[0-9]+|#x[0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);"


@dataclass(frozen=True)
class Item:
    """One candidate to judge: a worksheet row (every field as text, "" when empty)."""

    query_id: str
    query: str
    chunk_id: str
    content: str
    title: str = ""
    found_in: str = ""
    best_rank: str = ""
    note: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.query_id, self.chunk_id


@dataclass(frozen=True)
class Progress:
    """How far an assessor is: ``done`` of ``total`` candidates judged (``skipped`` of them without a
    grade), and per query id (in worksheet order) ``(done, total)``."""

    done: int
    total: int
    skipped: int
    per_query: dict[str, tuple[int, int]]

    @property
    def graded(self) -> int:
        return self.done - self.skipped

    def table(self) -> pd.DataFrame:
        """Per query: candidates judged and candidates in all, in worksheet order."""
        import pandas as pd

        return pd.DataFrame([(q, d, t) for q, (d, t) in self.per_query.items()],
                            columns=["query_id", "judged", "candidates"])

    def __str__(self) -> str:
        queries = sum(d == t for d, t in self.per_query.values())
        return (f"{self.done} of {self.total} judged ({self.skipped} skipped); "
                f"{queries} of {len(self.per_query)} queries complete")


def read_worksheet(source: pd.DataFrame | str | Path) -> list[Item]:
    """The candidates of a judging worksheet (a CSV path or a DataFrame), in its order.

    A (query, chunk) pair listed twice is kept once. Raises :class:`InputError` naming the
    file, row and column for a missing column or an empty query id, query or chunk id.
    """
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        name, df = "<worksheet>", source.astype(object).where(source.notna(), "").astype(str)
    else:
        name = str(source)
        with reading(source):
            df = pd.read_csv(source, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(name, [Problem(name, None, c, "missing column (a worksheet of `weknora-nb testset pool` "
                                        "has it)") for c in missing])
    problems: list[Problem] = []
    items: dict[tuple[str, str], Item] = {}
    for row, rec in enumerate(df.to_dict("records"), start=1):
        blank = [c for c in ("query_id", "query", "chunk_id") if not str(rec[c]).strip()]
        problems += [Problem(name, row, c, "must not be empty", where="row") for c in blank]
        if blank:
            continue
        item = Item(str(rec["query_id"]).strip(), str(rec["query"]), str(rec["chunk_id"]).strip(),
                    str(rec["content"]), str(rec.get("knowledge_title", "")), str(rec.get("found_in", "")),
                    str(rec.get("best_rank", "")), str(rec.get("note", "")))
        items.setdefault(item.key, item)
    if problems:
        raise InputError(name, problems)
    if len(items) < len(df):
        log.warning("%s: %d duplicate (query, chunk) row(s) kept once", name, len(df) - len(items))
    return list(items.values())


def query_terms(query: str) -> list[str]:
    """The terms of ``query`` to mark in a chunk: its Latin words and numbers of two characters or more
    (lower case; marking ignores case) and the character bigrams of its Chinese runs (a lone letter or
    Chinese character is too common to mark)."""
    terms = [w.lower() for w in _WORD.findall(query) if len(w) > 1]
    for run in _CJK_RUN.findall(query):
        terms += [run[i:i + 2] for i in range(len(run) - 1)]
    return list(dict.fromkeys(terms))


def highlight(text: str, terms: Iterable[str]) -> str:
    """``text`` escaped for HTML, then every occurrence of ``terms`` wrapped in ``<mark>``.

    Escaping comes first, so the text can never inject markup; the marks skip the entities
    escaping made (``&lt;`` stays whole), and longer terms win over the shorter ones they hold.
    """
    escaped = html.escape(text, quote=True)
    words = sorted({html.escape(t) for t in terms if t}, key=len, reverse=True)
    if not words:
        return escaped
    pattern = re.compile(f"({_ENTITY})|({'|'.join(map(re.escape, words))})", re.IGNORECASE)
    marked = pattern.sub(lambda m: m.group(1) or f"<mark>{m.group(2)}</mark>", escaped)
    return marked.replace("</mark><mark>", "")


class LabellingSession:
    """One assessor judging the candidates of a worksheet into a labels log.

    ``worksheet``: a worksheet CSV path or DataFrame (:func:`read_worksheet`); ``log``: a
    :class:`LabelsLog` or its path; ``assessor``: a name or initials (needed for agreement).
    The session starts at the first candidate this assessor has not judged in the log.
    """

    def __init__(self, worksheet: pd.DataFrame | str | Path, log: LabelsLog | str | Path, assessor: str):
        if not str(assessor).strip():
            raise UsageError("an assessor id is needed (a name or initials): set `assessor` in the parameters cell")
        self.items = read_worksheet(worksheet)
        self.log = log if isinstance(log, LabelsLog) else LabelsLog(log)
        self.assessor = str(assessor).strip()
        keys = {it.key for it in self.items}
        self._judged: dict[tuple[str, str], int | None] = {
            (j.query_id, j.chunk_id): j.grade for j in latest(self.log.read())
            if j.assessor == self.assessor and (j.query_id, j.chunk_id) in keys}
        self._index = self._next_unjudged(-1)
        self.ui: LabellingWidget | None = None

    @property
    def index(self) -> int:
        """The position of :attr:`current` in the worksheet (``len(items)`` past the end)."""
        return self._index

    @property
    def current(self) -> Item | None:
        """The candidate shown now; None when the session is past the last one."""
        return self.items[self._index] if self._index < len(self.items) else None

    def earlier(self, item: Item | None = None) -> tuple[bool, int | None]:
        """Whether this assessor judged ``item`` (default: :attr:`current`) already, and the grade (None: skipped)."""
        item = item or self.current
        if item is None or item.key not in self._judged:
            return False, None
        return True, self._judged[item.key]

    def grade(self, g: int) -> None:
        """Grade the current candidate ``g`` (0-3): appended to the log (on disk on return), then move on."""
        if g not in GRADES or isinstance(g, bool):
            raise UsageError(argument="grade", allowed=list(GRADES), got=g)
        self._judge(g)

    def skip(self) -> None:
        """Leave the current candidate without a grade (a judgement with grade None), then move on."""
        self._judge(None)

    def back(self) -> bool:
        """Return to the previous candidate (False at the first one); grading it again appends a line that wins."""
        if self._index == 0:
            return False
        self._index = min(self._index, len(self.items)) - 1
        return True

    @property
    def done(self) -> bool:
        """True when every candidate carries a judgement of this assessor (skips included)."""
        return len(self._judged) == len(self.items)

    @property
    def progress(self) -> Progress:
        """Candidates judged / total, skips, and per query."""
        per: dict[str, tuple[int, int]] = {}
        for it in self.items:
            d, t = per.get(it.query_id, (0, 0))
            per[it.query_id] = (d + (it.key in self._judged), t + 1)
        skipped = sum(g is None for g in self._judged.values())
        return Progress(len(self._judged), len(self.items), skipped, per)

    def widget(self) -> Any:
        """The labelling panel (an ipywidgets VBox) over this session; kept as :attr:`ui`."""
        self.ui = LabellingWidget(self)
        return self.ui.container

    def _judge(self, g: int | None) -> None:
        item = self.current
        if item is None:
            raise UsageError("every candidate has been judged: nothing is shown to grade (press Back to revise one)")
        self.log.append(item.query_id, item.chunk_id, g, assessor=self.assessor)
        self._judged[item.key] = g
        self._index = self._next_unjudged(self._index)

    def _next_unjudged(self, after: int) -> int:
        """The first unjudged candidate after position ``after``, else the first anywhere, else the end."""
        n = len(self.items)
        for i in [*range(after + 1, n), *range(0, min(after + 1, n))]:
            if self.items[i].key not in self._judged:
                return i
        return n


class LabellingWidget:
    """The ipywidgets panel of a :class:`LabellingSession`: every button and key calls the session's API."""

    def __init__(self, session: LabellingSession):
        import ipywidgets as w
        from ipyevents import Event

        self.session = session
        self.progress_bar = w.IntProgress(min=0, max=max(len(session.items), 1), description="judged")
        self.progress_text = w.HTML()
        self.query = w.HTML()
        self.chunk = w.HTML()
        self.status = w.HTML()
        self.help = w.HTML(KEY_HELP)
        self.buttons = {g: w.Button(description=f"{g} {GRADE_MEANINGS[g]}", tooltip=f"key {g}: {GRADE_HINTS[g]}",
                                    layout=w.Layout(width="auto")) for g in GRADES}
        self.skip_button = w.Button(description="Skip (s)", tooltip="key s: judge later; saved without a grade")
        self.back_button = w.Button(description="Back (b)", tooltip="key b or Backspace: the previous candidate")
        for g, b in self.buttons.items():
            b.add_class("wk-grade").add_class(f"wk-grade-{g}")
            b.on_click(lambda _b, g=g: self._act(lambda: self.session.grade(g)))
        self.skip_button.add_class("wk-skip").on_click(lambda _b: self._act(self.session.skip))
        self.back_button.add_class("wk-back").on_click(lambda _b: self._act(self.session.back))
        parts = [(self.progress_bar, "wk-progress"), (self.progress_text, "wk-progress-text"),
                 (self.query, "wk-query"), (self.chunk, "wk-chunk"), (self.status, "wk-status"), (self.help, "wk-help")]
        for part, css in parts:
            part.add_class(css)
        controls = w.HBox([*self.buttons.values(), self.skip_button, self.back_button])
        self.container = w.VBox([self.progress_bar, self.progress_text, self.query, self.chunk, controls,
                                 self.status, self.help]).add_class("wk-labelling")
        self.events = Event(source=self.container, watched_events=["keydown"])
        self.events.on_dom_event(self.on_key)
        self.refresh()

    def on_key(self, event: dict[str, Any]) -> None:
        """A key pressed over the panel: ``0``-``3``, ``s``, ``b`` / Backspace (others are ignored)."""
        action = KEYS.get(str(event.get("key", "")))
        if action is None or event.get("ctrlKey") or event.get("metaKey") or event.get("altKey"):
            return
        if action.startswith("grade "):
            g = int(action.split()[1])
            self._act(lambda: self.session.grade(g))
        else:
            self._act(self.session.skip if action == "skip" else self.session.back)

    def _act(self, action: Callable[[], object]) -> None:
        """Run one session action and show its outcome; an error of ours (a full disk ...) is shown, not lost."""
        try:
            action()
        except WeknoraNbError as exc:
            log.error("labelling: %s", exc)
            self.refresh(error=str(exc))
            return
        self.refresh()

    def refresh(self, error: str | None = None) -> None:
        """Show the session's current candidate, progress and status."""
        s, item = self.session, self.session.current
        p = s.progress
        self.progress_bar.value = p.done
        position = f"candidate {s.index + 1} of {p.total} · " if item is not None else ""
        self.progress_text.value = f"<span class='wk-progress-line'>{html.escape(position + str(p))}</span>"
        for b in self.buttons.values():
            b.disabled = item is None
            b.button_style = ""
        self.skip_button.disabled = item is None
        self.back_button.disabled = s.index == 0
        if item is None:
            self.query.value = ""
            self.chunk.value = ""
            self.status.value = (f"<b>All {p.total} candidates judged</b> ({p.skipped} skipped); the labels are in "
                                 f"<code>{html.escape(str(s.log.path))}</code>. Back revises the last ones.")
        else:
            self.query.value = render_query(item)
            self.chunk.value = render_chunk(item)
            self.status.value = self._status(item)
        if error is not None:
            self.status.value = f"<span class='wk-error' style='color:#b00020'>{html.escape(error)}</span>"

    def _status(self, item: Item) -> str:
        seen, g = self.session.earlier(item)
        if not seen:
            return "<span class='wk-new'>Not judged yet.</span>"
        if g is None:
            return "<span class='wk-earlier'>You skipped this one before; a grade now replaces the skip.</span>"
        self.buttons[g].button_style = "info"
        return (f"<span class='wk-earlier'>You graded this {g} ({GRADE_MEANINGS[g]}) before; "
                "a new grade replaces it.</span>")


def render_query(item: Item) -> str:
    """The query as HTML (escaped), with its id."""
    return (f"<div><b>Query</b> <code>{html.escape(item.query_id)}</code>: "
            f"<span class='wk-query-text' style='font-size:1.15em'>{html.escape(item.query)}</span></div>")


def render_chunk(item: Item) -> str:
    """The candidate chunk as HTML: title, id, where it was found, its text escaped with the query's terms marked."""
    found = f" · found in {html.escape(item.found_in)}" if item.found_in else ""
    rank = f" · best rank {html.escape(item.best_rank)}" if item.best_rank else ""
    note = f"<div class='wk-note'><i>{html.escape(item.note)}</i></div>" if item.note else ""
    return (f"<div class='wk-chunk-head'><b class='wk-title'>{html.escape(item.title or '(no title)')}</b> "
            f"<code class='wk-chunk-id'>{html.escape(item.chunk_id)}</code>{found}{rank}</div>{note}"
            "<div class='wk-chunk-text' style='white-space:pre-wrap;border:1px solid #ccc;padding:0.5em;"
            f"max-height:28em;overflow:auto'>{highlight(item.content, query_terms(item.query))}</div>")
