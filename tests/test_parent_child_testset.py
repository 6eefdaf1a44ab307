"""The demo's parent-child test set (weknora_nb/sandbox/demo/parent-child/): its labels are the demo test set's,
carried over by content to the children (docs/weknora-contract.md C110), and the shipped files are what
``carry_over.py`` writes from the current documents and chunkers."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest

from weknora_nb.analysis.carryover import carry_over
from weknora_nb.core.testset import TestSet, load_testset
from weknora_nb.demo import demo_testset
from weknora_nb.sandbox.runner import demo_dir

HERE = demo_dir() / "parent-child"


def _script():
    spec = importlib.util.spec_from_file_location("carry_over_pc", HERE / "carry_over.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def inventories() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The flat and the parent-child inventory as the script builds them now."""
    from weknora_nb.sandbox.chunking import corpus_chunks
    from weknora_nb.sandbox.parentchild import parent_child_corpus

    script = _script()
    return script.inventory(corpus_chunks(demo_dir())), script.inventory(parent_child_corpus(demo_dir()))


STALE = "run weknora_nb/sandbox/demo/parent-child/carry_over.py (a document or a chunker changed)"


def test_the_shipped_inventories_are_the_chunkers_current_ones(inventories):
    flat, pc = inventories
    for shipped, now in ((HERE / "chunks-flat.parquet", flat), (HERE / "chunks.parquet", pc)):
        pd.testing.assert_frame_equal(pd.read_parquet(shipped), now, obj=f"{shipped.name}: {STALE}")
    assert pc["parent_chunk_id"].str.startswith(tuple(f"{k}:p" for k in pc["knowledge_id"].unique())).all()


@pytest.mark.contract("C110")
def test_every_label_is_carried_to_one_child_with_its_grade(inventories):
    flat, pc = inventories
    old, new = load_testset(demo_dir() / "testset.jsonl"), load_testset(HERE / "testset.jsonl")
    result = carry_over(old, flat, pc)
    assert result.counts()["carried"] == result.counts()["old_labels"] == len(old.qrels) == 4570
    assert TestSet.from_records(result.records).hash == new.hash, STALE
    # one child per flat chunk, same grade: the child's id is the flat id with "c" before the position
    moved = old.qrels.assign(chunk_id=old.qrels["chunk_id"].str.replace(r":(\d{3})$", r":c\1", regex=True))
    cols = ["query_id", "chunk_id", "grade"]
    pd.testing.assert_frame_equal(moved[cols].sort_values(cols).reset_index(drop=True),
                                  new.qrels[cols].sort_values(cols).reset_index(drop=True))
    assert set(new.qrels["chunk_id"]) <= set(pc["chunk_id"]) and new.n_valid == old.n_valid == 336
    lineage = json.loads((HERE / "testset.jsonl.lineage.json").read_text(encoding="utf-8"))
    assert lineage["parent"] == {"hash": old.hash, "path": "../testset.jsonl"} and lineage["hash"] == new.hash
    assert lineage["kind"] == "carry-over" and lineage["rule"]["name"] == "strict" and lineage["pairs_flagged"] == 0


def test_the_demo_measures_the_parent_child_version_on_it(tmp_path):
    assert demo_testset(tmp_path, kind="parent-child") == HERE / "testset.jsonl"
    first = demo_testset(tmp_path, 5, kind="parent-child")
    assert first == tmp_path / "parent-child-testset-first-5.jsonl" and len(load_testset(first).queries) == 5
    assert demo_testset(tmp_path, faq=True) == demo_dir() / "faq" / "testset.jsonl"
