"""Submit, read, cancel and batch over real HTTP, and the walls between branches."""

from __future__ import annotations

import time

import pytest
import requests
from redis import Redis

from shared import clock
from shared.models import TicketRequest, TicketStatus
from shared.queue import TicketQueue
from tests.fake_clock import FakeClock
from tests.producer.api.conftest import Api

LOAN = {"type": "loan_approval", "prompt": "Approve a 20k loan for client 991?", "urgent_level": 3}
COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice.", "vip_level": 2}


def test_submit_answers_202_with_id_status_priority_and_expiry(api: Api, branch: requests.Session) -> None:
    before = time.time()
    response = branch.post(api.url("/v1/tickets"), json=LOAN)
    assert response.status_code == 202, response.text
    body = response.json()
    assert set(body) == {"id", "status", "priority", "expires_at"}
    assert body["status"] == "queued"
    assert body["priority"] == -0.3  # base 0 − 0.1 × urgent level 3
    assert before + 30 - 1 < body["expires_at"] < time.time() + 30 + 1  # loan TTL from the policy


def test_submitted_ticket_is_queued_for_the_keys_branch(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue
) -> None:
    ticket_id = branch.post(api.url("/v1/tickets"), json=COMPLAINT).json()["id"]
    stored = ticket_queue.get(ticket_id)
    assert stored is not None
    assert stored.branch_id == "0412"
    assert stored.status is TicketStatus.QUEUED
    assert ticket_queue.stats().depth_by_type["complaint"] == 1


def test_read_shows_status_result_error_and_timings(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue
) -> None:
    ticket_id = branch.post(api.url("/v1/tickets"), json=LOAN).json()["id"]
    claimed = ticket_queue.claim("w-test", 1)
    assert [c.ticket.id for c in claimed] == [ticket_id]
    assert ticket_queue.finish(
        ticket_id, claimed[0].token, "done", result="approved", usage={"total_tokens": 9}
    )

    response = branch.get(api.url(f"/v1/tickets/{ticket_id}"))
    assert response.status_code == 200
    view = response.json()
    assert view["status"] == "done"
    assert view["result"] == "approved"
    assert view["error"] is None
    assert view["usage"] == {"total_tokens": 9}
    assert view["timings"]["queue_wait_seconds"] >= 0
    assert view["timings"]["total_seconds"] >= view["timings"]["queue_wait_seconds"]


def test_cancel_a_queued_ticket_then_cancel_again_changes_nothing(api: Api, branch: requests.Session) -> None:
    ticket_id = branch.post(api.url("/v1/tickets"), json=COMPLAINT).json()["id"]

    first = branch.delete(api.url(f"/v1/tickets/{ticket_id}"))
    assert first.status_code == 200
    assert first.json() == {
        "id": ticket_id,
        "status": "cancelled",
        "previous_status": "queued",
        "cancelled": True,
    }
    again = branch.delete(api.url(f"/v1/tickets/{ticket_id}"))
    assert again.json() == {
        "id": ticket_id,
        "status": "cancelled",
        "previous_status": "cancelled",
        "cancelled": False,
    }
    assert branch.get(api.url(f"/v1/tickets/{ticket_id}")).json()["status"] == "cancelled"


def test_cancel_a_running_ticket_makes_its_lease_stale(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue
) -> None:
    ticket_id = branch.post(api.url("/v1/tickets"), json=LOAN).json()["id"]
    claimed = ticket_queue.claim("w-test", 1)[0]

    assert branch.delete(api.url(f"/v1/tickets/{ticket_id}")).json()["previous_status"] == "running"
    # The worker learns at its next lease extension and aborts the inference request.
    assert ticket_queue.extend(ticket_id, claimed.token) == "stale:cancelled"


def test_another_branch_gets_404_for_read_and_cancel(
    api: Api, branch: requests.Session, other_branch_key: str
) -> None:
    ticket_id = branch.post(api.url("/v1/tickets"), json=COMPLAINT).json()["id"]
    with api.session(other_branch_key) as other:
        read = other.get(api.url(f"/v1/tickets/{ticket_id}"))
        cancel = other.delete(api.url(f"/v1/tickets/{ticket_id}"))
        unknown = other.get(api.url("/v1/tickets/0000000000000000000000000z"))
    assert read.status_code == cancel.status_code == 404
    # Indistinguishable from an id that never existed, apart from the id itself.
    assert read.json()["error"]["message"].replace(ticket_id, "X") == unknown.json()["error"][
        "message"
    ].replace("0000000000000000000000000z", "X")
    assert branch.get(api.url(f"/v1/tickets/{ticket_id}")).json()["status"] == "queued"


def test_operator_reads_any_branchs_ticket(api: Api, branch: requests.Session, operator_key: str) -> None:
    ticket_id = branch.post(api.url("/v1/tickets"), json=COMPLAINT).json()["id"]
    with api.session(operator_key) as operator:
        assert operator.get(api.url(f"/v1/tickets/{ticket_id}")).json()["branch_id"] == "0412"


def test_operator_submits_only_for_a_named_branch(api: Api, operator_key: str) -> None:
    with api.session(operator_key) as operator:
        missing = operator.post(api.url("/v1/tickets"), json=LOAN)
        named = operator.post(api.url("/v1/tickets"), json={**LOAN, "branch_id": "0007"})
    assert missing.status_code == 422
    assert missing.json()["error"]["issues"][0]["loc"] == ["body", "branch_id"]
    assert named.status_code == 202


def test_branch_id_in_body_must_be_the_keys_branch(api: Api, branch: requests.Session) -> None:
    same = branch.post(api.url("/v1/tickets"), json={**LOAN, "branch_id": "0412"})
    other = branch.post(api.url("/v1/tickets"), json={**LOAN, "branch_id": "0413"})
    assert same.status_code == 202
    assert other.status_code == 403
    assert other.json()["error"]["code"] == "branch_mismatch"


def test_idempotent_retry_returns_the_same_ticket_and_creates_one(
    api: Api, branch: requests.Session, redis_client: Redis, ticket_queue: TicketQueue
) -> None:
    headers = {"Idempotency-Key": "req-77"}
    first = branch.post(api.url("/v1/tickets"), json=LOAN, headers=headers)
    second = branch.post(api.url("/v1/tickets"), json=LOAN, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert ticket_queue.stats().depth == 1
    assert redis_client.hget(api.queue_keys.counts, "loan_approval:submitted") == "1"


def test_idempotency_key_is_per_branch(api: Api, branch: requests.Session, other_branch_key: str) -> None:
    headers = {"Idempotency-Key": "shared-name"}
    mine = branch.post(api.url("/v1/tickets"), json=LOAN, headers=headers).json()["id"]
    with api.session(other_branch_key) as other:
        theirs = other.post(api.url("/v1/tickets"), json=LOAN, headers=headers).json()["id"]
    assert mine != theirs


def test_batch_partial_success_with_per_item_results(api: Api, branch: requests.Session) -> None:
    items = [
        LOAN,
        {"type": "mortgage", "prompt": "x"},
        {**COMPLAINT, "idempotency_key": "b-1"},
        {**COMPLAINT, "idempotency_key": "b-1"},
        {**COMPLAINT, "branch_id": "0001"},
        {"type": "complaint", "prompt": "x", "colour": "red"},
    ]
    response = branch.post(api.url("/v1/tickets/batch"), json={"tickets": items})
    assert response.status_code == 200, response.text
    body = response.json()
    codes = [(r["index"], r["status_code"], r["outcome"]) for r in body["results"]]
    assert codes == [
        (0, 202, "queued"),
        (1, 422, "invalid"),
        (2, 202, "queued"),
        (3, 202, "existing"),
        (4, 403, "forbidden"),
        (5, 422, "invalid"),
    ]
    results = body["results"]
    assert results[2]["id"] == results[3]["id"]
    assert results[1]["error"]["issues"][0]["loc"] == ["body", "tickets", 1, "type"]
    assert "loan_approval, complaint, archive_query" in results[1]["error"]["issues"][0]["msg"]
    assert results[5]["error"]["issues"] == [
        {
            "loc": ["body", "tickets", 5, "colour"],
            "msg": "Extra inputs are not permitted",
            "type": "extra_forbidden",
        }
    ]
    assert (body["queued"], body["existing"], body["rejected"], body["invalid"]) == (2, 1, 0, 3)
    for result in results:
        if result["id"] is not None:
            assert branch.get(api.url(f"/v1/tickets/{result['id']}")).status_code == 200


def test_batch_over_500_items_is_refused_whole(api: Api, branch: requests.Session) -> None:
    response = branch.post(api.url("/v1/tickets/batch"), json={"tickets": [{"type": "x"}] * 501})
    assert response.status_code == 422
    assert response.json()["error"]["issues"][0]["loc"] == ["body", "tickets"]


def test_queues_shows_depth_level_mode_and_workers(api: Api, branch: requests.Session) -> None:
    branch.post(api.url("/v1/tickets"), json=COMPLAINT)
    branch.post(api.url("/v1/tickets"), json=COMPLAINT)
    body = branch.get(api.url("/v1/queues")).json()
    assert body["queue"] == api.settings.queue_name
    assert body["types"]["complaint"]["depth"] == 2
    assert body["types"]["loan_approval"]["depth"] == 0
    assert body["depth"] == 2
    assert body["level"] == "green"
    assert body["mode"] == "normal"
    assert body["workers"]["alive"] == 0
    assert body["workers"]["details"] is None  # worker details are for operators


def test_healthz_and_metrics_need_no_key(api: Api) -> None:
    assert requests.get(api.url("/healthz"), timeout=5).json() == {"status": "ok", "redis": "ok"}
    metrics = requests.get(api.url("/metrics"), timeout=5)
    assert metrics.status_code == 200
    queue = api.settings.queue_name
    assert f'tidegate_queue_depth{{queue="{queue}",type="complaint"}} 0.0' in metrics.text
    assert f'tidegate_alarm_level{{queue="{queue}"}} 0.0' in metrics.text


def test_a_queued_ticket_past_its_ttl_reads_expired_with_no_sweeper_running(
    api: Api,
    branch: requests.Session,
    ticket_queue: TicketQueue,
    redis_client: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No worker, monitor or reaper runs here: the read itself ends the ticket, once, atomically."""
    submitted = branch.post(
        api.url("/v1/tickets"), json={"type": "complaint", "prompt": "hi", "ttl_seconds": 1}
    )
    ticket_id = submitted.json()["id"]
    keys = api.queue_keys
    assert branch.get(api.url(f"/v1/tickets/{ticket_id}")).json()["status"] == "queued"
    FakeClock(clock.now() + 1.5).install(monkeypatch)  # the API runs in this process: past the TTL
    view = branch.get(api.url(f"/v1/tickets/{ticket_id}")).json()
    assert (view["status"], view["error"]) == ("expired", "TTL passed while queued")
    assert view["finished_at"] >= view["expires_at"]
    # Recorded, not only reported: out of every queued structure, counted once, with a retention.
    assert redis_client.hget(keys.ticket(ticket_id), "status") == "expired"
    for queued in (keys.pending, keys.deadlines, keys.waiting("complaint")):
        assert redis_client.zscore(queued, ticket_id) is None
    assert redis_client.ttl(keys.ticket(ticket_id)) > 0
    assert branch.get(api.url(f"/v1/tickets/{ticket_id}")).json()["status"] == "expired"
    assert ticket_queue.reap("after-the-read").expired == 0
    assert ticket_queue.stats().counts["complaint:expired"] == 1
    assert ticket_queue.claim("w-late", 1) == []


def test_a_read_before_the_deadline_changes_nothing(ticket_queue: TicketQueue, redis_client: Redis) -> None:
    request = TicketRequest(type="complaint", branch_id="0412", prompt="hi", ttl_seconds=30)
    ticket_id = ticket_queue.enqueue(request).ticket_id
    [read] = ticket_queue.get_many([ticket_id])
    assert read is not None and read.status is TicketStatus.QUEUED
    assert redis_client.zscore(ticket_queue.keys.pending, ticket_id) is not None
    assert ticket_queue.get_many(["0000000000000000000000000z"]) == [None]
