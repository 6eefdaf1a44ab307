"""Parent-child chunks scored as the user sees them (docs/method.md section 14): the results table's
``parent_chunk_id``, ``shown_chunk_ids`` and ``flags`` columns in every format, the families a result shows
(:class:`~weknora_nb.collect.run.shown.Families`, from an inventory shaped as WeKnora Lite v0.7.2 lists it), and
scoring that unfolds what is shown (``sub_chunks="expand"``) or the child's own id only (``"ignore"``)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from weknora_nb.collect.run.shown import Families
from weknora_nb.core.codes import parquet_codes
from weknora_nb.core.errors import ResultsError
from weknora_nb.core.results import read_results, write_results
from weknora_nb.core.scoring import score, score_files
from weknora_nb.core.testset import TestSet
from weknora_nb.core.unfold import expand_sub_chunks

# A document of a parent-child knowledge base as Lite v0.7.2 lists it with ?chunk_type=text&chunk_type=parent_text
# (recording 22f): parents restart their chunk_index at 0 beside the children's; a summary chunk's parent is the
# document's first text child (22e).
INVENTORY = pd.DataFrame([
    {"chunk_id": "P1", "chunk_type": "parent_text", "parent_chunk_id": None, "chunk_index": 0},
    {"chunk_id": "c1", "chunk_type": "text", "parent_chunk_id": "P1", "chunk_index": 0},
    {"chunk_id": "P2", "chunk_type": "parent_text", "parent_chunk_id": None, "chunk_index": 1},
    {"chunk_id": "c2", "chunk_type": "text", "parent_chunk_id": "P1", "chunk_index": 1},
    {"chunk_id": "c4", "chunk_type": "text", "parent_chunk_id": "P1", "chunk_index": 3},
    {"chunk_id": "c3", "chunk_type": "text", "parent_chunk_id": "P1", "chunk_index": 2},
    {"chunk_id": "c5", "chunk_type": "text", "parent_chunk_id": "P2", "chunk_index": 4},
    {"chunk_id": "c6", "chunk_type": "text", "parent_chunk_id": "P2", "chunk_index": 5},
    {"chunk_id": "s1", "chunk_type": "summary", "parent_chunk_id": "c1", "chunk_index": 6},
    {"chunk_id": "i1", "chunk_type": "image_ocr", "parent_chunk_id": "c5", "chunk_index": 0},
])


@pytest.mark.contract("C100", "C101")
def test_a_merged_child_shows_its_parent_and_siblings_in_document_order():
    fam = Families.of(INVENTORY)
    # knowledge-search / chat (after the merge): WeKnora lists the hit's own id in sub_chunk_id (47-...-pc)
    assert fam.shown("knowledge-search", "c2", "text", "P1", ["c2", "c3"]) == ["c3", "P1", "c1", "c4"]
    assert fam.shown("chat", "c5", "text", "P2", ["c5"]) == ["P2", "c6"]
    # a summary's parent is a text child whose content the merge does not show: nothing
    assert fam.shown("knowledge-search", "s1", "summary", "c1", []) == []
    # an image hit shows its text parent and that one's parent family
    assert fam.shown("knowledge-search", "i1", "image_ocr", "c5", ["i1"]) == ["c5", "P2", "c6"]
    # a merged neighbour of another parent shows that parent too
    assert fam.shown("knowledge-search", "c4", "text", "P1", ["c4", "c5"]) == ["c5", "P1", "c1", "c2", "c3", "P2",
                                                                                "c6"]
    # hybrid-search and FAQ search merge nothing: the child's content only
    assert fam.shown("hybrid-search", "c2", "text", "P1", []) == []
    assert fam.shown("faq-search", "f1", "faq", None, ["f1"]) == []
    # no inventory: the parent id comes from the result, the siblings are unknown
    assert Families.of(None).shown("knowledge-search", "c2", "text", "P1", ["c2"]) == ["P1"]
    # references rebuilt by the Redis stream manager keep parent_chunk_id, not sub_chunk_id (C106)
    assert fam.shown("chat", "c2", "text", "P1", []) == ["P1", "c1", "c3", "c4"]


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"stage": "final", "repeat": 1, "score": 0.5, "status": "ok"}
    return pd.DataFrame([{**base, **r} for r in rows])


TS = TestSet.from_records([{"query_id": "q1", "query": "x", "relevant": {"c4": 3, "c9": 1}},
                           {"query_id": "q2", "query": "y", "relevant": {"c2": 2}}])
# one knowledge-search answer per query, as the collector writes it: WeKnora's sub_chunk_id (own id included)
# and what the result shows besides itself
FINAL = frame([
    {"query_id": "q1", "rank": 1, "chunk_id": "c2", "parent_chunk_id": "P1", "sub_chunk_ids": '["c2", "c3"]',
     "shown_chunk_ids": '["c3", "P1", "c1", "c4"]', "flags": None},
    {"query_id": "q1", "rank": 2, "chunk_id": "c5", "parent_chunk_id": "P2", "sub_chunk_ids": '["c5"]',
     "shown_chunk_ids": '["P2", "c6"]', "flags": None},
    {"query_id": "q2", "rank": 1, "chunk_id": "c2", "parent_chunk_id": "P1", "sub_chunk_ids": '["c2"]',
     "shown_chunk_ids": '["P1", "c1", "c3", "c4"]', "flags": "vector_path_missing"},
])


@pytest.mark.contract("C100")
def test_scoring_credits_what_is_shown_or_the_child_only():
    shown = score(TS, FINAL, ["recall@10", "recall@1"])
    child = score(TS, FINAL, ["recall@10", "recall@1"], sub_chunks="ignore")
    assert shown.summary_wide().loc["final", "recall@10"] == pytest.approx((0.5 + 1) / 2)  # q1: c4 shown
    assert child.summary_wide().loc["final", "recall@10"] == pytest.approx((0 + 1) / 2)
    assert shown.counts.n_sub_chunks_expanded == 4 + 2 + 4
    # WeKnora listing the hit's own id in sub_chunk_id is no duplicate: nothing removed, no warning
    assert shown.counts.n_duplicates_removed == 0 and not any("duplicate" in w for w in shown.warnings)


def test_old_runs_unfold_sub_chunk_ids_without_the_hits_own_id():
    old = FINAL.drop(columns=["shown_chunk_ids", "parent_chunk_id", "flags"])
    got, n = expand_sub_chunks(old)
    assert n == 1 and got["chunk_id"].tolist() == ["c2", "c3", "c5", "c2"]   # c2, c5, c2 own ids not repeated
    sc = score(TS, old, ["recall@10"])
    assert sc.counts.n_duplicates_removed == 0 and sc.counts.n_sub_chunks_expanded == 1


def test_shown_chunk_ids_take_precedence_row_by_row():
    rows = frame([
        {"query_id": "q1", "rank": 1, "chunk_id": "a", "sub_chunk_ids": '["a", "b"]', "shown_chunk_ids": "[]"},
        {"query_id": "q1", "rank": 2, "chunk_id": "c", "sub_chunk_ids": '["d"]', "shown_chunk_ids": None,
         "parent_chunk_id": "P"},
        {"query_id": "q1", "rank": 3, "chunk_id": "e", "sub_chunk_ids": None, "shown_chunk_ids": '["f", "e"]'}])
    got, n = expand_sub_chunks(rows)
    assert got["chunk_id"].tolist() == ["a", "c", "d", "e", "f"] and n == 2
    assert got["rank"].tolist() == [1, 2, 3, 4, 5]
    assert got.loc[got["chunk_id"] == "c", "parent_chunk_id"].tolist() == ["P"]
    assert got.loc[got["chunk_id"] == "d", "parent_chunk_id"].isna().all()  # an unfolded row: the result's own facts


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_the_new_columns_go_through_every_format(tmp_path, suffix):
    path = write_results(FINAL, tmp_path / f"results{suffix}")
    back = read_results(path)
    for col in ("parent_chunk_id", "shown_chunk_ids", "flags"):
        assert back[col].astype("string").tolist() == FINAL[col].astype("string").tolist(), col
    sc = score_files_of(tmp_path, path)
    assert sc.summary_wide().loc["final", "recall@10"] == pytest.approx(0.75)


def score_files_of(tmp_path, path):
    ts = tmp_path / "ts.jsonl"
    ts.write_text("".join(json.dumps({"query_id": q, "query": t, "relevant": r}) + "\n" for q, t, r in
                          [("q1", "x", {"c4": 3, "c9": 1}), ("q2", "y", {"c2": 2})]))
    return score_files(ts, path, ["recall@10"])


def test_a_parquet_file_with_lists_to_unfold_takes_the_tables_path(tmp_path):
    path = write_results(FINAL, tmp_path / "results.parquet")
    assert parquet_codes(path) is None   # shown_chunk_ids to unfold: read_results, not the codes' fast path
    hybrid = FINAL.assign(stage="hybrid", sub_chunk_ids=None, shown_chunk_ids="[]")
    assert parquet_codes(write_results(hybrid, tmp_path / "h.parquet")) is not None   # nothing to unfold


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_shown_chunk_ids_that_is_no_list_names_its_row_and_field(tmp_path, suffix):
    bad = FINAL.copy()
    bad.loc[1, "shown_chunk_ids"] = '{"P2": 1}'
    path = write_results(bad, tmp_path / f"results{suffix}")
    with pytest.raises(ResultsError) as err:
        read_results(path)
    line = 3 if suffix == ".csv" else 2
    assert any(p.line == line and p.field == "shown_chunk_ids" and "JSON list of chunk ids" in p.message
               for p in err.value.problems)


def test_a_bad_list_in_a_table_being_unfolded_names_its_column():
    bad = FINAL.copy()
    bad.loc[2, "shown_chunk_ids"] = "P1, c1"
    with pytest.raises(ResultsError) as err:
        expand_sub_chunks(bad)
    assert [(p.line, p.field) for p in err.value.problems] == [(3, "shown_chunk_ids")]
