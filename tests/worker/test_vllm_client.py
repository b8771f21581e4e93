"""The vLLM client against the simulator over HTTP: requests, usage, errors, abort."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ops.lab.sim.process import SimulatorProcess
from shared import clock
from shared.models import ChatMessage, Ticket, TicketStatus
from tests.waiting import wait_until
from tests.worker.conftest import sim_metric
from worker.vllm_client import ErrorKind, RequestAborted, RequestHandle, VllmClient, VllmError


def make_ticket(
    *,
    prompt: str | None = "Summarise the loan file of branch 0412 for the credit committee.",
    messages: list[ChatMessage] | None = None,
    max_tokens: int = 32,
    priority: float = -0.3,
    ttl: float = 30.0,
) -> Ticket:
    now = clock.now()
    return Ticket(
        id=f"t{threading.get_ident()}x{now:.6f}".replace(".", ""),
        type="loan_approval",
        branch_id="b1",
        status=TicketStatus.RUNNING,
        priority=priority,
        prompt=None if messages else prompt,
        messages=messages,
        max_tokens=max_tokens,
        ttl_seconds=ttl,
        prompt_tokens_estimate=16,
        created_at=now,
        expires_at=now + ttl,
    )


def test_completion_streams_usage_ttft_and_names_the_ticket(
    simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = simulator()
    client = VllmClient(sim.base_url)
    ticket = make_ticket(max_tokens=24)
    handle = RequestHandle()
    completion = client.run(ticket, max_tokens=24, handle=handle)
    assert completion.prompt_tokens > 0
    assert 1 <= completion.completion_tokens <= 24
    assert completion.text.strip()
    assert completion.ttft_seconds is not None and completion.ttft_seconds <= completion.total_seconds
    assert handle.first_token_at == completion.first_token_at
    assert completion.model == client.model
    usage = completion.usage()
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # The ticket id is vLLM's request id: the simulator's log names it.
    wait_until(lambda: f"cmpl-{ticket.id}" in sim.log_text(), 5, "the request id in the simulator log")
    client.close()


def test_chat_ticket(simulator: Callable[..., SimulatorProcess]) -> None:
    sim = simulator()
    client = VllmClient(sim.base_url)
    ticket = make_ticket(
        messages=[ChatMessage(role="user", content="Why was my card declined?")], max_tokens=16
    )
    completion = client.run(ticket, max_tokens=16, handle=RequestHandle())
    assert completion.completion_tokens >= 1 and completion.text
    wait_until(lambda: f"chatcmpl-{ticket.id}" in sim.log_text(), 5, "the chat request id in the log")


def test_4xx_is_permanent_with_vllms_message(simulator: Callable[..., SimulatorProcess]) -> None:
    sim = simulator(max_model_len=256)
    client = VllmClient(sim.base_url)
    with pytest.raises(VllmError) as info:
        client.run(make_ticket(max_tokens=1000), max_tokens=1000, handle=RequestHandle())
    assert info.value.kind is ErrorKind.CLIENT and not info.value.transient
    assert info.value.status_code == 400
    assert "256" in info.value.message  # vLLM's message names the context limit


def test_connection_refused_is_transient() -> None:
    client = VllmClient("http://127.0.0.1:1", model="m", connect_timeout=0.5)
    with pytest.raises(VllmError) as info:
        client.run(make_ticket(), max_tokens=8, handle=RequestHandle())
    assert info.value.kind is ErrorKind.CONNECT and info.value.transient


class OldVllmWithoutPriority(BaseHTTPRequestHandler):
    """vLLM before 0.10 refused a non-zero `priority` unless started with priority scheduling."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)  # type: ignore[attr-defined]
        if body.get("priority"):
            payload = json.dumps(
                {
                    "object": "error",
                    "message": f"Got priority {body['priority']} but Priority scheduling is not enabled.",
                    "type": "BadRequestError",
                    "code": 400,
                }
            ).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        chunks = [
            {"model": "old", "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]},
            {"model": "old", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
        ]
        stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        data = stream.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_priority_is_dropped_for_a_vllm_that_refuses_it() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OldVllmWithoutPriority)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = VllmClient(f"http://127.0.0.1:{server.server_port}", model="old")
        completion = client.run(make_ticket(priority=-0.3), max_tokens=8, handle=RequestHandle())
        assert (completion.text, completion.prompt_tokens, completion.completion_tokens) == ("ok", 3, 1)
        client.run(make_ticket(priority=2.0), max_tokens=8, handle=RequestHandle())
        sent = [b.get("priority") for b in server.bodies]  # type: ignore[attr-defined]
        assert sent == [-30, None, None], "one refusal, then no priority is sent again"
    finally:
        server.shutdown()
        server.server_close()


def test_priority_is_accepted_under_fcfs_by_current_vllm(simulator: Callable[..., SimulatorProcess]) -> None:
    sim = simulator(scheduling_policy="fcfs")
    client = VllmClient(sim.base_url)
    assert client.run(make_ticket(priority=-0.3), max_tokens=8, handle=RequestHandle()).completion_tokens >= 1
    assert "priority" in client.build_request(make_ticket(), 8)[1]


def test_priority_and_request_id_in_the_body(simulator: Callable[..., SimulatorProcess]) -> None:
    sim = simulator()
    client = VllmClient(sim.base_url)
    ticket = make_ticket(priority=2.2)
    _, body = client.build_request(ticket, 8)
    assert body["priority"] == 220 and body["request_id"] == ticket.id and body["stream"] is True


def test_abort_closes_the_request_and_vllm_frees_it(simulator: Callable[..., SimulatorProcess]) -> None:
    sim = simulator(time_scale=1)
    client = VllmClient(sim.base_url)
    ticket = make_ticket(max_tokens=4000)
    handle = RequestHandle()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            client.run(ticket, max_tokens=4000, handle=handle)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: handle.first_token_at is not None, 10, "the first token")
    assert sim_metric(sim.base_url, "vllm:num_requests_running") == 1
    assert handle.abort("cancelled")
    thread.join(5)
    assert not thread.is_alive(), "abort did not stop the blocked read"
    assert len(errors) == 1 and isinstance(errors[0], RequestAborted) and errors[0].reason == "cancelled"
    wait_until(
        lambda: sim_metric(sim.base_url, "tidegate_sim_aborted_requests_total") == 1,
        5,
        "the simulator to count the abort",
    )
    assert sim_metric(sim.base_url, "vllm:num_requests_running") == 0
    assert sim_metric(sim.base_url, "vllm:kv_cache_usage_perc") == 0


def test_passed_through_sampling_reaches_vllm_but_never_overrides_tidegates_fields() -> None:
    client = VllmClient("http://127.0.0.1:9", model="m")  # build_request sends nothing
    ticket = make_ticket().model_copy(
        update={"sampling": {"temperature": 0.1, "stop": ["\n"], "max_tokens": 9999, "stream": False}}
    )
    _, body = client.build_request(ticket, 8)
    assert (body["temperature"], body["stop"]) == (0.1, ["\n"])
    assert (body["max_tokens"], body["stream"], body["model"]) == (8, True, "m")


def test_each_piece_of_the_answer_goes_to_on_text_as_it_arrives(
    simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = simulator()
    pieces: list[str] = []
    completion = VllmClient(sim.base_url).run(
        make_ticket(), max_tokens=12, handle=RequestHandle(), on_text=pieces.append
    )
    assert len(pieces) == completion.completion_tokens > 1
    assert "".join(pieces) == completion.text
