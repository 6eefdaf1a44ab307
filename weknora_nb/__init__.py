"""weknora-nb: measure how well a WeKnora knowledge base retrieves, why it fails, and whether a change helped.

The package is layered; each layer imports only the ones below it::

    cli, demo                      commands on top
    reports                        tables, figures, notebook helpers, HTML rendering
    analysis   collect   sandbox   statistics and diagnosis · HTTP collection · the embedded WeKnora
    core                           test sets, results, metrics, tiers, pipeline, scoring, run folders

The names below are the public API (docs/architecture.md: everything else is internal and may move); each is
imported when first used, so that ``import weknora_nb`` (and ``weknora-nb --help``) stays fast and loads no HTTP
or plotting library. Collecting is ``weknora_nb.collect.collect`` (the subpackage ``weknora_nb.collect`` takes the
name).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from weknora_nb._version import __version__

#: public name -> module that defines it
_EXPORTS = {
    "DEFAULT_METRICS": "weknora_nb.core.metrics",
    "parse_metric": "weknora_nb.core.metrics",
    "Problem": "weknora_nb.core.errors",
    "WeknoraNbError": "weknora_nb.core.errors",
    "UsageError": "weknora_nb.core.errors",
    "InputError": "weknora_nb.core.errors",
    "MetricError": "weknora_nb.core.errors",
    "ResultsError": "weknora_nb.core.errors",
    "TestSetError": "weknora_nb.core.errors",
    "read_results": "weknora_nb.core.results",
    "read_trec_run": "weknora_nb.core.results",
    "write_results": "weknora_nb.core.results",
    "write_trec_run": "weknora_nb.core.results",
    "Scores": "weknora_nb.core.scoring",
    "score": "weknora_nb.core.scoring",
    "score_files": "weknora_nb.core.scoring",
    "TestSet": "weknora_nb.core.testset",
    "load_testset": "weknora_nb.core.testset",
    "load_trec_qrels": "weknora_nb.core.testset",
    "tier": "weknora_nb.core.tiers",
    "Run": "weknora_nb.core.run",
    "load_run": "weknora_nb.core.run",
    "ClientSettings": "weknora_nb.collect.http.client",
    "run_checks": "weknora_nb.collect.checks.integrity",
    "render_report": "weknora_nb.reports.render",
}
#: analysis modules reachable as ``wk.compare``, ``wk.stratify``, ...
_MODULES = {name: f"weknora_nb.analysis.{name}" for name in ("compare", "diagnose", "gate", "stats", "stratify")}

__all__ = [
    "ClientSettings", "DEFAULT_METRICS", "InputError", "MetricError", "Problem", "ResultsError", "Run", "Scores",
    "TestSet", "TestSetError", "UsageError", "WeknoraNbError", "__version__", "compare", "diagnose", "gate",
    "load_run", "load_testset", "load_trec_qrels", "parse_metric", "read_results", "read_trec_run", "render_report",
    "run_checks", "score", "score_files", "stats", "stratify", "tier", "write_results", "write_trec_run",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from weknora_nb.analysis import compare, diagnose, gate, stats, stratify
    from weknora_nb.collect.checks.integrity import run_checks
    from weknora_nb.collect.http.client import ClientSettings
    from weknora_nb.core.errors import (
        InputError,
        MetricError,
        Problem,
        ResultsError,
        TestSetError,
        UsageError,
        WeknoraNbError,
    )
    from weknora_nb.core.metrics import DEFAULT_METRICS, parse_metric
    from weknora_nb.core.results import read_results, read_trec_run, write_results, write_trec_run
    from weknora_nb.core.run import Run, load_run
    from weknora_nb.core.scoring import Scores, score, score_files
    from weknora_nb.core.testset import TestSet, load_testset, load_trec_qrels
    from weknora_nb.core.tiers import tier
    from weknora_nb.reports.render import render_report


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'weknora_nb' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
