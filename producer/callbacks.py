"""Callback delivery: POST an ended ticket's JSON to its `callback_url`, as an rq job.

The monitor hands ids from the queue's outbox to rq (queue `tidegate-callbacks`, function
`producer.callbacks.deliver_callback`, args `(queue_name, ticket_id)`, rq `Retry` with growing
intervals). A failed delivery raises so rq retries it; the job only reads the ticket, so a failing
callback can never change the ticket's state. Delivery is at least once: receivers dedupe on the
`Idempotency-Key` header (ticket id and final status).
"""

from __future__ import annotations

import logging
from typing import Any, cast

import requests
from redis import Redis
from rq import get_current_job

from producer.api.schemas import TicketView
from shared.config import Settings
from shared.keys import QueueKeys
from shared.models import Ticket
from shared.redis_conn import connect, make_client

log = logging.getLogger("tidegate.callbacks")

CALLBACK_TIMEOUT_S = 10.0
USER_AGENT = "tidegate-callback/1"


class CallbackFailed(RuntimeError):
    """The receiver did not take the callback; rq retries the job."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _redis(redis_url: str | None) -> tuple[Redis, bool]:
    """The given Redis; else the one the rq job lives on (where the monitor enqueued it); else the
    settings'. Also whether the caller owns (and must close) the client."""
    if redis_url:
        return make_client(redis_url), True
    job = get_current_job()
    if job is not None:
        return job.connection, False
    return connect(Settings().redis_url), True


def read_ticket(client: Redis, queue_name: str, ticket_id: str) -> Ticket | None:
    raw = cast("dict[Any, Any]", client.hgetall(QueueKeys(queue_name).ticket(ticket_id)))
    return Ticket.from_redis({_text(k): _text(v) for k, v in raw.items()}) if raw else None


def callback_body(ticket: Ticket) -> dict[str, Any]:
    """The same document GET /v1/tickets/{id} answers, so one parser serves both."""
    return TicketView.from_ticket(ticket).model_dump(mode="json")


def deliver_callback(
    queue_name: str, ticket_id: str, redis_url: str | None = None, timeout: float = CALLBACK_TIMEOUT_S
) -> int | None:
    """POST the ticket to its callback_url; the receiver's status, or None when there is nothing to send.

    Raises CallbackFailed on a network error or a non-2xx answer, so rq's Retry applies.
    """
    client, owned = _redis(redis_url)
    try:
        ticket = read_ticket(client, queue_name, ticket_id)
    finally:
        if owned:
            client.close()
    if ticket is None:
        log.warning(
            "callback of ticket %s (queue %s) skipped: ticket past its retention", ticket_id, queue_name
        )
        return None
    if not ticket.callback_url:
        return None
    if not ticket.status.terminal:
        log.warning("callback of ticket %s skipped: still %s", ticket_id, ticket.status.value)
        return None
    headers = {
        "User-Agent": USER_AGENT,
        "Idempotency-Key": f"{ticket.id}:{ticket.status.value}",
        "X-Tidegate-Ticket-Id": ticket.id,
    }
    try:
        response = requests.post(
            ticket.callback_url, json=callback_body(ticket), headers=headers, timeout=timeout
        )
    except requests.RequestException as exc:
        raise CallbackFailed(
            f"callback of ticket {ticket.id} to {ticket.callback_url} failed: {exc}"
        ) from exc
    if not 200 <= response.status_code < 300:
        raise CallbackFailed(
            f"callback of ticket {ticket.id} to {ticket.callback_url} answered HTTP {response.status_code} "
            "(expected 2xx)"
        )
    return response.status_code
