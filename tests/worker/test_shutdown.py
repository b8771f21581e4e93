"""Worker processes stopped politely (SIGTERM) and brutally (SIGKILL): nothing is lost or doubled."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from typing import cast

from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.models import TicketStatus
from shared.queue import TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import sim_metric
from tests.worker.support import (
    assert_rescued_exactly_once,
    leased_by,
    producer_for,
    submit_many,
    submit_numbered,
    wait_metric,
    worker_process_flags,
)

NO_HEADROOM = ("--critical-headroom", "0")
"""These tests fill the whole batch with complaints, so no slot is kept for loans."""
WORKER_FLAGS = worker_process_flags("--gpu-backend", "sim")


def test_kill_9_mid_batch_loses_nothing_and_doubles_nothing(
    simulator: Callable[..., SimulatorProcess],
    spawn_worker: Callable[..., subprocess.Popen[bytes]],
    redis_client: Redis,
    fast_queue: TicketQueue,
) -> None:
    # 20 ms decode steps: an answer takes seconds, so the kill lands while all four are generating.
    sim = simulator(time_scale=1, decode_step_s=0.02)
    ids = submit_numbered(producer_for(fast_queue), 8, 30, max_tokens=150, ttl_seconds=120)
    victim = spawn_worker(
        "--vllm-url", sim.base_url, "--worker-id", "victim", "--max-batch", "4", *NO_HEADROOM, *WORKER_FLAGS
    )
    wait_metric(sim.base_url, "vllm:num_requests_running", 4, 20, "the victim's batch of 4 in vLLM")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    lost = leased_by(redis_client, fast_queue, "victim")  # frozen now: nobody renews or releases them
    assert len(lost) == 4
    rescuer = spawn_worker("--vllm-url", sim.base_url, "--worker-id", "rescuer", "--burst", *WORKER_FLAGS)
    assert rescuer.wait(60) == 0
    assert_rescued_exactly_once(fast_queue, ids, lost, "rescuer")
    # The dead worker's requests were dropped by vLLM when its connections closed.
    assert sim_metric(sim.base_url, "tidegate_sim_aborted_requests_total") == len(lost)
    # The victim never deregistered; its heartbeat simply lapses.
    assert redis_client.exists(fast_queue.keys.worker("rescuer")) == 0


def test_sigterm_returns_unstarted_tickets_at_once_and_finishes_running_ones(
    simulator: Callable[..., SimulatorProcess],
    spawn_worker: Callable[..., subprocess.Popen[bytes]],
    redis_client: Redis,
    fast_queue: TicketQueue,
) -> None:
    # vLLM runs two sequences at a time; the worker sends six, so four wait inside vLLM unstarted.
    # Slow decoding (10 ms a step) keeps the two running ones going for a second or more. Each
    # ticket's tokens go to its live stream, where the test sees which ones the worker has begun.
    sim = simulator(time_scale=1, max_num_seqs=2, decode_step_s=0.01)
    ids = submit_many(producer_for(fast_queue), 6, max_tokens=600, ttl_seconds=120, live="tokens")
    worker = spawn_worker(
        "--vllm-url",
        sim.base_url,
        "--worker-id",
        "polite",
        "--max-batch",
        "6",
        *NO_HEADROOM,
        "--grace-seconds",
        "20",
        *WORKER_FLAGS,
    )
    wait_until(
        lambda: (
            len(leased_by(redis_client, fast_queue, "polite")) == 6
            and sim_metric(sim.base_url, "vllm:num_requests_running") == 2
            and sum(cast("int", redis_client.xlen(fast_queue.keys.live(i))) > 0 for i in ids) == 2
        ),
        20,
        "six leased, two generating, and the worker holding the first tokens of those two",
    )
    worker.send_signal(signal.SIGTERM)
    wait_until(
        lambda: fast_queue.stats().pending == 4, 2, "the four unstarted tickets back in the queue at once"
    )
    back = fast_queue.get_many(cast("list[str]", redis_client.zrange(fast_queue.keys.pending, 0, -1)))
    assert all(t is not None and t.status is TicketStatus.QUEUED and t.attempts == 0 for t in back)
    assert worker.wait(30) == 0
    tickets = fast_queue.get_many(ids)
    statuses = sorted(t.status.value for t in tickets if t is not None)
    assert statuses == ["done", "done", "queued", "queued", "queued", "queued"]
    assert fast_queue.stats().inflight == 0
    assert redis_client.zscore(fast_queue.keys.workers, "polite") is None, "the worker left the registry"
