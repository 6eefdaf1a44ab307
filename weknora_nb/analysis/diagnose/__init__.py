"""Degraded queries and their causes (docs/method.md section 6).

A query is *degraded* at a stage when Recall@K < 0.3 or NDCG@10 < 0.5 there (both
thresholds and K are parameters). Each degraded query gets one or more causes, each with
its evidence, by following every relevant chunk (grade >= 1) that is missing from the
stage's top K back through the pipeline the stage ran (first repeat of each stage).

A knowledge-search stage (``final``) runs WeKnora's pipeline with the tenant retrieval
config (``docs/weknora-contract.md`` C29-C44): CHUNK_SEARCH (hybrid-search at
``match_count = embedding_top_k`` with the effective thresholds) -> CHUNK_RERANK, only when
a rerank model resolves (model score threshold, composite score, MMR) -> CHUNK_MERGE
(ranges merged, short results widened with neighbours, overlapping results dropped) ->
FILTER_TOP_K (``rerank_top_k``). The run's ``hybrid`` stage stands for CHUNK_SEARCH's
candidates. A loss is named for the step that caused it (the causes: :mod:`.rules`).

*A reranker ran* for a query when its list carries model scores (``model_score``; at v0.6.2,
which writes none, ``base_score``: both are written only by the rerank step, C39). The rerank,
merge-drop and top-k causes apply only at stages whose settings are the tenant retrieval config
(knowledge-search); the ``citations`` stage runs the server's conversation settings instead (C66),
so its diagnosis never blames knowledge-search's rerank or top-k. Where a stage's settings came
from is the manifest's ``stages.<name>.settings_source``, else follows from its role.

The stages upstream of a degraded stage, and so the paths a cause can look at, follow
from the stage's pipeline role (:func:`weknora_nb.core.pipeline.role_of`): a custom stage
such as ``hybrid-100`` (hybrid-search) is diagnosed like ``hybrid``, ``final-b``
(knowledge-search) like ``final``. Of several upstream stages with one role, the one named
as the role (the built-in stage) is looked at, else the first collected.

The modules, one concept each:

- :mod:`.settings`: what each stage ran with (:class:`StageSettings`, :func:`effective_config`);
- :mod:`.query`: the evidence of one degraded query (:class:`DegradedQuery`, :class:`LostChunk`);
- :mod:`.overlap`: text overlap as the merge step's overlap drop sees it (C42);
- :mod:`.rules`: the causes, each one registered function (:func:`cause`, :data:`CAUSES`);
- :mod:`.diagnosis`: the diagnosis of a run (:func:`diagnose`, :func:`diagnose_run`, :class:`Diagnosis`).

The names below are the ones the notebooks, the reports and a new cause use.
"""

from weknora_nb.analysis.diagnose.diagnosis import Diagnosis, degraded_queries, diagnose, diagnose_run
from weknora_nb.analysis.diagnose.query import DegradedQuery, KnowledgeBase, LostChunk
from weknora_nb.analysis.diagnose.rules import CAUSES, UNEXPLAINED, Cause, cause, causes
from weknora_nb.analysis.diagnose.settings import StageSettings, effective_config, stage_settings

#: what ``weknora_nb.diagnose`` offers (the package's submodules are its internals)
__all__ = ["CAUSES", "UNEXPLAINED", "Cause", "DegradedQuery", "Diagnosis", "KnowledgeBase", "LostChunk",
           "StageSettings", "cause", "causes", "degraded_queries", "diagnose", "diagnose_run", "effective_config",
           "stage_settings"]
