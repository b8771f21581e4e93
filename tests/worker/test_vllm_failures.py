"""A failing vLLM: crash mode, a stopped server, refusals, cancels and expiry while running."""

from __future__ import annotations

import threading
from collections.abc import Callable

import requests
from prometheus_client import REGISTRY
from redis import Redis

from ops.lab.sim.process import SimulatorProcess
from shared.models import TicketStatus
from shared.queue import TicketQueue
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker, sim_metric
from tests.worker.support import producer_for, submit_many, wait_all_ended, wait_metric


def test_crash_mode_tickets_return_and_finish_once_vllm_is_back(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    ids = submit_many(producer_for(fast_queue, max_attempts=10), 8, max_tokens=300)
    sim = simulator(time_scale=2, kv_blocks=96, max_model_len=1536, oom_mode="crash", oom_recovery_s=2)
    start_worker(sim.base_url, max_batch=4, gpu_backend=None)
    wait_until(lambda: fast_queue.stats().inflight >= 2, 10, "the worker to start tickets")

    def exhaust_kv() -> None:
        body = {
            "prompt": "x " * 500,
            "max_tokens": 1000,
            "ignore_eos": True,
            "model": "togethercomputer/LLaMA-2-7B-32K",
        }
        requests.post(f"{sim.base_url}/v1/completions", json=body, timeout=60)

    loaders = [threading.Thread(target=exhaust_kv) for _ in range(2)]
    for loader in loaders:
        loader.start()
    wait_until(
        lambda: sim_metric(sim.base_url, "tidegate_sim_oom_crashes_total") >= 1, 10, "the simulated OOM crash"
    )
    for loader in loaders:
        loader.join(30)
    tickets = wait_all_ended(fast_queue, ids, 60, "every ticket to end")
    assert {t.status for t in tickets} == {TicketStatus.DONE}
    retried = [t for t in tickets if t.attempts > 1]
    assert retried, "the crash should have sent running tickets back to the queue"
    assert fast_queue.stats().inflight == 0


def test_stopped_vllm_tickets_finish_once_it_is_back(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
    redis_client: Redis,
) -> None:
    sim = simulator()
    port = sim.port
    sim.stop()
    ids = submit_many(producer_for(fast_queue, max_attempts=50), 5)
    start_worker(f"http://127.0.0.1:{port}", gpu_backend=None, model="togethercomputer/LLaMA-2-7B-32K")
    wait_until(
        lambda: any(
            "connection" in str(redis_client.hget(fast_queue.keys.ticket(i), "last_error")) for i in ids
        ),
        10,
        "a refused connection recorded on a ticket",
    )
    simulator(port=port)
    tickets = wait_all_ended(fast_queue, ids, 30, "every ticket to end")
    assert {t.status for t in tickets} == {TicketStatus.DONE}


def test_a_dead_endpoint_spends_at_most_one_attempt_and_tickets_expire(
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    """An outage is not the tickets' fault: after the first failures the shared breaker holds vLLM
    failing, so its probes' failures spend no attempt, and tickets end `expired`, not `failed`."""
    ids = submit_many(producer_for(fast_queue), 3, ttl_seconds=3)
    running = start_worker("http://127.0.0.1:1", gpu_backend=None, model="m")
    tickets = wait_all_ended(fast_queue, ids, 30, "every ticket to end")
    assert {t.status for t in tickets} == {TicketStatus.EXPIRED}
    # Only requests sent while vLLM still looked healthy (the first batch) spent one.
    assert max(t.attempts for t in tickets) <= 1, [t.attempts for t in tickets]
    assert fast_queue.stats().inflight == 0
    calls = REGISTRY.get_sample_value(
        "tidegate_vllm_errors_total", {"worker": running.worker.config.worker_id, "kind": "connection"}
    )
    assert calls is not None and calls >= 2  # it kept probing, paced by its backoff
    breakers = running.worker.breakers
    assert breakers.store.read(breakers.primary_endpoint).failures >= 1


def test_a_4xx_fails_the_ticket_with_vllms_message(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    sim = simulator(max_model_len=256)
    ids = submit_many(producer_for(fast_queue), 1, max_tokens=1000)
    start_worker(sim.base_url, gpu_backend=None)
    (ticket,) = wait_all_ended(fast_queue, ids, 10, "the ticket to end")
    assert ticket.status is TicketStatus.FAILED and ticket.attempts == 1
    assert (
        ticket.error is not None
        and "vLLM rejected the request (400)" in ticket.error
        and "256" in ticket.error
    )


def test_cancel_of_a_running_ticket_aborts_its_request(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    sim = simulator(time_scale=1, decode_step_s=0.05)  # an answer takes seconds
    producer = producer_for(fast_queue)
    (ticket_id,) = submit_many(producer, 1, max_tokens=4000, ttl_seconds=60, type="archive_query")
    start_worker(sim.base_url, gpu_backend=None)
    wait_metric(sim.base_url, "vllm:num_requests_running", 1, 10, "the request in vLLM")
    assert producer.cancel(ticket_id) == "running"
    wait_metric(
        sim.base_url, "tidegate_sim_aborted_requests_total", 1, 5, "the simulator to see the request aborted"
    )
    assert sim_metric(sim.base_url, "vllm:num_requests_running") == 0
    ticket = fast_queue.get(ticket_id)
    assert ticket is not None and ticket.status is TicketStatus.CANCELLED and ticket.result is None


def test_a_ticket_expiring_while_running_is_aborted_and_ends_expired(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    sim = simulator(time_scale=1, decode_step_s=0.05)  # longer than the 1.5 s TTL
    (ticket_id,) = submit_many(producer_for(fast_queue), 1, max_tokens=4000, ttl_seconds=1.5)
    start_worker(sim.base_url, gpu_backend=None)
    (ticket,) = wait_all_ended(fast_queue, [ticket_id], 10, "the ticket to end")
    assert ticket.status is TicketStatus.EXPIRED
    wait_metric(sim.base_url, "tidegate_sim_aborted_requests_total", 1, 5, "vLLM to have freed the request")
