"""The arguments of a collection, checked before anything is asked of the server or written.

:func:`checked_arguments` refuses the first argument that is not allowed (a :class:`UsageError` naming its
command-line option) and normalises the others into :class:`Arguments`, which every step of the collection
reads. The stages are fitted to the knowledge bases' types once the server has said what they are (the
collector's ``_fit_stages``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.collect.run.stages import DEFAULT_SELECTION, Stage, resolve_stages
from weknora_nb.core.errors import UsageError
from weknora_nb.core.weknora import UI_CHAT_AGENT

#: what ``--chat-agent`` takes to send no ``agent_id``
NO_AGENT = "none"


@dataclass(frozen=True)
class Arguments:
    """The checked arguments of a collection (``stages`` fitted to the knowledge bases once known)."""

    settings: ClientSettings
    kb_ids: list[str]
    stages: list[Stage]
    repeats: int
    concurrency: int
    warmup: int
    default_stages: bool = False  # no stages were asked for: the defaults, fitted to the knowledge bases
    faq_kb_ids: tuple[str, ...] = ()  # the knowledge bases of type faq (searched by faq-search stages)
    session_title: str = "weknora-nb"  # the title of the chat sessions the run creates
    chat_agent: str | None = UI_CHAT_AGENT  # the agent chat stages name (None: none, config.yaml's settings)
    vector_retrieval: bool = True  # some knowledge base has vector retrieval (C49 indexing_strategy)


def checked_arguments(settings: ClientSettings, kb_ids: list[str] | str,
                      stages: str | Sequence[str | Stage] | None, repeats: int, concurrency: int,
                      warmup: int, out: str | Path, chat_agent: str | None = UI_CHAT_AGENT) -> Arguments:
    """The arguments checked and normalised; :class:`UsageError` names the first one that is not allowed.
    ``chat_agent``: an agent id, or :data:`NO_AGENT` (or None) for none."""
    _check_out(Path(out))
    for argument, value, minimum in (("--repeats", repeats, 1), ("--concurrency", concurrency, 1),
                                     ("--warmup", warmup, 0)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
            raise UsageError(argument=argument, allowed=f">= {minimum}", got=value)
    ids = [kb_ids] if isinstance(kb_ids, str) else list(kb_ids)
    if not ids or not all(isinstance(k, str) and k for k in ids):
        raise UsageError(argument="--kb-id", allowed="one or more non-empty knowledge base ids", got=kb_ids)
    if chat_agent is not None and (not isinstance(chat_agent, str) or not chat_agent.strip()):
        raise UsageError(argument="--chat-agent", allowed=f"an agent id (e.g. {UI_CHAT_AGENT}) or {NO_AGENT!r}",
                         got=chat_agent)
    agent = None if chat_agent is None or chat_agent.strip().lower() == NO_AGENT else chat_agent.strip()
    chosen = resolve_stages(DEFAULT_SELECTION if stages is None else stages)
    return Arguments(settings, ids, chosen, int(repeats), int(concurrency), int(warmup),
                     default_stages=stages is None, chat_agent=agent)


def _check_out(out: Path) -> None:
    """:class:`UsageError` (``--out``) when the run folder, or the nearest of its parents that exists, is a file."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == out else f" inside {path}"
                raise UsageError(f"--out must name a run folder{where}, but {path} is a file; "
                                 "choose a folder, e.g. outputs/runs/NAME")
            return
