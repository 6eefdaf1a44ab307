"""JSON written fast (:func:`json_bytes`): orjson where it writes the standard library's value, the standard
library wherever it would not.

The sandbox encodes every response it sends and a collection every checkpoint record it appends, so the
encoder is on the path of every request: orjson writes a large answer many times faster than ``json.dumps``,
and the check that decides which of the two may write it (the finiteness walk below) costs less than the
difference.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

#: what orjson writes its own way hands over to the standard library (through orjson's refusal, below):
#: subclasses of str, int, dict and list (a str enum), dataclasses, dates and times
_HANDED_OVER = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME

#: nesting orjson writes (it refuses deeper); a deeper value, or one that holds itself, is the standard library's
_MAX_DEPTH = 254


def json_bytes(obj: Any, *, allow_nan: bool = True) -> bytes:
    """``obj`` as ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan)`` writes
    it, in UTF-8: the same bytes but for the notation of floats, which orjson writes in the shortest form that
    reads back to the same number (``0.00001`` where Python writes ``1e-05``; Go writes ``0.00001`` too).

    orjson writes it unless the standard library must: a float that is not finite (orjson writes ``null``;
    the standard library writes ``NaN`` / ``Infinity``, or with ``allow_nan`` false raises ``ValueError``, as
    Go's ``encoding/json`` refuses them), or a value orjson refuses (a key that is no string, an integer beyond
    64 bits, a string that is no UTF-8, a subclass of a JSON type, a float subclass such as NumPy's, a
    dataclass, a date, nesting deeper than 254 levels or a value that holds itself). The standard library
    then writes it as it always did, or raises its own error.
    """
    if _finite(obj):
        try:
            return orjson.dumps(obj, option=_HANDED_OVER)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan).encode("utf-8")


def _finite(obj: Any) -> bool:
    """Whether every float (exactly ``float``) in ``obj``'s dicts, lists and tuples is finite; False too when
    they nest deeper than orjson writes (which a value holding itself does)."""
    isfinite = math.isfinite
    if type(obj) is float:
        return isfinite(obj)
    stack = [(obj, 0)] if type(obj) in (dict, list, tuple) else []
    while stack:
        container, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return False
        for value in container.values() if type(container) is dict else container:
            kind = type(value)
            if kind is dict or kind is list or kind is tuple:
                stack.append((value, depth + 1))
            elif kind is float and not isfinite(value):
                return False
    return True
