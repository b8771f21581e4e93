"""API keys: one per branch (or operator), shown once at creation and stored only as a sha256.

A stolen Redis dump then reveals no usable key. A key's id (the first hex digits of its hash) names it
in listings and revocations without exposing it. Revoked keys keep their record for the audit trail.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, cast

from redis import Redis

from shared import clock
from shared.audit import record_action
from shared.keys import QueueKeys

TOKEN_PREFIX = "tg_"
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
KEY_ID_LENGTH = 12
BRANCH_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
"""The same rule as a ticket's branch_id, so every key's branch can own tickets."""


class Role(StrEnum):
    BRANCH = "branch"
    OPERATOR = "operator"


@dataclass(frozen=True)
class ApiKey:
    """A stored key without its secret."""

    key_id: str
    role: Role
    branch_id: str | None
    label: str
    created_at: float
    revoked_at: float | None = None
    default_type: str | None = None
    """The ticket type of an OpenAI-style call that names none (header or body)."""

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> ApiKey:
        data = json.loads(raw)
        return cls(
            key_id=str(data["key_id"]),
            role=Role(data["role"]),
            branch_id=data.get("branch_id"),
            label=str(data.get("label", "")),
            created_at=float(data["created_at"]),
            revoked_at=None if data.get("revoked_at") is None else float(data["revoked_at"]),
            default_type=data.get("default_type"),
        )


def _audited(key: ApiKey) -> dict[str, object]:
    """What the audit trail keeps of a key: everything but its creation time (the entry has one)."""
    doc = asdict(key)
    del doc["created_at"]
    return doc


class ApiKeyError(ValueError):
    """A key operation that cannot be done; the message names the value and what is accepted."""


def _new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def tokens_equal(a: str, b: str) -> bool:
    """Constant-time comparison, so response timing leaks nothing about a key."""
    return hmac.compare_digest(hash_token(a), hash_token(b))


class ApiKeyStore:
    """Keys of one queue in `keys.api_keys` (HASH sha256(token) → ApiKey JSON)."""

    def __init__(self, redis: Redis, keys: QueueKeys) -> None:
        self.redis = redis
        self.keys = keys

    def create(
        self,
        role: Role,
        branch_id: str | None = None,
        label: str = "",
        *,
        default_type: str | None = None,
        actor: str = "operator",
    ) -> tuple[str, ApiKey]:
        """A new key: returns the token (shown once, never stored) and its record; `actor` made it."""
        if role is Role.BRANCH:
            if branch_id is None or not BRANCH_ID_PATTERN.match(branch_id):
                raise ApiKeyError(
                    f"branch {branch_id!r} is not a valid branch id: use 1-32 letters, digits, '_' or '-'"
                )
        elif branch_id is not None:
            raise ApiKeyError(f"an operator key belongs to no branch, got branch {branch_id!r}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        digest = hash_token(token)
        record = ApiKey(
            digest[:KEY_ID_LENGTH], role, branch_id, label, clock.now(), default_type=default_type
        )
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.api_keys, digest, record.to_json())
        self._audit(pipe, actor, "key.create", record.key_id, None, _audited(record))
        pipe.execute()
        return token, record

    def create_callback_secret(self, branch_id: str) -> str | None:
        """The branch's new callback signing secret, or None when it already has one.

        Unlike API keys the secret is stored as it is: signing a delivery needs it. It is shown
        only when created, so a second key for the branch does not reveal it again.
        """
        secret = _new_secret()
        created = self.redis.hsetnx(self.keys.callback_secrets, branch_id, secret)
        return secret if created else None

    def rotate_callback_secret(self, branch_id: str, actor: str = "operator") -> str:
        """Replace the branch's signing secret (a lost or leaked one): deliveries from now on are
        signed with the returned secret only, which is shown this once."""
        if not BRANCH_ID_PATTERN.match(branch_id):
            raise ApiKeyError(
                f"branch {branch_id!r} is not a valid branch id: use 1-32 letters, digits, '_' or '-'"
            )
        secret = _new_secret()
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.callback_secrets, branch_id, secret)
        self._audit(pipe, actor, "key.rotate_secret", branch_id, None, None)  # never the secret itself
        pipe.execute()
        return secret

    def _audit(self, pipe: Any, actor: str, action: str, target: str, before: Any, after: Any) -> None:
        record_action(pipe, self.keys, actor=actor, action=action, target=target, before=before, after=after)

    def lookup(self, token: str) -> ApiKey | None:
        """The record of `token`, revoked or not; None for a key never issued here."""
        raw = cast("str | bytes | None", self.redis.hget(self.keys.api_keys, hash_token(token)))
        if raw is None:
            return None
        return ApiKey.from_json(raw.decode() if isinstance(raw, bytes) else raw)

    def _all(self) -> dict[str, ApiKey]:
        raw = cast("dict[str | bytes, str | bytes]", self.redis.hgetall(self.keys.api_keys))
        return {
            (k.decode() if isinstance(k, bytes) else k): ApiKey.from_json(
                v.decode() if isinstance(v, bytes) else v
            )
            for k, v in raw.items()
        }

    def list_keys(self, branch_id: str | None = None) -> list[ApiKey]:
        """Every key (oldest first), optionally of one branch; secrets are never stored, so never shown."""
        found = [k for k in self._all().values() if branch_id is None or k.branch_id == branch_id]
        return sorted(found, key=lambda k: k.created_at)

    def revoke(self, key_id: str, actor: str = "operator") -> ApiKey:
        """Mark the key `key_id` revoked (kept for the audit trail); revoking twice is harmless."""
        for digest, record in self._all().items():
            if record.key_id == key_id:
                if record.revoked:
                    return record
                revoked = dataclasses.replace(record, revoked_at=clock.now())
                pipe = self.redis.pipeline(transaction=True)
                pipe.hset(self.keys.api_keys, digest, revoked.to_json())
                self._audit(pipe, actor, "key.revoke", key_id, _audited(record), _audited(revoked))
                pipe.execute()
                return revoked
        raise ApiKeyError(f"no API key with id {key_id!r}; `tidegate keys list` shows the ids")
