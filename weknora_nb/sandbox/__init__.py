"""The embedded sandbox: a small real retrieval system that speaks WeKnora's HTTP API."""

from weknora_nb.sandbox.chunking import Chunk, chunk_corpus, chunk_markdown
from weknora_nb.sandbox.engine import ModelMissingError, RetrievalEngine, SandboxIndex, VersionConfig, load_versions
from weknora_nb.sandbox.runner import DEFAULT_KB_ID, SandboxServer, build_index, demo_dir, load_demo_versions
from weknora_nb.sandbox.server import FaultConfig, SandboxApp, create_app

__all__ = ["Chunk", "DEFAULT_KB_ID", "FaultConfig", "ModelMissingError", "RetrievalEngine", "SandboxApp",
           "SandboxIndex", "SandboxServer", "VersionConfig", "build_index", "chunk_corpus", "chunk_markdown",
           "create_app", "demo_dir", "load_demo_versions", "load_versions"]
