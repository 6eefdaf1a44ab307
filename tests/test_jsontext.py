"""json_bytes (core/jsontext.py, issue 17): the value the standard library writes, in its bytes but for the
notation of floats; non-finite floats and what orjson refuses written, or refused, as the standard library
does."""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
import random
from typing import Any

import numpy as np
import pytest

from weknora_nb.core.jsontext import json_bytes

from .conftest import examples

#: control characters, DEL, quotes, backslashes, Go's five escapes, Chinese, an emoji (two UTF-16 units)
ALPHABET = "ab 中文\x00\x01\x08\x0c\x1f\x7f\r\n\t\"\\/<>&\u2028\u2029é😀"


def standard(obj: Any, allow_nan: bool = True) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan).encode("utf-8")


def random_value(rng: random.Random, depth: int = 0, floats: bool = True) -> Any:
    kinds = ["str", "int", "none", "bool"] + (["float"] * floats) + (["list", "tuple", "dict"] if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(12)))
    if kind == "int":
        return rng.choice([0, -1, 7, 2**53 + 1, -(2**63), 2**63 - 1, rng.randrange(-10**6, 10**6)])
    if kind == "float":
        return rng.choice([0.0, -0.0, 0.5, 1e-7, 1e-5, 123456.789, 1e15, rng.random(), -rng.random() * 1e-3])
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    items = [random_value(rng, depth + 1, floats) for _ in range(rng.randrange(5))]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    return {"".join(rng.choice(ALPHABET) for _ in range(rng.randrange(6))): v for v in items}


@pytest.mark.parametrize("seed", range(4))
def test_the_value_is_the_standard_librarys_and_so_are_the_bytes_of_all_but_floats(seed):
    rng = random.Random(seed)
    for _ in range(examples(300)):
        value = random_value(rng)
        assert json.loads(json_bytes(value)) == json.loads(standard(value))
        plain = random_value(rng, floats=False)
        assert json_bytes(plain) == standard(plain), plain


def test_floats_read_back_to_the_same_number():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.random(2000) * 10.0 ** rng.integers(-12, 16, 2000), [5e-324, 1.7976931348623157e308]])
    assert json.loads(json_bytes(values.tolist())) == values.tolist()
    assert json_bytes([1e-05, 1e-07, 0.1]) == b"[0.00001,1e-7,0.1]"   # Go's encoding/json writes these so too


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_float_that_is_not_finite_is_written_or_refused_as_the_standard_library_does(bad):
    for value in (bad, [1, {"a": [bad]}], {"k": (bad,)}):
        assert json_bytes(value) == standard(value)   # NaN, Infinity, -Infinity: not null
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            json_bytes(value, allow_nan=False)


class Colour(enum.StrEnum):
    RED = "red"


@pytest.mark.parametrize("value", [
    {1: "int key", None: "null key", 2.5: "float key"},    # keys that are no strings
    [2**64, -(2**70)],                                       # integers beyond 64 bits
    [np.float64(0.25), np.float32(0.5).item()],             # a float subclass
    {"colour": Colour.RED},                                  # a str subclass, written as its string
])
def test_what_orjson_refuses_is_written_by_the_standard_library(value):
    assert json_bytes(value) == standard(value)


def test_nesting_deeper_than_orjson_writes_is_written_by_the_standard_library():
    deep: Any = 1.5
    for i in range(300):
        deep = [deep] if i % 2 else {"k": deep}
    assert json_bytes(deep) == standard(deep)


@pytest.mark.parametrize("value", [dt.date(2026, 12, 4), {"at": dt.datetime(2026, 12, 4, 12)}, {"a set": {1, 2}}])
def test_what_the_standard_library_refuses_is_refused(value):
    with pytest.raises(TypeError, match="is not JSON serializable"):
        json_bytes(value)


def test_a_string_that_is_no_utf8_and_a_value_that_holds_itself_are_refused_as_ever():
    with pytest.raises(UnicodeEncodeError):
        json_bytes(["\ud800"])
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference detected"):
        json_bytes({"a": loop})
