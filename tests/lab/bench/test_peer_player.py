"""The peer arms' branch clients against a scripted loopback server: answers, shed codes, retries, books."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ops.lab.bench.peer_player import DROPPED, PeerClientSettings, PeerPlayer
from ops.lab.bench.peer_runs import engine_priority
from ops.lab.bench.peers.litellm import litellm_config
from ops.lab.bench.peers.smg import smg_class
from ops.lab.traffic.records import OUTCOMES
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy


class Script(BaseHTTPRequestHandler):
    """Answers by the `x-script` header: ok, shed-then-ok (429 first), busy (SMG's queue timeout), drop
    (the connection closes), dead (an engine's own 503, with a Retry-After longer than the run)."""

    calls: dict[str, int] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        script, key = self.headers["x-script"], self.headers["x-key"]
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            call = self.calls[key]
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

    settings = PeerClientSettings(
        honouring=frozenset(a.branch_id for a in plan), retry_delay_s=0.01, max_attempts=3, drain_timeout_s=3
    )
    player = PeerPlayer(plan, policy, shape, settings)
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
