"""``expand_sub_chunks`` (vectorised: sort codes, one take per column) against the plain pandas formulation
(copy, explode, concatenate, sort by the key, renumber) on random tables: ties, missing keys, duplicate
absorbed ids, nulls in the lists, integer ids, categorical / object / string columns, a non-default index,
``shown_chunk_ids`` given or not row by row, lists naming the result's own id (never unfolded again)."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

from weknora_nb.core.results import read_results
from weknora_nb.core.unfold import expand_sub_chunks

from .conftest import examples


def reference_expand(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Copy, explode the lists, concatenate, sort by the key, renumber: the plain pandas formulation."""
    columns = [c for c in ("sub_chunk_ids", "shown_chunk_ids") if c in df.columns and df[c].notna().any()]
    if not columns:
        return df, 0
    chosen = pd.Series([None] * len(df), index=df.index, dtype="string")
    for c in columns:   # shown_chunk_ids wins where it gives a value ("[]" included)
        text = df[c].astype("string")
        given = text.notna() & (text.str.strip() != "")
        chosen = chosen.mask(given, text)
    blank = chosen.str.strip()
    has = (chosen.notna() & (blank != "") & (blank != "[]")).to_numpy(dtype=bool)
    if not has.any():
        return df, 0
    own = df["chunk_id"].astype("string")[has].tolist()
    lists = [[x for x in json.loads(t) if x is None or o is pd.NA or str(x) != o]
             for t, o in zip(chosen[has].tolist(), own, strict=True)]
    base = df.copy()
    for c in base.columns:
        if isinstance(base[c].dtype, pd.CategoricalDtype):
            base[c] = base[c].astype("string")
    base["_sub"] = 0
    extra = base[has].copy()
    extra["_ids"] = lists
    extra = extra.explode("_ids")
    extra = extra[extra["_ids"].notna()]
    n = len(extra)
    extra["chunk_id"] = extra["_ids"].astype("string")
    extra["_sub"] = extra.groupby(level=0).cumcount() + 1
    for c in ("chunk_index", "knowledge_id", "score", "base_score", "model_score", "match_type"):
        if c in extra.columns:
            extra[c] = None
    extra = extra.drop(columns="_ids")
    out = pd.concat([base, extra.astype(base.dtypes.to_dict())], ignore_index=True)
    out = out.sort_values(["query_id", "stage", "repeat", "rank", "_sub"], kind="stable", na_position="last")
    has_chunk = out["chunk_id"].notna()
    keys = [out["query_id"], out["stage"], out["repeat"]]
    new_rank = out[has_chunk].groupby(keys, sort=False, observed=True).cumcount() + 1
    out["rank"] = pd.array(pd.Series(pd.NA, index=out.index, dtype="Int64").mask(has_chunk, new_rank), dtype="Int64")
    return out.drop(columns="_sub").reset_index(drop=True), n


SUBS = [None, "", "[]", " [ ] ", '["x1"]', '["x2", null, "x3"]', '[1, "y"]', "[null]", '["d", "d"]', '["c1", "x4"]',
        '["c2"]']


def random_table(rng: random.Random) -> pd.DataFrame:
    n = rng.randint(1, 25)
    df = pd.DataFrame([{"query_id": rng.choice(["q1", "q2", "q10", None]),
                        "stage": rng.choice(["final", "hybrid", None]),
                        "repeat": rng.choice([1, 2, None]), "rank": rng.choice([1, 2, 2, 3, None]),
                        "chunk_id": rng.choice(["c1", "c2", None, "c3"]), "score": rng.choice([0.5, None, 1.0]),
                        "knowledge_id": rng.choice(["k", None]), "chunk_index": rng.choice([1, None]),
                        "sub_chunk_ids": rng.choice(SUBS), "status": "ok", "other": rng.choice(["a", "b"])}
                       for _ in range(n)])
    for c in ("repeat", "rank", "chunk_index"):
        df[c] = df[c].astype("Int64")
    for c in ("query_id", "stage", "chunk_id", "knowledge_id"):
        df[c] = df[c].astype(rng.choice(["string", "object", "category"]))
    df["sub_chunk_ids"] = df["sub_chunk_ids"].astype(rng.choice(["string", "object"]))
    if rng.random() < 0.5:
        df["shown_chunk_ids"] = pd.array([rng.choice(SUBS) for _ in range(n)], dtype="string")
    if rng.random() < 0.3:
        df.index = [f"r{i}" for i in range(n)]
    return df


@pytest.mark.parametrize("seed", range(8))
def test_expand_equals_the_plain_formulation_on_random_tables(seed):
    rng = random.Random(seed)
    for _ in range(examples(40)):
        df = random_table(rng)
        want, n_want = reference_expand(df.copy())
        got, n_got = expand_sub_chunks(df.copy())
        pd.testing.assert_frame_equal(got, want)
        assert n_got == n_want


def test_categories_written_alike_sort_and_group_as_one():
    """A categorical column's sort keys come from its categories (kernel of _sort_codes): 1 and "1" are two
    categories the plain formulation, which works on strings, reads as one value."""
    df = pd.DataFrame({"query_id": pd.Categorical([1, "1", "q0", 1, None], categories=["q0", 1, "1"]),
                       "stage": "final", "repeat": 1, "rank": pd.array([2, 1, 1, 3, 1], dtype="Int64"),
                       "chunk_id": ["a", "b", "c", "d", "e"], "status": "ok",
                       "sub_chunk_ids": ['["x"]', None, '["y", "z"]', None, '["w"]']})
    want, n_want = reference_expand(df.copy())
    got, n_got = expand_sub_chunks(df.copy())
    pd.testing.assert_frame_equal(got, want)
    assert n_got == n_want == 4
    assert got["rank"].tolist()[:5] == [1, 2, 3, 4, 1]   # "1" and 1: one query, ranks 1..4 over both


def test_expand_equals_the_plain_formulation_on_a_results_file_read_back(tmp_path):
    rng = np.random.default_rng(5)
    n = 3000
    q, rep, rank = rng.integers(0, 60, n), rng.integers(1, 4, n), rng.integers(1, 11, n)
    subs = rng.choice(np.array([None, '["a"]', '["b", "c"]', "[]", '["a", null]'], dtype=object), n)
    df = pd.DataFrame({"query_id": [f"q{i}" for i in q], "stage": rng.choice(["final", "hybrid"], n),
                       "repeat": rep, "rank": rank, "chunk_id": [f"c{i}" for i in rng.integers(0, 200, n)],
                       "score": rng.random(n), "status": "ok", "sub_chunk_ids": subs})
    df = df.drop_duplicates(["query_id", "stage", "repeat", "rank"]).sort_values(["query_id", "stage", "repeat",
                                                                                  "rank"])
    df.to_parquet(tmp_path / "results.parquet")
    table = read_results(tmp_path / "results.parquet")  # categorical columns, as the notebooks get them
    want, n_want = reference_expand(table.copy())
    got, n_got = expand_sub_chunks(table)
    pd.testing.assert_frame_equal(got, want)
    assert n_got == n_want > 0
