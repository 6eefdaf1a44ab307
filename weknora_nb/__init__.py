"""weknora-nb: measure how well a WeKnora knowledge base retrieves."""

from .errors import InputError, MetricError, Problem, ResultsError, TestSetError, WeknoraNbError
from .metrics import DEFAULT_METRICS, parse_metric
from .results import read_results, read_trec_run, write_results, write_trec_run
from .scoring import Scores, score
from .testset import TestSet, load_testset, load_trec_qrels
from .tiers import tier

__version__ = "0.1.0"

from . import compare, diagnose, gate, stats, stratify  # noqa: E402,F401  (analysis modules: wk.compare, ...)

__all__ = [
    "DEFAULT_METRICS", "InputError", "MetricError", "Problem", "ResultsError", "Scores", "TestSet",
    "TestSetError", "WeknoraNbError", "load_testset", "load_trec_qrels", "parse_metric", "read_results",
    "read_trec_run", "score", "tier", "write_results", "write_trec_run", "__version__",
]
