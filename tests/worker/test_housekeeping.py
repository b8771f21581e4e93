"""Housekeeping on its own: fake queue, sizer, registry and GPU; vLLM's scrape patched.

Each chore is called directly; the loop is checked once, started and stopped, waiting on the
chores having run rather than on time."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from tests.waiting import wait_until
from worker import housekeeping
from worker.gpu_memory import GpuBackendError, GpuMemory
from worker.housekeeping import REAP_INTERVAL_SECONDS, Housekeeping
from worker.inflight import InFlight
from worker.vllm_metrics import VllmMetricsError


@dataclass
class FakeQueue:
    reaps: list[tuple[str, float]] = field(default_factory=list)
    fail: bool = False
    redis: Any = None
    keys: Any = None
    policy: Any = field(default_factory=lambda: SimpleNamespace(alarms=None))

    def reap(self, worker_id: str, interval: float) -> None:
        if self.fail:
            raise redis.ConnectionError("Redis restarting")
        self.reaps.append((worker_id, interval))


class FakeSizer:
    limit = 8

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    def update(self, inputs: Any) -> None:
        self.inputs.append(inputs)


class FakeRegistry:
    def __init__(self) -> None:
        self.beats: list[dict[str, Any]] = []

    def heartbeat(self, info: dict[str, Any]) -> None:
        self.beats.append(info)


class FakeGpu:
    def __init__(self) -> None:
        self.broken = False

    def memory(self, index: int) -> GpuMemory:
        if self.broken:
            raise GpuBackendError("NVML is gone")
        return GpuMemory(index=index, total_bytes=8 << 30, free_bytes=6 << 30, used_bytes=2 << 30)


@dataclass
class Chores:
    keeping: Housekeeping
    queue: FakeQueue
    sizer: FakeSizer
    registry: FakeRegistry
    gpu: FakeGpu
    degraded: list[bool]


@pytest.fixture
def chores(monkeypatch: pytest.MonkeyPatch) -> Chores:
    monkeypatch.setattr(housekeeping, "scrape", lambda *a, **k: None)
    monkeypatch.setattr(housekeeping, "read_control_state", lambda *a: (SimpleNamespace(degraded=True), None))
    queue, sizer, registry, gpu = FakeQueue(), FakeSizer(), FakeRegistry(), FakeGpu()
    degraded: list[bool] = []
    keeping = Housekeeping(
        queue=queue,  # type: ignore[arg-type]
        worker_id="w-unit",
        gpu_index=0,
        sizer=sizer,  # type: ignore[arg-type]
        inflight=InFlight(),
        registry=registry,  # type: ignore[arg-type]
        gpu_provider=gpu,  # type: ignore[arg-type]
        vllm_url="http://127.0.0.1:9",
        heartbeat_seconds=0.05,
        resize_seconds=0.05,
        info=lambda: {"worker_id": "w-unit"},
        on_degraded=degraded.append,
    )
    return Chores(keeping, queue, sizer, registry, gpu, degraded)


def test_reap_sweeps_for_this_worker_at_the_reap_interval(chores: Chores) -> None:
    chores.keeping.reap()
    assert chores.queue.reaps == [("w-unit", REAP_INTERVAL_SECONDS)]


def test_a_failing_chore_is_logged_never_raised(chores: Chores, caplog: pytest.LogCaptureFixture) -> None:
    chores.queue.fail = True
    chores.keeping.guarded("reap", chores.keeping.reap)

    def broken() -> None:
        raise KeyError("a bug")

    chores.keeping.guarded("resize", broken)
    assert "reap failed (Redis restarting)" in caplog.text and "resize failed unexpectedly" in caplog.text


def test_resize_feeds_the_sizer(chores: Chores) -> None:
    chores.keeping.resize()
    (inputs,) = chores.sizer.inputs
    assert (inputs.gpu_free_bytes, inputs.gpu_total_bytes, inputs.own_inflight) == (6 << 30, 8 << 30, 0)


def test_an_unreadable_source_is_logged_once_until_it_recovers(
    chores: Chores, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    chores.gpu.broken = True

    def no_metrics(*_args: Any, **_kw: Any) -> None:
        raise VllmMetricsError("no /metrics")

    monkeypatch.setattr(housekeeping, "scrape", no_metrics)
    caplog.set_level(logging.INFO, logger=housekeeping.__name__)
    for _ in range(3):
        chores.keeping.resize()
    assert caplog.text.count("memory unreadable") == 1 and caplog.text.count("no /metrics") == 1
    assert chores.sizer.inputs[-1].gpu_free_bytes is None, "sized from vLLM alone"
    chores.gpu.broken = False
    chores.keeping.resize()
    assert "GPU 0 memory readable again" in caplog.text


def test_heartbeat_reads_degraded_service_and_writes_the_registry(chores: Chores) -> None:
    chores.keeping.heartbeat()
    assert chores.degraded == [True] and chores.registry.beats == [{"worker_id": "w-unit"}]


def test_the_loop_runs_every_chore_and_stops(chores: Chores) -> None:
    chores.keeping.start()
    try:
        wait_until(
            lambda: chores.queue.reaps and len(chores.sizer.inputs) >= 2 and len(chores.registry.beats) >= 2,
            10,
            "every chore to run, resize and heartbeat more than once",
        )
    finally:
        chores.keeping.stop()
    assert not chores.keeping._thread.is_alive()
