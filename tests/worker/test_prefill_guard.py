"""The prefill guard end to end: non-critical prompts still in prefill stay within the bound while
the batch itself fills, and without the guard a burst of long prompts is sent all at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from ops.lab.sim.process import SimulatorProcess
from shared.queue import TicketQueue
from tests.worker.conftest import RunningWorker
from tests.worker.support import producer_for, submit, ticket, wait_all_done

BATCH = 8


def watch(running: RunningWorker, stop: threading.Event, seen: dict[str, int]) -> None:
    """Record the most prompt tokens in prefill and the most tickets in flight at any sample."""
    while not stop.wait(0.005):
        snapshot = running.worker.inflight.snapshot()
        seen["prefill"] = max(
            seen["prefill"], sum(r.ticket.prompt_tokens_estimate for r in snapshot if not r.started)
        )
        seen["inflight"] = max(seen["inflight"], len(snapshot))


@pytest.mark.parametrize("guarded", [True, False])
def test_long_prompts_enter_prefill_a_few_at_a_time_while_the_batch_fills(
    simulator: Callable[..., SimulatorProcess],
    start_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
    guarded: bool,
) -> None:
    producer = producer_for(fast_queue)
    bodies = [
        ticket("archive_query", prompt=f"archive {i} page " * 600, max_tokens=300) for i in range(BATCH)
    ]
    ids = submit(producer, bodies)
    first = fast_queue.get(ids[0])
    assert first is not None
    prompt = first.prompt_tokens_estimate
    guard = int(2.5 * prompt)  # two long prompts in prefill at once, not three
    # Slow prefill and decode at real time: a prompt takes a large part of a second to prefill.
    sim = simulator(
        time_scale=1, prefill_tokens_per_s=4 * prompt, decode_step_s=0.01, stop_median_tokens=10**6
    )
    running = start_worker(
        sim.base_url,
        max_batch=BATCH,
        critical_headroom=0,
        adaptive_limit=False,
        prefill_guard_tokens=guard if guarded else 0,
    )
    seen = {"prefill": 0, "inflight": 0}
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(running, stop, seen), daemon=True)
    watcher.start()
    try:
        wait_all_done(fast_queue, ids, 60)
    finally:
        stop.set()
        watcher.join(5)
    if guarded:
        assert seen["prefill"] <= guard
        assert seen["inflight"] > 2, "decoding tickets do not count: the batch still fills past the guard"
    else:
        assert seen["prefill"] > guard, (
            "unguarded, the burst is sent at once (the bound above means something)"
        )
