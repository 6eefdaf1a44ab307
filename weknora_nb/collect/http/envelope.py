"""WeKnora's responses read: the envelope's ``data``, or the :class:`RequestFailed` kind of a failure.

A client sees three error shapes (docs/weknora-contract.md C14): the handlers' envelope
``{"success": false, "error": {"code", "message", "details"}}`` (C11, codes C12), the
auth layer's bare ``{"error": "..."}`` (401, 400 and 403, with ``"code": "TENANT_REQUIRED"``
on the 409 of a platform key, C2-C8) and the panic body of ``Recovery`` (C13). An unknown
route is gin's plain-text 404 (C14): no envelope, so no code.

The auth failures get a message that says what to do (a platform key without
``--tenant-id``, a wrong tenant, a key without the capability an endpoint needs, C4-C7),
and a 500 whose envelope says a knowledge base was not found (knowledge-search turns
every service error into 500 code 1007, C28) is a :class:`NotFound`, never retried.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import orjson

from weknora_nb.collect.http.retry import retry_after
from weknora_nb.core.errors import (
    AuthFailed,
    BadRequest,
    NotFound,
    ProtocolFailed,
    RateLimited,
    RequestFailed,
    ServerFailed,
)

#: C6: the API-key gate's 403 message
CAPABILITY_REFUSED = "API key scope does not allow this operation"

#: C7: the capability each route needs (besides full access), by path pattern, first match wins
_CAPABILITIES: tuple[tuple[str, str], ...] = (
    (r"^/api/v1/messages/search", "message_history"),
    (r"^/api/v1/(sessions|knowledge-chat|messages/[^/]+/load)", "chat"),
    (r"^/api/v1/tenants/kv/", "manage_tenant_settings"),
    (r"^/api/v1/system/", "manage_vector_stores"),
    (r"^/api/v1/evaluation", "run_evaluations"),
    (r"^/api/v1/(knowledge-bases|knowledge|chunks|knowledge-search)", "retrieve"),
)
#: C26, C28: a service error naming a missing knowledge base (repository ErrKnowledgeBaseNotFound)
_KB_NOT_FOUND = re.compile(r"knowledge base\b[^.;]*\bnot found", re.IGNORECASE)


def capability_for(path: str) -> str | None:
    """The API-key capability C7 says ``path`` needs (``retrieve``, ``chat``, ...), None when not listed."""
    return next((cap for pattern, cap in _CAPABILITIES if re.match(pattern, path)), None)


def route_missing(exc: RequestFailed) -> bool:
    """Whether ``exc`` is the server saying the route does not exist: a 405, or a 404 without an
    envelope code (gin's plain ``404 page not found``, C14; a handler's 404 carries code 1003)."""
    return exc.status == 405 or (exc.status == 404 and exc.code is None)


def json_value(text: bytes | str) -> Any:
    """The JSON value of ``text`` (a response body, an SSE data line), as ``json.loads`` reads it.

    orjson parses it (several times faster: a collection parses every response), unless the
    text holds a run of 19 digits or more: orjson reads an integer beyond 64 bits as a float,
    where the standard library keeps it whole. A text orjson refuses but the standard library
    reads (``NaN``, UTF-16, a byte-order mark, an escaped lone surrogate) or refuses too goes to
    ``json.loads`` as well, so the value, and the ``ValueError`` of text that is not JSON, are
    the standard library's.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if _LONG_RUN not in data.translate(_DIGITS_AS_ZERO):   # a scan in C: a regex would cost more than the parse
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


#: every ASCII digit as ``0``: a run of 19 digits, an integer orjson may not hold (20 digits reach 2**64; 19,
#: 2**63), is then a run of 19 zeros (UTF-8 puts no ASCII byte inside a multi-byte character)
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19


def unwrap(resp: httpx.Response, *, envelope: bool = False, tenant_id: str | None = None) -> Any:
    """The envelope's ``data`` (the whole body when ``envelope``), or the failure's exception.

    ``tenant_id`` (the X-Tenant-ID sent) goes into the messages of tenant errors.
    A 2xx body must be a JSON object without ``success: false``, holding ``data`` unless
    ``envelope`` (C9; ``/system/info``'s ``{code, msg, data}``, C10, passes).
    """
    status = resp.status_code
    try:
        body = json_value(resp.content)
    except ValueError:
        body = None
    where = f"{resp.request.method} {resp.request.url.path}"
    if status >= 400:
        raise failure(resp, body, tenant_id=tenant_id)
    if not isinstance(body, dict):
        raise ProtocolFailed(f"{where}: HTTP {status} but the body is not a JSON object", status=status)
    if body.get("success") is False:
        raise ProtocolFailed(f"{where}: HTTP {status} with success=false: {str(body.get('error'))[:200]}",
                             status=status)
    if "data" not in body and not envelope:
        raise ProtocolFailed(f"{where}: no 'data' in the envelope", status=status)
    return body if envelope else body["data"]


def failure(resp: httpx.Response, body: Any, *, tenant_id: str | None = None) -> RequestFailed:
    """The :class:`RequestFailed` kind of an error response (status >= 400), its message naming
    the request, the status, the envelope's code and message."""
    status = resp.status_code
    method, path = resp.request.method, resp.request.url.path
    code, msg = _code_and_message(resp, body)
    shown = f"HTTP {status}" + (f" code {code}" if code is not None else "")
    text = f"{method} {path}: {shown}: {msg}"
    auth = _auth_failure(status, code, msg, method, path, tenant_id, text)
    if auth is not None:
        return auth
    if status == 404:
        return NotFound(text if code is not None else f"{method} {path}: HTTP 404: no such route on this server "
                        f"({msg[:80]})", status=status, code=code)
    if status == 429:
        return RateLimited(text, status=status, code=code, retry_after=retry_after(resp))
    if status >= 500 and _KB_NOT_FOUND.search(msg):
        return NotFound(f"{text} (the knowledge base does not exist or is not visible to this key)",
                        status=status, code=code)
    if status >= 500:
        return ServerFailed(text, status=status, code=code)
    return BadRequest(text, status=status, code=code)


def _code_and_message(resp: httpx.Response, body: Any) -> tuple[Any, str]:
    """The error's code and message: the envelope's (C11), the auth layer's bare ``error`` (and
    ``code`` on a 409, C4), the panic body's ``message`` (C13), or the start of a non-JSON page."""
    if not isinstance(body, dict):
        return None, resp.text[:200].strip()
    err = body.get("error")
    if isinstance(err, dict):
        return err.get("code"), str(err.get("message", ""))
    if err is not None:
        detail = body.get("message")
        return body.get("code"), str(err) + (f": {detail}" if detail else "")
    return body.get("code"), str(body.get("message") or body)[:200]


def _auth_failure(status: int, code: Any, msg: str, method: str, path: str, tenant_id: str | None,
                  text: str) -> AuthFailed | None:
    """The :class:`AuthFailed` of an auth-layer refusal (C2-C8, C26's 403), with what to do; else None."""
    tenant = f"--tenant-id {tenant_id}" if tenant_id else "no --tenant-id"
    if status == 409 and code == "TENANT_REQUIRED":
        return AuthFailed(f"this is a platform key: pass --tenant-id (the workspace to measure). {text}",
                          status=status, code=code)
    if status == 400 and code is None and re.search(r"tenant|workspace", msg, re.IGNORECASE):
        return AuthFailed(f"the tenant is not valid ({tenant}): X-Tenant-ID must be a workspace id > 0. {text}",
                          status=status, code=code)
    if status == 401:
        hint = (f", or {tenant} names no workspace" if tenant_id else "")
        return AuthFailed(f"the server rejected the API key{hint}. {text}", status=status, code=code)
    if status != 403:
        return None
    if CAPABILITY_REFUSED in msg:
        cap = capability_for(path)
        need = f"the capability {cap!r}" if cap else "a capability"
        return AuthFailed(f"the API key lacks {need} that {method} {path} needs (give the key {cap or 'it'} or "
                          f"full access). {text}", status=status, code=code)
    if re.search(r"switch workspaces|target (tenant|workspace)", msg):
        return AuthFailed(f"wrong tenant: the API key cannot act in the workspace of {tenant}. {text}",
                          status=status, code=code)
    if code == 1002:
        return AuthFailed(f"the API key may not access this knowledge base (not shared with its workspace, or "
                          f"outside the key's knowledge-base list). {text}", status=status, code=code)
    return AuthFailed(text, status=status, code=code)
