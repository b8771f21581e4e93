"""No GPU time for answers nobody waits for: a claimed ticket whose deadline can no longer be met is
ended `expired` (reason deadline_passed, counted per type) instead of being started; critical types
and tickets with time to spare run."""

from __future__ import annotations

from collections.abc import Callable

from ops.lab.sim.process import SimulatorProcess
from shared.models import TicketStatus
from shared.queue import TicketQueue
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, running_ticket, submit, ticket, wait_all_ended
from worker.deadlines import DEADLINE_PASSED, StartRule


def test_a_worker_does_not_start_what_is_due_before_it_could_answer(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    # Due a millisecond after submission: past due before any worker could give the first token.
    late = [ticket("complaint", deadline_ms=1), ticket("archive_query", deadline_ms=1)]
    on_time = [ticket("complaint"), ticket("loan_approval", deadline_ms=1)]  # a loan is never dropped
    ids = submit(producer_for(fast_queue), late + on_time)
    start_worker(simulator().base_url, burst=True, deadline_service_seconds=0.25)
    ended = wait_all_ended(fast_queue, ids, 30, "every ticket to end")
    assert [t.status for t in ended] == [TicketStatus.EXPIRED] * 2 + [TicketStatus.DONE] * 2
    for expired in ended[:2]:
        assert expired.error is not None and expired.error.startswith(DEADLINE_PASSED)
        assert expired.result is None and expired.usage is None  # no answer was generated
    counts = fast_queue.stats().counts
    assert counts["complaint:deadline_passed"] == counts["archive_query:deadline_passed"] == 1
    assert counts["complaint:expired"] == 1 and counts["complaint:done"] == 1
    assert "loan_approval:deadline_passed" not in counts


def test_the_start_rule_keeps_the_least_service_time_in_hand() -> None:
    rule = StartRule(frozenset({"loan_approval"}), service_seconds=0.5)
    assert not rule.too_late(running_ticket(deadline=10.0), now=9.5)
    assert rule.too_late(running_ticket(deadline=10.0), now=9.6)
    assert not rule.too_late(running_ticket("loan_approval", deadline=10.0), now=20.0)
    assert not rule.too_late(
        running_ticket(deadline=None), now=1e9
    )  # a ticket stored before deadlines existed
    assert rule.reason(running_ticket(deadline=10.0), now=11.0).startswith("deadline_passed: ")
