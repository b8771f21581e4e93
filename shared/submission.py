"""Submitting tickets: the enqueue script calls that queue a batch of them or record them
`rejected`, and what they return. `TicketQueue.enqueue_many` is the way in; the stored form of a
request and the script's values for it are built in shared/ticket_builder.py.

Batches, and what a refusal leaves behind:
- A ticket of a type the policy does not know refuses the whole batch before anything is sent
  (`EnqueueItemError` with its index and the field `type`).
- The tickets go to the script in chunks of `CHUNK`, each chunk sent on one connection as soon as it
  is built (one round trip in all). Each chunk is one atomic script call that checks every ticket
  before it writes any; past the check each ticket is queued, found `existing` or recorded
  `rejected` on its own, in batch order.
- A ticket the script refuses (a bad value) fails its own chunk only: nothing of that chunk is
  written, the other chunks are, and `EnqueueItemError` names the ticket and field and carries the
  results of every written ticket (None for the refused chunk's).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import NoScriptError, ResponseError

from shared import clock
from shared.deadlines import types_ahead
from shared.keys import WAKE_LIST_CAP, QueueKeys
from shared.models import Ticket, TicketRequest, TicketStatus
from shared.policy import Policy, RetainedOutcome, UnknownTicketType
from shared.replica_acks import check_acks, wait_command
from shared.scripts import Scripts
from shared.shed import ShedCode
from shared.shed_log import shed_minute
from shared.streamed import call_packed, send_streamed
from shared.ticket_builder import Draft, EnqueueOptions, TicketBuilder

EnqueueOutcome = Literal["queued", "existing", "rejected"]

CHUNK = 200
"""Tickets per script call: enough to amortise the call, few enough that one call holds Redis for a
short while only (other clients wait while a script runs)."""


class EnqueueItemError(ValueError):
    """The enqueue script refused one ticket of a batch; nothing of that ticket's chunk was written.

    `index` is the ticket's place in the submitted batch (from 0); `results` holds the outcome of
    every ticket whose chunk was written, None for the refused chunk's tickets.
    """

    def __init__(
        self, index: int, field: str, message: str, results: Sequence[EnqueueResult | None] = ()
    ) -> None:
        super().__init__(f"ticket {index} of the batch: {field}: {message}")
        self.index = index
        self.field = field
        self.message = message
        self.results = list(results)


@dataclass(frozen=True)
class EnqueueResult:
    outcome: EnqueueOutcome
    ticket_id: str
    ticket: Ticket | None = None
    """The stored ticket for new and rejected tickets; None for `existing` (read it with `get`)."""
    code: ShedCode | None = None
    """Why a rejected ticket was shed."""
    retry_after: float | None = None
    """Seconds the enqueue script's own estimate asks a shed ticket to wait (the deadline rule);
    None when admission's estimate stands."""


def _raised(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


_REFUSED = re.compile(r"^ticket (\d+) \(([^)]*)\): (\w+) (.*)$", re.DOTALL)


class Submission(TicketBuilder):
    """Submits the tickets it builds (shared/ticket_builder.py) through the enqueue script of one queue."""

    def __init__(self, policy: Policy, keys: QueueKeys, scripts: Scripts) -> None:
        super().__init__(policy)
        self.keys = keys
        self.scripts = scripts

    @cached_property
    def _header(self) -> tuple[list[str], list[Any]]:
        """The KEYS and leading ARGV every call shares, but the minute's shed counts (KEYS[8])."""
        types = self.policy.type_names
        keys = [
            self.keys.pending,
            self.keys.deadlines,
            self.keys.counts,
            self.keys.wake,
            self.keys.delayed,
            self.keys.ticket_prefix,
            self.keys.idempotency_prefix,
            "",
            *[self.keys.waiting(t) for t in types],
            *[self.keys.branch_depth(t) for t in types],
            self.keys.monitor_state,
            *[self.keys.branch_service(t) for t in types],
            *[self.keys.branch_tokens(t) for t in types],
        ]
        queue = self.policy.queue
        args: list[Any] = [
            self._idempotency_seconds,
            queue.rejected_retention_seconds,
            WAKE_LIST_CAP,
            len(types),
            *types,
            *[self.policy.type_policy(t).cap for t in types],
            *[self.shed_words(ShedCode.TYPE_CAP, t) for t in types],
            *[repr(self.policy.type_policy(t).slo_seconds) for t in types],
            *["1" if self.policy.type_policy(t).critical else "" for t in types],
            *[types_ahead(self.policy, t) for t in types],
            *self.policy.fairness.cost_args(),
        ]
        return keys, args

    def _chunk_command(self, drafts: Sequence[Draft], now: float) -> list[Any]:
        """One EVALSHA of the enqueue script for `drafts`."""
        keys, header = self._header
        command: list[Any] = ["EVALSHA", self.scripts.enqueue.sha, len(keys), *keys[:7]]
        command += [self.keys.sheds(shed_minute(now)), *keys[8:], repr(now), *header]
        for draft in drafts:
            command.extend(draft.values)
        return command

    @cached_property
    def _idempotency_seconds(self) -> int:
        outcomes: tuple[RetainedOutcome, ...] = ("done", "failed", "expired", "cancelled")
        return max(self.policy.queue.retention_for(o) for o in outcomes)

    def _result(self, draft: Draft, raw: Sequence[str]) -> EnqueueResult:
        outcome, ticket_id = raw[0], raw[1]
        ticket, options = draft.ticket, draft.options
        if outcome == "existing":
            return EnqueueResult("existing", ticket_id)
        if outcome == "rejected":  # what the script stored: the lean record, its code and words
            code = ShedCode.parse(raw[2])
            retry_after = options.retry_after
            estimated: float | None = None
            if code is ShedCode.DEADLINE_UNREACHABLE:  # the script's estimate comes in the words' place
                estimated = retry_after = float(raw[3])
                words = self.shed_words(code, ticket.type)
            elif code is ShedCode.QUEUE_RED and options.shed is None:  # the red line's Retry-After
                retry_after = float(raw[3])
                words = self.shed_words(code, ticket.type)
            else:
                words = raw[3] or self.shed_words(code, ticket.type)  # the fair-share rule leaves them
            update = {
                "id": ticket_id,
                "status": TicketStatus.REJECTED,
                "error": words,
                "shed_code": code.value,
                "retry_after": retry_after,
                "finished_at": ticket.created_at,
                "prompt_tokens_estimate": 0,
                "urgent_level": 0,
                "vip_level": 0,
                "is_bulk": False,
                "prompt": None,
                "messages": None,
            }
            stored = ticket.model_copy(update=update)
            return EnqueueResult("rejected", ticket_id, stored, code, estimated)
        queued = ticket if ticket_id == ticket.id else ticket.model_copy(update={"id": ticket_id})
        return EnqueueResult("queued", ticket_id, queued)

    def _chunk_results(self, start: int, drafts: Sequence[Draft], reply: Any) -> list[EnqueueResult]:
        if isinstance(reply, ResponseError):
            found = _REFUSED.match(str(reply))
            if found is None:
                raise reply  # not about a ticket (MOVED after a failover, a server error): the caller's
            index = start + int(found.group(1)) - 1
            raise EnqueueItemError(index, found.group(3), found.group(4))
        return [self._result(d, reply[4 * i : 4 * i + 4]) for i, d in enumerate(drafts)]

    def _check(self, requests: Sequence[TicketRequest], options: Sequence[EnqueueOptions]) -> None:
        """Refuse a batch naming an unknown type before any of it is sent (chunks go out as built)."""
        if len(requests) != len(options):
            raise ValueError(f"{len(requests)} requests but {len(options)} options; give one per request")
        for index, request in enumerate(requests):
            if request.type not in self.policy.types:
                message = str(UnknownTicketType(request.type, self.policy.type_names))
                raise EnqueueItemError(index, "type", message)

    def submit_many(
        self,
        server: Redis,
        requests: Sequence[TicketRequest],
        options: Sequence[EnqueueOptions],
        replica_acks: int = 0,
    ) -> list[EnqueueResult]:
        """Submit many tickets in one round trip, `CHUNK` tickets to a script call, each chunk sent
        as soon as it is built (shared/streamed.py) so Redis runs it while the next is prepared.

        With `replica_acks` the run ends with WAIT (shared/replica_acks.py) and raises
        ReplicaAcksMissing unless that many replicas hold the writes.
        """
        if not requests:
            return []
        self._check(requests, options)
        now = clock.now()
        drafts: list[Draft] = []
        starts = range(0, len(requests), CHUNK)

        def commands() -> Iterator[list[Any]]:
            for start in starts:
                pairs = zip(requests[start : start + CHUNK], options[start : start + CHUNK], strict=True)
                chunk = [self._draft(r, o, now) for r, o in pairs]
                drafts.extend(chunk)
                yield self._chunk_command(chunk, now)
            if replica_acks:
                yield wait_command(replica_acks)

        replies = self._run_loaded(server, commands())
        if replica_acks:
            check_acks(_raised(replies.pop()), replica_acks)
        return self._collect(starts, drafts, replies)

    async def submit_many_async(
        self, client: AsyncRedis, requests: Sequence[TicketRequest], options: Sequence[EnqueueOptions]
    ) -> list[EnqueueResult]:
        """`submit_many` on an asyncio client, for an event loop (no WAIT for replicas: a caller that
        needs them uses `submit_many` off the loop). A chunk is one awaited call."""
        if not requests:
            return []
        self._check(requests, options)
        now = clock.now()
        drafts = [self._draft(r, o, now) for r, o in zip(requests, options, strict=True)]
        starts = range(0, len(drafts), CHUNK)
        replies = [
            await self._call_async(client, self._chunk_command(drafts[s : s + CHUNK], now)) for s in starts
        ]
        return self._collect(starts, drafts, replies)

    async def _call_async(self, client: AsyncRedis, command: list[Any]) -> Any:
        """The chunk's reply, or its error reply; a server without the script ran nothing, so the
        chunk is sent once more after loading it."""
        for attempt in range(2):
            try:
                return await call_packed(client, command)
            except NoScriptError as exc:
                if attempt:
                    return exc
                await client.script_load(self.scripts.enqueue.script)
            except ResponseError as exc:
                return exc
        raise AssertionError("unreachable: the second attempt returns")

    def _run_loaded(self, server: Redis, commands: Iterator[list[Any]]) -> list[Any]:
        """Send the run; chunks refused because the server lacks the script (it was flushed, or a
        new primary never saw it) ran nothing, so they are sent again once it is loaded."""
        sent: list[list[Any]] = []

        def kept() -> Iterator[list[Any]]:
            for command in commands:
                sent.append(command)
                yield command

        replies = send_streamed(server, kept())
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing and sent[-1][0] == "WAIT":  # the WAIT must follow the writes it covers
            missing.append(len(sent) - 1)
        if missing:
            server.script_load(self.scripts.enqueue.script)
            for i, reply in zip(missing, send_streamed(server, (sent[i] for i in missing)), strict=True):
                replies[i] = reply
        return replies

    def _collect(self, starts: range, drafts: Sequence[Draft], replies: list[Any]) -> list[EnqueueResult]:
        """Every chunk's results; a refused chunk raises after the others are read, carrying them."""
        results: list[EnqueueResult | None] = []
        refused: EnqueueItemError | None = None
        for start, reply in zip(starts, replies, strict=True):
            chunk = drafts[start : start + CHUNK]
            try:
                results.extend(self._chunk_results(start, chunk, reply))
            except EnqueueItemError as exc:
                refused = refused or exc
                results.extend([None] * len(chunk))
        if refused is not None:
            raise EnqueueItemError(refused.index, refused.field, refused.message, results)
        return [r for r in results if r is not None]
