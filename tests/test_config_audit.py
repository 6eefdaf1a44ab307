"""The config audit (docs/method.md, "Config audit"): each finding on hand-made results that contradict a setting,
its clean and "not checked" cases (a check that cannot run is never clean), the report cells of notebooks 02 and 04,
and a sandbox collection whose tenant saved a high rerank threshold."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb.analysis.config_audit import CLEAN, FINDING, NOT_CHECKED, audit, to_frame
from weknora_nb.core.run import Run, load_run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet
from weknora_nb.reports import audit_view

QUERIES = [f"q{i}" for i in range(8)]
TS = TestSet.from_records([{"query_id": q, "query": f"question {q}", "relevant": {"c1": 2}} for q in QUERIES])

HYBRID = {"endpoint": "hybrid-search", "params": {"match_count": 50, "skip_context_enrichment": True}}
VECTOR = {"endpoint": "hybrid-search", "params": {"match_count": 50, "disable_keywords_match": True,
                                                  "vector_threshold": 0.3}}
KEYWORD = {"endpoint": "hybrid-search", "params": {"match_count": 50, "disable_vector_match": True,
                                                   "keyword_threshold": 1.5}}
FINAL = {"endpoint": "knowledge-search", "params": {}, "settings_source": "tenant retrieval config"}
CHAT = {"endpoint": "chat", "params": {}, "settings_source": "server conversation config"}
SAVED = {"embedding_top_k": 50, "vector_threshold": 0.15, "keyword_threshold": 0.3, "rerank_top_k": 3,
         "rerank_threshold": 0.5, "rerank_model_id": "rr"}


def rows(stage: str, query: str, hits: list[dict], repeat: int = 1) -> list[dict]:
    """One request's results: each hit a dict of its columns (chunk_id, score, model_score, ...)."""
    if not hits:
        return [{"query_id": query, "stage": stage, "repeat": repeat, "rank": None, "chunk_id": None,
                 "score": None, "status": "ok"}]
    return [{"query_id": query, "stage": stage, "repeat": repeat, "rank": r, "status": "ok", "match_type": 0, **h}
            for r, h in enumerate(hits, start=1)]


def a_run(results: list[dict], stages: dict[str, dict], *, config: dict | None = None,
          engine: str = "postgres") -> Run:
    res = pd.DataFrame(results)
    for col in ("model_score", "base_score", "match_type"):
        if col not in res.columns:
            res[col] = None
    res["match_type"] = res["match_type"].astype("Int64")
    manifest = {"stages": stages, "server": {"version": "0.7.2", "keyword_index_engine": engine}}
    if config is not None:
        manifest["retrieval_config"] = {"raw": config, "effective": config}
    return Run(Path("hand-made"), manifest, res, TS, score(TS, res, ["recall@10"]))


def found(run: Run, name: str, stage: str = "final"):
    hits = [f for f in audit(run) if f.name == name and f.stage == stage]
    assert len(hits) == 1, [f"{f.name}@{f.stage}" for f in audit(run)]
    return hits[0]


def final_hit(chunk: str, model: float, base: float = 0.0161, match_type: int = 0) -> dict:
    return {"chunk_id": chunk, "score": min(1.0, 0.6 * model + 0.3 * base + 0.1), "model_score": model,
            "base_score": base, "match_type": match_type}


def test_final_results_below_the_rerank_threshold_are_a_finding_and_the_fallback_is_not():
    res = [*rows("final", "q0", [final_hit("c1", 0.9), final_hit("<b>c2</b>", 0.1)]),   # 0.1 < 0.5: contradicts
           *rows("final", "q1", [final_hit("c3", 0.3)]),                                # one result: the fallback
           *rows("final", "q2", [final_hit("c4", 0.49996)])]                            # 0.5 at four decimals
    f = found(a_run(res, {"final": FINAL}, config=SAVED), "rerank_below_threshold")
    assert (f.status, f.contradicting, f.checked, f.value) == (FINDING, 1, 4, 0.5)
    assert f.queries == ["q0"] and "<b>c2</b> model_score 0.1000 < 0.5" in f.examples[0]
    assert "1 list(s) of one result below it are the fallback" in f.detail
    clean = found(a_run(res[:1] + res[2:], {"final": FINAL}, config=SAVED), "rerank_below_threshold")
    assert (clean.status, clean.contradicting) == (CLEAN, 0)


def test_no_model_score_or_no_config_is_not_checked_never_clean():
    res = rows("final", "q0", [{"chunk_id": "c1", "score": 0.01}])
    f = found(a_run(res, {"final": FINAL}, config=SAVED), "rerank_below_threshold")
    assert f.status == NOT_CHECKED and "no result carries a rerank model score" in f.detail
    f = found(a_run(rows("final", "q0", [final_hit("c1", 0.1)]), {"final": FINAL}), "rerank_below_threshold")
    assert f.status == NOT_CHECKED and "did not record the tenant retrieval config" in f.detail
    collapsed = found(a_run(res, {"final": FINAL}, config=SAVED), "rerank_scores_collapsed")
    assert collapsed.status == NOT_CHECKED
    chat = found(a_run(rows("citations", "q0", [final_hit("c1", 0.1)]), {"citations": CHAT}, config=SAVED),
                 "settings", "citations")
    assert chat.status == NOT_CHECKED and "C66" in chat.detail
    assert all(f.status != CLEAN for f in audit(a_run(res, {"final": FINAL})) if f.name != "longer_than_top_k")


def test_vector_hits_below_the_vector_threshold_only_where_the_score_is_a_similarity():
    vec = [*rows("vector", "q0", [{"chunk_id": "c1", "score": 0.8}, {"chunk_id": "c2", "score": 0.2}]),
           *rows("vector", "q1", [{"chunk_id": "c1", "score": 0.31}])]
    f = found(a_run(vec, {"vector": VECTOR}, config=SAVED), "vector_below_threshold", "vector")
    assert (f.status, f.contradicting, f.checked, f.value, f.queries) == (FINDING, 1, 3, 0.3, ["q0"])
    # knowledge-search: a raw cosine base score (above the largest RRF score 1/61) below 0.15 contradicts it;
    # a fused base score (0.0161) is not a similarity and is not checked
    fin = rows("final", "q0", [final_hit("c1", 0.9, base=0.6), final_hit("c2", 0.8, base=0.1)])
    f = found(a_run(fin, {"final": FINAL}, config=SAVED), "vector_below_threshold")
    assert (f.status, f.contradicting, f.checked) == (FINDING, 1, 2)
    fused = rows("final", "q0", [final_hit("c1", 0.9), final_hit("c2", 0.8)])
    f = found(a_run(fused, {"final": FINAL}, config=SAVED), "vector_below_threshold")
    assert f.status == NOT_CHECKED and "fused (RRF)" in f.detail
    # ... unless a vector-only stage scored the same query and chunk: c2's similarity 0.1 is below 0.15, yet the
    # fused list holds it as a vector hit (match type 0: it came through the vector path)
    plain = {"endpoint": "hybrid-search", "params": {"match_count": 50, "disable_keywords_match": True}}
    measured = [*fused, *rows("vector", "q0", [{"chunk_id": "c1", "score": 0.7}, {"chunk_id": "c2", "score": 0.1}])]
    f = found(a_run(measured, {"vector": plain, "final": FINAL}, config=SAVED), "vector_below_threshold")
    assert (f.status, f.contradicting, f.checked) == (FINDING, 1, 2)
    assert "c2 vector score at stage vector 0.1000 < 0.15" in f.examples[0]
    f = found(a_run(rows("hybrid", "q0", [{"chunk_id": "c1", "score": 0.01}]), {"hybrid": HYBRID}, config=SAVED),
              "vector_below_threshold", "hybrid")
    assert f.status == NOT_CHECKED and "sets no vector threshold" in f.detail


def test_keyword_threshold_applied_by_opensearch_ignored_by_postgres():
    kw = rows("keyword", "q0", [{"chunk_id": "c1", "score": 7.5, "match_type": 1},
                                {"chunk_id": "c2", "score": 0.9, "match_type": 1}])
    f = found(a_run(kw, {"keyword": KEYWORD}, config=SAVED, engine="opensearch"), "keyword_below_threshold", "keyword")
    assert (f.status, f.contradicting, f.checked) == (FINDING, 1, 2)
    f = found(a_run(kw, {"keyword": KEYWORD}, config=SAVED, engine="postgres"), "keyword_threshold_ignored", "keyword")
    assert (f.status, f.contradicting, f.value) == (FINDING, 1, 1.5)
    assert "ignored by the Postgres keyword path (C19)" in f.detail
    above = kw[:1]
    f = found(a_run(above, {"keyword": KEYWORD}, config=SAVED, engine="sqlite"), "keyword_threshold_ignored",
              "keyword")
    assert (f.status, f.contradicting) == (CLEAN, 0)


def test_a_collapsed_reranker_is_a_finding_over_many_lists():
    flat = [r for i, q in enumerate(QUERIES[:6])
            for r in rows("final", q, [final_hit(f"c{i}a", 0.9731), final_hit(f"c{i}b", 0.9734),
                                       final_hit(f"c{i}c", 0.9731)])]
    f = found(a_run(flat, {"final": FINAL}, config=SAVED), "rerank_scores_collapsed")
    assert (f.status, f.contradicting, f.checked) == (FINDING, 6, 6) and "2 distinct value(s)" in f.detail
    spread = [r for i, q in enumerate(QUERIES[:6])
              for r in rows("final", q, [final_hit(f"c{i}a", 0.95), final_hit(f"c{i}b", 0.7)])]
    assert found(a_run(spread, {"final": FINAL}, config=SAVED), "rerank_scores_collapsed").status == CLEAN
    few = flat[:9]   # three lists: too few to call a reranker collapsed
    f = found(a_run(few, {"final": FINAL}, config=SAVED), "rerank_scores_collapsed")
    assert f.status == NOT_CHECKED and "fewer than 5" in f.detail


def test_an_empty_final_list_whose_hybrid_stage_found_hits_is_a_finding():
    res = [*rows("hybrid", "q0", [{"chunk_id": "c1", "score": 0.016}]), *rows("final", "q0", []),
           *rows("hybrid", "q1", []), *rows("final", "q1", []),
           *rows("hybrid", "q2", [{"chunk_id": "c1", "score": 0.016}]), *rows("final", "q2", [final_hit("c1", 0.9)])]
    f = found(a_run(res, {"hybrid": HYBRID, "final": FINAL}, config=SAVED), "final_empty_retrieval_found")
    assert (f.status, f.contradicting, f.checked, f.queries) == (FINDING, 1, 3, ["q0"])
    assert "2 of 3 knowledge-search lists are empty; 1 of them" in f.detail
    f = found(a_run(res[3:], {"final": FINAL}, config=SAVED), "final_empty_retrieval_found")
    assert f.status == NOT_CHECKED


def test_lists_longer_than_top_k():
    res = [*rows("final", "q0", [final_hit(f"c{i}", 0.9) for i in range(4)]),
           *rows("final", "q1", [final_hit("c", 0.9)])]
    f = found(a_run(res, {"final": FINAL}, config=SAVED), "longer_than_top_k")
    assert (f.status, f.contradicting, f.checked, f.value) == (FINDING, 1, 2, 3)


def test_findings_come_first_and_the_table_has_its_columns():
    res = [*rows("final", "q0", [final_hit("c1", 0.9), final_hit("c2", 0.1)])]
    found_all = audit(a_run(res, {"final": FINAL}, config=SAVED))
    statuses = [f.status for f in found_all]
    assert statuses == sorted(statuses, key=[FINDING, CLEAN, NOT_CHECKED].index)
    table = to_frame(found_all)
    assert list(table.columns)[:3] == ["name", "status", "stage"] and len(table) == len(found_all)


def test_the_report_cells_escape_knowledge_base_text():
    res = [*rows("final", "q0", [final_hit("c1", 0.9), final_hit("<script>x</script>", 0.1)]),
           *rows("final", "q1", [final_hit("c1", 0.9)])]
    run = a_run(res, {"final": FINAL}, config=SAVED)
    page = audit_view.config_audit(run).data
    assert "<script>" not in page and "&lt;script&gt;" in page and "rerank_below_threshold" in page
    assert "Not checked" in page
    four = audit_view.degraded_audit(run, "final", ["q0", "q9"]).data
    assert "rerank_below_threshold" in four and re.search(r"<td[^>]*>1</td>", four)
    none = audit_view.degraded_audit(run, "vector", ["q0"]).data
    assert "no check could run" in none


@pytest.mark.slow
def test_a_sandbox_tenant_with_a_high_rerank_threshold(tmp_path):
    """The sandbox applies its tenant's saved rerank threshold as WeKnora does (C36): no result below it but the
    one-result fallback lists, which the audit does not count."""
    from weknora_nb.collect import ClientSettings, collect
    from weknora_nb.sandbox import SandboxServer, demo_dir
    from weknora_nb.sandbox.runner import load_demo_versions

    lines = (demo_dir() / "testset.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    testset = tmp_path / "testset.jsonl"
    testset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    version = dataclasses.replace(load_demo_versions()["rerank"], tenant_saved=True, tenant_rerank_threshold=0.97)
    os.environ.setdefault("WEKNORA_API_KEY", "sk-audit-test")
    with SandboxServer(version) as sb:
        collect(ClientSettings(sb.base_url), sb.kb_id, testset, tmp_path / "run", stages="hybrid,final", repeats=1,
                warmup=0, progress=False, inventory=False, system=sb.describe())
    run = load_run(tmp_path / "run", cache=False)
    below = found(run, "rerank_below_threshold")
    assert below.status == CLEAN and below.value == pytest.approx(0.97) and below.checked > 0
    fallback = int(re.search(r"(\d+) list\(s\) of one result below it are the fallback", below.detail).group(1))
    assert fallback > 0   # lists where nothing reached 0.97: the model's first result kept (C36), not a finding
    assert found(run, "final_empty_retrieval_found").status == CLEAN   # the best model score is never below 0.15
    assert found(run, "rerank_scores_collapsed").status == CLEAN       # the sandbox's reranker ranks
    assert found(run, "vector_below_threshold").status == NOT_CHECKED  # fused retrieval scores (C21)


def test_weknora_lite_recorded_run_obeys_its_settings():
    """A collection from a running WeKnora Lite v0.7.2 (tests/fixtures/sandbox_vs_weknora/lite, a tenant that never
    saved a retrieval config, a rerank model registered): every knowledge-search result is at or above the assumed
    0.2 threshold, and every vector hit at or above the vector threshold."""
    folder = Path(__file__).parent / "fixtures" / "sandbox_vs_weknora" / "lite"
    ids = pd.read_parquet(folder / "results.parquet", columns=["query_id"])["query_id"].unique()
    testset = TestSet.from_records([{"query_id": str(q), "query": str(q), "relevant": {"none": 1}} for q in ids])
    run = load_run(folder, testset=testset, other_version=True, cache=False)
    findings = audit(run)
    assert not [f for f in findings if f.status == FINDING]
    below = found(run, "rerank_below_threshold")
    assert (below.status, below.checked, below.value) == (CLEAN, 291, 0.2) and "assumed" in below.detail
    # the final list's vector hits, scored by the vector stage for the same query: none below 0.15 (Lite v0.7.2
    # applies the vector threshold, C99); its keyword hits (BM25 x 1e6 on SQLite) are far above 0.3, which SQLite
    # ignores anyway
    vector = found(run, "vector_below_threshold")
    assert (vector.status, vector.checked) == (CLEAN, 253) and "at stage vector" in vector.detail
    ignored = found(run, "keyword_threshold_ignored")
    assert (ignored.status, ignored.value, ignored.checked) == (CLEAN, 0.3, 10)


def test_v062_writes_no_model_score_and_the_chat_reranker_is_audited_for_collapse():
    old = rows("final", "q0", [{"chunk_id": "c1", "score": 0.7, "base_score": 0.016}])
    run = a_run(old, {"final": FINAL}, config=SAVED)
    run.manifest["server"]["version"] = "v0.6.2"
    f = found(run, "rerank_below_threshold")
    assert f.status == NOT_CHECKED and "C39" in f.detail
    chat = [r for i, q in enumerate(QUERIES[:5])
            for r in rows("citations", q, [final_hit(f"c{i}a", 0.0001), final_hit(f"c{i}b", 0.0)])]
    run = a_run(chat, {"citations": CHAT}, config=SAVED)
    assert found(run, "rerank_scores_collapsed", "citations").status == FINDING
    assert found(run, "settings", "citations").status == NOT_CHECKED


def test_named_documents_run_without_thresholds_so_they_are_not_checked():
    scoped = {**FINAL, "params": {"knowledge_ids": ["doc-1"]}}
    res = rows("final", "q0", [final_hit("c1", 0.9, base=0.05)])
    f = found(a_run(res, {"final": scoped}, config=SAVED), "vector_below_threshold")
    assert f.status == NOT_CHECKED and "C33" in f.detail
