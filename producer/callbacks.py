"""Callback delivery: POST an ended ticket's JSON to its `callback_url`, as an rq job.

The monitor hands ids from the queue's outbox to rq (queue `tidegate-callbacks`, function
`producer.callbacks.deliver_callback`, args `(queue_name, ticket_id)`, rq `Retry` with growing
intervals). A failed delivery raises so rq retries it; the job only reads the ticket, so a failing
callback can never change the ticket's state. Delivery is at least once: receivers dedupe on the
`webhook-id` (also sent as `Idempotency-Key`): ticket id and final status, the same on every retry.

Deliveries are signed the Standard Webhooks way with the branch's secret (`tidegate keys create`
shows it once), so a branch can tell tidegate's callback from a forged one. The target is checked
again here, at connect time (producer/callback_transport.py): a URL accepted at submission whose
host now resolves inside the bank is refused without a packet sent.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Sequence
from typing import Any, cast

import requests
from redis import Redis
from rq import get_current_job
from standardwebhooks import Webhook

from producer.api.schemas import TicketView
from producer.callback_transport import guarded_session
from shared import clock
from shared.callback_targets import RefusedTarget
from shared.config import Settings
from shared.keys import QueueKeys
from shared.models import Ticket
from shared.redis_conn import connect_from, make_client

log = logging.getLogger("tidegate.callbacks")

CALLBACK_TIMEOUT_S = 10.0
USER_AGENT = "tidegate-callback/1"


class CallbackFailed(RuntimeError):
    """The receiver did not take the callback; rq retries the job."""


class CallbackRefused(CallbackFailed):
    """The target resolves to an address callbacks may not reach; nothing was sent."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _redis(redis_url: str | None) -> tuple[Redis, bool]:
    """The given Redis; else the one the rq job lives on (where the monitor enqueued it); else the
    settings'. Also whether the caller owns (and must close) the client."""
    if redis_url:
        return make_client(redis_url), True
    job = get_current_job()
    settings = Settings()
    if job is not None and not settings.redis_cluster:  # on a Cluster rq lives on a Redis of its own
        return job.connection, False
    return connect_from(settings), True


def read_ticket(client: Redis, queue_name: str, ticket_id: str) -> Ticket | None:
    raw = cast("dict[Any, Any]", client.hgetall(QueueKeys(queue_name).ticket(ticket_id)))
    return Ticket.from_redis({_text(k): _text(v) for k, v in raw.items()}) if raw else None


def callback_body(ticket: Ticket) -> dict[str, Any]:
    """The same document GET /v1/tickets/{id} answers, so one parser serves both."""
    return TicketView.from_ticket(ticket).model_dump(mode="json")


def branch_secret(client: Redis, queue_name: str, branch_id: str) -> str | None:
    raw = client.hget(QueueKeys(queue_name).callback_secrets, branch_id)
    return None if raw is None else _text(raw)


def signed_headers(secret: str | None, message_id: str, body: str, now: float) -> dict[str, str]:
    """Standard Webhooks headers: id, timestamp and `v1,<base64 HMAC-SHA256(id.timestamp.body)>`."""
    timestamp = dt.datetime.fromtimestamp(int(now), tz=dt.UTC)
    headers = {"webhook-id": message_id, "webhook-timestamp": str(int(now))}
    if secret is not None:
        headers["webhook-signature"] = Webhook(secret).sign(message_id, timestamp, body)
    return headers


def _allow_hosts(given: Sequence[str] | None) -> Sequence[str]:
    return given if given is not None else Settings().policy.callbacks.allow_hosts


def deliver_callback(
    queue_name: str,
    ticket_id: str,
    redis_url: str | None = None,
    timeout: float = CALLBACK_TIMEOUT_S,
    allow_hosts: Sequence[str] | None = None,
) -> int | None:
    """POST the ticket to its callback_url; the receiver's status, or None when there is nothing to send.

    Raises CallbackFailed on a network error, a refused target or a non-2xx answer, so rq's Retry
    applies. `allow_hosts` defaults to the policy's `[callbacks] allow_hosts`.
    """
    client, owned = _redis(redis_url)
    try:
        ticket = read_ticket(client, queue_name, ticket_id)
        secret = branch_secret(client, queue_name, ticket.branch_id) if ticket else None
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
    if secret is None:
        log.warning(
            "callback of ticket %s sent unsigned: branch %s has no secret", ticket.id, ticket.branch_id
        )
    message_id = f"{ticket.id}:{ticket.status.value}"
    body = json.dumps(callback_body(ticket), separators=(",", ":"))
    headers = {
        "User-Agent": USER_AGENT,
        "Content-Type": "application/json",
        "Idempotency-Key": message_id,
        "X-Tidegate-Ticket-Id": ticket.id,
        **signed_headers(secret, message_id, body, clock.now()),
    }
    with guarded_session(_allow_hosts(allow_hosts)) as session:
        return _post(session, ticket, body.encode(), headers, timeout)


def _post(
    session: requests.Session, ticket: Ticket, body: bytes, headers: dict[str, str], timeout: float
) -> int:
    assert ticket.callback_url is not None
    try:
        response = session.post(
            ticket.callback_url, data=body, headers=headers, timeout=timeout, allow_redirects=False
        )
    except RefusedTarget as exc:
        raise CallbackRefused(
            f"callback of ticket {ticket.id} to {ticket.callback_url} refused: {exc}"
        ) from exc
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
