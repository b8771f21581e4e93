"""Priority and cancellation hold on the OpenAI path: a streamed urgent loan overtakes queued archive
queries, and a caller that goes away gets its ticket cancelled and its vLLM request aborted."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai
import pytest

from ops.lab.sim.process import SimulatorProcess
from shared.models import TicketStatus
from tests.producer.api.openai.conftest import Gateway, RunningWorker
from tests.waiting import wait_until
from tests.worker.conftest import sim_metric
from tests.worker.support import producer_for, submit, ticket, wait_inflight

LOAN_MESSAGES = [{"role": "user", "content": "Approve the mortgage of customer 4411?"}]


def test_streamed_urgent_loan_gets_its_first_token_before_queued_archives(
    gateway: Gateway,
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
) -> None:
    sim = simulator(time_scale=1, decode_step_s=0.005, max_num_seqs=1)  # one sequence of capacity
    producer = producer_for(gateway.queue)
    archives = submit(producer, [ticket("archive_query", max_tokens=150, ttl_seconds=60) for _ in range(4)])
    # Queue order alone: with preemption the running archive would go back too (tests/worker).
    start_worker(sim.base_url, gpu_backend=None, max_batch=1, critical_headroom=0, preemption=False)
    wait_inflight(gateway.queue, 1, 10, "the worker to take the first archive query")
    client = gateway.client(gateway.key(default_type="archive_query"))
    stream = client.chat.completions.create(
        model="tidegate",
        messages=LOAN_MESSAGES,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
        extra_headers={"X-Tidegate-Type": "loan_approval", "X-Tidegate-Urgent-Level": "3"},
    )
    with stream:
        first = next(c for c in stream if c.choices and c.choices[0].delta.content)
        first_token_at = time.time()
        rest = [c for c in stream if c.choices]
    assert first.choices[0].delta.content and rest[-1].choices[0].finish_reason
    stored = [t for t in gateway.queue.get_many(archives) if t is not None]
    started_before = [t.id for t in stored if t.started_at is not None and t.started_at < first_token_at]
    assert len(started_before) == 1, (
        "only the archive already running may start before the loan's first token"
    )
    assert len(stored) == 4 and sum(t.status is TicketStatus.QUEUED for t in stored) >= 2
    for archive in archives:
        producer.cancel(archive)


def test_closing_a_stream_mid_answer_cancels_the_ticket_and_aborts_the_request(
    gateway: Gateway,
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
) -> None:
    sim = simulator(time_scale=1, decode_step_s=0.05)  # the whole answer would take many seconds
    start_worker(sim.base_url, gpu_backend=None)
    client = gateway.client(gateway.key(default_type="complaint"))
    with client.chat.completions.with_streaming_response.create(
        model="tidegate",
        messages=LOAN_MESSAGES,
        max_tokens=2000,
        stream=True,  # type: ignore[arg-type]
    ) as raw:
        ticket_id = raw.headers["x-tidegate-ticket-id"]
        pieces = raw.iter_lines()
        got = [line for _, line in zip(range(6), pieces, strict=False)]
        assert any(line.startswith("data: {") for line in got)
        closed_at = time.monotonic()
    wait_until(
        lambda: sim_metric(sim.base_url, "tidegate_sim_aborted_requests_total") == 1,
        5,
        "the simulator to count the request aborted",
        interval=0.05,
    )
    close_to_abort = time.monotonic() - closed_at
    ended = gateway.queue.get(ticket_id)
    assert ended is not None and ended.status is TicketStatus.CANCELLED
    assert sim_metric(sim.base_url, "vllm:num_requests_running") == 0
    assert close_to_abort < 3.0, f"abort took {close_to_abort:.2f} s after the close"
    print(f"close to abort: {close_to_abort * 1000:.0f} ms")


def test_a_non_streamed_call_that_times_out_while_queued_is_cancelled(gateway: Gateway) -> None:
    client = gateway.client(gateway.key(default_type="complaint"), timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="tidegate", messages=LOAN_MESSAGES, max_tokens=8)  # type: ignore[arg-type]
    counts = wait_until(
        lambda: (c := gateway.queue.stats().counts).get("complaint:cancelled") == 1 and c,
        5,
        "the queued ticket to be cancelled",
    )
    assert counts.get("complaint:submitted") == 1
    assert gateway.queue.stats().depth == 0, "the cancelled ticket is still queued"


def test_a_request_vllm_refuses_answers_its_error_streamed_or_not(
    gateway: Gateway,
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
) -> None:
    sim = simulator(max_model_len=256)  # max_tokens 1000 cannot fit: vLLM answers 400
    start_worker(sim.base_url, gpu_backend=None)
    client = gateway.client(gateway.key(default_type="complaint"))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tidegate", messages=LOAN_MESSAGES, max_tokens=1000)  # type: ignore[arg-type]
    assert refused.value.code == "ticket_failed" and "256" in refused.value.message
    with pytest.raises(openai.APIError) as broken:
        list(client.completions.create(model="tidegate", prompt="hello", max_tokens=1000, stream=True))
    assert "vLLM rejected the request (400)" in broken.value.message
    counts = gateway.queue.stats().counts
    assert counts.get("complaint:failed") == 2 and not counts.get("complaint:cancelled")


def test_a_non_streamed_call_closed_while_running_aborts_the_request(
    gateway: Gateway,
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
) -> None:
    sim = simulator(time_scale=1, decode_step_s=0.05)  # the answer would take many seconds
    start_worker(sim.base_url, gpu_backend=None)
    client = gateway.client(gateway.key(default_type="complaint"), timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="tidegate", messages=LOAN_MESSAGES, max_tokens=2000)  # type: ignore[arg-type]
    wait_until(
        lambda: sim_metric(sim.base_url, "tidegate_sim_aborted_requests_total") == 1,
        5,
        "the simulator to count the request aborted",
        interval=0.05,
    )
    counts = gateway.queue.stats().counts
    assert counts.get("complaint:cancelled") == 1 and not counts.get("complaint:done")
