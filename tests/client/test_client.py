"""TidegateClient (the tidegate-client distribution) against the real API, and its retry rules
against a scripted HTTP peer."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import threading
import time
from collections.abc import Iterator
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from redis import Redis
from tidegate_client import (
    ApiResponseError,
    AsyncTidegateClient,
    CancelResult,
    ConnectionFailed,
    RejectedError,
    RetryEvent,
    RetryPolicy,
    TicketStatus,
    TicketView,
    TidegateClient,
    WaitTimeout,
    parse_retry_after,
)

from shared.queue import TicketQueue
from tests.producer.api.conftest import Api, publish_alarm
from tests.producer.api.peer import Answer, ScriptedPeer

LOAN = {"type": "loan_approval", "prompt": "Approve a 20k loan?", "urgent_level": 2}
COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice."}


def _reads_a_ticket(request: httpx.Request) -> bool:
    return request.method == "GET" and request.url.path.startswith("/v1/tickets/")


class TicketReads(httpx.HTTPTransport):
    """The real transport, with an event set once the API has answered a GET of a ticket: a test
    that must act while the client is already waiting acts after it instead of after a sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if _reads_a_ticket(request):
            self.answered.set()
        return response


class AsyncTicketReads(httpx.AsyncHTTPTransport):
    """TicketReads for the async client."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if _reads_a_ticket(request):
            self.answered.set()
        return response


@pytest.fixture
def reads() -> TicketReads:
    return TicketReads()


@pytest.fixture
def client(api: Api, branch_key: str, reads: TicketReads) -> Iterator[TidegateClient]:
    with TidegateClient(api.base_url, branch_key, retry=RetryPolicy(deadline=20), transport=reads) as c:
        yield c


def test_submit_get_wait_and_cancel(
    client: TidegateClient, reads: TicketReads, ticket_queue: TicketQueue
) -> None:
    accepted = client.submit(LOAN)
    assert accepted.status is TicketStatus.QUEUED
    assert client.get(accepted.id).priority == pytest.approx(-0.2)
    reads.answered.clear()
    polled_first: list[bool] = []

    def worker() -> None:
        # Finish only once `wait` has read the ticket still queued, so it must poll again.
        polled_first.append(reads.answered.wait(10))
        claimed = ticket_queue.claim("w-client-test", 1)[0]
        ticket_queue.finish(claimed.ticket.id, claimed.token, "done", result="approved")

    thread = threading.Thread(target=worker)
    thread.start()
    view = client.wait(accepted.id, timeout=10)
    thread.join()
    assert polled_first == [True], "the client's wait never read the ticket"
    assert (view.status, view.result) == (TicketStatus.DONE, "approved")

    other = client.submit(COMPLAINT)
    cancelled = client.cancel(other.id)
    assert (cancelled.status, cancelled.cancelled) == (TicketStatus.CANCELLED, True)


def test_wait_gives_up_at_its_timeout(client: TidegateClient) -> None:
    accepted = client.submit(COMPLAINT)
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as raised:
        client.wait(accepted.id, timeout=0.5, poll_initial=0.05)
    assert 0.4 < time.monotonic() - started < 2
    assert raised.value.last.status is TicketStatus.QUEUED


def test_submit_many_and_a_422_names_the_field(client: TidegateClient) -> None:
    batch = client.submit_many([LOAN, {"type": "nope", "prompt": "x"}])
    assert [r.status_code for r in batch.results] == [202, 422]
    with pytest.raises(ApiResponseError) as raised:
        client.submit({"type": "complaint", "prompt": "x", "vip_level": 9})
    assert raised.value.status == 422
    assert "body.vip_level" in str(raised.value)
    assert raised.value.param == "vip_level" and raised.value.detail is not None
    assert [i.loc for i in raised.value.detail.issues] == [["body", "vip_level"]]
    assert batch.results[1].error is not None and batch.results[1].error.param == "tickets.1.type"


def test_red_complaint_waits_out_retry_after_and_succeeds_once_the_level_drops(
    api: Api, branch_key: str, redis_client: Redis, ticket_queue: TicketQueue
) -> None:
    publish_alarm(redis_client, api.queue_keys, "red")
    events: list[RetryEvent] = []
    first_retry = threading.Event()

    def record(event: RetryEvent) -> None:
        events.append(event)
        first_retry.set()

    outcome: dict[str, Any] = {}

    def submit() -> None:
        with TidegateClient(api.base_url, branch_key, retry=RetryPolicy(deadline=20), on_retry=record) as c:
            outcome["accepted"] = c.submit(COMPLAINT)

    thread = threading.Thread(target=submit)
    thread.start()
    assert first_retry.wait(10), "the client never got a 429"
    publish_alarm(redis_client, api.queue_keys, "green")  # the monitor clears the level
    thread.join(20)

    assert outcome["accepted"].status is TicketStatus.QUEUED
    assert events[0].status == 429
    assert events[0].sleep_seconds == 1.0  # exactly the Retry-After the API gave
    stats = ticket_queue.stats()
    assert stats.depth_by_type["complaint"] == 1
    assert stats.outcome_count("complaint", "rejected") == len(events)  # each shed attempt is on record


def test_still_shed_at_the_deadline_raises_rejected(api: Api, branch_key: str, redis_client: Redis) -> None:
    publish_alarm(redis_client, api.queue_keys, "red")
    with (
        TidegateClient(api.base_url, branch_key, retry=RetryPolicy(deadline=0.5)) as c,
        pytest.raises(RejectedError) as raised,
    ):
        c.submit(COMPLAINT)
    assert raised.value.code == "queue_red"
    assert raised.value.retry_after is not None and raised.value.retry_after >= 1


# ---- retry rules against a scripted peer -----------------------------------------------------------
ACCEPTED = {"id": "01abc", "status": "queued", "priority": 0.0, "expires_at": 1.0}


def test_5xx_is_retried_with_the_same_idempotency_key_and_jittered_backoff() -> None:
    script: list[Answer] = [(503, {}, {"error": {"message": "busy"}}), (500, {}, {}), (202, {}, ACCEPTED)]
    events: list[RetryEvent] = []
    with (
        ScriptedPeer(script) as peer,
        TidegateClient(peer.url, "k", retry=RetryPolicy(base=0.01, cap=0.05), on_retry=events.append) as c,
    ):
        assert c.submit(COMPLAINT).id == "01abc"
    keys = {r["Idempotency-Key"] for r in peer.requests}
    assert len(peer.requests) == 3 and len(keys) == 1
    assert [e.status for e in events] == [503, 500]
    assert all(0 <= e.sleep_seconds <= 0.05 for e in events)


def test_4xx_other_than_429_is_not_retried() -> None:
    with ScriptedPeer([(403, {}, {"error": {"message": "no", "code": "branch_mismatch"}})]) as peer:
        with TidegateClient(peer.url, "k") as c, pytest.raises(ApiResponseError) as raised:
            c.submit(COMPLAINT)
        assert len(peer.requests) == 1
    assert (raised.value.status, raised.value.code) == (403, "branch_mismatch")


def test_retry_after_is_honoured_but_never_past_the_deadline() -> None:
    script: list[Answer] = [(429, {"Retry-After": "3"}, {"error": {"message": "shed", "code": "queue_red"}})]
    with ScriptedPeer(script) as peer:
        started = time.monotonic()
        with (
            TidegateClient(peer.url, "k", retry=RetryPolicy(deadline=1)) as c,
            pytest.raises(RejectedError) as raised,
        ):
            c.submit(COMPLAINT)
        assert time.monotonic() - started < 0.5  # a 3 s wait cannot fit in 1 s: give up at once
        assert len(peer.requests) == 1
    assert raised.value.retry_after == 3


def test_connection_errors_are_retried_until_the_deadline() -> None:
    with ScriptedPeer([]) as peer:
        url = peer.url  # the port is closed once the peer stops
    events: list[RetryEvent] = []
    started = time.monotonic()
    client = TidegateClient(url, "k", retry=RetryPolicy(deadline=0.5, base=0.02), on_retry=events.append)
    with client, pytest.raises(ConnectionFailed, match="retry deadline"):
        client.get("01abc")
    # It stops once the next jittered pause would pass the deadline, so only the upper bound is fixed.
    assert time.monotonic() - started < 3
    assert len(events) >= 2 and all(e.status is None and e.error for e in events)
    assert sum(e.sleep_seconds for e in events) <= 0.5


def test_full_jitter_stays_under_the_capped_exponential() -> None:
    client = TidegateClient("http://unused", "k", retry=RetryPolicy(base=0.5, cap=4), rng=random.Random(7))
    for attempt in range(8):
        ceiling = min(4, 0.5 * 2**attempt)
        draws = [client.backoff(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in draws)
        assert max(draws) > ceiling * 0.8 and min(draws) < ceiling * 0.2  # spread over the whole range
    client.close()


def test_retry_after_as_an_http_date_is_honoured() -> None:
    when = format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3), usegmt=True)
    script: list[Answer] = [(503, {"Retry-After": when}, {"error": {"message": "busy"}}), (202, {}, ACCEPTED)]
    events: list[RetryEvent] = []
    with ScriptedPeer(script) as peer, TidegateClient(peer.url, "k", on_retry=events.append) as c:
        started = time.monotonic()
        assert c.submit(COMPLAINT).id == "01abc"
        waited = time.monotonic() - started
    # The date has a one-second resolution (and the answer takes a moment): two to three seconds.
    assert [e.status for e in events] == [503]
    assert 1.5 <= events[0].sleep_seconds <= 3.0
    assert waited >= events[0].sleep_seconds


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("3", 3.0),
        ("0", 0.0),
        ("-4", 0.0),
        ("Thu, 01 Jan 1970 00:01:40 GMT", 60.0),
        ("soon", None),
        ("", None),
    ],
)
def test_parse_retry_after_reads_both_forms(header: str, seconds: float | None) -> None:
    assert parse_retry_after(header, now=40.0) == seconds


def test_the_async_client_submits_waits_and_cancels(
    api: Api, branch_key: str, ticket_queue: TicketQueue
) -> None:
    async def scenario() -> tuple[TicketView, CancelResult, int]:
        reads = AsyncTicketReads()
        retry = RetryPolicy(deadline=20)
        async with AsyncTidegateClient(api.base_url, branch_key, retry=retry, transport=reads) as client:
            accepted = await client.submit(LOAN)
            claimed = ticket_queue.claim("w-async-client", 1)[0]
            assert claimed.ticket.id == accepted.id
            waiting = asyncio.create_task(client.wait(accepted.id, timeout=10, poll_initial=0.05))
            await asyncio.wait_for(reads.answered.wait(), 10)  # its first poll saw the ticket running
            ticket_queue.finish(claimed.ticket.id, claimed.token, "done", result="approved")
            done = await waiting
            other = await client.submit(COMPLAINT)
            cancelled = await client.cancel(other.id)
            depth = (await client.queues()).types["complaint"].depth
            return done, cancelled, depth

    done, cancelled, depth = asyncio.run(scenario())
    assert (done.status, done.result, done.terminal) == (TicketStatus.DONE, "approved", True)
    assert done.timings.total_seconds is not None and done.timings.total_seconds > 0
    assert (cancelled.previous_status, cancelled.cancelled) == (TicketStatus.QUEUED, True)
    assert depth == 0


def test_the_async_client_retries_with_the_same_rules() -> None:
    script: list[Answer] = [(429, {"Retry-After": "0"}, {"error": {"message": "shed", "type": "x"}})]
    script.append((202, {}, ACCEPTED))
    events: list[RetryEvent] = []

    async def scenario() -> str:
        async with AsyncTidegateClient(peer.url, "k", on_retry=events.append) as client:
            return (await client.submit(COMPLAINT)).id

    with ScriptedPeer(script) as peer:
        assert asyncio.run(scenario()) == "01abc"
    assert [(e.status, e.sleep_seconds) for e in events] == [(429, 0.0)]
    assert len({r["Idempotency-Key"] for r in peer.requests}) == 1
