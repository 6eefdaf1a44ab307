"""Record values written as text: JSON that keeps a key written twice, labels written as text (a CSV cell, a
Parquet text column: ``{"a": 3}`` or ``a:3;b:1``), tags written as text, an overlap written as text.

Nothing collapses silently: a JSON object whose text repeats a key is read as a :class:`Repeated` dict
that keeps every pair as written, so that the record check (:mod:`weknora_nb.core.testset.validate`)
names the key instead of keeping the last value. A problem found while parsing goes to a :data:`Bad`
callback, which names the file, line (or row) and field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import repeat
from typing import Any

#: ``bad(field, message)``: records a problem at the line (or row) being checked
Bad = Callable[[str | None, str], None]

#: an integer grade written as text (at most 18 digits: what int64 holds)
GRADE_TEXT = re.compile(r"[+-]?[0-9]{1,18}")
#: a decimal number written as text (``0.83``, ``1``, ``.5``)
NUMBER_TEXT = re.compile(r"[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18}")


class Repeated(dict):
    """A JSON object whose text repeats a key; ``pairs`` keeps every (key, value) as written."""

    __slots__ = ("pairs",)
    pairs: list[tuple[Any, Any]]


def object_pairs(pairs: list[tuple[Any, Any]]) -> dict:
    """``object_pairs_hook``: a dict, or a :class:`Repeated` one when a key is repeated."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    rep = Repeated(obj)
    rep.pairs = list(pairs)
    return rep


_DECODER = json.JSONDecoder(object_pairs_hook=object_pairs)
#: what :func:`parse_json` gives for text that is not JSON
NOT_JSON = object()


def parse_json(text: str, bad: Bad, field: str | None, *, column: bool = True) -> Any:
    """The value of JSON ``text``, or :data:`NOT_JSON` with the reason given to ``bad(field, message)``."""
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        bad(field, f"not valid JSON: {exc.msg}" + (f" (column {exc.colno})" if column else ""))
    except RecursionError:
        bad(field, "not valid JSON: nested too deeply")
    except ValueError as exc:  # an integer of more than 4300 digits
        bad(field, f"not valid JSON: {exc}")
    return NOT_JSON


def parse_relevant_text(text: str, bad: Bad) -> dict | None:
    """``{"a": 3}`` (JSON) or ``a:3;b:1``; None (with a problem recorded) when malformed."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        plain = _plain_labels(text)
        if plain is not None:
            return plain
        val = parse_json(text, bad, "relevant", column=False)
        return None if val is NOT_JSON else val
    pairs: list[tuple[str, Any]] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        cid, sep, grade = part.rpartition(":")
        if not sep:
            bad("relevant", f"expected 'chunk_id:grade', got {part!r}")
            return None
        g: Any = int(grade) if GRADE_TEXT.fullmatch(grade.strip()) else grade.strip()
        pairs.append((cid.strip(), g))
    return object_pairs(pairs)   # a chunk written twice is reported by the record's check


def _plain_labels(text: str) -> dict | None:
    """The JSON object ``text`` read by orjson when it plainly maps chunk ids to integers, each written once;
    None when Python's parser must read it (it names what is wrong, and reads what orjson reads otherwise:
    numbers past 64 bits, ``NaN``...). Without escapes, the text's colons are one per key written plus those
    inside the keys: one more means a key written twice (orjson keeps the last silently)."""
    import orjson

    if "\\" in text:
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict or set(map(type, obj.values())) - {int} \
            or text.count(":") != len(obj) + sum(map(str.count, obj, repeat(":"))):
        return None
    return obj


def parse_tags_text(text: Any) -> Any:
    """Tags written as text: a JSON list, or names separated by ``;`` or ``,``; anything else as it is (the
    record's check reports it)."""
    if not isinstance(text, str):
        return text
    t = text.strip()
    if t.startswith("["):
        val = parse_json(t, lambda *_: None, "tags")
        return t if val is NOT_JSON else val  # validation reports it
    return [x.strip() for x in t.replace(",", ";").split(";") if x.strip()]


def parse_number_text(text: Any) -> Any:
    """A decimal number written as text (a CSV cell's overlap, ``0.83``) as a float; anything else as it is
    (the record's check reports it)."""
    if isinstance(text, str) and NUMBER_TEXT.fullmatch(text.strip()):
        return float(text.strip())
    return text
