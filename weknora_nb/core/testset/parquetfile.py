"""A Parquet test set: the JSONL schema's fields as columns (unknown columns are ignored).

``relevant`` is text (as in CSV), a map from chunk id to grade, or a struct with one integer field per
chunk (an absent chunk null); ``tags`` a list of strings or text. A batch of rows whose ``relevant`` is a
map column is checked at once (:func:`~weknora_nb.core.testset.validate.bulk_fields`), else row by row.
:func:`parquet_schema` and :func:`parquet_columns` read the WeKnora dataset folder's files too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from weknora_nb.core.errors import Problem, TestSetError, reading
from weknora_nb.core.testset.builder import BATCH, Builder
from weknora_nb.core.testset.model import TestSet
from weknora_nb.core.testset.parsing import Bad, object_pairs, parse_relevant_text, parse_tags_text
from weknora_nb.core.testset.validate import KNOWN_FIELDS, REQUIRED, bulk_fields

log = logging.getLogger(__name__)


def parquet_schema(path: Path) -> pa.Schema:
    """The schema of a Parquet file (a file that cannot be read: TestSetError naming it)."""
    with reading(path, TestSetError):
        return pq.read_schema(path)


def parquet_columns(path: Path, columns: list[str]) -> Iterator[dict[str, list[Any]]]:
    """Yield the ``columns`` of a Parquet file as Python lists, a batch of rows at a time."""
    with reading(path, TestSetError), pq.ParquetFile(path) as pf:
        for batch in pf.iter_batches(batch_size=BATCH, columns=columns):
            cols = {name: batch.column(name).to_pylist() for name in columns}
            yield cols


def _relevant_type_problem(t: pa.DataType) -> str | None:
    """Why a Parquet ``relevant`` column of Arrow type ``t`` cannot hold labels (None: it can)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    text = (pa.types.is_string(t) or pa.types.is_large_string(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t))
    if text or pa.types.is_null(t):
        return None
    if pa.types.is_map(t) and (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
        return None
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        twice = sorted({n for n in names if names.count(n) > 1})
        return f"has a struct type that names chunk(s) {twice} twice" if twice else None
    return (f"has Arrow type {t}; expected text (JSON or 'id:grade;id:grade'), a map from chunk id (string) "
            "to grade, or a struct with one integer field per chunk")


def load_parquet(path: Path) -> TestSet:
    """A Parquet test set: the JSONL schema's fields as columns (unknown columns ignored)."""
    schema = parquet_schema(path)
    names = list(schema.names)
    missing = set(REQUIRED) - set(names)
    if missing:
        raise TestSetError(path, [Problem(str(path), None, None, f"missing column(s) {sorted(missing)}")])
    twice = sorted({n for n in names if names.count(n) > 1 and n in KNOWN_FIELDS})
    why = _relevant_type_problem(schema.field("relevant").type) if not twice else None
    if twice or why:
        msg = f"column(s) {twice} appear twice" if twice else f"the column {why}"
        raise TestSetError(path, [Problem(str(path), None, "relevant" if why else None, msg)])
    unknown = sorted(set(names) - KNOWN_FIELDS)
    if unknown:
        log.debug("%s: ignoring unknown column(s) %s", path, unknown)
    columns = [n for n in names if n in KNOWN_FIELDS]
    builder = Builder(str(path), "row")
    as_map = pa.types.is_map(schema.field("relevant").type) or pa.types.is_null(schema.field("relevant").type)
    row = 0
    for cols in parquet_columns(path, columns):
        if as_map and _parquet_batch(builder, cols, row):
            row += len(cols["query_id"])
            continue
        for values in zip(*(cols[n] for n in columns), strict=True):
            row += 1
            obj = {k: v for k, v in zip(columns, values, strict=True) if not missing_value(v) or k in REQUIRED}
            texts = [obj[k] for k in ("relevant", "tags") if isinstance(obj.get(k), str)]
            if _parquet_record(obj, builder.complaint(row)):   # JSON text may spell a surrogate (\\ud800)
                builder.put(row, obj, check_text=any("\\u" in t for t in texts))
    return TestSet.from_builder(builder)


def _parquet_batch(builder: Builder, cols: dict[str, list[Any]], first: int) -> bool:
    """Check a batch of rows whose ``relevant`` is a map column at once
    (:func:`~weknora_nb.core.testset.validate.bulk_fields`) and give them to ``builder``; False, with nothing
    given, when a row needs its own look (a chunk twice in its map...)."""
    n = len(cols["query_id"])
    pairs = [p if p is not None else [] for p in cols["relevant"]]   # a null map: no label
    rel = list(map(dict, pairs))
    if list(map(len, rel)) != list(map(len, pairs)):   # a chunk twice: the row-by-row check names it
        return False
    fields = bulk_fields(_column_field({**cols, "relevant": rel}, n), n)
    del rel, pairs   # freed before the collector resumes
    if fields is None:
        return False
    builder.add_columns(np.arange(first + 1, first + 1 + n, dtype=np.int64), fields)
    return True


def _column_field(cols: dict[str, list[Any]], n: int) -> Callable[[str], list[Any]]:
    """``name -> its column`` (``n`` Nones for a column the file does not have)."""
    absent = [None] * n
    return lambda name: cols.get(name, absent)


def _parquet_record(obj: dict[str, Any], bad: Bad) -> bool:
    """Turn a Parquet row's ``relevant`` (text, map or struct) and ``tags`` (text or list) into the JSONL
    schema, in place; False when ``relevant`` is malformed text (the problem recorded)."""
    rel = obj.get("relevant")
    if isinstance(rel, str):
        rel = parse_relevant_text(rel, bad)
        if rel is None:
            return False
    elif isinstance(rel, list):   # a map column arrives as [(key, value), ...]
        rel = object_pairs(rel)
    elif isinstance(rel, dict):   # a struct column: absent chunks are null
        rel = {k: v for k, v in rel.items() if not missing_value(v)}
    obj["relevant"] = {} if rel is None else rel
    if isinstance(obj.get("tags"), str):
        obj["tags"] = parse_tags_text(obj["tags"])
    return True


def missing_value(v: Any) -> bool:
    """None or a float NaN (how a table says "no value")."""
    return v is None or (isinstance(v, float) and math.isnan(v))
