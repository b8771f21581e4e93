"""The audit trail: every operator action, who took it, when, and the state before and after.

One capped stream per queue (`QueueKeys.audit`), written by the functions that change the state
(`set_mode`, the key store, the rollout store), each in the same transaction as its change, so an
action is never recorded without happening nor happens unrecorded. Who: an API key's name for calls
over HTTP (`key_actor`), the OS user or `--actor` for the command line (`os_user`).
"""

from __future__ import annotations

import getpass
import json
from dataclasses import asdict, dataclass
from typing import Any, cast

from redis import Redis

from shared import clock
from shared.keys import QueueKeys

AUDIT_MAXLEN = 10_000
"""Entries kept per queue; older ones are trimmed (approximately, which is O(1))."""


@dataclass(frozen=True)
class AuditEntry:
    time: float
    actor: str
    action: str
    """What was done: `mode.set`, `key.create`, `key.revoke`, `key.rotate_secret`, `rollout.<step>`."""
    target: str
    """What it was done to: the queue, a key's id, a branch, a rollout's id."""
    before: Any
    after: Any

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def os_user() -> str:
    """Who runs this command line: the default actor of commands that take `--actor`."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def key_actor(key_id: str, name: str = "") -> str:
    """The actor of an API call: its key's id, and its name (the label given at creation) if any."""
    return f"key:{key_id} ({name})" if name else f"key:{key_id}"


def record_action(
    redis: Any, keys: QueueKeys, *, actor: str, action: str, target: str, before: Any, after: Any
) -> None:
    """Append one entry; `redis` may be a pipeline, so the entry joins the change it records."""
    entry = {
        "time": repr(clock.now()),
        "actor": actor,
        "action": action,
        "target": target,
        "before": json.dumps(before, sort_keys=True),
        "after": json.dumps(after, sort_keys=True),
    }
    redis.xadd(keys.audit, entry, maxlen=AUDIT_MAXLEN, approximate=True)


def _loads(raw: str | None) -> Any:
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError:
        return raw


def read_audit(redis: Redis, keys: QueueKeys, limit: int = 100) -> list[AuditEntry]:
    """The latest `limit` entries, newest first."""
    rows = cast("list[tuple[str, dict[str, str]]]", redis.xrevrange(keys.audit, count=limit))
    return [
        AuditEntry(
            time=float(fields.get("time", "0")),
            actor=fields.get("actor", ""),
            action=fields.get("action", ""),
            target=fields.get("target", ""),
            before=_loads(fields.get("before")),
            after=_loads(fields.get("after")),
        )
        for _, fields in rows
    ]
