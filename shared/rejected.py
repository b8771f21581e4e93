"""Reading rejected records back from the buckets the enqueue script files them in.

A shed submission leaves no ticket hash of its own: shared/lua/lib/rejected.lua packs its record
into one field of a bucket hash shared with the records of its time, so thousands of refusals cost
a few hundred bytes each rather than a key apiece. This module knows that layout on the Python side:
where an id's record lies and how to turn it back into the fields a ticket hash would hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import Redis

from shared.keys import QueueKeys
from shared.models import TicketStatus

BUCKET_CHARS = 7
"""An id's leading characters that name its bucket (as REJECTED_BUCKET_CHARS in the Lua)."""
PACKED = (
    "type",
    "branch_id",
    "priority",
    "max_tokens",
    "ttl_seconds",
    "prompt_chars",
    "prompt_digest",
    "created_at",
    "first_seen_at",
)
"""The record's values after its shed code and Retry-After, in the order the Lua packs them (a
retry's first sighting last, empty for a first try)."""
SEPARATOR = "\x1f"


def slot(keys: QueueKeys, ticket_id: str) -> tuple[str, str]:
    """The bucket key and the field that hold `ticket_id`'s record; the "~" keeps a bucket apart
    from any ticket's own hash (ids are letters and digits)."""
    return keys.ticket("~" + ticket_id[:BUCKET_CHARS]), ticket_id[BUCKET_CHARS:]


def unpacked(ticket_id: str, packed: str) -> dict[str, str]:
    """The record as the fields of a ticket hash (`Ticket.from_redis` reads them)."""
    code, retry_after, *values = packed.split(SEPARATOR)
    raw = dict(zip(PACKED, values, strict=False))
    raw.update(id=ticket_id, status=TicketStatus.REJECTED.value, shed_code=code, retry_after=retry_after)
    if raw.get("created_at") and raw.get("ttl_seconds"):
        raw["expires_at"] = repr(float(raw["created_at"]) + float(raw["ttl_seconds"]))
    return {name: value for name, value in raw.items() if value != ""}


def read_rejected(redis: Redis, keys: QueueKeys, ticket_ids: Sequence[str]) -> list[dict[str, str] | None]:
    """Each id's rejected record as ticket-hash fields, None where it has none; one round trip."""
    if not ticket_ids:
        return []
    pipe = redis.pipeline(transaction=False)
    for ticket_id in ticket_ids:
        pipe.hget(*slot(keys, ticket_id))
    replies: list[Any] = pipe.execute()
    return [
        unpacked(ticket_id, _text(reply)) if reply is not None else None
        for ticket_id, reply in zip(ticket_ids, replies, strict=True)
    ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
