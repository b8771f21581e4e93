"""ClaimLoop on its own: fakes for the queue, the sizer and the breaker gate, the real claim plan; no
Redis, no simulator. Each round (`_step`) is driven by the test, so no timing decides an outcome."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from shared.keys import QueueKeys
from shared.models import TicketRequest
from shared.policy import load_policy
from shared.queue import ClaimedTicket
from shared.submission import Submission
from tests.fake_clock import FakeClock
from worker.claim_loop import ClaimLoop
from worker.claim_plan import Bound, Gate
from worker.deadlines import StartRule
from worker.inflight import InFlight, RunningTicket
from worker.queue_endpoints import QueueEndpoint, QueueEndpoints

POLICY = load_policy()
BLOCK_SECONDS = 0.01
_BUILDER = Submission(POLICY, QueueKeys("claim-loop-unit"), None)  # type: ignore[arg-type]  # builds only


def claimed(ticket_type: str = "complaint") -> ClaimedTicket:
    request = TicketRequest(type=ticket_type, branch_id="0412", prompt="hello")
    return ClaimedTicket(_BUILDER.build_ticket(request), token="t")


@dataclass
class FakeQueue:
    """Hands out what `ready` holds; records every claim and wait."""

    ready: list[ClaimedTicket] = field(default_factory=list)
    delayed: int = 0
    leased: int = 0
    next_retry: float | None = None
    fail_claims: int = 0
    claims: list[dict[str, Any]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    policy: Any = POLICY

    def claim(self, worker_id: str, count: int, **options: Any) -> list[ClaimedTicket]:
        if self.fail_claims:
            self.fail_claims -= 1
            raise redis.ConnectionError("Redis restarting")
        self.claims.append({"count": count, **options})
        taken, self.ready = self.ready[:count], self.ready[count:]
        return taken

    def sizes(self) -> tuple[int, int, int]:
        return len(self.ready), self.delayed, self.leased

    def seconds_until_next_retry(self) -> float | None:
        return self.next_retry

    def wait_for_work(self, seconds: float) -> None:
        self.waits.append(seconds)


class FakeSizer:
    def __init__(self, limit: int, budget: int | None = None) -> None:
        self.limit = limit
        self.bound = Bound.MAX_BATCH
        self.budget = budget
        self.observed: list[int] = []

    def token_budget(self, own_reserved_tokens: int) -> int | None:
        return self.budget

    def usable_kv_tokens(self) -> int | None:
        return None

    def observe(self, cost_tokens: int) -> None:
        self.observed.append(cost_tokens)


class FakeGate:
    """The shared breaker as one worker sees it: the test sets the verdict and who wins the probe."""

    def __init__(
        self, gate: Gate, wait: float = 0.0, probe: bool = True, why: Bound = Bound.HALF_OPEN
    ) -> None:
        self.gate: tuple[Gate, float, Bound | None] = (gate, wait, None if gate is Gate.GO else why)
        self.probe = probe
        self.released = 0

    def claim_gate(self) -> tuple[Gate, float, Bound | None]:
        return self.gate

    def take_probe(self) -> bool:
        return self.probe

    def release_probe(self) -> None:
        self.released += 1


def endpoints_of(gate: FakeGate, queue: FakeQueue) -> QueueEndpoints:
    """The real per-queue view over one queue whose breaker gate is `gate`."""
    one = SimpleNamespace(keys=QueueKeys("claim-loop-unit"))
    return QueueEndpoints(queue, [QueueEndpoint(one, gate, None)])  # type: ignore[arg-type]


class FakeWriter:
    def __init__(self) -> None:
        self.given_back: list[str] = []
        self.too_late: list[str] = []

    def deadline_passed(self, item: ClaimedTicket, reason: str) -> None:
        self.too_late.append(item.ticket.id)

    def give_back(self, running: RunningTicket, reason: str) -> None:
        self.given_back.append(running.id)


@dataclass
class Loop:
    loop: ClaimLoop
    queue: FakeQueue
    inflight: InFlight
    started: list[RunningTicket]
    writer: FakeWriter


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return FakeClock(start=100.0).install(monkeypatch)


def make_loop(
    *,
    limit: int = 4,
    budget: int | None = None,
    gate: FakeGate | None = None,
    burst: bool = False,
    start_rule: StartRule | None = None,
) -> Loop:
    queue, inflight, writer = FakeQueue(), InFlight(), FakeWriter()
    started: list[RunningTicket] = []
    loop = ClaimLoop(
        queue=queue,  # type: ignore[arg-type]
        worker_id="w-unit",
        gpu=0,
        sizer=FakeSizer(limit, budget),  # type: ignore[arg-type]
        inflight=inflight,
        writer=writer,  # type: ignore[arg-type]
        start=started.append,
        stop=threading.Event(),
        lease_seconds=30.0,
        block_seconds=BLOCK_SECONDS,
        burst=burst,
        endpoints=None if gate is None else endpoints_of(gate, queue),
        start_rule=start_rule,
    )
    return Loop(loop, queue, inflight, started, writer)


def test_a_round_claims_the_free_slots_and_starts_each_ticket(fake_clock: FakeClock) -> None:
    run = make_loop(limit=4)
    run.inflight.add(RunningTicket(claimed().ticket, "t", 0))
    run.queue.ready = [claimed() for _ in range(5)]
    assert run.loop._step() is False
    assert run.queue.claims[0]["count"] == 3, "four slots, one taken"
    assert run.queue.claims[0]["take_first_over_budget"] is False, "something runs: no oversize head"
    assert len(run.started) == 3 and run.inflight.count() == 4 and run.loop.claimed_total == 3
    assert all(r.healthy and not r.probe for r in run.started)


def test_at_the_limit_nothing_is_claimed(fake_clock: FakeClock) -> None:
    run = make_loop(limit=1)
    run.inflight.add(RunningTicket(claimed().ticket, "t", 0))
    run.queue.ready = [claimed()]
    run.loop._step()
    assert run.queue.claims == [] and run.started == []


def test_no_kv_budget_left_holds_claims_while_something_runs(fake_clock: FakeClock) -> None:
    run = make_loop(limit=4, budget=0)
    run.inflight.add(RunningTicket(claimed().ticket, "t", 0))
    run.queue.ready = [claimed()]
    run.loop._step()
    assert run.queue.claims == []


def test_after_a_vllm_failure_it_pauses_then_probes_with_one_ticket(fake_clock: FakeClock) -> None:
    gate = FakeGate(Gate.WAIT, 2.0, why=Bound.FAILING)
    run = make_loop(limit=4, gate=gate)
    run.queue.ready = [claimed() for _ in range(3)]
    run.loop._step()
    assert run.queue.claims == [], "paused: nothing is claimed"
    assert run.loop.last_plan is not None and run.loop.last_plan.bound is Bound.FAILING
    gate.gate = (Gate.PROBE, 0.0, Bound.FAILING)
    run.loop._step()
    assert [c["count"] for c in run.queue.claims] == [1], "failing: the one probe ticket"
    assert run.started[0].probe and run.started[0].healthy is False, "its failure spends no attempt"
    assert run.loop.last_plan is not None and run.loop.last_plan.bound is Bound.FAILING
    gate.gate = (Gate.GO, 0.0, None)  # the probe succeeded
    run.loop._step()
    assert run.queue.claims[-1]["count"] == 3


def test_an_open_circuit_claims_nothing(fake_clock: FakeClock) -> None:
    run = make_loop(gate=FakeGate(Gate.WAIT, 30.0, why=Bound.OPEN))
    run.queue.ready = [claimed()]
    run.loop._step()
    assert run.queue.claims == []
    assert run.loop.last_plan is not None and run.loop.last_plan.bound is Bound.OPEN


def test_half_open_the_worker_that_wins_the_probe_claims_one_ticket_as_the_probe(
    fake_clock: FakeClock,
) -> None:
    gate = FakeGate(Gate.PROBE, probe=True)
    run = make_loop(gate=gate)
    run.queue.ready = [claimed(), claimed()]
    run.loop._step()
    assert [c["count"] for c in run.queue.claims] == [1]
    assert run.started[0].probe and not run.started[0].healthy
    assert run.loop.last_plan is not None and run.loop.last_plan.bound is Bound.HALF_OPEN


def test_half_open_a_worker_that_loses_the_probe_claims_nothing(fake_clock: FakeClock) -> None:
    run = make_loop(gate=FakeGate(Gate.PROBE, probe=False))
    run.queue.ready = [claimed()]
    run.loop._step()
    assert run.queue.claims == []


def test_a_probe_ticket_past_its_deadline_is_ended_and_the_probe_given_back(fake_clock: FakeClock) -> None:
    gate = FakeGate(Gate.PROBE, probe=True)
    run = make_loop(gate=gate, start_rule=StartRule(frozenset({"loan_approval"}), service_seconds=0.25))
    late = claimed()
    assert late.ticket.deadline is not None
    fake_clock.advance(late.ticket.deadline - fake_clock.at)  # due now: less than the least service
    run.queue.ready = [late]
    run.loop._step()
    assert run.writer.too_late == [late.ticket.id] and run.started == []
    assert gate.released == 1, "no call will judge the circuit: the next claimer probes"


def test_a_probe_with_nothing_to_send_is_given_back(fake_clock: FakeClock) -> None:
    gate = FakeGate(Gate.PROBE, probe=True)
    run = make_loop(gate=gate)
    run.loop._step()
    assert gate.released == 1, "the next claimer may probe"


def test_idle_it_blocks_for_work_no_longer_than_the_next_retry(fake_clock: FakeClock) -> None:
    run = make_loop()
    run.loop._step()
    assert run.queue.waits == [BLOCK_SECONDS]
    run.queue.delayed, run.queue.next_retry = 1, 0.001
    run.loop.block_seconds = 5.0
    run.loop._step()
    assert run.queue.waits[-1] == 0.01, "the next retry is due: at least a short block, not a spin"


def test_burst_mode_ends_when_the_queue_is_drained(fake_clock: FakeClock) -> None:
    run = make_loop(burst=True)
    run.queue.leased = 1
    assert run.loop._step() is False, "another worker's lease may come back"
    run.queue.leased = 0
    assert run.loop._step() is True


def test_a_ticket_claimed_while_shutting_down_is_given_back(fake_clock: FakeClock) -> None:
    run = make_loop()
    run.inflight.close()
    run.queue.ready = [claimed()]
    run.loop._step()
    assert len(run.writer.given_back) == 1 and run.started == []


def test_a_redis_error_is_retried_not_raised(fake_clock: FakeClock) -> None:
    run = make_loop(burst=True)
    run.loop.start = lambda running: run.inflight.remove(running.id)  # each ticket ends at once
    run.queue.fail_claims = 2
    run.queue.ready = [claimed()]
    run.loop.run()  # burst: returns once the queue is drained
    assert run.queue.fail_claims == 0 and run.loop.claimed_total == 1
