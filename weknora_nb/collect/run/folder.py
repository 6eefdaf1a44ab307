"""The run folder of a collection: created or reopened, and its manifest, written as the collection goes.

:func:`open_run` creates the folder or reopens it: a folder that holds a run is refused unless the run is
resumed, and a resumed run must be the same run (target, test set, stage definitions, repeats). It reads
what the checkpoint holds and starts the manifest: what the run is (never the API key) and what the server
said about itself. A collection that stops before its end (an auth failure, Ctrl-C, a file that cannot be
written) records why (:func:`write_stopped_manifest`, :func:`recording_a_stop`); one that ends records its
outcome (:func:`write_final_manifest`). Every manifest is written atomically and durably.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from weknora_nb._version import __version__
from weknora_nb.collect.http.client import server_address
from weknora_nb.collect.run.arguments import Arguments
from weknora_nb.collect.run.checkpoint import Records, read_checkpoint
from weknora_nb.collect.run.preflight import ServerFacts, system_description
from weknora_nb.core.errors import RunExistsError, StorageError, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.run import CHECKPOINT, MANIFEST, read_manifest
from weknora_nb.core.testset import TestSet

#: the manifest's parts that must not change when a run is resumed
_COMPARED = ("target", "testset", "stages", "repeats")
#: what defines a stage (the rest of a manifest's stage entry is what the run found out)
_STAGE_DEFINITION = ("endpoint", "params", "keep_match_types")


@dataclass
class RunFolder:
    """A run folder opened for collection: where it is, what it runs, its manifest so far, what is done."""

    run_dir: Path
    name: str
    queries: list[tuple[str, str]]  # (query_id, query text), in test-set order
    manifest: dict[str, Any]
    done: Records

    @property
    def manifest_path(self) -> Path:
        return self.run_dir / MANIFEST

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / CHECKPOINT


def refuse_used_folder(run_dir: Path, resume: bool) -> None:
    """:class:`RunExistsError` when ``run_dir`` holds a run and ``resume`` was not asked for."""
    if not resume and ((run_dir / MANIFEST).exists() or (run_dir / CHECKPOINT).exists()):
        raise RunExistsError(f"{run_dir} already holds a run; pass resume=True (--resume) to continue it, "
                             "or choose another output folder")


def open_run(args: Arguments, testset: TestSet, testset_path: str | None, out: str | Path,
             described: tuple[dict | None, ServerFacts, list[str]], resume: bool, run_name: str | None) -> RunFolder:
    """Create or reopen the run folder and read what its checkpoint holds.

    ``described`` is (the user's system description, what the server said, the notes so far).
    A folder that holds a run is refused unless ``resume``; a resumed run must have the same
    target, test set, stage definitions and repeats (:data:`_COMPARED`). Blocking: run in a
    worker thread.
    """
    run_dir = Path(out)
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
    name = run_name or run_dir.name
    base = _manifest_base(args, testset, testset_path, name, described)
    previous = read_manifest(run_dir) if (run_dir / MANIFEST).exists() else None
    refuse_used_folder(run_dir, resume)
    if previous:
        changed = [k for k in _COMPARED if json.dumps(_comparable(previous, k), sort_keys=True)
                   != json.dumps(_comparable(base, k), sort_keys=True)]
        if changed:
            raise RunExistsError(f"{run_dir} holds a different run (changed: {', '.join(changed)}); "
                                 "resume only with the same target, test set, stages and repeats")
    done = read_checkpoint(run_dir / CHECKPOINT)
    manifest = {**base, "status": "running", "started_at": (previous or {}).get("started_at") or _now(),
                "resumed_at": [*(previous or {}).get("resumed_at", []), _now()] if previous else []}
    if previous:
        _carry_over(previous, manifest)
    queries = [(q, t) for q, t in testset.queries[["query_id", "query"]].itertuples(index=False)]
    return RunFolder(run_dir, name, queries, manifest, done)


def _carry_over(previous: dict[str, Any], manifest: dict[str, Any]) -> None:
    """What a resumed run keeps from its earlier collections: the sessions counted, each hybrid-search
    stage's method (a resumed run with nothing left to request sends none) and the integrity start snapshot."""
    if previous.get("sessions"):
        manifest["sessions"] = previous["sessions"]
    start = ((previous.get("integrity") or {}).get("snapshots") or {}).get("start")
    if start:  # the knowledge base as it was when the run began, not when it was resumed
        manifest["integrity"] = {"snapshots": {"start": start}}
    for name, stage in manifest["stages"].items():
        method = ((previous.get("stages") or {}).get(name) or {}).get("method")
        if method:
            stage["method"] = method


def _comparable(manifest: dict[str, Any], key: str) -> Any:
    """The part ``key`` of a manifest as a resumed run must repeat it (stages: their definitions only; the
    test set: its content, wherever its file now is or however its path was written)."""
    value = manifest.get(key)
    if key == "stages" and isinstance(value, dict):
        return {n: {k: d.get(k) for k in _STAGE_DEFINITION} for n, d in value.items() if isinstance(d, dict)}
    if key == "testset" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "path"}
    return value


def _manifest_base(args: Arguments, testset: TestSet, testset_path: str | None, run_name: str,
                   described: tuple[dict | None, ServerFacts, list[str]]) -> dict[str, Any]:
    """What a run is: target (never the key), test set, stages, repeats, concurrency, timeouts, and what
    the server said about itself (server, knowledge bases, retrieval config, the system description)."""
    settings = args.settings
    user_system, facts, notes = described
    system, sources = system_description(user_system, facts)
    return {
        "run_name": run_name,
        "workbench": {"name": "weknora-nb", "version": __version__, "python": platform.python_version()},
        "target": {"base_url": server_address(settings.base_url), "knowledge_base_ids": list(args.kb_ids),
                   "api_key_env": settings.api_key_env, "tenant_id": settings.tenant_id},
        "testset": {"path": testset_path, "hash": testset.hash, "n_queries": len(testset),
                    "n_valid": testset.n_valid, "n_invalid": len(testset.invalid_ids)},
        "stages": {s.name: s.to_dict() for s in args.stages},
        "repeats": args.repeats, "concurrency": args.concurrency, "warmup": args.warmup,
        "timeouts": {"read_s": settings.timeout_s, "connect_s": settings.connect_timeout_s,
                     "max_attempts": settings.max_attempts},
        "server": facts.server, "knowledge_bases": facts.knowledge_bases, "retrieval_config": facts.retrieval_config,
        "system": system, "system_sources": sources, "notes": list(notes),
    }


@contextlib.contextmanager
def recording_a_stop(run: RunFolder) -> Iterator[None]:
    """Within the block, Ctrl-C (a cancelled task) and a :class:`StorageError` are recorded in the manifest
    (``interrupted``, ``stopped``) before they go on; a manifest that cannot be written stays as it was."""
    try:
        yield
    except (asyncio.CancelledError, KeyboardInterrupt):
        with contextlib.suppress(StorageError):
            write_stopped_manifest(run, "interrupted", "interrupted (Ctrl-C); resume to go on")
        raise
    except StorageError as exc:
        with contextlib.suppress(StorageError):
            write_stopped_manifest(run, "stopped", f"storage: {exc}")
        raise


def write_stopped_manifest(run: RunFolder, status: str, why: str) -> None:
    """The manifest of a collection that stopped before its end (an auth failure, Ctrl-C, a file that
    could not be written): ``status``, why, end time, requests done so far. Blocking."""
    run.manifest.update(status=status, stopped_by=why[:500], ended_at=_now(), n_done=len(run.done))
    write_json_atomic(run.manifest_path, run.manifest)


def write_final_manifest(run: RunFolder, counts: dict[str, dict[str, int]], failed: list[dict[str, Any]]) -> None:
    """The manifest with the run's outcome: status (complete or incomplete), end time, counts. Blocking."""
    dropped = int(sum(r.get("n_dropped", 0) for r in run.done.values()))
    run.manifest.update(status="incomplete" if failed else "complete", ended_at=_now(), counts=counts,
                        n_failed=len(failed), dropped_non_primary=dropped)
    write_json_atomic(run.manifest_path, run.manifest)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically and durably (temp file, fsync, rename). Blocking.

    An OS error (a read-only folder, a full disk) is a :class:`StorageError` naming ``path``."""
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
