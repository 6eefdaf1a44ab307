"""Arrow text arrays (``large_string``) read and written without a Python string per value: their bytes end to
end, and their values as JSON text.

The test set's content hash (:mod:`weknora_nb.core.testset.model`) and the per-query rows of
``weknora-nb score --json`` (:mod:`weknora_nb.core.scoring.json_rows`) are JSON text built column by column
with these; the test-set checks read the offsets to find ids that are empty or padded with whitespace.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

#: the Arrow type of every text column built here
TEXT = pa.large_string()

#: bytes JSON escapes in a string (``"``, ``\\``, control characters), and the others
_JSON_ESCAPED = np.zeros(256, bool)
_JSON_ESCAPED[[*range(32), 34, 92]] = True
_JSON_PLAIN = bytes(np.flatnonzero(~_JSON_ESCAPED).astype(np.uint8))


def large_text(x) -> pa.Array:
    """A column of strings (Series, array, or Arrow) as an Arrow large_string array (one chunk, no dictionary)."""
    a = x if isinstance(x, pa.Array) else pa.array(x.array if isinstance(x, pd.Series) else x)
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if pa.types.is_dictionary(a.type):
        a = a.dictionary_decode()
    return a.cast(pa.large_string())


def text_offsets(arr: pa.Array) -> np.ndarray:
    """The offsets of a large_string array's values into its data buffer (``len(arr) + 1`` of them, int64): a view,
    not to be written to."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)


def string_bytes(arr: pa.Array) -> memoryview:
    """The UTF-8 bytes of a large_string array's values, end to end."""
    offsets = text_offsets(arr)
    data = arr.buffers()[2]
    return memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else memoryview(b"")


def escape_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """Which strings of ``arr`` (large_string) hold a character JSON escapes (``"``, ``\\``, a control
    character); None when none does (the usual case, found by one pass over the bytes)."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    masks: list[np.ndarray | None] = []
    for ch in chunks:
        offsets = text_offsets(ch) if len(ch) else np.zeros(1)
        lo, hi = int(offsets[0]), int(offsets[-1])
        data = bytes(memoryview(ch.buffers()[2])[lo:hi]) if hi > lo else b""
        if not data.translate(None, _JSON_PLAIN):
            masks.append(None)
            continue
        mask = np.zeros(len(ch), bool)
        mask[np.searchsorted(offsets, np.flatnonzero(_JSON_ESCAPED[np.frombuffer(data, np.uint8)]) + lo,
                             side="right") - 1] = True
        masks.append(mask)
    if all(m is None for m in masks):
        return None
    return np.concatenate([np.zeros(len(ch), bool) if m is None else m for ch, m in zip(chunks, masks, strict=True)])


def json_strings(arr: pa.Array, escape: np.ndarray | None | bool = True) -> pa.Array:
    """Each string as JSON text (``json.dumps(s, ensure_ascii=False)``); nulls stay null. ``escape``: which
    strings need escapes (from :func:`escape_mask`; True: find out here)."""
    quote = pa.scalar('"', TEXT)
    return pc.binary_join_element_wise(quote, json_inner(arr, escape), quote, pa.scalar("", TEXT))


def json_inner(arr: pa.Array, escape: np.ndarray | None | bool = True) -> pa.Array:
    """:func:`json_strings` without the quotes around each: ``arr`` itself when no string needs an escape."""
    needs = escape_mask(arr) if escape is True else escape
    if needs is None or needs is False or not needs.any():
        return arr
    escaped = [json.encoder.encode_basestring(s)[1:-1] for s in arr.filter(pa.array(needs)).to_pylist()]
    return pc.replace_with_mask(arr, pa.array(needs), pa.array(escaped, arr.type))
