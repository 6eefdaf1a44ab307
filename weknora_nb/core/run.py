"""The run folder: what a collection writes, and a run loaded and scored.

A run folder (``outputs/runs/<name>/``) holds:

=================== ==============================================================
``manifest.json``   what was run against what (never a key), stages and their
                    definitions, what the server said (``server``,
                    ``knowledge_bases``, ``retrieval_config`` raw and effective),
                    the system description, sessions, notes, counts and times
``checkpoint.jsonl`` one line per finished request (the resumable record)
``results.parquet`` the results table (:mod:`weknora_nb.core.results`)
``chunks.parquet``  the knowledge base's chunk inventory (ids, positions, content)
``answers.jsonl``   chat answers and their inline citations (``citations`` stage)
=================== ==============================================================

::

    run = load_run("outputs/runs/rerank", metrics=["ndcg@5"], domain_adjustment=0.05)
    run.scores.summary_wide()        # stages x metrics
    run.focus_stage()                # "final" when the run has it
    run.inventory()                  # the chunk listing, or None
    run.effective_retrieval_config   # the settings knowledge-search ran with (C30)
    run.settings_source("citations") # "server conversation config"
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from weknora_nb.core.errors import NotComparableError, RunFolderError, UsageError
from weknora_nb.core.pipeline import focus_stage
from weknora_nb.core.results import read_results
from weknora_nb.core.scoring import Scores, score
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.core.weknora import SETTINGS_SOURCES, effective_retrieval_config

__all__ = ["MANIFEST", "CHECKPOINT", "RESULTS", "CHUNKS", "ANSWERS", "Run", "load_run", "read_manifest",
           "iter_runs", "flatten"]

MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint.jsonl"
RESULTS = "results.parquet"
CHUNKS = "chunks.parquet"
ANSWERS = "answers.jsonl"


@dataclass
class Run:
    """A run folder, loaded: manifest, results table, its test set and its scores."""

    path: Path
    manifest: dict[str, Any]
    results: pd.DataFrame
    testset: TestSet
    scores: Scores

    @property
    def name(self) -> str:
        return str(self.manifest.get("run_name") or self.path.name)

    @property
    def stages(self) -> list[str]:
        return self.scores.stages

    @property
    def stage_definitions(self) -> dict[str, dict[str, Any]]:
        """Each stage's definition as collected (endpoint, parameters), from the manifest."""
        return dict(self.manifest.get("stages") or {})

    @property
    def retrieval_config(self) -> dict[str, Any] | None:
        """The tenant retrieval configuration as read from the server at collection time (zeros when the
        tenant never saved one, docs/weknora-contract.md C57); None when it could not be read."""
        recorded = self.manifest.get("retrieval_config")
        if not isinstance(recorded, dict):
            return None
        if _is_split(recorded):
            return recorded.get("raw")
        return None if "unavailable" in recorded else recorded

    @property
    def effective_retrieval_config(self) -> dict[str, Any] | None:
        """The settings knowledge-search ran with: the manifest's ``retrieval_config.effective``, or for a
        manifest that holds only the config as read, :func:`~weknora_nb.core.weknora.effective_retrieval_config`
        of it (C30: zeros mean the defaults). None when the config could not be read."""
        recorded = self.manifest.get("retrieval_config")
        if isinstance(recorded, dict) and _is_split(recorded):
            return recorded.get("effective")
        raw = self.retrieval_config
        return effective_retrieval_config(raw) if raw is not None else None

    @property
    def server(self) -> dict[str, Any] | None:
        """What ``GET /api/v1/system/info`` said (``version``, engines, C56), ``{"error": ...}`` when it
        could not be read, None for a run collected before it was recorded."""
        return self.manifest.get("server")

    @property
    def knowledge_bases(self) -> dict[str, dict[str, Any]]:
        """Each knowledge base's configuration as the server gave it (``type``, ``chunking_config``,
        ``embedding_model_id``, ``indexing_strategy``, ..., C49), by id; empty when not recorded."""
        return dict(self.manifest.get("knowledge_bases") or {})

    @property
    def sessions(self) -> dict[str, Any] | None:
        """The chat sessions of the run: ``{"created", "deleted", "kept"}``; None when not recorded."""
        return self.manifest.get("sessions")

    @property
    def notes(self) -> list[str]:
        """What a reader of the figures must know, as the collector recorded it (stages dropped, settings
        that differ between stages, content that was escaped, ...)."""
        return list(self.manifest.get("notes") or [])

    def settings_source(self, stage: str) -> str | None:
        """Where ``stage``'s retrieval settings came from: ``"request"`` (hybrid-search, FAQ search),
        ``"tenant retrieval config"`` (knowledge-search), ``"server conversation config"`` (chat, C66);
        read from the manifest, else from the stage's endpoint; None for a stage of unknown endpoint."""
        definition = self.stage_definitions.get(stage) or {}
        recorded = definition.get("settings_source")
        return str(recorded) if recorded else SETTINGS_SOURCES.get(str(definition.get("endpoint")))

    def focus_stage(self, requested: str | None = None) -> str:
        """The stage to look at (:func:`weknora_nb.core.pipeline.focus_stage`): ``requested``,
        else ``final`` when present, else the stage furthest down the pipeline.

        Raises :class:`UsageError` naming the stages present when ``requested`` is not one of them.
        """
        chosen = focus_stage(self.stages, requested, self.stage_definitions)
        if chosen is None:
            raise UsageError(argument="stage", allowed=self.stages, got=requested)
        return chosen

    def inventory(self) -> pd.DataFrame | None:
        """The knowledge base's chunk listing recorded with the run, or None when it was not fetched."""
        p = self.path / CHUNKS
        return pd.read_parquet(p) if p.exists() else None


def _is_split(recorded: dict[str, Any]) -> bool:
    """Whether a manifest's ``retrieval_config`` is the ``{"raw", "effective"}`` pair (else the config as read)."""
    return "raw" in recorded and "effective" in recorded


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the run folder ``path``; :class:`RunFolderError` when there is none or it is damaged."""
    p = Path(path)
    mpath = p / MANIFEST
    if not mpath.is_file():
        raise RunFolderError(f"{p} is not a run folder (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{mpath} cannot be read: {exc}") from exc
    if not isinstance(manifest, dict):
        raise RunFolderError(f"{mpath} is not a JSON object")
    return manifest


def load_run(path: str | Path, *, testset: TestSet | str | Path | None = None,
             metrics: Iterable[str] | None = None, domain_adjustment: float = 0.0) -> Run:
    """Load a run folder and score it against its test set (from the manifest unless given).

    The test set's hash must match the one the run recorded; ``domain_adjustment`` (0, or
    0.05-0.10) lowers the acceptance thresholds of the tiers.
    """
    p = Path(path)
    manifest = read_manifest(p)
    if testset is None:
        tpath = (manifest.get("testset") or {}).get("path")
        if not tpath:
            raise RunFolderError(f"{p / MANIFEST} records no test-set path; pass testset=")
        testset = tpath
    ts = testset if isinstance(testset, TestSet) else load_testset(testset)
    recorded = (manifest.get("testset") or {}).get("hash")
    if recorded and recorded != ts.hash:
        raise NotComparableError(f"{p}: the test set given ({ts.hash[:19]}...) is not the one this run was "
                                 f"collected with ({recorded[:19]}...)")
    if not (p / RESULTS).is_file():
        raise RunFolderError(f"{p} holds no {RESULTS}: the collection has not finished (resume it with --resume)")
    results = read_results(p / RESULTS)
    scores = score(ts, results, metrics, source=str(p / RESULTS), domain_adjustment=domain_adjustment)
    return Run(p, manifest, results, ts, scores)


def iter_runs(root: str | Path) -> list[Path]:
    """Run folders under ``root`` (those with a manifest), oldest first."""
    def started(p: Path) -> str:
        try:
            return str(read_manifest(p).get("started_at") or "")
        except RunFolderError:
            return ""
    return sorted((p.parent for p in Path(root).glob(f"*/{MANIFEST}")), key=started)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": value}`` (what config diffs and the manifest table show)."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = obj
    return out
