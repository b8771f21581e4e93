"""The lab's deadline ablation takes both of issue 29's deadline rules out, and only those."""

from __future__ import annotations

import pytest

from ops.lab.bench.ablation import ABLATIONS
from ops.monitor.sampler import Sampler
from shared.queue import TicketQueue
from tests.monitor.support import fill
from tests.worker.support import running_ticket
from worker.deadlines import StartRule


@pytest.fixture
def deadlines_ablated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ablation applied, and undone after the test (monkeypatch restores what it first saw)."""
    monkeypatch.setattr(StartRule, "too_late", StartRule.too_late)
    monkeypatch.setattr(Sampler, "sample", Sampler.sample)
    ABLATIONS["deadlines"]()


def test_a_ticket_past_its_deadline_still_starts(deadlines_ablated: None) -> None:
    assert not StartRule(frozenset({"loan_approval"}), service_seconds=0.5).too_late(
        running_ticket(deadline=10.0), now=30.0
    )


def test_the_monitor_publishes_no_service_rate_so_admission_has_no_evidence_to_refuse_on(
    deadlines_ablated: None, ticket_queue: TicketQueue
) -> None:
    sampler = Sampler(ticket_queue, window_seconds=10.0)
    sampler.sample(now=0.0)
    ids = fill(ticket_queue, 4, "complaint")
    for claimed in ticket_queue.claim("w1", 4):
        ticket_queue.finish(claimed.ticket.id, claimed.token, "done")
    sample = sampler.sample(now=2.0)
    assert (sample.service_rate, sample.service_peak) == (0.0, 0.0)
    assert sample.drain_rate == pytest.approx(len(ids) / 2.0)  # the other figures untouched
