"""Who is calling: a Bearer API key resolves to a branch or an operator, or the request gets 401.

Resolved keys are cached for a second so a 429 storm costs Redis nothing for authentication; a
revoked key therefore stops working within `cache_seconds`. Unknown keys are never cached, so a new
key works at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from producer.api.errors import api_error
from producer.api.keys import ApiKeyStore, Role, hash_token, tokens_equal
from shared.audit import key_actor

CACHE_LIMIT = 10_000
BOOTSTRAP_OPERATOR_ID = "operator-env"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True)
class Principal:
    role: Role
    branch_id: str | None
    key_id: str
    default_type: str | None = None
    name: str = ""
    """The key's label, given at creation: who holds it."""

    @property
    def actor(self) -> str:
        """How the audit trail names this caller."""
        return key_actor(self.key_id, self.name)

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR

    def may_see(self, ticket_branch: str) -> bool:
        """A branch sees only its own tickets; an operator sees all."""
        return self.is_operator or self.branch_id == ticket_branch


class Authenticator:
    def __init__(self, store: ApiKeyStore, operator_key: str | None, cache_seconds: float = 1.0) -> None:
        self.store = store
        self.operator_key = operator_key or None
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str | None) -> Principal | None:
        """The caller behind `token` when known without Redis (operator key, or cached); else None."""
        if not token:
            return None
        if self.operator_key is not None and tokens_equal(token, self.operator_key):
            return Principal(Role.OPERATOR, None, BOOTSTRAP_OPERATOR_ID)
        with self._lock:
            cached = self._cache.get(hash_token(token))
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        return None

    def authenticate(self, token: str | None) -> Principal:
        """The caller behind `token`, or ApiError 401 saying what is wrong with it."""
        if not token:
            raise api_error(
                401,
                "missing API key: send the header 'Authorization: Bearer <key>' "
                "(`tidegate keys create --branch <id>` issues one)",
                code="missing_api_key",
                headers=_CHALLENGE,
            )
        known = self.cached(token)
        if known is not None:
            return known
        digest = hash_token(token)
        record = self.store.lookup(token)
        if record is None or record.revoked:
            with self._lock:
                self._cache.pop(digest, None)
            reason = "revoked" if record is not None else "unknown"
            raise api_error(401, f"{reason} API key", code="invalid_api_key", headers=_CHALLENGE)
        principal = Principal(record.role, record.branch_id, record.key_id, record.default_type, record.label)
        if self.cache_seconds > 0:
            with self._lock:
                if len(self._cache) >= CACHE_LIMIT:
                    self._cache.clear()
                self._cache[digest] = (time.monotonic() + self.cache_seconds, principal)
        return principal


def require_operator(principal: Principal) -> None:
    if not principal.is_operator:
        raise api_error(
            403,
            f"this needs an operator key; key {principal.key_id} belongs to branch {principal.branch_id}",
            code="operator_only",
        )
