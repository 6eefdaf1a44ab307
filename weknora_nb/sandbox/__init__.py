"""The embedded sandbox: a small real retrieval system that speaks WeKnora's HTTP API.

The names below are imported when first used, so that reading a light module of the sandbox
(``weknora_nb.sandbox.emulation``, for the CLI's ``--weknora-version`` choices) loads neither the
models, Postgres nor the HTTP server. Inside the sandbox, modules import each other by their own module
names, never these. A name whose module needs the ``sandbox`` extra says so when that extra is not installed
(:class:`~weknora_nb.core.extras.MissingExtra`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> module that defines it
_EXPORTS = {
    "Chunk": "weknora_nb.sandbox.chunking", "chunk_corpus": "weknora_nb.sandbox.chunking",
    "chunk_markdown": "weknora_nb.sandbox.chunking",
    "VersionConfig": "weknora_nb.sandbox.versions", "load_versions": "weknora_nb.sandbox.versions",
    "ModelMissingError": "weknora_nb.sandbox.embedders", "SandboxIndex": "weknora_nb.sandbox.index",
    "RetrievalEngine": "weknora_nb.sandbox.engine", "NegativeMatchCount": "weknora_nb.sandbox.engine",
    "PipelineSettings": "weknora_nb.sandbox.pipeline", "CONVERSATION_SETTINGS": "weknora_nb.sandbox.pipeline",
    "DEFAULT_KB_ID": "weknora_nb.sandbox.runner", "DEFAULT_FAQ_KB_ID": "weknora_nb.sandbox.runner",
    "SandboxServer": "weknora_nb.sandbox.runner",
    "build_index": "weknora_nb.sandbox.runner", "demo_dir": "weknora_nb.sandbox.runner",
    "load_demo_versions": "weknora_nb.sandbox.runner",
    "FaultConfig": "weknora_nb.sandbox.faults", "SandboxApp": "weknora_nb.sandbox.server",
    "create_app": "weknora_nb.sandbox.server",
    "WeKnoraRelease": "weknora_nb.sandbox.emulation", "RELEASES": "weknora_nb.sandbox.emulation",
    "DEFAULT_RELEASE": "weknora_nb.sandbox.emulation",
}

__all__ = ["CONVERSATION_SETTINGS", "Chunk", "DEFAULT_FAQ_KB_ID", "DEFAULT_KB_ID", "DEFAULT_RELEASE", "FaultConfig",
           "ModelMissingError", "NegativeMatchCount", "PipelineSettings", "RELEASES", "RetrievalEngine", "SandboxApp",
           "SandboxIndex", "SandboxServer", "VersionConfig", "WeKnoraRelease", "build_index", "chunk_corpus",
           "chunk_markdown", "create_app", "demo_dir", "load_demo_versions", "load_versions"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from weknora_nb.sandbox.chunking import Chunk, chunk_corpus, chunk_markdown
    from weknora_nb.sandbox.embedders import ModelMissingError
    from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES, WeKnoraRelease
    from weknora_nb.sandbox.engine import NegativeMatchCount, RetrievalEngine
    from weknora_nb.sandbox.faults import FaultConfig
    from weknora_nb.sandbox.index import SandboxIndex
    from weknora_nb.sandbox.pipeline import CONVERSATION_SETTINGS, PipelineSettings
    from weknora_nb.sandbox.runner import (
        DEFAULT_FAQ_KB_ID,
        DEFAULT_KB_ID,
        SandboxServer,
        build_index,
        demo_dir,
        load_demo_versions,
    )
    from weknora_nb.sandbox.server import SandboxApp, create_app
    from weknora_nb.sandbox.versions import VersionConfig, load_versions


#: the light modules, which need no extra
_LIGHT = {"weknora_nb.sandbox.emulation", "weknora_nb.sandbox.chunking", "weknora_nb.sandbox.versions"}


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    if name in _EXPORTS:
        if _EXPORTS[name] not in _LIGHT:
            from weknora_nb.core.extras import require

            require("sandbox", f"weknora_nb.sandbox.{name}")
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'weknora_nb.sandbox' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
