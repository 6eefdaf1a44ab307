"""How WeKnora's Go server writes and reads its wire format, for the sandbox's HTTP server.

- JSON as Go's ``encoding/json`` writes it: compact, UTF-8, with ``<``, ``>``, ``&``, U+2028 and
  U+2029 escaped (``\\u003c``...): docs/weknora-contract.md C62 (gin's ``c.JSON`` and ``c.SSEvent``).
- The three error shapes of C14: the ``ErrorHandler`` envelope of an AppError
  ``{"success": false, "error": {"code", "message", "details"}}`` (C11, codes and statuses C12);
  the bare ``{"error": ...}`` of the auth layer (C2-C8); the ``Recovery`` panic body (C13);
  and gin's plain-text ``404 page not found`` for unknown routes and methods (C14).
- Request binding as gin's ``ShouldBindJSON`` / ``ShouldBindQuery`` does it: a field of the wrong
  JSON type fails with Go's ``json: cannot unmarshal ...`` message, a missing ``binding:"required"``
  field with the validator's ``Key: 'Struct.Field' Error:...`` message; unknown fields are ignored
  and ``null`` is the zero value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response

from weknora_nb.core.jsontext import json_bytes
from weknora_nb.core.weknora import ERROR_CODES

_GO_ESCAPES = [(char.encode("utf-8"), f"\\u{ord(char):04x}".encode("ascii")) for char in "<>&\u2028\u2029"]

#: C11 / C12
BAD_REQUEST, FORBIDDEN, NOT_FOUND, TOO_MANY_REQUESTS, INTERNAL = 1000, 1002, 1003, 1006, 1007


def go_json(obj: Any) -> bytes:
    """``obj`` as Go's ``json.Marshal`` writes it (compact; ``<`` ``>`` ``&`` as ``\\u003c``...; C62; NaN and
    infinities refused with ``ValueError``, as Go refuses them): :func:`~weknora_nb.core.jsontext.json_bytes`.

    The escaped characters can only stand inside JSON strings, so replacing them in the
    text is the same as escaping each string. Each is looked for first (a scan at C speed): most
    answers hold none, and a regular expression's substitution would cost about as much as the encoding.
    """
    data = json_bytes(obj, allow_nan=False)
    for char, escaped in _GO_ESCAPES:
        if char in data:
            data = data.replace(char, escaped)
    return data


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON response as gin's ``c.JSON`` writes it."""
    return Response(go_json(body), status_code=status, media_type="application/json",
                    headers=dict(headers) if headers else None)


def ok(data: Any, status: int = 200, **extra: Any) -> Response:
    """The success envelope ``{"success": true, "data": ..., **extra}`` (C9; sessions answer 201, C58)."""
    return _json({"success": True, "data": data, **extra}, status)


def app_error(code: int, message: str, details: Any = None, *, headers: Mapping[str, str] | None = None) -> Response:
    """``ErrorHandler``'s answer to an AppError: its HTTP status (C12) and the C11 envelope, ``details``
    always present (``null`` when the error has none)."""
    status = ERROR_CODES[code][1]
    return _json({"success": False, "error": {"code": code, "message": message, "details": details}}, status,
                 headers)


def internal_error() -> Response:
    """``ErrorHandler``'s answer to an error that is no AppError: 500, code 1007, no ``details`` (C11)."""
    return _json({"success": False, "error": {"code": INTERNAL, "message": "Internal server error"}}, 500)


def bare_error(status: int, message: str, **extra: str) -> Response:
    """The auth layer's bare ``{"error": message, **extra}`` (C2-C8; ``code`` for 409 TENANT_REQUIRED)."""
    return _json({"error": message, **extra}, status)


def panic_body(message: str) -> Response:
    """``Recovery``'s answer to a panic: 500 ``{"error": "Internal Server Error", "message": <panic>}`` (C13)."""
    return _json({"error": "Internal Server Error", "message": message}, 500)


def route_not_found() -> Response:
    """gin's default answer for a path or method no route serves: ``404 page not found``, plain text (C14)."""
    return Response(b"404 page not found", status_code=404, media_type="text/plain")


# ---------------------------------------------------------------------------------------
# binding
# ---------------------------------------------------------------------------------------
class BindError(ValueError):
    """A request that gin's binding refuses; ``str()`` is the message gin gives."""


@dataclass(frozen=True)
class Field:
    """One field of a Go request struct: JSON name, Go type (``string``, ``int``, ``int64``, ``float64``,
    ``bool``, ``[]string``, ``[]int64``, ``[]float32``, ``any``), Go name, and ``binding:"required"``."""

    json_name: str
    go_type: str
    go_name: str = ""
    required: bool = False


_SCALARS: dict[str, tuple[type, ...]] = {"string": (str,), "int": (int,), "int64": (int,), "float64": (int, float),
                                         "float32": (int, float), "bool": (bool,)}
_ZERO: dict[str, Any] = {"string": "", "int": 0, "int64": 0, "float64": 0.0, "float32": 0.0, "bool": False}


def _kind(value: Any) -> str:
    """The JSON kind Go's decoder names in its errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _convert(value: Any, go_type: str, where: str) -> Any:
    """``value`` decoded into ``go_type`` (None is the zero value), or :class:`BindError` with Go's message."""
    if go_type == "any":
        return value
    if value is None:
        return [] if go_type.startswith("[]") else _ZERO[go_type]
    if go_type.startswith("[]"):
        if not isinstance(value, list):
            raise BindError(f"json: cannot unmarshal {_kind(value)} into Go struct field {where} of type {go_type}")
        return [_convert(v, go_type[2:], where) for v in value]
    allowed = _SCALARS[go_type]
    if isinstance(value, bool) != (go_type == "bool") or not isinstance(value, allowed):
        raise BindError(f"json: cannot unmarshal {_kind(value)} into Go struct field {where} of type {go_type}")
    if go_type in ("int", "int64") and isinstance(value, float):
        raise BindError(f"json: cannot unmarshal number {value:g} into Go struct field {where} of type {go_type}")
    return float(value) if isinstance(value, int | float) and go_type.startswith("float") else value


def _syntax_error(exc: json.JSONDecodeError) -> BindError:
    """Go's message for a body that is not JSON (``unexpected EOF`` or ``invalid character ...``)."""
    if exc.pos >= len(exc.doc.rstrip()):
        return BindError("unexpected EOF")
    return BindError(f"invalid character {exc.doc[exc.pos]!r} looking for beginning of value")


def bind_json(raw: bytes, struct: str, spec: tuple[Field, ...]) -> dict[str, Any]:
    """The body decoded as gin's ``ShouldBindJSON`` into the Go struct ``struct`` described by ``spec``.

    Returns every field of ``spec`` (missing or null ones as their zero value). Raises
    :class:`BindError`: ``EOF`` for an empty body, a syntax error, ``json: cannot unmarshal ...``
    for a value of the wrong type, the validator's message for a missing required field.
    """
    if not raw.strip():
        raise BindError("EOF")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _syntax_error(exc) from None
    except UnicodeDecodeError:
        raise BindError("invalid character in string literal") from None
    if not isinstance(data, dict):
        raise BindError(f"json: cannot unmarshal {_kind(data)} into Go value of type {struct}")
    short = struct.rsplit(".", 1)[-1]
    out = {f.json_name: _convert(data.get(f.json_name), f.go_type, f"{short}.{f.json_name}") for f in spec}
    for f in spec:
        if f.required and out[f.json_name] in ("", 0, [], False, None):
            raise BindError(f"Key: '{short}.{f.go_name}' Error:Field validation for '{f.go_name}' failed on the "
                            "'required' tag")
    return out


async def bind_request(request: Request, struct: str, spec: tuple[Field, ...], *,
                       message: str | None = None) -> dict[str, Any] | Response:
    """:func:`bind_json` of ``request``'s body, or the 400 envelope WeKnora answers when it fails: the
    binder's text as the message, or (``message`` given) that message with the binder's text as details."""
    try:
        return bind_json(await request.body(), struct, spec)
    except BindError as exc:
        return app_error(BAD_REQUEST, str(exc)) if message is None else app_error(BAD_REQUEST, message, str(exc))


def _query_int(params: QueryParams, name: str) -> int:
    """An integer query parameter as gin's form binding reads it (absent or empty: 0)."""
    text = params.get(name, "")
    if text == "":
        return 0
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise BindError(f'strconv.ParseInt: parsing "{text}": invalid syntax')
    return int(text)


def bind_pagination(params: QueryParams) -> tuple[int, int]:
    """``page`` and ``page_size`` bound into ``types.Pagination`` (``binding:"omitempty,min=1"`` and
    ``"omitempty,min=1,max=1000"``, C50): 0 or absent passes (the handler's default applies), a
    negative value or a page size over 1000 is a :class:`BindError` with the validator's message."""
    page, size = _query_int(params, "page"), _query_int(params, "page_size")
    for name, bad in (("Page", "min" if page < 0 else None),
                      ("PageSize", "min" if size < 0 else "max" if size > 1000 else None)):
        if bad is not None:
            raise BindError(f"Key: 'Pagination.{name}' Error:Field validation for '{name}' failed on the '{bad}' tag")
    return page, size
