"""The config audit: the results a run collected checked against the settings the server says it applies.

WeKnora's most reported retrieval problems are settings that do not do what they say (issues #174: the rerank
threshold seemingly ignored; #2143: a reranker returning collapsed scores; #713, #2391: rerank filtering that
empties the results). :func:`audit` reads what each stage ran with (:func:`weknora_nb.analysis.diagnose.settings.
stage_settings`: the request's parameters for hybrid-search, the tenant's effective retrieval config for
knowledge-search, C29-C30) and checks every result against it. Each check gives one :class:`AuditFinding`:

=============================== ===================================================================================
``rerank_below_threshold``      knowledge-search results whose rerank model score (``model_score``, C39) is below
                                the rerank threshold, while the rerank step ran (C36). The fallback is allowed: a
                                list of one result, every model score below the threshold, that one >= 0 (C36 keeps
                                the model's first result when none pass; its floor 0.15, or 0 for named documents
                                from v0.7.2, is not checked).
``vector_below_threshold``      vector-path hits whose similarity is below the vector threshold (C19). A score is a
                                similarity only when the list was not fused: a vector-only hybrid-search stage, or a
                                vector hit (``match_type`` 0) whose retrieval score exceeds the largest RRF score
                                ``(w_v + w_k) / (k + 1)`` (C21); a fused hit takes the similarity the run's
                                vector-only stage gave the same query and chunk, else it is not checked.
``keyword_below_threshold``     the same for the keyword path where the engine applies the threshold (OpenSearch,
                                C109); ``keyword_threshold_ignored`` where it does not (Postgres C19, SQLite C99,
                                Weaviate, Elasticsearch: C109): the setting is not what the server runs.
``rerank_scores_collapsed``     a reranker whose model scores are the same within :data:`COLLAPSE_RANGE` in most
                                lists (at least :data:`COLLAPSE_SHARE` of the lists with two or more model scores,
                                and at least :data:`COLLAPSE_MIN_LISTS` of them): the model does not rank (the
                                v0.6.x ``truncate_prompt_tokens: 511`` symptom, C108, #2143). Every stage with model
                                scores, the chat's too.
``final_empty_retrieval_found`` knowledge-search lists that came back empty for a query whose hybrid-search stage
                                of the same repeat found something (#713, #2391: rerank filtering, or the tenant's
                                retrieval thresholds when they are stricter than the hybrid stage's, C36, C31).
``longer_than_top_k``           lists longer than the stage's top-k (knowledge-search ``rerank_top_k``, C43;
                                hybrid-search ``match_count``, C17).
=============================== ===================================================================================

A check whose inputs the run lacks (no model scores, a threshold of 0, the chat's settings not recorded, no hybrid
stage) is ``not checked`` with the reason, never ``clean``. Scores the server writes with four decimals
(``base_score``, ``model_score``: C39) are compared with a tolerance of half the last digit (:data:`ROUNDING`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from weknora_nb.analysis.diagnose.settings import (
    KNOWLEDGE_SEARCH,
    REQUEST,
    StageSettings,
    effective_config,
    stage_settings,
)
from weknora_nb.core.weknora import RETRIEVAL_DEFAULTS

if TYPE_CHECKING:
    from weknora_nb.core.run import Run

#: the statuses of a finding: the results contradict the setting; checked and nothing contradicts it; not checked
FINDING, CLEAN, NOT_CHECKED = "finding", "clean", "not checked"
#: half the last digit of a score the server writes with four decimals (C39)
ROUNDING = 5e-5
#: model scores of one list within this range are "collapsed" (four decimals: at most 10 distinct steps apart)
COLLAPSE_RANGE = 1e-3
#: the share of lists (with two or more model scores) that must be collapsed for the reranker to be called collapsed
COLLAPSE_SHARE = 0.5
#: the fewest lists with two or more model scores the collapse check needs
COLLAPSE_MIN_LISTS = 5
#: examples kept per finding
EXAMPLES = 5
#: the columns of :func:`to_frame`
COLUMNS = ["name", "status", "stage", "setting", "value", "source", "contradicting", "checked", "unit", "detail",
           "examples"]


@dataclass
class AuditFinding:
    """One check of one stage: its stable ``name``, ``status`` (:data:`FINDING`, :data:`CLEAN`,
    :data:`NOT_CHECKED`), the ``setting`` and the ``value`` the server says it applies (and its ``source``), how many
    ``checked`` items (``unit``: results, lists) and how many of them ``contradicting`` it, a sentence of ``detail``
    (why not checked, what it means), up to :data:`EXAMPLES` ``examples`` (query, repeat, chunk, score) and the
    ``queries`` concerned."""

    name: str
    status: str
    stage: str
    setting: str
    value: Any
    source: str
    detail: str
    checked: int = 0
    contradicting: int = 0
    unit: str = "results"
    examples: list[str] = field(default_factory=list)
    #: every query (id) with a contradicting result or list, sorted
    queries: list[str] = field(default_factory=list)


def audit(run: Run) -> list[AuditFinding]:
    """Every check of every stage of ``run`` (docs/method.md, "Config audit"): findings first, then clean
    checks, then those not checked, each in stage order."""
    res = _ok_rows(run.results)
    config = effective_config(run.manifest.get("retrieval_config"))
    defs = run.stage_definitions
    path_scores = _path_scores(res, defs)
    out: list[AuditFinding] = []
    for stage in _stages(run, res):
        rows = res[res["stage"] == stage]
        definition = defs.get(stage) or {}
        reranked = int(rows.loc[rows["model_score"].notna(), "query_id"].nunique()) if "model_score" in rows else 0
        st = stage_settings(stage, definition, config, run.server, reranked)
        endpoint = definition.get("endpoint")
        source = _source_text(st, definition)
        if st.source == KNOWLEDGE_SEARCH or endpoint == "knowledge-search":
            out.append(_rerank_threshold(stage, rows, st, source, run))
            if (definition.get("params") or {}).get("knowledge_ids"):
                out += [AuditFinding(f"{p}_below_threshold", NOT_CHECKED, stage, f"{p}_threshold", None, source,
                                     "not checked: the stage names documents (knowledge_ids), whose search runs "
                                     "without thresholds from v0.7.2 and with a direct load at v0.6.x (C33)")
                        for p in ("vector", "keyword")]
            else:
                out += _path_thresholds(stage, rows, st, source, config, None, path_scores)
            out.append(_top_k(stage, rows, "rerank_top_k", st.rerank_top_k, source, "C43"))
            out.append(_empty_final(stage, rows, res, defs, st.rerank_threshold))
        elif st.source == REQUEST and endpoint in ("hybrid-search", None):
            params = definition.get("params") or {}
            single = ("vector" if params.get("disable_keywords_match") and not params.get("disable_vector_match")
                      else "keyword" if params.get("disable_vector_match") and not params.get("disable_keywords_match")
                      else None)
            out += _path_thresholds(stage, rows, st, source, config, single, path_scores)
            mc = params.get("match_count")
            if isinstance(mc, (int, float)) and mc > 0:
                out.append(_top_k(stage, rows, "match_count", int(mc), source, "C17"))
        else:
            why = ("the chat runs config.yaml's conversation settings or its agent's (C66, C113), which the run "
                   "does not record" if endpoint == "chat" or st.source != REQUEST else
                   f"the audit reads the settings of hybrid-search and knowledge-search stages, not of {endpoint}")
            out.append(AuditFinding("settings", NOT_CHECKED, stage, "thresholds and top-k", None, source,
                                    f"not checked: {why}"))
        out.append(_collapsed(stage, rows, source))
    order = {FINDING: 0, CLEAN: 1, NOT_CHECKED: 2}
    return sorted(out, key=lambda f: order[f.status])   # stable: stage order kept within a status


def to_frame(findings: Iterable[AuditFinding]) -> pd.DataFrame:
    """The findings as a table (:data:`COLUMNS`), examples joined by ``; ``."""
    rows = [{**asdict(f), "examples": "; ".join(f.examples)} for f in findings]
    for row in rows:
        del row["queries"]
    return pd.DataFrame(rows, columns=COLUMNS)


def _ok_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The successful requests' rows (status ``ok``), the score columns as floats (NaN when absent)."""
    res = results
    if "status" in res.columns:
        res = res[res["status"].astype(str) == "ok"]
    res = res.copy()
    for col in ("score", "base_score", "model_score"):
        res[col] = (pd.to_numeric(res[col], errors="coerce").astype(float) if col in res.columns
                    else np.nan)
    if "match_type" not in res.columns:
        res["match_type"] = pd.NA
    res["stage"] = res["stage"].astype(str)
    res["query_id"] = res["query_id"].astype(str)
    return res


def _stages(run: Run, res: pd.DataFrame) -> list[str]:
    """The stages in pipeline order (the run's), then any others the results hold."""
    known = [s for s in run.scores.all_stages] if run.scores is not None else []
    return list(dict.fromkeys([*known, *res["stage"].unique().tolist()]))


def _source_text(st: StageSettings, definition: dict[str, Any]) -> str:
    """Where the stage's settings come from, for a reader."""
    if st.source == REQUEST:
        return f"the request ({definition.get('endpoint') or 'hybrid-search'})"
    return st.source


def _hits(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that hold a chunk (an empty list is one row without one)."""
    return rows[rows["chunk_id"].notna() & (rows["chunk_id"].astype(str).str.strip() != "")]


def _queries(ids: Iterable[Any]) -> list[str]:
    """The distinct query ids, sorted."""
    return sorted({str(q) for q in ids})


def _example(row: Any, column: str, bound: float | None = None) -> str:
    """``q (repeat r): chunk c column 0.1234 < bound``."""
    said = f"{row.query_id} (repeat {int(row.repeat)}): {row.chunk_id} {column} {getattr(row, column):.4f}"
    return said + (f" < {bound:g}" if bound is not None else "")


def _rerank_threshold(stage: str, rows: pd.DataFrame, st: StageSettings, source: str, run: Run) -> AuditFinding:
    """``rerank_below_threshold``: model scores below the rerank threshold, the one-result fallback allowed (C36)."""
    name, setting = "rerank_below_threshold", "rerank_threshold"
    hits = _hits(rows)
    value = st.rerank_threshold
    if value is None:
        return AuditFinding(name, NOT_CHECKED, stage, setting, None, source,
                            "not checked: the run did not record the tenant retrieval config")
    scored = hits[hits["model_score"].notna()]
    if not len(scored):
        why = ("the server (before v0.6.3) writes no model score (C39)" if st.rerank_column == "base_score" else
               "no result carries a rerank model score: the rerank step did not run (no rerank model, C35) or fell "
               "back to the retrieval candidates (C37)")
        return AuditFinding(name, NOT_CHECKED, stage, setting, value, source, f"not checked: {why}")
    assumed = (" (assumed: the tenant never saved a retrieval config, so 0.2, C30; a saved 0 would make it 0)"
               if st.rerank_threshold_assumed else "")
    if value <= 0:
        return AuditFinding(name, NOT_CHECKED, stage, setting, value, source,
                            f"not checked: the rerank threshold is {value:g}{assumed}: every model score passes")
    below = scored["model_score"] < value - ROUNDING
    per_list = scored.assign(below=below).groupby(["query_id", "repeat"], observed=True)["below"].agg(["sum", "size"])
    fallback = per_list[(per_list["size"] == 1) & (per_list["sum"] == 1)].index
    keyed = scored.set_index(["query_id", "repeat"]).index
    bad = scored[below.to_numpy() & ~keyed.isin(fallback)]
    status = FINDING if len(bad) else CLEAN
    detail = (f"{len(bad)} of {len(scored)} reranked results score below the rerank threshold {value:g}{assumed}; "
              f"{len(fallback)} list(s) of one result below it are the fallback WeKnora allows (C36).")
    if len(bad):
        detail += (" The server returned what its threshold excludes: the threshold it runs is not the one "
                   "it reports (#174), or the model scores were changed after the threshold (C108).")
    return AuditFinding(name, status, stage, setting, value, source, detail, len(scored), len(bad), "results",
                        [_example(r, "model_score", value) for r in bad.head(EXAMPLES).itertuples()],
                        _queries(bad["query_id"]))


def _max_rrf(config: dict[str, Any] | None) -> float:
    """The largest score weighted RRF can give, ``(w_v + w_k) / (k + 1)`` (C21): a larger score is a raw one."""
    cfg = config or RETRIEVAL_DEFAULTS
    k = float(cfg.get("rrf_k") or RETRIEVAL_DEFAULTS["rrf_k"])
    weights = (float(cfg.get(w) or RETRIEVAL_DEFAULTS[w]) for w in ("rrf_vector_weight", "rrf_keyword_weight"))
    return sum(weights) / (k + 1)


def _path_scores(res: pd.DataFrame, defs: dict[str, dict[str, Any]]) -> dict[str, tuple[str, pd.Series]]:
    """Per path (``vector``, ``keyword``), the first single-path hybrid-search stage of the run and its raw scores
    by (query id, chunk id): the similarity (or BM25 score) of that chunk for that query, the same one the
    knowledge-search and hybrid stages' paths saw (the same query text and embedding: knowledge-search does not
    rewrite the query, C31). The largest over repeats (they agree: the scores are deterministic)."""
    out: dict[str, tuple[str, pd.Series]] = {}
    for stage, d in defs.items():
        params = d.get("params") or {}
        if d.get("endpoint") != "hybrid-search" or bool(params.get("disable_keywords_match")) == bool(
                params.get("disable_vector_match")):
            continue
        path = "vector" if params.get("disable_keywords_match") else "keyword"
        hits = _hits(res[res["stage"] == stage])
        if path in out or not len(hits):
            continue
        keyed = hits.assign(chunk_id=hits["chunk_id"].astype(str)).dropna(subset=["score"])
        out[path] = (stage, keyed.groupby(["query_id", "chunk_id"], observed=True)["score"].max())
    return out


def _path_thresholds(stage: str, rows: pd.DataFrame, st: StageSettings, source: str, config: dict[str, Any] | None,
                     single_path: str | None,
                     path_scores: dict[str, tuple[str, pd.Series]] | None = None) -> list[AuditFinding]:
    """``vector_below_threshold`` and the keyword check of one stage (C19, C21, C109). A hit's raw path score is its
    own retrieval score when not fused, else the score a single-path stage of the run gave the same query and chunk
    (``path_scores``, :func:`_path_scores`); a hit found by both paths is a vector hit (C21), so a ``match_type`` 0
    hit came through the vector path and a ``match_type`` 1 hit through the keyword path alone."""
    hits = _hits(rows)
    knowledge = st.source == KNOWLEDGE_SEARCH
    # the retrieval score of a result: knowledge-search writes it as base_score after a rerank (C39)
    retrieval = hits["base_score"].where(hits["base_score"].notna(), hits["score"]) if knowledge else hits["score"]
    if knowledge and hits["model_score"].notna().any() and hits["base_score"].isna().all():
        retrieval = pd.Series(np.nan, index=hits.index)
    tol = ROUNDING if knowledge else 1e-9
    limit = _max_rrf(config)
    column = "base_score" if knowledge and hits["base_score"].notna().any() else "score"
    out = []
    for path, match, value in (("vector", 0, st.vector_threshold), ("keyword", 1, st.keyword_threshold)):
        setting = f"{path}_threshold"
        name = f"{path}_below_threshold"
        if single_path is not None and single_path != path:
            continue
        note = st.keyword_note if path == "keyword" else None
        if note:   # "0.3, ignored by the Postgres keyword path (C19)": the threshold set, and why it is not applied
            value, name = float(note.split(",")[0]), "keyword_threshold_ignored"
        if value is None:
            out.append(AuditFinding(name, NOT_CHECKED, stage, setting, 0, source,
                                    f"not checked: the stage sets no {path} threshold (0: every score passes)"))
            continue
        mt = pd.to_numeric(hits["match_type"], errors="coerce")
        on_path = hits.index[(mt == match).to_numpy()] if single_path is None else hits.index
        scores = retrieval.loc[on_path].dropna()
        own = scores if single_path is not None else scores[scores > limit + tol]
        # (score, what it is) of every hit whose raw path score is known
        known = {i: (float(v), column) for i, v in own.items()}
        other = (path_scores or {}).get(path) if single_path is None else None
        if other is not None:
            rest = hits.loc[[i for i in on_path if i not in known]]
            keys = pd.MultiIndex.from_arrays([rest["query_id"].astype(str), rest["chunk_id"].astype(str)])
            looked = pd.Series(other[1].reindex(keys).to_numpy(), index=rest.index).dropna()
            known.update({i: (float(v), f"{path} score at stage {other[0]}") for i, v in looked.items()})
        if not known:
            why = (f"no {path} hit carries a raw {path} score: every one's retrieval score is at most "
                   f"{limit:.4f}, the largest fused (RRF) score (C21), so it says nothing of the similarity"
                   + ("" if other is not None else f", and the run has no {path}-only stage to take it from")
                   if len(on_path) else f"no {path}-path hit at this stage")
            out.append(AuditFinding(name, NOT_CHECKED, stage, setting, value, source, f"not checked: {why}"))
            continue
        below = [i for i, (v, _) in known.items() if v < value - (tol if known[i][1] == column else 1e-9)]
        examples = [f"{hits.at[i, 'query_id']} (repeat {int(hits.at[i, 'repeat'])}): {hits.at[i, 'chunk_id']} "
                    f"{known[i][1]} {known[i][0]:.4f} < {value:g}" for i in below[:EXAMPLES]]
        n_other = sum(1 for _, what in known.values() if what != column)
        unknown = len(on_path) - len(known)
        detail = (f"{len(below)} of {len(known)} {path}-path hits are below the {path} threshold {value:g}"
                  + (f" ({n_other} scored by the same query and chunk at stage {other[0]}, the result's own score "
                     "being fused)" if other is not None and n_other else "")
                  + (f"; {unknown} fused scores of hits not at that stage not checked" if unknown else "") + ".")
        if note:
            detail += (f" The threshold is {note.split(', ', 1)[1]}: the setting is not what the server runs."
                       if below else "")
        elif below:
            detail += " The server returned hits its threshold excludes (on WeKnora Lite before v0.7.2 the vector "\
                      "threshold is not applied, C99)." if path == "vector" else " The server returned hits its "\
                      "threshold excludes."
        out.append(AuditFinding(name, FINDING if below else CLEAN, stage, setting, value, source, detail,
                                len(known), len(below), "results", examples, _queries(hits.loc[below, "query_id"])))
    return out


def _top_k(stage: str, rows: pd.DataFrame, setting: str, value: int, source: str, fact: str) -> AuditFinding:
    """``longer_than_top_k``: lists with more results than the stage's top-k."""
    sizes = _hits(rows).groupby(["query_id", "repeat"], observed=True).size()
    lists = rows.groupby(["query_id", "repeat"], observed=True).ngroups
    longer = sizes[sizes > value]
    examples = [f"{q} (repeat {int(r)}): {int(n)} results" for (q, r), n in longer.head(EXAMPLES).items()]
    detail = f"{len(longer)} of {lists} lists hold more than {setting} = {value} results ({fact})."
    return AuditFinding("longer_than_top_k", FINDING if len(longer) else CLEAN, stage, setting, value, source,
                        detail, lists, len(longer), "lists", examples,
                        _queries(longer.index.get_level_values(0)))


def _collapsed(stage: str, rows: pd.DataFrame, source: str) -> AuditFinding:
    """``rerank_scores_collapsed``: most lists' model scores within :data:`COLLAPSE_RANGE` (C108, #2143)."""
    name, setting = "rerank_scores_collapsed", "rerank model"
    scored = _hits(rows)
    scored = scored[scored["model_score"].notna()]
    if not len(scored):
        return AuditFinding(name, NOT_CHECKED, stage, setting, None, source,
                            "not checked: no result carries a rerank model score", unit="lists")
    spread = scored.groupby(["query_id", "repeat"], observed=True)["model_score"].agg(["min", "max", "size"])
    several = spread[spread["size"] >= 2]
    if len(several) < COLLAPSE_MIN_LISTS:
        return AuditFinding(name, NOT_CHECKED, stage, setting, None, source,
                            f"not checked: {len(several)} list(s) with two or more model scores, fewer than "
                            f"{COLLAPSE_MIN_LISTS}", checked=len(several), unit="lists")
    flat = several[(several["max"] - several["min"]) <= COLLAPSE_RANGE + ROUNDING]
    distinct = int(scored["model_score"].round(4).nunique())
    share = len(flat) / len(several)
    status = FINDING if share >= COLLAPSE_SHARE else CLEAN
    detail = (f"In {len(flat)} of {len(several)} lists ({share:.0%}) every model score lies within "
              f"{COLLAPSE_RANGE:g}; the stage's model scores take {distinct} distinct value(s).")
    if status == FINDING:
        detail += (" The reranker does not rank: its scores are constant or collapsed (a prompt truncated to its "
                   "last tokens, v0.6.x truncate_prompt_tokens 511, C108, #2143; or a broken model endpoint).")
    examples = [f"{q} (repeat {int(r)}): {int(s['size'])} scores in [{s['min']:.4f}, {s['max']:.4f}]"
                for (q, r), s in flat.head(EXAMPLES).iterrows()]
    return AuditFinding(name, status, stage, setting, f"{COLLAPSE_RANGE:g} range", source, detail, len(several),
                        len(flat), "lists", examples, _queries(flat.index.get_level_values(0)))


def _empty_final(stage: str, rows: pd.DataFrame, res: pd.DataFrame, defs: dict[str, dict[str, Any]],
                 threshold: float | None) -> AuditFinding:
    """``final_empty_retrieval_found``: empty knowledge-search lists of queries a hybrid stage found hits for
    (``threshold``: the stage's rerank threshold, shown as the setting concerned)."""
    name, setting = "final_empty_retrieval_found", "rerank_threshold"
    hybrid = [s for s, d in defs.items() if d.get("endpoint") == "hybrid-search"
              and not (d.get("params") or {}).get("disable_keywords_match")
              and not (d.get("params") or {}).get("disable_vector_match")]
    source = "the hybrid-search stage of the same query and repeat"
    if not hybrid:
        return AuditFinding(name, NOT_CHECKED, stage, setting, threshold, source,
                            "not checked: the run has no hybrid-search stage with both paths", unit="lists")
    lists = rows.groupby(["query_id", "repeat"], observed=True)["chunk_id"].apply(lambda c: c.notna().any())
    empty = lists[~lists]
    found = _hits(res[res["stage"].isin(hybrid)]).groupby(["query_id", "repeat"], observed=True).size()
    found = found[found > 0]
    both = [key for key in empty.index if key in found.index]
    hp = json.dumps({s: (defs[s].get("params") or {}) for s in hybrid}, ensure_ascii=False, sort_keys=True)
    detail = (f"{len(empty)} of {len(lists)} knowledge-search lists are empty; {len(both)} of them for a query the "
              f"hybrid-search stage ({', '.join(hybrid)}) found hits for.")
    if both:
        detail += (" Rerank filtering (C36: nothing above the threshold and the first result below the 0.15 floor) "
                   f"or the tenant's retrieval thresholds, stricter than the hybrid stage's request ({hp}), emptied "
                   "them (#713, #2391).")
    examples = [f"{q} (repeat {int(r)}): {int(found[(q, r)])} hybrid hits, no final result" for q, r in both[:EXAMPLES]]
    return AuditFinding(name, FINDING if both else CLEAN, stage, setting, threshold, source, detail, len(lists),
                        len(both), "lists", examples, _queries(q for q, _ in both))


__all__ = ["AuditFinding", "CLEAN", "COLUMNS", "FINDING", "NOT_CHECKED", "audit", "to_frame"]
