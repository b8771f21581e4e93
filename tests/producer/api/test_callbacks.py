"""Callbacks: an ended ticket's JSON is POSTed to its callback_url by an rq job that retries, and a
failing receiver never changes the ticket."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from redis import Redis
from rq import Queue, Retry, SimpleWorker
from rq.job import JobStatus

from ops.monitor.dispatch import JobOptions, callback_job
from producer.callbacks import CallbackFailed, deliver_callback
from shared.config import Settings
from shared.queue import TicketQueue
from tests.producer.api.conftest import Api
from tests.producer.api.peer import Answer, ScriptedPeer

OK: Answer = (200, {}, {"received": True})
BROKEN: Answer = (500, {}, {"error": "receiver down"})


@pytest.fixture
def api_settings(api_settings: Settings, loopback_callbacks_policy: str) -> Settings:
    """Receivers here listen on 127.0.0.1, which the policy must allow (test_callback_safety.py)."""
    return Settings(**api_settings.model_dump(exclude={"policy_file"}), policy_file=loopback_callbacks_policy)


def _finished_ticket(api: Api, branch: requests.Session, ticket_queue: TicketQueue, callback_url: str) -> str:
    body = {"type": "loan_approval", "prompt": "Approve?", "callback_url": callback_url}
    ticket_id: str = branch.post(api.url("/v1/tickets"), json=body).json()["id"]
    claimed = ticket_queue.claim("w-callback-test", 1)[0]
    assert ticket_queue.finish(ticket_id, claimed.token, "done", result="approved")
    return ticket_id


@pytest.fixture
def rq_queue(redis_url: str) -> Iterator[Queue]:
    """An rq queue of this test only; its keys and its jobs' keys are removed afterwards."""
    connection = Redis.from_url(redis_url)  # rq pickles jobs: replies stay bytes
    queue = Queue(f"tidegate-callbacks-test-{uuid.uuid4().hex[:10]}", connection=connection)
    yield queue
    job_ids = set(queue.job_ids) | set(queue.finished_job_registry.get_job_ids())
    job_ids |= set(queue.failed_job_registry.get_job_ids())
    for key in connection.scan_iter(match=f"rq:*{queue.name}*"):
        connection.delete(key)
    for job_id in job_ids:
        for key in connection.scan_iter(match=f"rq:*{job_id}*"):
            connection.delete(key)
    connection.srem("rq:queues", queue.key)
    connection.close()


def _work(queue: Queue) -> None:
    worker = SimpleWorker([queue], connection=queue.connection, name=f"w-{uuid.uuid4().hex[:10]}")
    worker.work(burst=True)
    queue.connection.delete(worker.key)  # rq leaves a dead worker's record to expire; drop it now


def test_delivers_the_public_ticket_json(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue, redis_url: str, redis_client: Redis
) -> None:
    with ScriptedPeer([OK]) as peer:
        ticket_id = _finished_ticket(api, branch, ticket_queue, peer.url + "/hooks/tidegate")
        # Finishing handed the id to the outbox, where the monitor picks it up for rq.
        assert redis_client.lrange(api.queue_keys.outbox, 0, -1) == [ticket_id]
        assert deliver_callback(api.settings.queue_name, ticket_id, redis_url) == 200
    assert peer.bodies == [branch.get(api.url(f"/v1/tickets/{ticket_id}")).json()]
    assert peer.requests[0]["Idempotency-Key"] == f"{ticket_id}:done"
    assert peer.bodies[0]["result"] == "approved"


def test_rq_retries_a_failing_receiver_until_it_answers(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue, redis_url: str, rq_queue: Queue
) -> None:
    with ScriptedPeer([BROKEN, BROKEN, OK]) as peer:
        ticket_id = _finished_ticket(api, branch, ticket_queue, peer.url)
        # As the monitor hands it over: by name, with (queue, ticket id); the job reads the ticket
        # from the Redis it lives on.
        job = rq_queue.enqueue(
            "producer.callbacks.deliver_callback",
            api.settings.queue_name,
            ticket_id,
            retry=Retry(max=3, interval=0),
        )
        _work(rq_queue)
    assert job.get_status(refresh=True) == JobStatus.FINISHED
    assert len(peer.requests) == 3
    assert job.return_value() == 200


def test_a_receiver_that_never_answers_fails_the_job_but_not_the_ticket(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue, redis_url: str, rq_queue: Queue
) -> None:
    with ScriptedPeer([BROKEN]) as peer:
        ticket_id = _finished_ticket(api, branch, ticket_queue, peer.url)
        job = rq_queue.enqueue(
            deliver_callback, api.settings.queue_name, ticket_id, redis_url, retry=Retry(max=2, interval=0)
        )
        _work(rq_queue)
    assert job.get_status(refresh=True) == JobStatus.FAILED
    assert len(peer.requests) == 3  # the first try and two retries
    view = branch.get(api.url(f"/v1/tickets/{ticket_id}")).json()
    assert (view["status"], view["result"], view["error"]) == ("done", "approved", None)


def test_unreachable_receiver_raises_for_rq(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue, redis_url: str
) -> None:
    with ScriptedPeer([]) as peer:
        closed = peer.url
    ticket_id = _finished_ticket(api, branch, ticket_queue, closed)
    with pytest.raises(CallbackFailed, match=f"callback of ticket {ticket_id}"):
        deliver_callback(api.settings.queue_name, ticket_id, redis_url, timeout=2)


def test_nothing_to_deliver_without_a_url_or_a_ticket(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue, redis_url: str
) -> None:
    ticket_id = branch.post(api.url("/v1/tickets"), json={"type": "complaint", "prompt": "hi"}).json()["id"]
    branch.delete(api.url(f"/v1/tickets/{ticket_id}"))
    assert deliver_callback(api.settings.queue_name, ticket_id, redis_url) is None
    assert deliver_callback(api.settings.queue_name, "0000000000000000000000000z", redis_url) is None


def _side_job_lines(redis_url: str, queue: Queue) -> list[dict[str, Any]]:
    """Run the side-job worker as deployments start it (rq's command, tidegate's worker class) in
    burst mode; every line it wrote to stdout or stderr, parsed as JSON."""
    name = f"w-{uuid.uuid4().hex[:10]}"
    command = [sys.executable, "-m", "rq.cli", "worker", "--burst", "--name", name]
    command += ["--worker-class", "shared.rq_logs.JsonLogWorker", "--url", redis_url, queue.name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    queue.connection.delete(f"rq:worker:{name}")
    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines, "the worker wrote nothing"
    return [json.loads(line) for line in lines]  # a line that is not JSON fails here


def test_the_side_job_worker_logs_json_lines_carrying_the_ticket_id(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue, redis_url: str, rq_queue: Queue
) -> None:
    with ScriptedPeer([BROKEN, OK]) as peer:
        ticket_id = _finished_ticket(api, branch, ticket_queue, peer.url)
        options = JobOptions(callback_retry_intervals=(0,), callbacks_queue=rq_queue.name)
        rq_queue.enqueue_many([callback_job(api.settings.queue_name, ticket_id, options)])
        lines = _side_job_lines(redis_url, rq_queue)
    assert len(peer.requests) == 2
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert not any("\x1b" in line["message"] for line in lines), "terminal colours in a log line"
    mine = [line for line in lines if line.get("ticket_id") == ticket_id]
    assert {line["rq_queue"] for line in mine} == {rq_queue.name}
    dequeued = [line for line in mine if f"callback of ticket {ticket_id}" in line["message"]]
    failed = [line for line in mine if line["level"] == "ERROR"]
    assert len(dequeued) >= 2, "both tries' dequeue lines carry the ticket"
    assert failed and "CallbackFailed" in failed[0]["message"]  # the traceback, inside one line
    assert any("Successfully completed" in line["message"] for line in mine)
    assert not any(line.get("ticket_id") for line in lines if "Listening on" in line["message"])
