"""Deadlines over HTTP: the header and body field (the smaller wins), 422 naming a bad one, the
deadline on the ticket, and a ticket that cannot start in time refused with its own code."""

from __future__ import annotations

import time

import pytest
import requests
from redis import Redis

from shared.models import TicketRequest
from shared.policy import Policy
from shared.queue import TicketQueue
from shared.shed import ShedCode
from tests.producer.api.conftest import Api, publish_alarm

COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice."}


def test_the_smaller_of_header_and_body_deadline_is_on_the_ticket(api: Api, branch: requests.Session) -> None:
    before = time.time()
    both = branch.post(
        api.url("/v1/tickets"),
        json={**COMPLAINT, "deadline_ms": 4000},
        headers={"X-Tidegate-Deadline-Ms": "3000"},
    )
    slo = branch.post(api.url("/v1/tickets"), json=COMPLAINT)
    assert both.status_code == slo.status_code == 202
    view = branch.get(api.url(f"/v1/tickets/{both.json()['id']}")).json()
    assert before + 3 <= view["deadline"] <= time.time() + 3
    view = branch.get(api.url(f"/v1/tickets/{slo.json()['id']}")).json()
    assert before + 10 <= view["deadline"] <= time.time() + 10  # the complaint SLO


@pytest.mark.parametrize(
    ("body", "headers", "field"),
    [
        ({**COMPLAINT, "deadline_ms": 0}, {}, "deadline_ms"),
        ({**COMPLAINT, "deadline_ms": "soon"}, {}, "deadline_ms"),
        (COMPLAINT, {"X-Tidegate-Deadline-Ms": "-3"}, "X-Tidegate-Deadline-Ms"),
        (COMPLAINT, {"X-Tidegate-Deadline-Ms": "soon"}, "X-Tidegate-Deadline-Ms"),
    ],
)
def test_a_bad_deadline_is_a_422_naming_it(
    api: Api, branch: requests.Session, body: dict[str, object], headers: dict[str, str], field: str
) -> None:
    answer = branch.post(api.url("/v1/tickets"), json=body, headers=headers)
    assert answer.status_code == 422
    assert field in answer.text


def test_a_complaint_that_cannot_start_in_time_is_refused_at_once(
    api: Api, branch: requests.Session, redis_client: Redis, policy: Policy
) -> None:
    queue = TicketQueue(redis_client, policy, api.settings.queue_name)
    queue.enqueue_many([TicketRequest(type="complaint", branch_id="b9", prompt="x") for _ in range(30)])
    publish_alarm(redis_client, api.queue_keys, "green", drain_rate=1.0)  # 30 ahead at 1/s
    shed = branch.post(api.url("/v1/tickets"), json=COMPLAINT)
    assert shed.status_code == 429
    assert shed.headers["X-Tidegate-Shed"] == ShedCode.DEADLINE_UNREACHABLE.value
    assert 15 <= int(shed.headers["Retry-After"]) <= 25  # about the 30 s wait past the 10 s SLO
    assert "past its deadline" in shed.json()["error"]["message"]
    loan = branch.post(api.url("/v1/tickets"), json={"type": "loan_approval", "prompt": "Approve?"})
    assert loan.status_code == 202


def test_a_started_ticket_says_how_long_it_was_queued(
    api: Api, branch: requests.Session, redis_client: Redis, policy: Policy
) -> None:
    accepted = branch.post(api.url("/v1/tickets"), json=COMPLAINT).json()
    queued = branch.get(api.url(f"/v1/tickets/{accepted['id']}"))
    assert "X-Tidegate-Queue-Ms" not in queued.headers  # not started yet
    queue = TicketQueue(redis_client, policy, api.settings.queue_name)
    started = queue.claim("w1", 1)[0].ticket
    answer = branch.get(api.url(f"/v1/tickets/{accepted['id']}"))
    assert started.queue_wait_seconds is not None
    assert int(answer.headers["X-Tidegate-Queue-Ms"]) == round(started.queue_wait_seconds * 1000)
    assert answer.json()["timings"]["queue_wait_seconds"] == pytest.approx(started.queue_wait_seconds)
