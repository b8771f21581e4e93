"""Batched enqueue and finish on a real Redis: one script call for many tickets, each ticket still
judged on its own, and a refused ticket named with its field while its call writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from shared.keys import WAKE_LIST_CAP
from shared.models import TicketRequest, TicketStatus
from shared.policy import Policy
from shared.queue import EnqueueItemError, EnqueueOptions, FinishItemError, Outcome, TicketQueue
from shared.shed import ShedCode
from shared.submission import CHUNK, Submission


def loans(n: int, **kw: Any) -> list[TicketRequest]:
    return [TicketRequest(type="loan_approval", branch_id="0412", prompt=f"loan {i}", **kw) for i in range(n)]


@pytest.fixture
def roomy_queue(redis_client: Redis, policy: Policy, queue_name: str) -> TicketQueue:
    """Caps above the batches here, so every admitted ticket is queued."""
    types = {n: t.model_copy(update={"cap": 10 * CHUNK}) for n, t in policy.types.items()}
    return TicketQueue(redis_client, policy.model_copy(update={"types": types}), queue_name)


def test_a_batch_of_several_chunks_queues_every_ticket_first_in_first_out(roomy_queue: TicketQueue) -> None:
    n = 2 * CHUNK + 7
    results = roomy_queue.enqueue_many(loans(n))
    assert [r.outcome for r in results] == ["queued"] * n
    claimed = roomy_queue.claim("w", n)
    assert [c.ticket.id for c in claimed] == [r.ticket_id for r in results]  # equal priority: FIFO
    assert [c.ticket.prompt for c in claimed] == [f"loan {i}" for i in range(n)]
    stats = roomy_queue.stats()
    assert stats.outcome_count("loan_approval", "submitted") == n
    assert roomy_queue.redis.llen(roomy_queue.keys.wake) == WAKE_LIST_CAP


def test_a_ticket_the_script_refuses_is_named_and_its_chunk_writes_nothing(
    roomy_queue: TicketQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad_index = CHUNK + 3
    drafted: list[str] = []
    original = Submission._draft

    def corrupt_one(self: Submission, *args: Any) -> Any:
        draft = original(self, *args)
        if len(drafted) == bad_index:
            draft.values[5] = "soon"  # expires_at: not a number
        drafted.append(draft.ticket.id)
        return draft

    monkeypatch.setattr(Submission, "_draft", corrupt_one)
    n = 2 * CHUNK + 5
    with pytest.raises(EnqueueItemError) as caught:
        roomy_queue.enqueue_many(loans(n))
    error = caught.value
    assert (error.index, error.field) == (bad_index, "expires_at")
    assert f"ticket {bad_index} of the batch: expires_at" in str(error)
    assert "'soon'" not in str(error) and '"soon"' in str(error)  # the value as the script saw it
    refused = range(CHUNK, 2 * CHUNK)
    assert all(error.results[i] is None for i in refused)
    written = [r for r in error.results if r is not None]
    assert [r.outcome for r in written] == ["queued"] * (n - CHUNK)  # the other chunks stand
    assert all(roomy_queue.get(drafted[i]) is None for i in refused)
    stats = roomy_queue.stats()
    assert stats.pending == n - CHUNK
    assert stats.outcome_count("loan_approval", "submitted") == n - CHUNK


def test_an_unknown_type_refuses_the_batch_before_anything_is_sent(roomy_queue: TicketQueue) -> None:
    batch = loans(4)
    batch.insert(2, TicketRequest(type="mortgage", branch_id="0412", prompt="x"))  # parsed without policy
    with pytest.raises(EnqueueItemError) as caught:
        roomy_queue.enqueue_many(batch)
    assert (caught.value.index, caught.value.field) == (2, "type")
    assert "'mortgage'" in str(caught.value) and "loan_approval" in str(caught.value)
    stats = roomy_queue.stats()
    assert (stats.pending, stats.counts) == (0, {})


def test_each_ticket_of_a_batch_gets_its_own_outcome(roomy_queue: TicketQueue) -> None:
    batch = [
        *loans(1, idempotency_key="k1"),
        *loans(1, idempotency_key="k1"),  # the same submission again, in the same batch
        TicketRequest(type="complaint", branch_id="0412", prompt="charged twice"),
        TicketRequest(type="archive_query", branch_id="0412", prompt="2019", is_bulk=True),
    ]
    options = [
        EnqueueOptions(),
        EnqueueOptions(),
        EnqueueOptions(shed=ShedCode.QUEUE_RED, retry_after=7.0),
        EnqueueOptions(defer_seconds=30.0),
    ]
    first, again, shed, deferred = roomy_queue.enqueue_many(batch, options)
    assert (first.outcome, again.outcome, again.ticket_id) == ("queued", "existing", first.ticket_id)
    assert (shed.outcome, shed.code) == ("rejected", ShedCode.QUEUE_RED)
    stored_shed = roomy_queue.get(shed.ticket_id)
    assert stored_shed is not None and stored_shed.status is TicketStatus.REJECTED
    assert (stored_shed.retry_after, stored_shed.prompt) == (7.0, None)
    assert deferred.outcome == "queued"
    stats = roomy_queue.stats()
    assert (stats.pending, stats.delayed) == (1, 1)
    assert stats.outcome_count("loan_approval", "submitted") == 1  # the replay is not a submission
    assert stats.outcome_count("complaint", "rejected") == 1


def test_finish_many_fences_each_ticket_on_its_own(roomy_queue: TicketQueue) -> None:
    roomy_queue.enqueue_many(loans(4))
    a, b, c, d = roomy_queue.claim("w", 4)
    assert roomy_queue.finish(d.ticket.id, d.token, "done", result="earlier")
    replies = roomy_queue.finish_many(
        [
            Outcome(a.ticket.id, a.token, "done", result="yes", usage={"completion_tokens": 1}),
            Outcome(b.ticket.id, "999999", "done", result="forged"),
            Outcome(c.ticket.id, c.token, "failed", error="refused by the model"),
            Outcome(d.ticket.id, d.token, "done", result="twice"),
        ]
    )
    assert replies == ["ok", "stale:running", "ok", "stale:done"]
    got_a, got_b, got_c, got_d = roomy_queue.get_many([a.ticket.id, b.ticket.id, c.ticket.id, d.ticket.id])
    assert got_a is not None and (got_a.status, got_a.result, got_a.usage) == (
        TicketStatus.DONE,
        "yes",
        {"completion_tokens": 1},
    )
    assert got_b is not None and (got_b.status, got_b.result) == (TicketStatus.RUNNING, None)
    assert got_c is not None and (got_c.status, got_c.error) == (TicketStatus.FAILED, "refused by the model")
    assert got_d is not None and got_d.result == "earlier"
    stats = roomy_queue.stats()
    assert stats.inflight == 1
    assert (stats.outcome_count("loan_approval", "done"), stats.outcome_count("loan_approval", "failed")) == (
        2,
        1,
    )


def test_a_bad_outcome_refuses_the_whole_finish(roomy_queue: TicketQueue) -> None:
    roomy_queue.enqueue_many(loans(2))
    a, b = roomy_queue.claim("w", 2)
    bad = Outcome(b.ticket.id, b.token, "maybe")  # type: ignore[arg-type]
    with pytest.raises(FinishItemError) as caught:
        roomy_queue.finish_many([Outcome(a.ticket.id, a.token, "done", result="x"), bad])
    assert (caught.value.index, caught.value.ticket_id, caught.value.field) == (1, b.ticket.id, "status")
    # The script checks the same before writing, for any caller that reaches it directly.
    keys = [
        roomy_queue.keys.inflight,
        roomy_queue.keys.counts,
        roomy_queue.keys.outbox,
        roomy_queue.keys.ticket_prefix,
    ]
    args = ["1", roomy_queue.policy.queue.retention_spec, *Outcome(a.ticket.id, a.token, "done").arguments()]
    args += [b.ticket.id, b.token, "maybe", "", "0"]
    with pytest.raises(ResponseError, match=rf'^ticket 2 \({b.ticket.id}\): status "maybe" is not accepted'):
        roomy_queue.scripts.finish(keys=keys, args=args)
    assert [t.status if t else None for t in roomy_queue.get_many([a.ticket.id, b.ticket.id])] == [
        TicketStatus.RUNNING,
        TicketStatus.RUNNING,
    ]
    assert roomy_queue.stats().inflight == 2
