"""The open-loop branch clients against a scripted loopback server: whole and streamed answers, shed
codes, retries, books."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ops.lab.bench.figures import Books
from ops.lab.bench.open_loop import OpenLoopPlayer, OpenLoopSettings
from ops.lab.bench.peer_runs import engine_priority
from ops.lab.bench.peers.litellm import litellm_config
from ops.lab.bench.peers.smg import smg_class
from ops.lab.bench.sim_probe import served_model
from ops.lab.bench.submission import DROPPED
from ops.lab.sim.process import SimulatorProcess
from ops.lab.traffic.records import OUTCOMES
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy


class Script(BaseHTTPRequestHandler):
    """Answers by the `x-script` header: ok, shed-then-ok (429 first), busy (SMG's queue timeout), drop
    (the connection closes), dead (an engine's own 503, with a Retry-After longer than the run)."""

    calls: dict[str, int] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        script, key = self.headers["x-script"], self.headers["x-key"]
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            call = self.calls[key]
        if script in STREAM_SCRIPTS:
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
            self._stream(script, call)
            return
        if script == "drop":
            self.connection.close()
            return
        if script == "dead":
            self._send(503, {"error": {"code": "503", "message": "engine dead"}}, {"Retry-After": "60"})
            return
        if script == "busy" or (script == "shed-then-ok" and call == 1):
            status, code = (
                (429, "scheduler_queue_full") if script != "busy" else (503, "scheduler_queue_timeout")
            )
            self._send(status, {"error": {"code": code, "message": "not now"}}, {"Retry-After": "0"})
            return
        self._send(200, {"usage": {"prompt_tokens": 5, "completion_tokens": 7}}, {})

    def _stream(self, script: str, call: int) -> None:
        """A server-sent event stream as vLLM and tidegate's front door send it, or one that breaks."""
        if script == "degraded-then-ok" and call == 1:  # tidegate's degraded answer: shed, text and all
            self._events(
                {"X-Tidegate-Shed": "red_alarm", "Retry-After": "0"}, [_text("busy, sorry")], done=True
            )
            return
        if script == "early-drop-then-ok" and call == 1:
            self._events({}, [], done=False)  # headers, then the connection closes
            return
        texts = [_text(""), _text("Hel"), _text("lo"), _text(" there")]
        if script == "error-event":
            error = {
                "error": {"message": "interrupted", "type": "server_error", "code": "answer_interrupted"}
            }
            self._events({}, [*texts[:2], error], done=True)
        elif script == "cut-after-text":
            self._events({}, texts[:2], done=False)
        else:
            usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
            self._events({}, [*texts, usage], done=True, pause_s=FIRST_TEXT_PAUSE_S)

    def _events(
        self, headers: dict[str, str], events: list[dict[str, Any]], *, done: bool, pause_s: float = 0.0
    ) -> None:
        self.send_response(200)
        for name, value in {"content-type": "text/event-stream", **headers}.items():
            self.send_header(name, value)
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        for number, event in enumerate(events):
            if number == 1 and pause_s:
                time.sleep(pause_s)  # the answer's first text comes this much after the empty chunk
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.flush()
        if done:
            self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"content-type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


STREAM_SCRIPTS = ("stream-ok", "degraded-then-ok", "early-drop-then-ok", "error-event", "cut-after-text")
FIRST_TEXT_PAUSE_S = 0.2


def _text(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}], "usage": None}


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Script)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


SCRIPTS = ("ok", "shed-then-ok", "busy", "drop", "dead")


def test_each_request_ends_once_and_every_shed_submission_is_counted_by_its_code(
    server: str, policy: Policy
) -> None:
    plan = [
        PlannedArrival(index, index * 0.01, "complaint", f"b{index}", prompt_tokens=5, max_tokens=7)
        for index in range(len(SCRIPTS))
    ]

    def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
        headers = {"x-script": SCRIPTS[arrival.index], "x-key": f"{server}-{arrival.index}"}
        return server, {"prompt": "hi", "max_tokens": arrival.max_tokens}, headers

    settings = OpenLoopSettings(
        honouring=frozenset(a.branch_id for a in plan), retry_delay_s=0.01, max_attempts=3, drain_timeout_s=3
    )
    player = OpenLoopPlayer(plan, policy, shape, settings)
    player.start()
    assert player.wait(30), "the player did not finish"
    player.close()
    records = {SCRIPTS[r.index]: r for r in player.records.values()}
    assert {name: r.outcome for name, r in records.items()} == {
        "ok": "done",
        "shed-then-ok": "done",
        "busy": "rejected",
        "drop": "rejected",
        "dead": "cancelled",  # waiting out its Retry-After when the run ended
    }
    assert (records["ok"].submissions, records["shed-then-ok"].submissions, records["busy"].submissions) == (
        1,
        2,
        3,
    )
    assert player.usage == {0: 12, 1: 12}
    assert dict(player.shed_codes) == {
        ("complaint", "429 scheduler_queue_full"): 1,
        ("complaint", "503 scheduler_queue_timeout"): 3,
        ("complaint", DROPPED): 3,
        ("complaint", "503"): 1,
    }
    ended = {outcome: player.submission_outcomes[("complaint", outcome)] for outcome in OUTCOMES}
    assert sum(ended.values()) == sum(r.submissions for r in records.values()) == 10
    assert (ended["done"], ended["rejected"], ended["failed"], ended["cancelled"]) == (2, 7, 1, 0)
    lag = player.send_lag()
    assert lag["p99_s"] is not None and lag["p99_s"] < 5


def test_a_streamed_answer_is_done_at_done_and_a_broken_one_failed_while_sheds_are_retried(
    server: str, policy: Policy
) -> None:
    plan = [
        PlannedArrival(index, index * 0.01, "complaint", f"b{index}", prompt_tokens=5, max_tokens=7)
        for index in range(len(STREAM_SCRIPTS))
    ]

    def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
        headers = {"x-script": STREAM_SCRIPTS[arrival.index], "x-key": f"{server}-stream-{arrival.index}"}
        return server, {"prompt": "hi", "max_tokens": arrival.max_tokens}, headers

    settings = OpenLoopSettings(
        honouring=frozenset(a.branch_id for a in plan), retry_delay_s=0.01, drain_timeout_s=10, stream=True
    )
    player = OpenLoopPlayer(plan, policy, shape, settings)
    player.start()
    assert player.wait(30), "the player did not finish"
    player.close()
    records = {STREAM_SCRIPTS[r.index]: r for r in player.records.values()}
    assert {name: (r.outcome, r.submissions) for name, r in records.items()} == {
        "stream-ok": ("done", 1),
        "degraded-then-ok": ("done", 2),  # the degraded 200 is a shed answer, retried
        "early-drop-then-ok": ("done", 2),  # closed before any text: shed, retried
        "error-event": ("failed", 1),  # an error event inside an admitted stream: failed, not done
        "cut-after-text": ("failed", 1),
    }
    ok = records["stream-ok"]
    assert ok.client_ttft_s is not None and ok.end_to_end_s is not None
    assert FIRST_TEXT_PAUSE_S <= ok.client_ttft_s < ok.end_to_end_s  # the empty first chunk is no token
    assert player.usage == {0: 8, 1: 8, 2: 8}  # from each stream's usage chunk
    assert dict(player.shed_codes) == {
        ("complaint", "200 red_alarm"): 1,
        ("complaint", DROPPED): 1,
        ("complaint", "stream error answer_interrupted"): 1,
        ("complaint", f"{DROPPED} after text"): 1,
    }
    assert records["degraded-then-ok"].rejections == 1
    ended = {outcome: player.submission_outcomes[("complaint", outcome)] for outcome in OUTCOMES}
    assert (ended["done"], ended["rejected"], ended["failed"]) == (3, 2, 2)
    assert sum(ended.values()) == sum(r.submissions for r in records.values()) == 7


def test_the_engine_gets_tidegates_order_as_integers_and_smg_a_class_per_type(policy: Policy) -> None:
    def arrival(ticket_type: str, **levels: int) -> PlannedArrival:
        return PlannedArrival(0, 0.0, ticket_type, "b", prompt_tokens=5, max_tokens=7, **levels)

    urgent_loan = engine_priority(policy, arrival("loan_approval", urgent_level=5))
    loan = engine_priority(policy, arrival("loan_approval"))
    complaint = engine_priority(policy, arrival("complaint", vip_level=5))
    archive = engine_priority(policy, arrival("archive_query"))
    assert urgent_loan < loan < complaint < archive
    assert all(isinstance(value, int) for value in (urgent_loan, loan, complaint, archive))
    assert [smg_class(policy, t) for t in ("loan_approval", "complaint", "archive_query")] == [
        "interactive",
        "default",
        "bulk",
    ]


def test_litellm_gets_one_capped_deployment_per_gpu_and_no_retries_of_its_own() -> None:
    config = litellm_config("m", ["http://127.0.0.1:1/", "http://127.0.0.1:2"], 32)
    deployments = config["model_list"]
    assert isinstance(deployments, list) and len(deployments) == 2
    assert [d["litellm_params"]["api_base"] for d in deployments] == [
        "http://127.0.0.1:1/v1",
        "http://127.0.0.1:2/v1",
    ]
    assert {d["litellm_params"]["max_parallel_requests"] for d in deployments} == {32}
    assert config["litellm_settings"] == {"num_retries": 0, "request_timeout": 600}


@pytest.mark.timeout(120)
def test_streamed_calls_to_a_simulator_record_their_first_token_before_their_end(policy: Policy) -> None:
    types = ("loan_approval", "complaint", "archive_query")
    plan = [
        PlannedArrival(index, index * 0.05, types[index % 3], f"b{index}", prompt_tokens=40, max_tokens=24)
        for index in range(9)
    ]
    with SimulatorProcess(time_scale=20) as sim:
        model = served_model(sim.base_url)

        def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
            ticket = arrival.body()
            return sim.base_url, {"model": model, "prompt": ticket["prompt"], "max_tokens": 24}, {}

        settings = OpenLoopSettings(honouring=frozenset(), drain_timeout_s=30, stream=True)
        player = OpenLoopPlayer(plan, policy, shape, settings)
        player.start()
        assert player.wait(60), "the player did not finish"
        player.close()
    records = sorted(player.records.values(), key=lambda r: r.index)
    assert [r.outcome for r in records] == ["done"] * len(plan), dict(player.shed_codes)
    for record in records:
        assert record.client_ttft_s is not None and record.end_to_end_s is not None
        assert 0 < record.client_ttft_s < record.end_to_end_s, record
        assert player.usage[record.index] > 40  # the prompt and the completion, from the usage chunk
    books = Books.from_ledger(player.ledger(list(types)), records)
    assert books.holds, books.line
    assert books.by_type["loan_approval"] == {"submitted": 3, "done": 3} | dict.fromkeys(
        ("failed", "expired", "cancelled", "rejected"), 0
    )
    assert not player.shed_codes
    lag = player.send_lag()
    assert lag["max_s"] is not None and lag["p99_s"] is not None and lag["p99_s"] <= lag["max_s"]
