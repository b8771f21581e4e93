"""Publishing a running ticket's answer to its live stream, for the API to relay as it is generated.

Only tickets submitted with `live` set (the OpenAI front door's) are published. A Redis error while
publishing never fails the ticket: the answer is still written to the ticket, where the API's
reader finds it when its capped wait runs out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from redis import Redis

from shared import clock
from shared.keys import QueueKeys
from shared.live import LiveKind, expiry_seconds, max_entries
from shared.models import Ticket

log = logging.getLogger(__name__)


class LivePublisher:
    """One ticket's live stream: `token` per piece of text, then `retry` or `end`.

    Each token's write also reads the ticket's status in the same round trip, so a streamed ticket
    cancelled by its caller calls `on_cancel` at its next token instead of at the next lease renewal.
    """

    def __init__(
        self, client: Redis, keys: QueueKeys, ticket: Ticket, on_cancel: Callable[[], object] | None = None
    ) -> None:
        self.client = client
        self.key = keys.live(ticket.id)
        self.ticket_key = keys.ticket(ticket.id)
        self.ticket = ticket
        self.on_cancel = on_cancel
        self.maxlen = max_entries(ticket.max_tokens)
        self._expiry_set = False
        self._broken = False

    def _add(self, fields: dict[str, str]) -> None:
        if self._broken:
            return
        token = fields["kind"] == LiveKind.TOKEN
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(self.key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            if not self._expiry_set or not token:
                pipe.expire(self.key, expiry_seconds(self.ticket.expires_at - clock.now()))
            if token:
                pipe.hget(self.ticket_key, "status")
            replies = pipe.execute()
            self._expiry_set = True
            if token and replies[-1] == "cancelled" and self.on_cancel is not None:
                self.on_cancel()
        except redis.RedisError as exc:
            self._broken = True
            log.warning(
                "ticket %s: live stream not written (%s); the answer still goes to the ticket", self.key, exc
            )

    def token(self, text: str) -> None:
        self._add({"kind": LiveKind.TOKEN, "text": text})

    def retry(self, error: str) -> None:
        self._add({"kind": LiveKind.RETRY, "error": error})

    def end(
        self,
        status: str,
        *,
        finish_reason: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        error: str = "",
    ) -> None:
        fields = {"kind": LiveKind.END, "status": status, "error": error}
        if finish_reason:
            fields["finish_reason"] = finish_reason
        if prompt_tokens is not None:
            fields["prompt_tokens"] = str(prompt_tokens)
        if completion_tokens is not None:
            fields["completion_tokens"] = str(completion_tokens)
        self._add(fields)
