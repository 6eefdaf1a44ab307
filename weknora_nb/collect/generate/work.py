"""The calls of a generation, each through the judge's machinery, each finished one a record of the log.

- :meth:`Worker.write`: a task's question (the ``generate-v1`` prompt, the task's passages, its type), then
  :meth:`Worker.check`: whether its passages answer it (``answerable-v1``, at temperature 0: a check, not a draw).
  Both are :class:`~weknora_nb.collect.judge.calls.Ask` requests of an
  :class:`~weknora_nb.collect.judge.calls.Asker`: the cache first, the cost limit, the strict reading with its
  retries; a reply that stays invalid, or a request that fails after the client's retries (a 429 included), is a
  record ``failed`` with its kind, never a question.
- :meth:`Worker.search`: the round trip: hybrid-search of the question on the knowledge base (both paths merged,
  ``match_count`` = depth K, WeKnora's parameters as the ``hybrid`` stage sends them), the first K distinct chunk
  ids among its search hits (match types 0 and 1), and the rank of the source chunk among them (None: a miss).
  A failed search is a record ``failed`` with the request's kind, never a miss.

Every record: ``kind``, ``key`` (``generate``: the task's key; ``check``: the request's cache key; ``search``: the
sha256 of the knowledge base, the depth, the source chunk and the question), ``status``, what was found or the
failure's ``failure`` kind, ``error`` and ``raw`` reply, and, for calls, the ledger (``calls``, ``cost``,
``cached``, ``model``) as the judge writes it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from weknora_nb.collect.generate.prompts import (
    ANSWERABLE_VERSION,
    GENERATE_VERSION,
    TYPE_NAMES,
    neutralise,
    parse_answerable,
    parse_questions,
    passages,
)
from weknora_nb.collect.http.client import WeKnoraClient
from weknora_nb.collect.judge.calls import Answered, Ask, Asker, cache_key
from weknora_nb.collect.judge.llm import LLMSettings
from weknora_nb.collect.judge.manifest import now
from weknora_nb.collect.judge.options import JudgeOptions
from weknora_nb.collect.judge.prompts import Prompt
from weknora_nb.collect.judge.store import JudgementLog, Key
from weknora_nb.collect.run.stages import PRIMARY_MATCH_TYPES, Stage
from weknora_nb.core.errors import AuthFailed, RequestFailed
from weknora_nb.core.synthetic import Task


class Worker:
    """Makes the calls of a generation and logs each (module docstring). ``done`` holds the records by key (those of
    the log, and those written since); ``texts`` the chunks' texts by id."""

    def __init__(self, settings: LLMSettings | None, calls: JudgeOptions, prompts: Mapping[str, Prompt],
                 texts: Mapping[str, str], kb_id: str, depth: int, log: JudgementLog | None,
                 done: dict[Key, dict[str, Any]]):
        self.settings, self.calls, self.prompts, self.texts = settings, calls, prompts, texts
        self.kb_id, self.depth, self.log, self.done = kb_id, depth, log, done
        self.stage = Stage("round-trip", "hybrid-search", {"match_count": depth})
        self.writer: Asker | None = None
        self.checker: Asker | None = None
        self.weknora: WeKnoraClient | None = None

    # -- the requests ------------------------------------------------------------------------
    def write_ask(self, task: Task) -> Ask:
        """The request writing ``task``'s question."""
        lang, prompt = task.language, self.prompts[GENERATE_VERSION]
        messages = prompt.render(question_type=TYPE_NAMES[lang][task.question_type],
                                 passages=passages([self.texts[c] for c in task.chunk_ids], lang))
        return Ask(cache_key(self.settings, self.calls, prompt, 1, self.calls.seed, messages), messages,
                   self.calls.seed, lang, lambda text: parse_questions(text, lang))

    def check_ask(self, task: Task, question: str) -> Ask:
        """The request asking whether ``task``'s passages answer ``question`` (temperature 0)."""
        lang, prompt = task.language, self.prompts[ANSWERABLE_VERSION]
        messages = prompt.render(passages=passages([self.texts[c] for c in task.chunk_ids], lang),
                                 question=neutralise(question))
        return Ask(cache_key(self.settings, replace(self.calls, temperature=0.0), prompt, 1, self.calls.seed,
                             messages), messages, self.calls.seed, lang, parse_answerable)

    def search_key(self, task: Task, question: str) -> str:
        blob = [self.kb_id, self.depth, task.source, question]
        return hashlib.sha256(json.dumps(blob, ensure_ascii=False).encode("utf-8")).hexdigest()

    # -- the calls ---------------------------------------------------------------------------
    async def write(self, task: Task) -> None:
        """``task``'s question (unless the log holds it), then its check (unless the log holds that)."""
        record = self.done.get(("generate", task.key, 0, 0))
        if record is None:
            assert self.writer is not None
            got = await self.writer.ask(self.write_ask(task))
            body = {"question": got.value[0]["question"], "answer": got.value[0]["answer"]} if got.ok else {}
            record = await self._keep("generate", task.key, got, {"task": task.to_dict(), **body})
        if record["status"] == "ok":
            await self.check(task, record["question"])

    async def check(self, task: Task, question: str) -> None:
        ask = self.check_ask(task, question)
        if ("check", ask.cache_key, 0, 0) in self.done:
            return
        assert self.checker is not None
        got = await self.checker.ask(ask)
        await self._keep("check", ask.cache_key, got, {"question": question, **(got.value if got.ok else {})})

    async def search(self, task: Task, question: str) -> None:
        """The round trip of ``question`` (module docstring), unless the log holds it."""
        key = self.search_key(task, question)
        if ("search", key, 0, 0) in self.done:
            return
        assert self.weknora is not None
        rec: dict[str, Any] = {"kind": "search", "key": key, "question": question, "source": task.source,
                               "depth": self.depth}
        t0 = time.perf_counter()
        try:
            items = await self.weknora.hybrid_search(self.kb_id, question, **self.stage.request_params())
        except AuthFailed:
            raise
        except RequestFailed as exc:
            rec.update(status="failed", failure=exc.kind, error=str(exc)[:500])
        else:
            ids = list(dict.fromkeys(str(it.get("id", "")) for it in items
                                     if _int(it.get("match_type")) in (None, *PRIMARY_MATCH_TYPES)))[:self.depth]
            rank = ids.index(task.source) + 1 if task.source in ids else None
            rec.update(status="ok", rank=rank, hit=rank is not None, returned=ids)
        rec.update(latency_ms=round((time.perf_counter() - t0) * 1000, 3), at=now())
        await self._append(rec)

    async def _keep(self, kind: str, key: str, got: Answered, body: dict[str, Any]) -> dict[str, Any]:
        """The record of an :class:`Answered` (its ledger as the judge writes it), appended to the log."""
        rec: dict[str, Any] = {"kind": kind, "key": key, "status": "ok" if got.ok else "failed", **body}
        if not got.ok:
            rec.update(failure=got.kind, error=got.error)
            if got.raw is not None:
                rec["raw"] = got.raw
        rec.update(cached=got.cached, calls=got.calls, cost=sum(c["cost"] for c in got.calls), model=got.model,
                   at=now())
        await self._append(rec)
        return rec

    async def _append(self, rec: dict[str, Any]) -> None:
        if self.log is not None:
            await self.log.append(rec)
        self.done[(rec["kind"], rec["key"], 0, 0)] = rec


def _int(x: Any) -> int | None:
    """A match type as an integer (``0``, ``1.0``, ``"1"``), else None."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return int(value) if value.is_integer() else None
