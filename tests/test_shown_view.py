"""The figures as the user sees the results beside the results' own ids (docs/method.md section 14): the analysis
(:mod:`weknora_nb.analysis.shown`) on hand-made results, and the report cells (:mod:`weknora_nb.reports.shown_view`)
that notebooks 02 and 04 show."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from weknora_nb.analysis.shown import degraded_either_way, showing_more, shown_vs_own_ids
from weknora_nb.core.run import Run
from weknora_nb.core.scoring import score
from weknora_nb.core.testset import TestSet
from weknora_nb.reports import shown_view

TS = TestSet.from_records([
    {"query_id": "q1", "query": "x", "relevant": {"c4": 3, "c9": 1}},
    {"query_id": "q2", "query": "y", "relevant": {"c2": 2}},
    {"query_id": "q3", "query": "z", "relevant": {"c7": 3}},
    {"query_id": "q4", "query": "w", "relevant": {"n1": 0}},          # unlabelled: no relevant chunk, invalid
])


def rows(stage: str, query: str, repeat: int, hits: list[tuple[str, str | None]]) -> list[dict]:
    """One request's results: (chunk id, the JSON list of what it shows besides itself, or None)."""
    return [{"query_id": query, "stage": stage, "repeat": repeat, "rank": r, "chunk_id": c, "score": 1 / r,
             "status": "ok", "shown_chunk_ids": shown, "sub_chunk_ids": None}
            for r, (c, shown) in enumerate(hits, start=1)]


def results() -> pd.DataFrame:
    final = [
        *rows("final", "q1", 1, [("c2", '["P1", "c1", "c3", "c4"]'), ("c9", "[]")]),
        *rows("final", "q1", 2, [("c2", '["P1", "c1", "c3", "c4"]')]),
        *rows("final", "q2", 1, [("c5", '["P2", "c6"]'), ("c2", '["P1", "c1", "c3", "c4"]')]),
        *rows("final", "q2", 2, [("c5", '["P2", "c6"]'), ("c2", '["P1", "c1", "c3", "c4"]')]),
        *rows("final", "q3", 1, [("c7", "[]")]),
        *rows("final", "q3", 2, [("c7", "[]")]),
        *rows("final", "q4", 1, [("n1", "[]")]),
    ]
    hybrid = [*rows("hybrid", "q1", 1, [("c4", None), ("c9", None)]), *rows("hybrid", "q2", 1, [("c2", None)]),
              *rows("hybrid", "q3", 1, [("c8", None)])]
    failed = [{"query_id": "q3", "stage": "hybrid", "repeat": 2, "rank": None, "chunk_id": None, "score": None,
               "status": "timeout", "shown_chunk_ids": None, "sub_chunk_ids": None}]
    return pd.DataFrame([*final, *hybrid, *failed])


def a_run(res: pd.DataFrame, metrics: list[str]) -> Run:
    return Run(Path("hand-made"), {}, res, TS, score(TS, res, metrics))


def test_both_figures_on_one_basis_and_their_difference():
    res = results()
    run = a_run(res, ["recall@10", "hit@1", "recall@1"])
    table = shown_vs_own_ids(run).set_index(["stage", "metric"])
    # own ids: the results' chunk ids alone, as if nothing were shown (the lists taken away)
    bare = score(TS, res.assign(shown_chunk_ids=None), ["recall@10", "hit@1", "recall@1"]).summary_wide()
    for (stage, metric), row in table.iterrows():
        assert row["as_shown"] == pytest.approx(run.scores.summary_wide().loc[stage, metric])
        assert row["own_ids"] == pytest.approx(bare.loc[stage, metric])
        assert row["difference"] == pytest.approx(row["as_shown"] - row["own_ids"])
    # by hand, final, recall@10 (c4 and c9 relevant for q1): as shown q1 finds both in repeat 1 and c4 in repeat 2
    # (0.75), on own ids c9 in repeat 1 only (0.25); q2 finds c2 either way (1); q3 c7 (1); q4 has no relevant
    # chunk and is not counted
    assert table.loc[("final", "recall@10"), "as_shown"] == pytest.approx((0.75 + 1 + 1) / 3)
    assert table.loc[("final", "recall@10"), "own_ids"] == pytest.approx((0.25 + 1 + 1) / 3)
    # the hybrid stage shows nothing and both figures agree
    assert table.loc[("hybrid", "recall@10"), "difference"] == 0
    assert showing_more(run).to_dict() == {"final": 6, "hybrid": 0}
    assert set(table.reset_index()["stage"]) == {"final", "hybrid"}


def test_a_metric_the_run_was_not_scored_with_is_scored_both_ways():
    run = a_run(results(), ["hit@1"])
    table = shown_vs_own_ids(run, ["recall@50"], ["final"])
    assert table["metric"].tolist() == ["recall@50"]
    assert table["as_shown"].iloc[0] == pytest.approx((0.75 + 1 + 1) / 3)


def test_queries_degraded_under_one_scoring_only():
    run = a_run(results(), ["recall@10", "ndcg@10"])
    table = degraded_either_way(run, "final", recall_below=0.3, ndcg_below=0.0)
    # q1's recall@10 is 0.5 as shown, 0.25 on own ids: degraded on own ids only
    assert table["query_id"].tolist() == ["q1"] and table["degraded"].tolist() == ["own ids only"]
    assert table["recall@10 (own ids)"].iloc[0] == pytest.approx(0.25)
    assert degraded_either_way(run, "no-such-stage").empty


def plain(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_report_cells_explain_the_difference_or_say_there_is_none():
    run = a_run(results(), ["recall@10", "hit@1"])
    said = plain(shown_view.shown_figures(run).data)
    assert "6 of 10 results of stage final show chunks besides their own id" in said
    assert "recall@50" in said and "own ids only" in said
    said = plain(shown_view.degraded_by_scoring(run, "final").data)
    assert re.search(r"At stage final, \d+ queries change sides", said)
    flat = results().assign(shown_chunk_ids=None)
    flat_run = a_run(flat, ["recall@10"])
    assert "No result of this run shows chunks besides its own id" in plain(shown_view.shown_figures(flat_run).data)
    assert "No result of stage final shows" in plain(shown_view.degraded_by_scoring(flat_run, "final").data)


def test_knowledge_base_text_in_ids_is_escaped():
    res = results()
    res.loc[res["query_id"] == "q1", "query_id"] = "<b>q1</b>"
    ts = TestSet.from_records([{**r, "query_id": "<b>q1</b>"} if r["query_id"] == "q1" else r for r in TS.records()])
    run = Run(Path("x"), {}, res, ts, score(ts, res, ["recall@10", "ndcg@10"]))
    html = shown_view.degraded_by_scoring(run, "final", ndcg_below=0.0).data
    assert "<b>q1</b>" not in html and "&lt;b&gt;q1&lt;/b&gt;" in html
