"""The GPU memory providers: NVML against a stub `pynvml`, the simulated one against a live simulator."""

from __future__ import annotations

import logging
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from ops.lab.sim.process import InProcessSimulator
from worker.gpu_memory import (
    GpuBackendError,
    GpuMemory,
    NvmlProvider,
    SimulatedProvider,
    make_provider,
)

GIB = 1024**3


@dataclass
class MemoryInfo:
    total: int
    free: int
    used: int


class StubNvml(types.ModuleType):
    """Just the pynvml calls the provider makes, over a fixed pair of 80 GiB GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.fail_init = fail_init
        self.initialised = False
        self.gpus = [MemoryInfo(80 * GIB, 60 * GIB, 20 * GIB), MemoryInfo(80 * GIB, 5 * GIB, 75 * GIB)]

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> MemoryInfo:
        return self.gpus[handle]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> StubNvml:
    stub = StubNvml()
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    return stub


@pytest.fixture
def broken_nvml(monkeypatch: pytest.MonkeyPatch) -> StubNvml:
    stub = StubNvml(fail_init=True)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    return stub


def test_nvml_provider_reports_each_gpu(nvml: StubNvml) -> None:
    provider = NvmlProvider()
    assert nvml.initialised and provider.name == "nvml"
    assert provider.device_count() == 2
    assert provider.memory(1) == GpuMemory(
        index=1, total_bytes=80 * GIB, free_bytes=5 * GIB, used_bytes=75 * GIB
    )
    nvml.gpus[1] = MemoryInfo(80 * GIB, 30 * GIB, 50 * GIB)
    assert provider.memory(1).free_bytes == 30 * GIB
    provider.close()
    assert not nvml.initialised


def test_nvml_provider_rejects_an_index_it_does_not_have(nvml: StubNvml) -> None:
    with pytest.raises(GpuBackendError, match="GPU index 2 does not exist; NVML sees 2 GPUs"):
        NvmlProvider().memory(2)


def test_nvml_failure_is_a_clear_startup_error_in_nvml_mode(broken_nvml: StubNvml) -> None:
    with pytest.raises(GpuBackendError, match="NVML nvmlInit failed: Driver Not Loaded"):
        make_provider("nvml", sim_url="http://127.0.0.1:1")


def test_missing_pynvml_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuBackendError, match="nvidia-ml-py"):
        NvmlProvider()


def test_auto_prefers_nvml_when_it_initialises(nvml: StubNvml, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tidegate.worker.gpu"):
        provider = make_provider("auto", sim_url="http://127.0.0.1:1")
    assert provider.name == "nvml"
    assert "GPU memory backend: nvml (2 GPUs)" in caplog.text


def test_auto_without_nvml_or_simulator_fails(broken_nvml: StubNvml) -> None:
    with pytest.raises(GpuBackendError, match="no usable GPU backend: NVML nvmlInit failed"):
        make_provider("auto", sim_url=None)


def test_sim_mode_needs_a_url() -> None:
    with pytest.raises(GpuBackendError, match="needs the simulator's URL"):
        make_provider("sim", sim_url=None)


def test_an_unreachable_simulator_is_a_clear_error() -> None:
    with pytest.raises(
        GpuBackendError, match=re.escape("cannot read simulated GPU memory from http://127.0.0.1:9/sim/gpus")
    ):
        SimulatedProvider("http://127.0.0.1:9", timeout_s=0.5).device_count()


@pytest.fixture(scope="module")
def sim() -> Iterator[InProcessSimulator]:
    with InProcessSimulator(gpus=2, kv_blocks=1024, time_scale=20) as simulator:
        yield simulator


def test_auto_falls_back_to_the_simulator(
    broken_nvml: StubNvml, sim: InProcessSimulator, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="tidegate.worker.gpu"):
        provider = make_provider("auto", sim_url=sim.base_url)
    assert provider.name == "sim"
    assert "NVML is not available (NVML nvmlInit failed: Driver Not Loaded)" in caplog.text
    assert f"GPU memory backend: sim (simulator at {sim.base_url})" in caplog.text


def test_simulated_provider_follows_the_simulator(sim: InProcessSimulator) -> None:
    provider = make_provider("sim", sim_url=sim.base_url + "/")
    assert provider.device_count() == 2
    before = provider.memory(1)
    profile = sim.config.profile
    assert before.total_bytes == profile.gpu_total_bytes
    assert before.used_bytes == profile.model_bytes + profile.overhead_bytes + 1024 * profile.block_bytes
    assert before.free_bytes == before.total_bytes - before.used_bytes
    requests.post(f"{sim.base_url}/sim/gpus/1/pressure", json={"extra_used_bytes": 4 * GIB}, timeout=5)
    after = provider.memory(1)
    assert after.free_bytes == before.free_bytes - 4 * GIB
    assert after.used_bytes == before.used_bytes + 4 * GIB
    assert provider.memory(0).free_bytes == before.free_bytes
    with pytest.raises(GpuBackendError, match="GPU index 2 does not exist"):
        provider.memory(2)
