"""Merged results unfolded (docs/method.md sections 2 and 14): each result followed by the chunks whose content
it shows, so that scoring credits what the user sees.

Two results columns hold those chunks as JSON lists of ids (:data:`~weknora_nb.core.codes.ID_LIST_COLUMNS`):

- ``sub_chunk_ids``: WeKnora's ``sub_chunk_id`` as returned (the chunks its merge step folded into the result;
  for a child shown with its parent WeKnora lists the result's own id there too, docs/weknora-contract.md C100);
- ``shown_chunk_ids``: what the collector made of it (the merged chunks without the result's own id, then, for a
  child shown with its parent's content, the parent and its other children in document order).

A row unfolds ``shown_chunk_ids`` when the column gives it a value (``[]`` included: nothing to unfold), else
``sub_chunk_ids`` (runs collected before the column existed). The result's own id is never unfolded again (it
would only count as a duplicate), a null in a list is skipped.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from weknora_nb.core.codes import ID_LIST_COLUMNS, _report, _value_at
from weknora_nb.core.errors import Problem, ResultsError


def expand_sub_chunks(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Unfold merged results: each chunk a result shows besides itself (``shown_chunk_ids``, else
    ``sub_chunk_ids``: see the module docstring) is placed right after its result, and ranks are renumbered
    1..n within each request.

    WeKnora's merge step folds neighbouring chunks into one result, and shows a child with its parent's
    content; unfolding credits those chunks at the positions they occupy (what the user, and the LLM, sees).
    Returns the new table and the number of chunks unfolded.

    An absorbed chunk's row is its result's row with its own ``chunk_id`` and no ``chunk_index``,
    ``knowledge_id``, ``score``, ``base_score``, ``model_score`` or ``match_type``. Rows come out sorted by
    (query_id, stage, repeat, rank, position after the result), missing values last, ties in their first
    order; categorical columns come out as strings; ``rank`` counts, per (query_id, stage, repeat), the rows
    with a chunk (rows without one, or with a key missing, get none).
    """
    found = _lists_to_unfold(df)
    if found is None:
        return df, 0
    has, absorbed = found
    counts = np.zeros(len(df), np.int64)
    counts[has] = [len(ids) for ids in absorbed]
    parent = np.repeat(np.arange(len(df)), 1 + counts)       # each row, then a row per absorbed chunk
    first = np.repeat(np.cumsum(1 + counts) - 1 - counts, 1 + counts)
    sub = np.arange(len(parent)) - first                       # 0: the result itself
    base = df.reset_index(drop=True)
    keys = [_sort_codes(base[c]) for c in ("query_id", "stage", "repeat", "rank")]
    ids = np.empty(len(parent), dtype=object)
    ids[sub > 0] = [c for chunk_ids in absorbed for c in chunk_ids]  # laid out as the rows are, before sorting
    order = np.lexsort((np.arange(len(parent)), sub, *(k[parent] for k in reversed(keys))))
    rows, extra, ids = parent[order], sub[order] > 0, ids[order]
    out = pd.DataFrame({c: _unfolded(base[c], rows, extra, c, ids) for c in base.columns})
    out["rank"] = _renumbered(out, keys, rows)
    return out, int(counts.sum())


#: the columns an absorbed chunk's row leaves empty (its result's own facts)
_RESULT_ONLY = ("chunk_index", "knowledge_id", "score", "base_score", "model_score", "match_type", "parent_chunk_id")


def _sort_codes(col: pd.Series) -> np.ndarray:
    """Integer sort keys of ``col`` in the order pandas sorts it (strings by value, also when categorical;
    missing values last). A categorical column's keys are its categories' places among them sorted as strings
    (each category converted and compared once, not each row)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        names = np.array([str(c) for c in col.cat.categories], dtype=object)
        _, place = np.unique(names, return_inverse=True)   # categories written alike share their place
        lookup = np.append(place.astype(np.int64), len(names))   # code -1 (missing) takes the last slot: last
        return lookup[col.cat.codes.to_numpy()]
    codes, _ = pd.factorize(col, sort=True)
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes < 0, codes.max(initial=-1) + 1, codes)


def _unfolded(col: pd.Series, rows: np.ndarray, extra: np.ndarray, name: str, ids: np.ndarray) -> Any:
    """Column ``name`` of the unfolded table: ``col`` at ``rows``; on the absorbed chunks' rows (``extra``) the
    chunk id ``ids`` for ``chunk_id``, nothing for :data:`_RESULT_ONLY`. Categorical columns become strings."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        taken = _category_strings(col, rows)
    else:
        taken = col.take(rows).reset_index(drop=True)
    if name == "chunk_id":
        values = taken.to_numpy(dtype=object, copy=True)
        values[extra] = ids[extra]
        return pd.Series(values, dtype=taken.dtype)
    if name in _RESULT_ONLY and extra.any():
        return taken.where(~extra, None) if taken.dtype == object else taken.mask(extra)
    return taken


def _category_strings(col: pd.Series, rows: np.ndarray) -> pd.Series:
    """``col.astype("string")`` at ``rows`` for a categorical ``col``, each category converted once (Arrow)."""
    codes = col.cat.codes.to_numpy()[rows]
    categories = pa.array([str(c) for c in col.cat.categories], type=pa.large_string())
    decoded = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), categories).dictionary_decode()
    return pd.Series(pd.array(decoded, dtype=pd.StringDtype()))


def _renumbered(out: pd.DataFrame, keys: list[np.ndarray], rows: np.ndarray) -> Any:
    """Ranks 1..n over the rows with a chunk within each (query_id, stage, repeat) of the sorted table; <NA>
    for rows without a chunk or with one of the three missing."""
    counted = out["chunk_id"].notna().to_numpy(dtype=bool, copy=True)
    for c in ("query_id", "stage", "repeat"):
        counted &= out[c].notna().to_numpy(dtype=bool)
    at = np.flatnonzero(counted)
    q, s, r = (k[rows[at]] for k in keys[:3])
    new_group = np.ones(len(at), dtype=bool)
    new_group[1:] = (q[1:] != q[:-1]) | (s[1:] != s[:-1]) | (r[1:] != r[:-1])
    starts = np.flatnonzero(new_group)
    rank = np.arange(len(at)) - np.repeat(starts, np.diff(np.append(starts, len(at)))) + 1
    values = np.zeros(len(out), dtype=np.int64)
    values[at] = rank
    return pd.arrays.IntegerArray(values, ~counted)


def _lists_to_unfold(df: pd.DataFrame) -> tuple[np.ndarray, list[list[str]]] | None:
    """The rows with a list to unfold (mask) and, for each of them, the chunk ids to place after it (no null,
    not the row's own id); None when no row has one. ResultsError naming the row of a list that is not one."""
    chosen: pd.Series | None = None
    column = pd.Series(None, index=df.index, dtype="string")   # which column each row's list comes from
    for name in ID_LIST_COLUMNS:   # sub_chunk_ids, then shown_chunk_ids over it where it gives a value
        if name not in df.columns or not df[name].notna().any():
            continue
        text = df[name].astype("string")
        given = (text.notna() & (text.str.strip() != "")).to_numpy(dtype=bool)
        chosen = text if chosen is None else chosen.where(~given, text)
        column = column.where(~given, name)
    if chosen is None:
        return None
    blank = chosen.str.strip()
    has = (chosen.notna() & (blank != "") & (blank != "[]")).to_numpy(dtype=bool)
    if not has.any():
        return None
    lists, bad = _id_lists(chosen[has])
    if len(bad):
        problems: list[Problem] = []
        rows = np.flatnonzero(has)[bad]
        for name in ID_LIST_COLUMNS:
            mine = rows[(column.iloc[rows] == name).to_numpy(dtype=bool)]
            _report(problems, "<results>", mine, name, _ID_LIST_FORMAT, 1, _value_at(chosen))
        raise ResultsError("<results>", problems)
    own = df["chunk_id"].astype("string")[has].tolist() if "chunk_id" in df.columns else [None] * len(lists)
    absorbed = [[str(x) for x in ids if x is not None and (o is pd.NA or o is None or str(x) != o)]
                for ids, o in zip(lists, own, strict=True)]
    return has, absorbed


_ID_LIST_FORMAT = 'must be a JSON list of chunk ids such as ["c1", "c2"]'


def _id_lists(subs: pd.Series) -> tuple[list[list], np.ndarray]:
    """Each value of ``subs`` (text) parsed as a JSON list of chunk ids (strings or integers; nulls
    are skipped later), and the positions of the values that are not such a list. Each distinct text is
    parsed once (a request's repeats and stages carry the same lists)."""
    codes, texts = pd.factorize(subs)
    parsed = [_chunk_id_list(t) for t in texts]
    lists = [parsed[c] if parsed[c] is not None else [] for c in codes]
    bad = [i for i, c in enumerate(codes) if parsed[c] is None]
    return lists, np.asarray(bad, dtype=np.int64)


def _chunk_id_list(text: str) -> list | None:
    """``text`` as a JSON list of chunk ids (strings, integers, nulls), or None when it is not one."""
    try:
        ids = json.loads(text)
    except (ValueError, RecursionError):
        return None
    ok = isinstance(ids, list) and all(
        x is None or isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)) for x in ids)
    return ids if ok else None


def check_id_lists(df: pd.DataFrame, path: str, problems: list[Problem], first_row: int) -> None:
    """A problem per row whose ``sub_chunk_ids`` or ``shown_chunk_ids`` is given but not a JSON list of chunk
    ids; those values become missing."""
    for name in ID_LIST_COLUMNS:
        if name not in df.columns:
            continue
        subs = df[name]
        blank = subs.str.strip()
        has = (subs.notna() & (blank != "") & (blank != "[]")).to_numpy(dtype=bool)
        if not has.any():
            continue
        _, bad = _id_lists(subs[has])
        if len(bad):
            rows = np.flatnonzero(has)[bad]
            _report(problems, path, rows, name, _ID_LIST_FORMAT, first_row, _value_at(subs))
            df[name] = subs.mask(np.isin(np.arange(len(subs)), rows))
