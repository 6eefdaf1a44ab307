"""Rows of scores as JSON text: the per-query rows of ``weknora-nb score --json`` (and ``--per-query-out``'s
JSONL) built column by column with Arrow, never as Python dicts, and rows of a small table as plain values.

Numbers are written as orjson writes them (a float in the shortest form that reads back the same double), a
missing value as null, so that the text is what ``json.dumps(indent=2)`` of the same rows would give.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from weknora_nb.core.arrowtext import json_inner, large_text, string_bytes
from weknora_nb.core.background import in_background

#: rows of ``--json``'s per-query array from which its text is built in two halves at once (:func:`per_query_json`)
JSON_HALVES_FROM = 20_000


def per_query_json(table: pd.DataFrame, names: list[str], *, indent: bool,
                   lines: bool = False) -> list[bytes | memoryview]:
    """The rows of :meth:`Scores.per_query_mean` as the JSON array of ``--json`` (``indent``: laid out as
    ``json.dumps(indent=2)`` lays out a list in the top object; ``lines``: one compact object a line
    instead), built column by column with Arrow: numbers in their shortest round-trip form, a missing
    value as null. The text comes in pieces, to be joined or written. From :data:`JSON_HALVES_FROM` rows the
    second half's text is built in a thread beside the first's (Arrow joins the pieces without the interpreter
    lock)."""
    if not len(table):
        return [] if lines else [b"[]"]
    if indent:
        opener, sep, closer, between = "\n    {\n      ", ",\n      ", "\n    }", ","
    else:
        opener, sep, closer, between = "{", ",", "}", "\n" if lines else ","
    keys = ["query_id", "stage", "n_repeats", *names]
    # ids without their quotes (the quotes go with the text around them), numbers as they are
    ids, stages = large_text(table["query_id"]), large_text(table["stage"])
    numbers = [table["n_repeats"].to_numpy(np.int64), *[table[m].to_numpy(np.float64) for m in names]]
    texts: list[str] = []
    for i, key in enumerate(keys):
        before = opener if i == 0 else '"' + sep if i in (1, 2) else sep   # the ids' closing quotes, after them
        texts.append(before + _json_key(key) + (": " if indent else ":") + ('"' if i < 2 else ""))

    def rows(lo: int, hi: int) -> bytes | memoryview:
        """The text of rows ``lo`` .. ``hi``, each followed by ``between``."""
        values = [json_inner(ids.slice(lo, hi - lo)), json_inner(stages.slice(lo, hi - lo)),
                  *[_json_numbers(v[lo:hi]) for v in numbers]]
        parts = [x for text, value in zip(texts, values, strict=True) for x in (text, value)] + [closer + between]
        return string_bytes(pc.binary_join_element_wise(
            *[pa.scalar(x, pa.large_string()) if isinstance(x, str) else x for x in parts],
            pa.scalar("", pa.large_string())))

    n = len(table)
    if n < max(JSON_HALVES_FROM, 2):
        bodies = [rows(0, n)]
    else:
        second = in_background(lambda: rows(n // 2, n), "weknora-nb-json")
        bodies = [rows(0, n // 2), second.result()]
    bodies[-1] = memoryview(bodies[-1])[:-len(between)]
    return [*bodies, b"\n"] if lines else [b"[", *bodies, b"\n  ]" if indent else b"]"]


def _json_key(key: str) -> str:
    """A key as JSON text, quoted."""
    import orjson

    return orjson.dumps(key).decode()


def _json_numbers(v: np.ndarray) -> pa.Array:
    """Numbers as JSON text, as orjson writes them (a float in the shortest form that reads back the same
    double, an integral one as ``1.0``; a NaN as null, as :func:`float_or_none` gives, and an infinity too, which
    JSON cannot write): one orjson call for the column, its text cut at the commas into an Arrow array."""
    import orjson

    raw = np.frombuffer(orjson.dumps(np.ascontiguousarray(v), option=orjson.OPT_SERIALIZE_NUMPY), np.uint8)[1:-1]
    commas = np.flatnonzero(raw == 44)   # numbers hold no comma
    offsets = np.empty(len(v) + 1, np.int64)
    offsets[0], offsets[-1] = 0, len(raw) - len(commas)
    offsets[1:-1] = commas - np.arange(len(commas))
    data = raw[raw != 44]
    return pa.LargeStringArray.from_buffers(len(v), pa.py_buffer(offsets), pa.py_buffer(data))


def json_records(table: pd.DataFrame, ints: tuple[str, ...] = ()) -> list[dict]:
    """The rows of ``table`` as dicts of plain values: a missing value None, the ``ints`` columns as int."""
    names, columns = list(table.columns), []
    for name in names:
        col = table[name]
        na = col.isna().to_numpy(dtype=bool)
        values = col.to_numpy(dtype=object).tolist()
        if name in ints or na.any():
            values = [None if n else (int(v) if name in ints else v) for v, n in zip(values, na, strict=True)]
        columns.append(values)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def float_or_none(x) -> float | None:
    """``x`` as a float, None for a missing value (JSON null)."""
    return None if x is None or pd.isna(x) else float(x)


def text_or_none(x) -> str | None:
    """``x`` when it is a string (a tier), else None."""
    return x if isinstance(x, str) else None
