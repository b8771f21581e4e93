"""Rollouts end to end: a worker, a primary and a candidate simulator, the monitor's wave judge.

The two simulators serve different model versions, so each ticket's recorded model says which
endpoint answered it. The monitor's part runs as its `RolloutController`, ticked by the test, so
a wave is judged exactly when the test has put its traffic through.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY
from redis import Redis

from ops.lab.procs.ports import free_port
from ops.lab.sim.process import SimulatorProcess
from ops.monitor.dispatch import JobOptions
from ops.monitor.rollout_controller import RolloutController
from shared import clock
from shared.breaker import endpoint_id
from shared.breaker_store import BreakerStore
from shared.control import read_events
from shared.keys import QueueKeys
from shared.models import Ticket, TicketRequest
from shared.policy import Policy, RolloutPolicy
from shared.queue import TicketQueue
from shared.rollout import RolloutState, RolloutStatus
from shared.rollout_report import rollout_summary
from shared.rollout_stats import read_shadow
from shared.rollout_store import RolloutStore
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker, sim_metric
from tests.worker.fault_proxy import FaultProxy
from tests.worker.support import producer_for, wait_all_ended
from worker.breaker_gate import BreakerGate
from worker.config import WorkerConfig
from worker.gpu_memory import make_provider
from worker.rollout_routing import RolloutRouter
from worker.vllm_client import RequestHandle, VllmClient, VllmError
from worker.worker import Worker

PRIMARY_MODEL = "qwen-sim:2026.11"
CANDIDATE_MODEL = "qwen-sim:2026.12"


@pytest.fixture
def rollout_policy(fast_policy: Policy) -> Policy:
    # Millisecond TTFTs on a loaded test machine are noise: the TTFT rule has its own unit tests.
    rollout = fast_policy.rollout.model_copy(
        update={"min_samples": 3, "shadow_concurrency": 32, "ttft_p95_margin": 1000.0}
    )
    return fast_policy.model_copy(update={"rollout": rollout})


@pytest.fixture
def controller(
    redis_client: Redis, rq_url: str, rollout_policy: Policy, queue_name: str
) -> Iterator[RolloutController]:
    rq_conn = Redis.from_url(rq_url, socket_timeout=10, socket_connect_timeout=5)
    jobs = JobOptions(actions_queue=f"actions-{queue_name}")
    yield RolloutController(redis_client, rq_conn, rollout_policy, QueueKeys(queue_name), jobs)
    leftovers = list(rq_conn.scan_iter(match=f"rq:*{queue_name}*", count=1000))
    if leftovers:
        rq_conn.delete(*leftovers)
    rq_conn.srem("rq:queues", f"rq:queue:{jobs.actions_queue}")
    rq_conn.close()


@pytest.fixture
def worker_on(
    redis_client: Redis, rollout_policy: Policy, queue_name: str
) -> Iterator[Callable[[str], RunningWorker]]:
    started: list[RunningWorker] = []

    def start(vllm_url: str) -> RunningWorker:
        config = WorkerConfig(
            gpu=0,
            vllm_url=vllm_url,
            worker_id=f"w-{queue_name}",
            queue_name=queue_name,
            lease_seconds=rollout_policy.queue.lease_seconds,
            grace_seconds=5.0,
            heartbeat_seconds=0.5,
            resize_seconds=0.2,
            block_seconds=0.2,
        )
        worker = Worker(config, redis_client, rollout_policy, gpu_provider=make_provider("sim", vllm_url))
        worker.rollout.refresh_seconds = 0.0  # see every step at once; production waits REFRESH_SECONDS
        running = RunningWorker(worker)
        started.append(running)
        running.thread.start()
        return running

    yield start
    for running in started:
        running.stop()


def start_rollout(redis_client: Redis, queue_name: str, url: str, **fields: Any) -> RolloutState:
    settings: dict[str, Any] = {"interval_seconds": 0.2, "shadow_fraction": 0.0, "version": "2026.12"}
    settings.update(fields)
    return RolloutStore(redis_client, QueueKeys(queue_name)).start(
        candidate_url=url, actor="test", **settings
    )


def submit_for(queue: TicketQueue, branches: list[str], per_branch: int = 1) -> dict[str, str]:
    """Submit short complaints; ticket id -> branch."""
    producer = producer_for(queue)
    out: dict[str, str] = {}
    for branch in branches:
        for n in range(per_branch):
            body = {
                "type": "complaint",
                "branch_id": branch,
                "prompt": f"{branch} asks {n} " * 8,
                "max_tokens": 8,
            }
            out[producer.submit(body).ticket_id] = branch
    return out


def served_by(queue: TicketQueue, ids: dict[str, str]) -> dict[str, str]:
    """Ticket id -> the model that answered it, once all are done."""
    tickets = wait_all_ended(queue, list(ids), 60, "every ticket to end")
    assert [t.status.value for t in tickets] == ["done"] * len(tickets), [t.error for t in tickets]
    return {t.id: str((t.usage or {}).get("model")) for t in tickets}


def shadow_metric(outcome: str) -> float:
    """This process's `tidegate_rollout_shadow_total` for `outcome` (the workers here run in-process)."""
    return REGISTRY.get_sample_value("tidegate_rollout_shadow_total", {"outcome": outcome}) or 0.0


def publish_level(redis_client: Redis, keys: QueueKeys, level: str) -> None:
    """Publish `level` as fresh for the rest of the test."""
    redis_client.hset(
        keys.alarm, mapping={"level": level, "since": clock.now(), "updated_at": clock.now() + 600}
    )


def rollout_steps(redis_client: Redis, queue_name: str) -> list[dict[str, str]]:
    events = read_events(redis_client, QueueKeys(queue_name), 200)
    return [e for e in reversed(events) if e.get("kind") == "rollout"]


def test_a_healthy_candidate_advances_wave_by_wave_and_branch_3_joins_at_wave_3(
    simulator: Callable[..., SimulatorProcess],
    worker_on: Callable[[str], RunningWorker],
    controller: RolloutController,
    redis_client: Redis,
    rollout_policy: Policy,
    queue_name: str,
) -> None:
    primary = simulator(model=PRIMARY_MODEL)
    candidate = simulator(model=CANDIDATE_MODEL)
    queue = TicketQueue(redis_client, rollout_policy, queue_name)
    worker_on(primary.base_url)
    state = start_rollout(redis_client, queue_name, candidate.base_url)
    branches = [f"b{d}" for d in range(10)]
    for wave in range(10):
        ids = submit_for(queue, branches, per_branch=3)
        models = served_by(queue, ids)
        for ticket_id, branch in ids.items():
            expected = CANDIDATE_MODEL if int(branch[-1]) <= wave else PRIMARY_MODEL
            assert models[ticket_id] == expected, f"wave {wave}: {branch} was served by {models[ticket_id]}"
        state = controller.tick(max(clock.now(), state.wave_due_at())) or state  # at the wave's end
        assert state.wave == wave + 1 or state.status is RolloutStatus.COMPLETE, f"wave {wave} did not pass"
    assert state.status is RolloutStatus.COMPLETE
    steps = [e["step"] for e in rollout_steps(redis_client, queue_name)]
    assert steps == ["start"] + ["advance"] * 10
    ids = submit_for(queue, ["b3", "hq"])
    assert set(served_by(queue, ids).values()) == {CANDIDATE_MODEL}, "a complete rollout serves everyone"


@pytest.mark.parametrize("fault", ["errors", "refused"])
def test_a_failing_candidate_is_rolled_back_in_its_first_wave_and_no_ticket_is_lost(
    fault: str,
    simulator: Callable[..., SimulatorProcess],
    worker_on: Callable[[str], RunningWorker],
    controller: RolloutController,
    redis_client: Redis,
    rollout_policy: Policy,
    queue_name: str,
) -> None:
    primary = simulator(model=PRIMARY_MODEL)
    with contextlib.ExitStack() as stack:
        if fault == "errors":  # half its calls answer 500, the others are answered
            url = stack.enter_context(FaultProxy(simulator(model=CANDIDATE_MODEL).base_url, 0.5)).url
        else:  # nothing listens: every call is refused
            url = f"http://127.0.0.1:{free_port()}"
        queue = TicketQueue(redis_client, rollout_policy, queue_name)
        worker_on(primary.base_url)
        state = start_rollout(redis_client, queue_name, url, interval_seconds=0.5)
        ids = submit_for(queue, ["b0"], per_branch=12) | submit_for(queue, [f"b{d}" for d in range(1, 10)], 2)
        keys = QueueKeys(queue_name)
        wait_until(
            lambda: (
                int(cast("str", redis_client.hget(keys.rollout_arms(state.id), "0:candidate:error") or 0))
                >= 3
            ),
            30,
            "the candidate to fail some of the wave's calls",
        )
        rolled = wait_until(
            lambda: controller.tick(max(clock.now(), state.wave_due_at())),
            10,
            "the monitor to judge the wave",
        )
        assert rolled.status is RolloutStatus.ROLLED_BACK and rolled.wave == 0
        assert "error rate" in rolled.reason
        models = served_by(queue, ids)
        later = submit_for(queue, ["b0", "b5"], per_branch=3)
        assert set(served_by(queue, later).values()) == {PRIMARY_MODEL}, "after the rollback: the primary"
    attempts = {t.attempts for t in queue.get_many(list(ids)) if t is not None}
    assert attempts == {1}, "a candidate's failure is answered by the primary in the same attempt"
    on_candidate = {ids[i] for i, model in models.items() if model == CANDIDATE_MODEL}
    assert on_candidate <= {"b0"}, "only wave 0's branch ever reached the candidate"
    assert set(models.values()) <= {PRIMARY_MODEL, CANDIDATE_MODEL}
    stats = queue.stats()
    submitted = len(ids) + len(later)
    assert (
        stats.outcome_count("complaint", "submitted") == submitted == stats.outcome_count("complaint", "done")
    )
    (rollback,) = [e for e in rollout_steps(redis_client, queue_name) if e["step"] == "rollback"]
    assert rollback["actor"] == "monitor" and float(rollback["candidate_error_rate"]) > 0.05
    assert controller.actions_queue.count == 1, "the notify job is queued with the rollback"


def test_a_candidate_answering_most_calls_with_503_is_rolled_back_within_three_intervals(
    simulator: Callable[..., SimulatorProcess],
    worker_on: Callable[[str], RunningWorker],
    controller: RolloutController,
    redis_client: Redis,
    rollout_policy: Policy,
    queue_name: str,
) -> None:
    """Its breaker opens and keeps canary tickets off it; those count against it, so the judge,
    needing the policy's default samples, still sees a failing candidate (it once held at wave 0)."""
    judged = rollout_policy.rollout.model_copy(update={"min_samples": RolloutPolicy().min_samples})
    controller.policy = rollout_policy.model_copy(update={"rollout": judged})
    primary = simulator(model=PRIMARY_MODEL)
    candidate = simulator(model=CANDIDATE_MODEL, error_rate=0.6, error_status=503)
    queue = TicketQueue(redis_client, rollout_policy, queue_name)
    worker_on(primary.base_url)
    interval = 2.0
    state = start_rollout(redis_client, queue_name, candidate.base_url, interval_seconds=interval)
    ids = submit_for(queue, ["b0"], per_branch=40) | submit_for(queue, [f"b{d}" for d in range(1, 10)], 2)
    rolled = wait_until(
        lambda: controller.tick(clock.now()),
        state.started_at + 3 * interval - clock.now(),
        "the monitor to roll the candidate back by itself within three wave intervals",
    )
    assert (rolled.ended_at or clock.now()) - state.started_at <= 3 * interval
    assert rolled.status is RolloutStatus.ROLLED_BACK and rolled.wave == 0
    assert "error rate" in rolled.reason
    (rollback,) = [e for e in rollout_steps(redis_client, queue_name) if e["step"] == "rollback"]
    assert rollback["actor"] == "monitor"
    arms = (rollout_summary(redis_client, QueueKeys(queue_name)) or {})["arms"]
    candidate_arm = arms["candidate"]  # as `tidegate rollout status --json` shows it
    assert candidate_arm["error"] > 0 and candidate_arm["error_rate"] > judged.error_rate_margin, (
        candidate_arm
    )
    assert candidate_arm["calls"] >= judged.min_samples
    models = served_by(queue, ids)
    assert set(models.values()) <= {PRIMARY_MODEL, CANDIDATE_MODEL}
    stats = queue.stats()
    assert (
        stats.outcome_count("complaint", "submitted") == len(ids) == stats.outcome_count("complaint", "done")
    )


@pytest.mark.parametrize(
    ("step", "branch", "started_on", "then_on"),
    [
        ("advance", "b1", PRIMARY_MODEL, CANDIDATE_MODEL),  # b1 joins the candidate at wave 1
        ("rollback", "b0", CANDIDATE_MODEL, PRIMARY_MODEL),  # b0 leaves it with everyone
    ],
)
def test_a_ticket_running_when_the_rollout_moves_finishes_where_it_started_once(
    step: str,
    branch: str,
    started_on: str,
    then_on: str,
    simulator: Callable[..., SimulatorProcess],
    worker_on: Callable[[str], RunningWorker],
    redis_client: Redis,
    rollout_policy: Policy,
    queue_name: str,
) -> None:
    slow: dict[str, Any] = {"time_scale": 2, "stop_median_tokens": 5000}  # runs its whole max_tokens
    fast: dict[str, Any] = {}
    primary = simulator(model=PRIMARY_MODEL, **(slow if started_on == PRIMARY_MODEL else fast))
    candidate = simulator(model=CANDIDATE_MODEL, **(slow if started_on == CANDIDATE_MODEL else fast))
    queue = TicketQueue(redis_client, rollout_policy, queue_name)
    worker_on(primary.base_url)
    state = start_rollout(redis_client, queue_name, candidate.base_url)
    body = {"type": "archive_query", "branch_id": branch, "prompt": "long history " * 8, "max_tokens": 200}
    long_id = producer_for(queue).submit(body).ticket_id
    slow_sim = primary if started_on == PRIMARY_MODEL else candidate
    wait_until(
        lambda: sim_metric(slow_sim.base_url, "vllm:num_requests_running") == 1, 20, "the long answer to run"
    )
    store = RolloutStore(redis_client, QueueKeys(queue_name))
    moved = store.advance(state.wave, "test") if step == "advance" else store.rollback("test", "drill")
    assert (queue.get(long_id) or moved).status.value == "running", "the step came mid-answer"
    after = submit_for(queue, [branch], per_branch=3)
    assert set(served_by(queue, after).values()) == {then_on}, f"after the {step}, new tickets move"
    (finished,) = wait_all_ended(queue, [long_id], 60, "the long ticket to end")
    assert finished.status.value == "done" and finished.attempts == 1, "answered once, not retried"
    assert (finished.usage or {}).get("model") == started_on, "it finished where it started"
    stats = queue.stats()
    assert (
        stats.outcome_count("archive_query", "done") == 1 == stats.outcome_count("archive_query", "submitted")
    )


def test_shadow_traffic_reaches_the_candidate_at_its_fraction_stops_at_orange_and_is_never_an_answer(
    simulator: Callable[..., SimulatorProcess],
    worker_on: Callable[[str], RunningWorker],
    redis_client: Redis,
    rollout_policy: Policy,
    queue_name: str,
) -> None:
    primary = simulator(model=PRIMARY_MODEL)
    candidate = simulator(model=CANDIDATE_MODEL)
    queue = TicketQueue(redis_client, rollout_policy, queue_name)
    running = worker_on(primary.base_url)
    keys = QueueKeys(queue_name)
    # As a monitor would publish it: without one the level follows depth, and a burst reads as orange.
    publish_level(redis_client, keys, "green")
    fraction = 0.3
    state = start_rollout(
        redis_client, queue_name, candidate.base_url, shadow_fraction=fraction, interval_seconds=3600
    )
    count = 120
    models: dict[str, str] = {}
    for _ in range(count // 40):  # in batches, under the complaint cap of 70 queued
        batch = submit_for(queue, ["b5"], per_branch=40)  # digit 5: not in wave 0, so on the primary
        models.update(served_by(queue, batch))
    assert set(models.values()) == {PRIMARY_MODEL}, "no branch receives a shadow answer"

    def settled() -> int:
        shadow = running.worker.rollout.shadow
        return len(read_shadow(redis_client, keys, state.id)) if shadow._busy == 0 else 0

    wait_until(settled, 20, "the shadow calls to finish")
    records = read_shadow(redis_client, keys, state.id)
    margin = 4 * math.sqrt(count * fraction * (1 - fraction))
    assert abs(len(records) - count * fraction) <= margin, f"{len(records)} shadows of {count} at {fraction}"
    assert running.worker.rollout.shadow.skipped == {"level": 0, "breaker": 0, "busy": 0}
    assert sim_metric(candidate.base_url, "vllm:request_success_total") == len(records)
    assert {r["candidate"]["model"] for r in records} == {CANDIDATE_MODEL}
    assert all(0.0 <= r["similarity"] <= 1.0 and r["primary"]["ttft_seconds"] is not None for r in records)
    for record in records:
        assert models[record["ticket"]] == PRIMARY_MODEL

    publish_level(redis_client, keys, "orange")
    skipped_before = shadow_metric("skipped_level")
    more = submit_for(queue, ["b5"], per_branch=40)
    assert set(served_by(queue, more).values()) == {PRIMARY_MODEL}
    # Each offer is refused before its ticket's result is written, so none can start after this.
    wait_until(lambda: running.worker.rollout.shadow._busy == 0, 10, "shadow calls started before to end")
    assert len(read_shadow(redis_client, keys, state.id)) == len(records), "no shadow call at orange"
    assert running.worker.rollout.shadow.skipped["level"] > 0
    assert shadow_metric("skipped_level") - skipped_before == running.worker.rollout.shadow.skipped["level"]


def test_the_candidate_arm_streams_and_a_failing_candidate_is_not_shadowed(
    simulator: Callable[..., SimulatorProcess], redis_client: Redis, rollout_policy: Policy, queue_name: str
) -> None:
    primary = VllmClient(simulator(model=PRIMARY_MODEL).base_url)
    candidate_url = simulator(model=CANDIDATE_MODEL).base_url
    keys = QueueKeys(queue_name)
    state = start_rollout(redis_client, queue_name, candidate_url, shadow_fraction=1.0, interval_seconds=3600)
    router = RolloutRouter(redis_client, keys, rollout_policy, pool_size=4, refresh_seconds=0.0)
    queue = TicketQueue(redis_client, rollout_policy, queue_name)

    def ticket(branch: str) -> Ticket:
        body = {"type": "complaint", "branch_id": branch, "prompt": "a question " * 8, "max_tokens": 8}
        return queue.build_ticket(TicketRequest.model_validate(body, context={"policy": rollout_policy}))

    arm = router.client_for(ticket("b0"), primary, primary)
    pieces: list[str] = []
    answer = arm.run(ticket("b0"), max_tokens=8, handle=RequestHandle(), on_text=pieces.append)
    assert answer.model == CANDIDATE_MODEL and "".join(pieces) == answer.text, "streamed text passes through"
    assert redis_client.hget(keys.rollout_arms(state.id), "0:candidate:ok") == "1"

    assert router.shadow.offer(state, ticket("b5"), answer, 8)
    wait_until(lambda: read_shadow(redis_client, keys, state.id), 10, "the shadow answer to be recorded")
    router.close()

    # The candidate's breaker is its one health state: open, it keeps shadow calls off it too.
    store = BreakerStore(redis_client, keys, rollout_policy.breaker)
    gate = BreakerGate(store, rollout_policy, primary, [])
    router = RolloutRouter(
        redis_client, keys, rollout_policy, pool_size=4, refresh_seconds=0.0, breakers=gate
    )
    for _ in range(rollout_policy.breaker.min_requests):
        store.record(endpoint_id(candidate_url), False)
    assert not router.shadow.offer(state, ticket("b5"), answer, 8), "no shadow while the candidate fails"
    assert router.shadow.skipped["breaker"] == 1
    router.close()
    primary.close()


def test_a_candidate_failing_mid_answer_is_not_answered_again_by_the_primary(
    simulator: Callable[..., SimulatorProcess], redis_client: Redis, rollout_policy: Policy, queue_name: str
) -> None:
    primary = VllmClient(simulator(model=PRIMARY_MODEL).base_url)
    candidate_sim = simulator(model=CANDIDATE_MODEL, stop_median_tokens=5000)
    keys = QueueKeys(queue_name)
    queue = TicketQueue(redis_client, rollout_policy, queue_name)
    body = {"type": "complaint", "branch_id": "b0", "prompt": "a question " * 8, "max_tokens": 16}
    ticket = queue.build_ticket(TicketRequest.model_validate(body, context={"policy": rollout_policy}))
    with FaultProxy(candidate_sim.base_url, 0.0, cut_after_events=3) as cutting:
        state = start_rollout(redis_client, queue_name, cutting.url)
        router = RolloutRouter(redis_client, keys, rollout_policy, pool_size=4, refresh_seconds=0.0)
        pieces: list[str] = []
        with pytest.raises(VllmError, match="without \\[DONE\\]"):
            router.client_for(ticket, primary, primary).run(
                ticket, max_tokens=16, handle=RequestHandle(), on_text=pieces.append
            )
        router.close()
    assert pieces, "the candidate had sent text before it broke off"
    assert len(pieces) < 16, "and the primary did not go on to answer it a second time"
    arms = redis_client.hgetall(keys.rollout_arms(state.id))
    assert arms == {"0:candidate:error": "1"}, "one candidate error, no primary call"
    primary.close()
