"""The collector reads response bodies and SSE lines with orjson, falling back to the standard library:
``json_value`` must give exactly what ``json.loads`` gives, and fail where it fails (issue 17)."""

from __future__ import annotations

import json
import math
import random

import pytest

from weknora_nb.collect.http.envelope import json_value

#: texts where the two parsers differ in what they accept, or where a slip would change a value
EDGES = [
    b'{"success":true,"data":[{"id":"a","score":0.1},{"id":"b","score":1e-7}]}',
    b'{"a":1,"a":2}',                               # a key written twice: the last wins in both
    b'{"big":123456789012345678901234567890}',      # beyond 64 bits: orjson refuses
    b'{"n":-9223372036854775809,"m":18446744073709551615}',
    b'{"x":NaN,"y":Infinity,"z":-Infinity}',        # not JSON, read by the standard library
    b'\xef\xbb\xbf{"bom":true}',                     # a UTF-8 byte-order mark
    '{"utf16":"\u4e2d\u6587"}'.encode("utf-16"),    # UTF-16 with its mark
    b'{"lone":"\\ud800"}',                          # an escaped lone surrogate
    b'{"pair":"\\ud83d\\ude00","tag":"\\u003cb\\u003e"}',
    '{"text":"中文 <b>&amp;</b>"}'.encode(),
    b'[1.0, 2.5e300, 5e-324, 0.30000000000000004, -0.0]',
    b'  {"spaced" : [ ] }  ',
    b'null', b'"just a string"', b'17', b'[1e400, -1e400, 1e-400]',
    b'{"id":"doc-1234567890123456789012","n":9223372036854775807,"m":-9223372036854775808}',
    '{"中":"１２３"}'.encode(),   # full-width digits are no JSON number
]
BAD = [b"", b"not json", b'{"a":1', b'{"a":1}{"b":2}', b"\xff\xfe\x00", b'{"a":01}', b'[1,]']


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN, and -0.0 told from 0.0 (both parsers keep the sign)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("text", EDGES)
def test_a_body_reads_as_the_standard_library_reads_it(text):
    assert same(json_value(text), json.loads(text))


@pytest.mark.parametrize("text", BAD)
def test_what_is_not_json_is_a_value_error_as_before(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        json_value(text)


def _random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-2**70, 2**70) if rng.random() < 0.1 else rng.randint(-1000, 1000)
    if kind == 2:
        return rng.choice([rng.uniform(-1, 1), rng.random() * 10 ** rng.randint(-300, 300), 0.1, -0.0])
    if kind in (3, 4):
        return "".join(rng.choice("ab 中文<>&\"\\\n\t\u2028é😀") for _ in range(rng.randrange(12)))
    if kind in (5, 6):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {f"k{rng.randrange(6)}": _random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


@pytest.mark.parametrize("seed", range(5))
def test_random_bodies_and_sse_lines_read_alike(seed):
    rng = random.Random(seed)
    for _ in range(300):
        value = _random_value(rng)
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")]))
        assert same(json_value(text), json.loads(text))            # an SSE line (str)
        assert same(json_value(text.encode()), json.loads(text.encode()))   # a body (bytes)
