"""A ticket's stream (producer/api/ticket_stream.py, read through this folder's live hub) resumed with `Last-Event-ID`, with the real httpx client against the real API,
a real worker and the simulator: a reader that drops mid-answer and comes back gets every token
exactly once; one whose stream is gone, or that names no event of it, is told so."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.models import TicketStatus
from tests.producer.api.openai.conftest import Gateway
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker

LIVE_TICKET = {
    "type": "complaint",
    "prompt": "My card was charged twice.",
    "max_tokens": 40,
    "live": "tokens",
}
TIMEOUT = httpx.Timeout(30.0)
SEEN_BEFORE_DROP = 3


@dataclass(frozen=True)
class Sse:
    id: str | None
    event: str
    data: dict[str, object]


def sse_events(response: httpx.Response) -> Iterator[Sse]:
    """The response's server-sent events, parsed as the standard says (id, event, data lines)."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "data" in fields:
            yield Sse(fields.get("id"), fields.get("event", "message"), json.loads(fields["data"]))
        fields = {}


@pytest.fixture
def slow_backend(
    simulator: Callable[..., SimulatorProcess], start_worker: Callable[..., RunningWorker]
) -> SimulatorProcess:
    """A simulator slow enough that a reader can drop and come back while the answer is made."""
    sim = simulator(time_scale=4, stop_median_tokens=400)
    start_worker(sim.base_url, gpu_backend=None)
    return sim


def _client(gateway: Gateway, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT
    )


def _submit(client: httpx.Client) -> str:
    answer = client.post("/v1/tickets", json=LIVE_TICKET)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _read(
    client: httpx.Client, ticket_id: str, last_event_id: str | None, stop_after: int | None
) -> list[Sse]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events: list[Sse] = []
    with client.stream("GET", f"/v1/tickets/{ticket_id}/stream", headers=headers) as response:
        assert response.status_code == 200, response.read()
        for item in sse_events(response):
            events.append(item)
            if stop_after is not None and len(events) == stop_after:
                break  # leaving the block closes the connection: the drop
    return events


def _tokens(events: list[Sse]) -> list[str]:
    return [str(e.data["text"]) for e in events if e.event == "token"]


def _wait_done(client: httpx.Client, ticket_id: str) -> dict[str, object]:
    ended = {s.value for s in TicketStatus if s.terminal}

    def view() -> dict[str, object] | None:
        got: dict[str, object] = client.get(f"/v1/tickets/{ticket_id}").json()
        return got if got["status"] in ended else None

    result: dict[str, object] = wait_until(view, 30.0, f"ticket {ticket_id} to end")
    return result


@pytest.mark.parametrize("come_back", ["while answering", "after the end"])
def test_a_reader_that_drops_and_comes_back_gets_every_token_once(
    gateway: Gateway, slow_backend: SimulatorProcess, come_back: str
) -> None:
    with _client(gateway, gateway.key()) as client:
        ticket_id = _submit(client)
        first = _read(client, ticket_id, None, SEEN_BEFORE_DROP)
        assert [e.event for e in first] == ["token"] * SEEN_BEFORE_DROP
        if come_back == "after the end":
            _wait_done(client, ticket_id)
        rest = _read(client, ticket_id, first[-1].id, None)
        stored = _wait_done(client, ticket_id)
    events = first + rest
    ids = [e.id for e in events if e.id]
    assert len(ids) == len(events), "every event read from the live stream carries its id"
    assert ids == sorted(set(ids), key=lambda i: tuple(int(p) for p in i.split("-"))), "no event twice"
    assert rest[-1].event == "end" and rest[-1].data["status"] == "done"
    assert "".join(_tokens(events)) == stored["result"]
    assert len(_tokens(events)) == rest[-1].data["completion_tokens"]


def test_a_resumed_stream_that_is_gone_or_unknown_is_refused(
    gateway: Gateway, slow_backend: SimulatorProcess, redis_client: Redis
) -> None:
    with _client(gateway, gateway.key()) as client:
        ticket_id = _submit(client)
        first = _read(client, ticket_id, None, 1)
        path = f"/v1/tickets/{ticket_id}/stream"
        malformed = client.get(path, headers={"Last-Event-ID": "yesterday"})
        unknown = client.get(path, headers={"Last-Event-ID": "9999999999999-0"})
        _wait_done(client, ticket_id)
        redis_client.delete(gateway.queue.keys.live(ticket_id))  # what its expiry does
        gone = client.get(path, headers={"Last-Event-ID": str(first[0].id)})
        fresh = client.get(path)  # without the header the ended ticket answers its end
    assert (malformed.status_code, malformed.json()["error"]["param"]) == (422, "Last-Event-ID")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_event_id")
    assert (gone.status_code, gone.json()["error"]["code"]) == (410, "stream_expired")
    assert "expired" in gone.json()["error"]["message"]
    assert fresh.status_code == 200 and "event: end" in fresh.text
