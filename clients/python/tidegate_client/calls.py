"""What each API operation sends and how its answer is read, as plain values both clients share.

Kept apart from the clients so a route, a header or an Idempotency-Key rule is written once, not
once per client, and apart from the HTTP session so these can be read without any sending or retrying.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tidegate_client.models import BatchResult, CancelResult, QueuesView, TicketAccepted, TicketView
from tidegate_client.streams import LAST_EVENT_ID, streamed_body

T = TypeVar("T")


def body_of(ticket: Any) -> dict[str, Any]:
    """A ticket given as a mapping or as any object with pydantic's `model_dump` (duck-typed, so
    this package needs no pydantic)."""
    dump = getattr(ticket, "model_dump", None)
    if callable(dump):
        return dict(dump(mode="json", exclude_unset=True))
    return dict(ticket)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to make: its method, path, body and headers, and how to read its JSON answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class Calls:
    """What each API method sends and how its answer is read, for both clients."""

    @staticmethod
    def submit(ticket: Mapping[str, Any] | Any, idempotency_key: str | None) -> Call[TicketAccepted]:
        body = body_of(ticket)
        key = idempotency_key or body.get("idempotency_key") or uuid.uuid4().hex
        return Call("POST", "/v1/tickets", TicketAccepted.from_json, body, {"Idempotency-Key": str(key)})

    @staticmethod
    def submit_many(tickets: Sequence[Mapping[str, Any] | Any]) -> Call[BatchResult]:
        items = []
        for ticket in tickets:
            item = body_of(ticket)
            item.setdefault("idempotency_key", uuid.uuid4().hex)  # makes retrying the batch safe
            items.append(item)
        return Call("POST", "/v1/tickets/batch", BatchResult.from_json, {"tickets": items})

    @staticmethod
    def get(ticket_id: str) -> Call[TicketView]:
        return Call("GET", f"/v1/tickets/{ticket_id}", TicketView.from_json)

    @staticmethod
    def cancel(ticket_id: str) -> Call[CancelResult]:
        return Call("DELETE", f"/v1/tickets/{ticket_id}", CancelResult.from_json)

    @staticmethod
    def queues() -> Call[QueuesView]:
        return Call("GET", "/v1/queues", QueuesView.from_json)

    @staticmethod
    def stream(ticket_id: str, last_event_id: str | None = None) -> Call[None]:
        headers = {LAST_EVENT_ID: last_event_id} if last_event_id else {}
        return Call("GET", f"/v1/tickets/{ticket_id}/stream", _nothing, headers=headers)

    @staticmethod
    def openai_stream(
        path: str, body: Mapping[str, Any], include_usage: bool, headers: Mapping[str, str] | None
    ) -> Call[None]:
        return Call("POST", path, _nothing, streamed_body(body, include_usage), dict(headers or {}))


def _nothing(_: Any) -> None:
    """A stream's parse: its body is read event by event, never as one JSON document."""
    return None
