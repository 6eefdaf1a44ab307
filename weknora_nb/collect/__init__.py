"""Collection: everything that talks HTTP to WeKnora or to an LLM.

- :mod:`.http`: how to reach WeKnora or an OpenAI-compatible service (client, retries, transport, secrets);
- :mod:`.run`: the collection of a run into a resumable run folder (:func:`collect`);
- :mod:`.judge`: the LLM judge of a run's answers;
- :mod:`.checks`: the integrity checks of a knowledge base, through the API and in its Postgres;
- :mod:`.history`: WeKnora's conversation history (``testset sample``).

Imports the core only. The names below are imported when first used, so that importing this package (or
one of its light modules, e.g. :mod:`.http.redact`) loads no HTTP or table library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> module that defines it
_EXPORTS = {
    "ClientSettings": "weknora_nb.collect.http.client",
    "WeKnoraClient": "weknora_nb.collect.http.client",
    "RunSummary": "weknora_nb.collect.run.results",
    "collect": "weknora_nb.collect.run.collector",
    "collect_async": "weknora_nb.collect.run.collector",
    "read_checkpoint": "weknora_nb.collect.run.checkpoint",
    "DEFAULT_STAGES": "weknora_nb.collect.run.stages",
    "Stage": "weknora_nb.collect.run.stages",
    "load_stage_file": "weknora_nb.collect.run.stages",
    "resolve_stages": "weknora_nb.collect.run.stages",
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only ("import X as X": a re-export)
    from weknora_nb.collect.http.client import ClientSettings as ClientSettings
    from weknora_nb.collect.http.client import WeKnoraClient as WeKnoraClient
    from weknora_nb.collect.run.checkpoint import read_checkpoint as read_checkpoint
    from weknora_nb.collect.run.collector import collect as collect
    from weknora_nb.collect.run.collector import collect_async as collect_async
    from weknora_nb.collect.run.results import RunSummary as RunSummary
    from weknora_nb.collect.run.stages import DEFAULT_STAGES as DEFAULT_STAGES
    from weknora_nb.collect.run.stages import Stage as Stage
    from weknora_nb.collect.run.stages import load_stage_file as load_stage_file
    from weknora_nb.collect.run.stages import resolve_stages as resolve_stages


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'weknora_nb.collect' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
