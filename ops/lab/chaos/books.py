"""The drill's ledger: every ticket it submitted is in exactly one state, and none vanished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from redis import Redis

from shared.keys import QueueKeys
from shared.rejected import slot as rejected_slot

TERMINAL = {"done", "failed", "expired", "cancelled", "rejected"}


@dataclass
class Books:
    """What one look at Redis found for the drill's tickets."""

    statuses: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    """Tickets whose status and queue sets disagree (queued but not queued, in two sets, ...)."""
    done_counted: int = 0
    done_found: int = 0

    @property
    def balanced(self) -> bool:
        return not self.missing and not self.misplaced and self.done_counted == self.done_found

    @property
    def open_tickets(self) -> int:
        return sum(n for status, n in self.statuses.items() if status not in TERMINAL)

    def summary(self) -> str:
        states = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()))
        verdict = "balanced" if self.balanced else "NOT balanced"
        extra = ""
        if self.missing:
            extra += f"; {len(self.missing)} missing"
        if self.misplaced:
            extra += f"; {len(self.misplaced)} in the wrong set"
        if self.done_counted != self.done_found:
            extra += f"; {self.done_counted} done counted for {self.done_found} done tickets"
        return f"{verdict}: {states or 'no tickets'}{extra}"


def stored_ticket_ids(redis: Redis, keys: QueueKeys) -> set[str]:
    """Every ticket the drill's own queue holds, including any whose submitter saw an error
    (a submit that reached a stalled Redis may still run when it resumes)."""
    prefix = keys.ticket_prefix
    pattern = prefix.replace("[", "\\[").replace("]", "\\]") + "*"
    ids = {key[len(prefix) :] for key in redis.scan_iter(match=pattern, count=1000)}
    return {i for i in ids if not i.startswith("~")}  # "~…" are buckets of rejected records


def read_books(redis: Redis, keys: QueueKeys, submitted: list[str]) -> Books:
    """Each ticket's status against the queue's sets, and the done counter against done tickets."""
    ticket_ids = sorted(set(submitted) | stored_ticket_ids(redis, keys))
    pipe = redis.pipeline(transaction=True)  # one consistent snapshot
    for ticket_id in ticket_ids:
        pipe.hget(keys.ticket(ticket_id), "status")
        pipe.hexists(*rejected_slot(keys, ticket_id))  # a rejected record lives in a shared bucket
    pipe.zrange(keys.pending, 0, -1)
    pipe.zrange(keys.delayed, 0, -1)
    pipe.zrange(keys.inflight, 0, -1)
    pipe.hgetall(keys.counts)
    replies = pipe.execute()
    own = cast("list[str | None]", replies[0 : 2 * len(ticket_ids) : 2])
    bucketed = cast("list[bool]", replies[1 : 2 * len(ticket_ids) : 2])
    statuses = [status or ("rejected" if held else None) for status, held in zip(own, bucketed, strict=True)]
    pending, delayed, inflight = (set(cast("list[str]", r)) for r in replies[2 * len(ticket_ids) : -1])
    counts = cast("dict[str, str]", replies[-1])
    books = Books()
    for ticket_id, status in zip(ticket_ids, statuses, strict=True):
        if status is None:
            books.missing.append(ticket_id)
            continue
        books.statuses[status] = books.statuses.get(status, 0) + 1
        places = (ticket_id in pending) + (ticket_id in delayed) + (ticket_id in inflight)
        expected = {"queued": ticket_id in pending or ticket_id in delayed, "running": ticket_id in inflight}
        if places > 1 or (status in TERMINAL and places) or (status in expected and not expected[status]):
            books.misplaced.append(ticket_id)
    books.done_found = books.statuses.get("done", 0)
    books.done_counted = sum(int(v) for k, v in counts.items() if k.endswith(":done"))
    return books
