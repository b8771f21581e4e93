"""Fault injection: an error share at the status asked for, extra latency, changed at run time."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from ops.lab.sim.process import SimulatorProcess
from tests.lab.sim.conftest import complete, token_ids

REQUESTS = 60


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(time_scale=200, error_rate=1.0, error_status=503, seed=3) as process:
        yield process


def _statuses(base_url: str, count: int) -> list[int]:
    return [complete(base_url, prompt=token_ids(8), max_tokens=2).status_code for _ in range(count)]


def _set(base_url: str, **fields: object) -> requests.Response:
    return requests.post(f"{base_url}/sim/faults", json=fields, timeout=5)


def test_start_flags_fail_every_request_with_the_status(sim: SimulatorProcess) -> None:
    _set(sim.base_url, error_rate=1.0, error_status=503, extra_latency_s=0)
    assert set(_statuses(sim.base_url, 5)) == {503}
    reply = complete(sim.base_url, prompt=token_ids(8), max_tokens=2)
    assert reply.json()["error"]["code"] == 503
    assert requests.get(f"{sim.base_url}/health", timeout=5).status_code == 200  # health is not injected


def test_runtime_change_sets_the_share_and_the_latency(sim: SimulatorProcess) -> None:
    assert _set(sim.base_url, error_rate=0.5, error_status=502).json() == {
        "error_rate": 0.5,
        "error_status": 502,
        "extra_latency_s": 0.0,
    }
    statuses = _statuses(sim.base_url, REQUESTS)
    failed = statuses.count(502)
    assert set(statuses) <= {200, 502}
    assert REQUESTS * 0.25 < failed < REQUESTS * 0.75, statuses
    _set(sim.base_url, error_rate=0.0, extra_latency_s=0.4)
    started = time.monotonic()
    assert _statuses(sim.base_url, 2) == [200, 200]
    assert time.monotonic() - started >= 0.8
    assert requests.get(f"{sim.base_url}/sim/faults", timeout=5).json()["extra_latency_s"] == 0.4
    _set(sim.base_url, extra_latency_s=0)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"error_rate": 1.5}, "error_rate"),
        ({"error_status": 200}, "error_status"),
        ({"error_status": "500"}, "error_status"),
        ({"extra_latency_s": -1}, "extra_latency_s"),
        ({"errors": 1}, "errors"),
    ],
)
def test_bad_fault_fields_answer_400_naming_the_field(
    sim: SimulatorProcess, body: dict[str, object], field: str
) -> None:
    reply = requests.post(f"{sim.base_url}/sim/faults", json=body, timeout=5)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == field
