"""The canonical JSONL test set (one record a line): read a block of lines at a time.

A block whose every record is plainly sound is parsed by orjson and checked at once
(:func:`~weknora_nb.core.testset.validate.bulk_columns`); a block holding anything unusual (a problem
to name, an odd type, a key written twice, a lone ``\\r``) is read line by line instead with Python's
parser, which keeps a key written twice, so that every message names its line and field. The fast path
only accepts what the line-by-line reading accepts, with the same result. Writing: :meth:`TestSet.to_jsonl
<weknora_nb.core.testset.model.TestSet.to_jsonl>`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from weknora_nb.core.testset import validate
from weknora_nb.core.testset.builder import Builder
from weknora_nb.core.testset.model import TestSet
from weknora_nb.core.testset.parsing import NOT_JSON, parse_json
from weknora_nb.core.testset.textfile import BOM, Decoder, raw_blocks

_ESCAPE_PAIR = re.compile(rb"\\.", re.DOTALL)


def load_jsonl(path: Path) -> TestSet:
    """A block of lines at a time: parsed and checked at once (:func:`_jsonl_block`) when every record
    in it is plainly sound, else line by line, each problem named."""
    builder = Builder(str(path), "line")
    decoder = Decoder(path, builder.problems)
    for block in raw_blocks(path):
        first = decoder.lineno
        bom = first == 0 and block[0].startswith(BOM)   # tolerated before the first line
        if _jsonl_block(builder, [block[0][3:], *block[1:]] if bom else block, first):
            decoder.skip(block)
            continue
        for lineno, line in decoder.lines(block):
            if not line.strip():
                continue
            obj = parse_json(line, builder.complaint(lineno), None)
            if obj is not NOT_JSON:   # only a JSON escape (\\ud800) can put a surrogate in a decoded line
                builder.add(lineno, obj, check_text="\\u" in line)
    return TestSet.from_builder(builder)


def _jsonl_block(builder: Builder, block: list[bytes], first: int) -> bool:
    """Parse (orjson) and check (:func:`~weknora_nb.core.testset.validate.bulk_columns`) the lines after line
    ``first`` at once and give them to ``builder``; False, with nothing given, when any line needs the
    line-by-line reading: a lone ``\\r``, text that is not one JSON object, a key written twice, nesting
    Python's parser refuses."""
    import orjson

    data = b"".join(block)
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):   # a lone \r ends a line too: the numbering moves
        return False
    blank = list(map(bytes.isspace, block))
    at = np.flatnonzero(~np.array(blank, dtype=bool)) if any(blank) else None
    lines = block if at is None else [block[i] for i in at]
    if not lines:
        return True
    try:
        objs = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:   # the line-by-line reading names the problem
        return False
    cols = validate.bulk_columns(objs)
    if cols is None or _key_twice(data, sum(map(len, objs)) + len(cols["chunk_id"])):
        return False   # a record to check alone, or a key written twice (orjson keeps the last silently)
    if any(set(map(type, validate.field_values(objs, name))) & {list, dict}
           for name in set().union(*objs) - validate.KNOWN_FIELDS):
        return False   # an ignored field holding a list: Python's parser may find it nested too deeply
    del objs   # freed before the collector resumes
    numbers = np.arange(first + 1, first + 1 + len(block), dtype=np.int64)
    builder.add_columns(numbers if at is None else numbers[at], cols)
    return True


def _key_twice(data: bytes, n_keys: int) -> bool:
    """Whether the JSON text ``data`` (valid JSON values, one a line), parsed into objects holding
    ``n_keys`` keys in all, writes a key twice: it then has more colons outside strings (one a key)."""
    colons = data.count(b":")
    if colons == n_keys:   # no colon in a string, and none more than the keys
        return False
    if b"\\" in data:
        data = _ESCAPE_PAIR.sub(b"", data)   # an escape pair never opens or closes a string
    b = np.frombuffer(data, np.uint8)
    quotes, at = np.flatnonzero(b == 34), np.flatnonzero(b == 58)
    return len(at) - int(np.count_nonzero(np.searchsorted(quotes, at) & 1)) != n_keys   # odd quotes: in a string
