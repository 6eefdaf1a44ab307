"""WeKnora's auth layer for the sandbox: API keys, tenants, the capability gate (docs/weknora-contract.md C1-C8).

- Only ``X-API-Key`` authenticates. A bearer token is only ever a JWT (C1); the sandbox has no
  users, so every bearer token is rejected: with no ``X-API-Key`` the answer is 401 "invalid or
  expired token" from v0.7.2, "missing authentication" at v0.6.x (C2).
- v0.6.x (``release.key_service`` false, C3): a key is its tenant's single key, ``X-Tenant-ID``
  is ignored and the caller has full access; a key the server does not know fails decoding
  ("invalid API key format"). Platform keys do not exist there.
- v0.7.2 and main (C3-C7): workspace and platform keys from a key service. A platform key needs
  ``X-Tenant-ID`` (409 ``TENANT_REQUIRED``), a malformed or zero one is a 400, a tenant that does
  not exist a 401; a workspace key naming another tenant is a 403. Platform keys are never full
  access (auth.go:537 @ v0.7.2): they pass the gate only through their capabilities. Each route
  needs one capability unless the key has full access (C7), else 403 (C6). A key with a KB
  allow-list is refused other knowledge bases with the envelope's 403, code 1002 (C7).

Whose sessions a key sees (docs/weknora-contract.md C82-C84): each principal has an
:attr:`Principal.owner`, the ``sessions.user_id`` it creates and is scoped to. From v0.7.2 a workspace
key owns ``api_tenant_key:<tenant>:<key id>`` (the key the sandbox is started with has id 1, the
``api_keys`` 2, 3, ... in their order) and a platform key ``api_platform:<key id>``; at v0.6.x every
key acts as its tenant's first user (:data:`FIRST_USER_ID` for tenant 1, which has users; the
synthetic ``system-<tenant>`` for the others). :attr:`Principal.admin` is the tenant role Admin or
Owner: every key at v0.6.x, full-access workspace keys from v0.7.2.

Keys are secrets: nothing here logs one.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from weknora_nb.core.errors import UsageError
from weknora_nb.sandbox.emulation import WeKnoraRelease
from weknora_nb.sandbox.wire import FORBIDDEN, app_error, bare_error

log = logging.getLogger(__name__)

#: the sandbox's one tenant (workspace)
TENANT_ID = 1
#: the first user of tenant 1 (by created_at): whom a v0.6.x API key acts as (repository/user.go:94-103 @ v0.6.2)
FIRST_USER_ID = "3f6b1c2e-8a47-4d0e-9c21-5b7e0d4a9f13"

#: C7: the capabilities the sandbox's routes need (tenant_api_key.go:78,82,112,128,157 @ v0.7.2)
RETRIEVE, CHAT, MESSAGE_HISTORY = "retrieve", "chat", "message_history"
MANAGE_TENANT_SETTINGS, MANAGE_VECTOR_STORES = "manage_tenant_settings", "manage_vector_stores"
CAPABILITIES = (RETRIEVE, CHAT, "read_agents", "ingest", "manage_kbs", "manage_agents", MESSAGE_HISTORY,
                "manage_models", "manage_mcp_services", "manage_datasources", "manage_channels",
                MANAGE_VECTOR_STORES, "manage_storage_backends", "manage_web_search", "run_evaluations",
                "manage_members", "manage_spaces", MANAGE_TENANT_SETTINGS)

_TENANT_REQUIRED = "Workspace required: platform API keys must send X-Tenant-ID"
_GATE_REFUSED = "Forbidden: API key scope does not allow this operation"


@dataclass(frozen=True)
class ApiKey:
    """One API key the sandbox accepts: ``kind`` "workspace" (bound to ``tenant_id``) or "platform"
    (picks its tenant with ``X-Tenant-ID``); ``capabilities`` None = full access (workspace keys only);
    ``knowledge_base_ids``: the KB allow-list (empty: every KB)."""

    kind: str
    tenant_id: int | None = TENANT_ID
    capabilities: frozenset[str] | None = None
    knowledge_base_ids: tuple[str, ...] = ()
    #: the key's id in the key service (``tenant_api_keys.id``), part of the sessions' owner (C82)
    key_id: int = 0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> ApiKey:
        """The key of ``{"kind", "tenant_id", "capabilities", "knowledge_base_ids"}`` (:class:`UsageError`
        naming the field for a bad kind, tenant id or capability)."""
        unknown = sorted(set(spec) - {"kind", "tenant_id", "capabilities", "knowledge_base_ids"})
        if unknown:
            raise UsageError(argument="an API key field", allowed=["kind", "tenant_id", "capabilities",
                                                                   "knowledge_base_ids"], got=unknown[0])
        kind = spec.get("kind", "workspace")
        if kind not in ("workspace", "platform"):
            raise UsageError(argument="kind", allowed=["workspace", "platform"], got=kind)
        tenant = spec.get("tenant_id", TENANT_ID if kind == "workspace" else None)
        if tenant is not None and (isinstance(tenant, bool) or not isinstance(tenant, int) or tenant < 0):
            raise UsageError(argument="tenant_id", allowed="a tenant id (an integer >= 0) or None", got=tenant)
        caps = spec.get("capabilities")
        if caps is not None:
            bad = [c for c in caps if c not in CAPABILITIES]
            if bad or isinstance(caps, str):
                raise UsageError(argument="capabilities", allowed=list(CAPABILITIES), got=bad[0] if bad else caps)
            caps = frozenset(caps)
        return cls(kind, tenant, caps, tuple(spec.get("knowledge_base_ids") or ()))

    @property
    def full_access(self) -> bool:
        """Full access: a workspace key without a capability list (platform keys never are, C3)."""
        return self.kind == "workspace" and self.capabilities is None


@dataclass(frozen=True)
class Principal:
    """Who a request authenticated as: its tenant, its key, and whether the key service's gate and KB
    allow-list apply (v0.7.2 and main; at v0.6.x a key has full access)."""

    tenant_id: int
    key: ApiKey
    gated: bool

    def may(self, capability: str) -> bool:
        """Whether the gate lets this principal use a route that needs ``capability`` (C6, C7)."""
        if not self.gated or self.key.full_access:
            return True
        return capability in (self.key.capabilities or ())

    def allows_kbs(self, kb_ids: list[str]) -> bool:
        """Whether a KB-restricted key may touch every one of ``kb_ids`` (C7)."""
        allow = self.key.knowledge_base_ids
        return not self.gated or not allow or all(k in allow for k in kb_ids)

    @property
    def owner(self) -> str:
        """The ``sessions.user_id`` this principal creates and is scoped to (C82, see the module docstring)."""
        if not self.gated:
            return FIRST_USER_ID if self.tenant_id == TENANT_ID else f"system-{self.tenant_id}"
        if self.key.kind == "platform":
            return f"api_platform:{self.key.key_id}"
        return f"api_tenant_key:{self.tenant_id}:{self.key.key_id}"

    @property
    def admin(self) -> bool:
        """Whether the tenant role is Admin or Owner: any key at v0.6.x (Admin), a full-access workspace key
        from v0.7.2 (Owner); other keys are Viewers (auth.go:258 @ v0.6.2, :536-540 @ v0.7.2)."""
        return not self.gated or self.key.full_access


class KeyRing:
    """The API keys the sandbox accepts (secret -> :class:`ApiKey`) and the tenants that exist."""

    def __init__(self, api_key: str, extra: Mapping[str, Mapping[str, Any]] | None = None,
                 tenants: frozenset[int] = frozenset({TENANT_ID})):
        self.tenants = tenants
        self._keys: dict[str, ApiKey] = {api_key: ApiKey("workspace", TENANT_ID, None, key_id=1)}
        for n, (secret, spec) in enumerate((extra or {}).items(), start=2):
            self._keys[secret] = replace(ApiKey.from_spec(spec), key_id=n)

    def lookup(self, presented: str) -> ApiKey | None:
        """The key ``presented`` is (compared in constant time with each), or None."""
        found = None
        for secret, key in self._keys.items():
            if secrets.compare_digest(presented.encode(), secret.encode()):
                found = key
        return found


def _tenant_header(headers: Headers) -> tuple[bool, int]:
    """(present, value) of ``X-Tenant-ID`` as ``strconv.ParseUint`` reads it (value 0: malformed or zero)."""
    text = headers.get("x-tenant-id", "").strip()
    if not text:
        return False, 0
    if not re.fullmatch(r"[0-9]{1,20}", text) or int(text) >= 2 ** 64:
        return True, 0
    return True, int(text)


def _tenant_optional(method: str, path: str) -> bool:
    """Routes a platform key may call without ``X-Tenant-ID`` (auth.go:441-452 @ v0.7.2)."""
    path = path.strip().rstrip("/")
    if path == "/api/v1/system/admin" or path.startswith("/api/v1/system/admin/"):
        return True
    if method == "GET" and path in ("/api/v1/tenants/all", "/api/v1/tenants/search"):
        return True
    return method == "POST" and path == "/api/v1/tenants"


class AuthMiddleware:
    """WeKnora's ``Auth`` middleware (global, so unknown routes need a key too, C14): every path but
    ``GET /health`` and ``OPTIONS`` requests needs an accepted ``X-API-Key``; the request's
    :class:`Principal` goes to ``scope["state"]["principal"]``."""

    def __init__(self, app: ASGIApp, *, keys: KeyRing, release: WeKnoraRelease):
        self.app = app
        self.keys = keys
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or (scope["path"], scope["method"]) == (
                "/health", "GET") or scope["path"].startswith("/v1/"):  # /v1/: the judge checks its bearer key
            await self.app(scope, receive, send)
            return
        got = self.authenticate(scope["method"], scope["path"], Headers(scope=scope))
        if isinstance(got, Response):
            await got(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = got
        await self.app(scope, receive, send)

    def authenticate(self, method: str, path: str, headers: Headers) -> Principal | Response:
        """The request's principal, or the bare 401/400/403/409 the auth layer answers (C2-C5)."""
        presented = headers.get("x-api-key", "")
        if not presented:
            bearer = headers.get("authorization", "").startswith("Bearer ")
            if bearer and self.release.bearer_rejection_message:
                return bare_error(401, "Unauthorized: invalid or expired token")
            return bare_error(401, "Unauthorized: missing authentication")
        key = self.keys.lookup(presented)
        if not self.release.key_service:
            return self._tenant_key(key)
        if key is None:
            log.info("sandbox auth: an unknown API key was refused")
            return bare_error(401, "Unauthorized: invalid API key")
        return self._platform_key(key, method, path, headers) if key.kind == "platform" else \
            self._workspace_key(key, headers)

    def _tenant_key(self, key: ApiKey | None) -> Principal | Response:
        """v0.6.x: the tenant's own key, full access, ``X-Tenant-ID`` ignored (auth.go:188-268 @ v0.6.2)."""
        if key is None or key.kind != "workspace" or key.tenant_id is None:
            log.info("sandbox auth: an API key that is no tenant key was refused")
            return bare_error(401, "Unauthorized: invalid API key format")
        if key.tenant_id not in self.keys.tenants:
            return bare_error(401, "Unauthorized: invalid API key")
        return Principal(key.tenant_id, ApiKey("workspace", key.tenant_id), gated=False)

    def _platform_key(self, key: ApiKey, method: str, path: str, headers: Headers) -> Principal | Response:
        """A platform key: its tenant from ``X-Tenant-ID`` (auth.go:387-407 @ v0.7.2)."""
        present, tenant = _tenant_header(headers)
        if not present:
            if not _tenant_optional(method, path):
                return bare_error(409, _TENANT_REQUIRED, code="TENANT_REQUIRED")
            return Principal(0, key, gated=True)
        if tenant == 0:
            return bare_error(400, "Invalid X-Tenant-ID header")
        if tenant not in self.keys.tenants:
            return bare_error(401, "Unauthorized: invalid API key")
        return Principal(tenant, key, gated=True)

    def _workspace_key(self, key: ApiKey, headers: Headers) -> Principal | Response:
        """A workspace key: its own tenant; ``X-Tenant-ID`` may only repeat it (auth.go:408-431 @ v0.7.2)."""
        if not key.tenant_id:
            return bare_error(401, "Unauthorized: invalid API key scope")
        present, tenant = _tenant_header(headers)
        if present and tenant == 0:
            return bare_error(400, "Invalid X-Tenant-ID header")
        if present and tenant != key.tenant_id:
            return bare_error(403, "Forbidden: workspace API key cannot switch workspaces")
        if key.tenant_id not in self.keys.tenants:
            return bare_error(401, "Unauthorized: invalid API key")
        return Principal(key.tenant_id, key, gated=True)


def principal_of(scope: Scope) -> Principal:
    """The principal :class:`AuthMiddleware` put in the request's scope."""
    principal: Principal = scope["state"]["principal"]
    return principal


def gate(principal: Principal, capability: str) -> Response | None:
    """The API-key gate of a route needing ``capability`` (api_key_gate.go:111-153): None or the bare 403."""
    return None if principal.may(capability) else bare_error(403, _GATE_REFUSED)


def refuse_kbs(principal: Principal, kb_ids: list[str]) -> Response | None:
    """``AuthorizeTenantAPIKeyKnowledgeBases``: the 403 (code 1002) for a KB outside the key's allow-list."""
    if kb_ids and not principal.allows_kbs(kb_ids):
        return app_error(FORBIDDEN, "API key scope does not allow one or more knowledge bases")
    return None


def refuse_targets(principal: Principal, kb_ids: list[str], knowledge_ids: list[str]) -> Response | None:
    """``AuthorizeTenantAPIKeyKnowledgeTargets`` (tenant_api_key.go:390-402 @ v0.7.2): a KB-restricted
    key may name no ``knowledge_ids`` and only allowed KBs (403, code 1002), else None."""
    if principal.gated and principal.key.knowledge_base_ids and knowledge_ids:
        return app_error(FORBIDDEN, "API key scope does not allow knowledge_ids without a verified knowledge base")
    return refuse_kbs(principal, kb_ids)
