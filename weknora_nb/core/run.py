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

A run folder is untrusted input (it may come from anyone): :func:`read_manifest` checks the
shape of every manifest field the package reads, and the run name with
:func:`check_run_name`, because the name decides where ``report`` writes. A relative
``testset.path`` is looked for from the run folder first, then from the current folder
(older runs stored the path as typed).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from weknora_nb.core.errors import InputError, NotComparableError, RunFolderError, UsageError, reading
from weknora_nb.core.pipeline import focus_stage
from weknora_nb.core.results import ResultCodes, read_results
from weknora_nb.core.scoring import Scores, result_codes, score
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.core.weknora import SETTINGS_SOURCES, effective_retrieval_config

MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint.jsonl"
RESULTS = "results.parquet"
CHUNKS = "chunks.parquet"
ANSWERS = "answers.jsonl"
#: a vector-store trace of the run's test set (``weknora-nb check --out``, collect.vectortrace): chunk rows,
#: query rows, summary
VECTOR_TRACE, VECTOR_TRACE_QUERIES, VECTOR_TRACE_SUMMARY = ("vector_trace.parquet", "vector_trace_queries.parquet",
                                                         "vector_trace.json")
#: the integrity check's result (``weknora-nb check --out``)
CHECK = "check.json"


@dataclass
class Run:
    """A run folder, loaded: manifest, results table, its test set and its scores."""

    path: Path
    manifest: dict[str, Any]
    results: pd.DataFrame
    testset: TestSet
    scores: Scores
    #: the hash of the test-set version the run was re-scored on, when not the one it was collected with
    rescored_on: str | None = None
    _codes: ResultCodes | None = field(default=None, repr=False, compare=False)

    @property
    def codes(self) -> ResultCodes:
        """The results as :func:`~weknora_nb.core.scoring.score` scores them (merged results unfolded, rows
        checked), made once: ``score(ts, run.codes, ...)`` skips both steps. A Run is its folder as loaded:
        change ``results`` in place and the codes (like ``scores``) no longer follow it; filter a copy."""
        if self._codes is None:
            self._codes = result_codes(self.results, source=str(self.path / RESULTS))
        return self._codes

    @property
    def name(self) -> str:
        """The manifest's ``run_name``, else the run folder's name; checked by :func:`check_run_name`
        (it names the report folder), so a :class:`RunFolderError` when it is not one safe folder name."""
        recorded = self.manifest.get("run_name")
        if recorded is None:
            return check_run_name(self.path.resolve().name, f"{self.path / MANIFEST} (no run name: the folder's name)")
        return check_run_name(recorded, self.path / MANIFEST)

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
        stages = self.scores.all_stages   # a stage with no scored request is one too: the caller says why
        chosen = focus_stage(stages, requested, self.stage_definitions)
        if chosen is None:
            raise UsageError(argument="stage", allowed=stages, got=requested)
        return chosen

    def inventory(self) -> pd.DataFrame | None:
        """The knowledge base's chunk listing recorded with the run, or None when it was not fetched."""
        p = self.path / CHUNKS
        if not p.exists():
            return None
        with reading(p, InputError):
            return pd.read_parquet(p)

    def vector_trace(self) -> pd.DataFrame | None:
        """The chunk rows of the vector-store trace written into the run folder (``weknora-nb check --out``), or
        None when there is none."""
        p = self.path / VECTOR_TRACE
        if not p.exists():
            return None
        with reading(p, InputError):
            return pd.read_parquet(p)


def _is_split(recorded: dict[str, Any]) -> bool:
    """Whether a manifest's ``retrieval_config`` is the ``{"raw", "effective"}`` pair (else the config as read)."""
    return "raw" in recorded and "effective" in recorded


#: the longest run name, in characters (and at most twice that in UTF-8 bytes: a folder name
#: has at most 255 bytes on most file systems)
RUN_NAME_MAX = 120

#: characters a file name cannot hold on Windows (``:`` would also name a drive there)
_WINDOWS_FORBIDDEN = '<>:"|?*'
_WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
                    *(f"LPT{i}" for i in range(1, 10))}


def _run_name_problem(name: object) -> str | None:
    """What makes ``name`` unusable as a run name, or None (the rule of :func:`check_run_name`)."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name:
        return "must not be empty"
    if name in (".", ".."):
        return "must not be '.' or '..'"
    if name.startswith("."):
        return "must not start with '.' (a hidden folder)"
    if "/" in name or "\\" in name:
        return "must be one folder name, without '/' or '\\'"
    control = next((c for c in name if unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs")), None)
    if control is not None:
        return f"must not hold control characters or line breaks (U+{ord(control):04X})"
    if len(name) > RUN_NAME_MAX or len(name.encode("utf-8")) > 2 * RUN_NAME_MAX:
        return f"must be at most {RUN_NAME_MAX} characters ({2 * RUN_NAME_MAX} bytes in UTF-8)"
    bad = sorted({c for c in name if c in _WINDOWS_FORBIDDEN})
    if bad:
        return f"must not hold {' '.join(bad)} (not allowed in file names on Windows)"
    if name != name.strip() or name.endswith("."):
        return "must not start or end with a space, nor end with '.'"
    if name.split(".")[0].upper() in _WINDOWS_DEVICES:
        return "must not be a Windows device name (CON, PRN, AUX, NUL, COM1-9, LPT1-9)"
    return None


def check_run_name(name: object, source: str | Path, *, error: Callable[[str], Exception] = RunFolderError) -> str:
    """``name`` when it can name a run (and so its report folder), else ``error`` naming ``source``
    and the field ``run_name``.

    A run name is one safe folder name: a non-empty string of at most :data:`RUN_NAME_MAX`
    characters (and twice that many UTF-8 bytes); no ``/`` or ``\\``; no control character,
    line break or lone surrogate; not ``.`` or ``..``; no leading ``.`` (a hidden report folder
    is easily lost); and, so that runs and reports can be copied to any system, none of
    ``< > : " | ? *``, no leading or trailing space, no trailing ``.`` and no Windows device
    name (``CON``, ``NUL``, ``COM1``, ...). The collector calls this before it writes a
    manifest, :func:`read_manifest` when it reads one, the report renderer before it makes a
    folder. ``source`` is what the message names (a manifest file, ``--out``); ``error`` the
    class raised (:class:`RunFolderError`, or :class:`UsageError` for an option).
    """
    problem = _run_name_problem(name)
    if problem is not None:
        shown = repr(name)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise error(f"{source}, field 'run_name': a run name {problem}. Got {shown} instead.")
    assert isinstance(name, str)
    return name


#: manifest fields the package reads, and the JSON types each may have (None: the field may be null)
_MANIFEST_SHAPE: dict[str, tuple[type, ...]] = {
    "testset": (dict,), "stages": (dict,), "notes": (list,), "knowledge_bases": (dict,), "sessions": (dict,),
    "server": (dict,), "retrieval_config": (dict,), "started_at": (str,),
}
_JSON_TYPE: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}


def _manifest_problems(manifest: dict[str, Any]) -> list[str]:
    """Each manifest field the package reads that has the wrong shape, as ``field 'F': ...``."""
    problems = []
    for key, types in _MANIFEST_SHAPE.items():
        value = manifest.get(key)
        if value is not None and not isinstance(value, types):
            problems.append(f"field '{key}' must be {_JSON_TYPE[types[0]]}, not {type(value).__name__}")
    testset = manifest.get("testset")
    if isinstance(testset, dict):
        path, digest = testset.get("path"), testset.get("hash")
        if path is not None and (not isinstance(path, str) or not path or "\x00" in path):
            problems.append(f"field 'testset.path' must be a file path (a non-empty string). Got {path!r} instead.")
        if digest is not None and not isinstance(digest, str):
            problems.append(f"field 'testset.hash' must be a string. Got {digest!r} instead.")
    if isinstance(manifest.get("stages"), dict):
        problems += [f"field 'stages.{name}' must be an object, not {type(d).__name__}"
                     for name, d in manifest["stages"].items() if not isinstance(d, dict)]
    if isinstance(manifest.get("notes"), list) and not all(isinstance(n, str) for n in manifest["notes"]):
        problems.append("field 'notes' must be a list of strings")
    return problems


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the run folder ``path``; :class:`RunFolderError` when there is none, it cannot
    be read or is not a JSON object, a field the package reads has the wrong shape, or its
    ``run_name`` is not a safe folder name (:func:`check_run_name`)."""
    p = Path(path)
    mpath = p / MANIFEST
    if not mpath.is_file():
        raise RunFolderError(f"{p} is not a run folder (no {MANIFEST})")
    try:
        with reading(mpath):
            text = mpath.read_text(encoding="utf-8")
            manifest = _parse_json(text)
    except InputError as exc:
        raise RunFolderError(f"{mpath} cannot be read: {exc.problems[0].message}") from exc
    if not isinstance(manifest, dict):
        raise RunFolderError(f"{mpath} is not a JSON object")
    problems = _manifest_problems(manifest)
    if problems:
        raise RunFolderError(f"{mpath}: " + "; ".join(problems))
    if manifest.get("run_name") is not None:
        check_run_name(manifest["run_name"], mpath)
    return manifest


def _parse_json(text: str) -> Any:
    """``json.loads(text)``; what the json module raises as a plain ValueError (an integer of more
    than 4300 digits) or a RecursionError (deep nesting) becomes a JSONDecodeError, so that
    :func:`~weknora_nb.core.errors.reading` names the file."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise json.JSONDecodeError(f"not usable JSON ({type(exc).__name__}: {exc})", text[:0], 0) from exc


#: set while reports render (in their kernels: :func:`weknora_nb.reports.cache.use_in_this_kernel`): a run loaded
#: with its recorded test set is ``run_cache(path, metrics=..., domain_adjustment=...)``, computed once per
#: rendering (:func:`weknora_nb.reports.cache.cached_run`); None: every call loads and scores
run_cache: Callable[..., Run] | None = None


def load_run(path: str | Path, *, testset: TestSet | str | Path | None = None,
             metrics: Iterable[str] | None = None, domain_adjustment: float = 0.0,
             other_version: bool = False, cache: bool = True) -> Run:
    """Load a run folder and score it against its test set (from the manifest unless given).

    The test set's hash must match the one the run recorded, unless ``other_version`` (a
    later version of the test set, docs/method.md section 10: the run is re-scored on it and
    :attr:`Run.rescored_on` says so); ``domain_adjustment`` (0, or 0.05-0.10) lowers the
    acceptance thresholds of the tiers. A relative test-set path in the manifest is looked for
    from the run folder, then from the current folder (:class:`RunFolderError` when it is in
    neither). ``cache``: False never takes the run from :data:`run_cache` (what the cache itself calls).
    """
    if cache and run_cache is not None and testset is None and not other_version:
        return run_cache(path, metrics=metrics, domain_adjustment=domain_adjustment)
    p = Path(path)
    manifest = read_manifest(p)
    ts = testset if isinstance(testset, TestSet) else load_testset(testset or _recorded_testset(p, manifest))
    recorded = (manifest.get("testset") or {}).get("hash")
    if recorded and recorded != ts.hash and not other_version:
        raise NotComparableError(f"{p}: the test set given ({ts.hash[:19]}...) is not the one this run was "
                                 f"collected with ({recorded[:19]}...)")
    if not (p / RESULTS).is_file():
        raise RunFolderError(f"{p} holds no {RESULTS}: the collection has not finished (resume it with --resume)")
    results = read_results(p / RESULTS)
    codes = result_codes(results, source=str(p / RESULTS))
    scores = score(ts, codes, metrics, source=str(p / RESULTS), domain_adjustment=domain_adjustment)
    return Run(p, manifest, results, ts, scores, rescored_on=ts.hash if recorded and recorded != ts.hash else None,
               _codes=codes)


def _recorded_testset(run_dir: Path, manifest: dict[str, Any]) -> Path:
    """The test set the manifest of ``run_dir`` names (``testset.path``): an absolute path as it is,
    a relative one from the run folder, else from the current folder; RunFolderError naming the
    manifest, the field and the path when there is none or no such file."""
    stored = (manifest.get("testset") or {}).get("path")
    mpath = run_dir / MANIFEST
    if not stored:
        raise RunFolderError(f"{mpath} records no test-set path (field 'testset.path'); "
                             "pass the test set explicitly (testset= in Python), or put the file back at that path")
    given = Path(stored)
    candidates = [given] if given.is_absolute() else [run_dir / given, given]
    found = next((c for c in candidates if c.exists()), None)
    if found is None:
        where = "" if given.is_absolute() else " (looked for from the run folder and from the current folder)"
        raise RunFolderError(f"{mpath}, field 'testset.path': the test set {stored!r} does not exist{where}; "
                             "pass the test set explicitly (testset= in Python), or put the file back at that path")
    return found


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
