"""Free and used memory per GPU, from NVML on real hardware or from a simulator's `/sim/gpus`.

The batch sizer needs the same figures either way, so both backends answer one small protocol. Which
one runs is configured (`TIDEGATE_GPU_BACKEND=nvml|sim|auto`) and logged; in `nvml` mode an NVML
failure stops the worker at start instead of silently falling back.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol

import requests

log = logging.getLogger("tidegate.worker.gpu")

Backend = Literal["nvml", "sim", "auto"]


class GpuBackendError(RuntimeError):
    """The configured GPU backend cannot report memory; the message says what failed and what to set."""


@dataclass(frozen=True)
class GpuMemory:
    index: int
    total_bytes: int
    free_bytes: int
    used_bytes: int


class GpuMemoryProvider(Protocol):
    name: str

    def device_count(self) -> int: ...

    def memory(self, index: int) -> GpuMemory: ...


class NvmlProvider:
    """Reads NVIDIA GPUs through NVML (`nvidia-ml-py`, module `pynvml`)."""

    name = "nvml"

    def __init__(self) -> None:
        try:
            self._nvml: ModuleType = importlib.import_module("pynvml")
        except ImportError as error:
            raise GpuBackendError(
                f"TIDEGATE_GPU_BACKEND=nvml needs the nvidia-ml-py package (module pynvml): {error}"
            ) from error
        self._call("nvmlInit")

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def memory(self, index: int) -> GpuMemory:
        count = self.device_count()
        if not 0 <= index < count:
            raise GpuBackendError(
                f"GPU index {index} does not exist; NVML sees {count} GPUs (0 to {count - 1})"
            )
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        info = self._call("nvmlDeviceGetMemoryInfo", handle)
        return GpuMemory(
            index=index, total_bytes=int(info.total), free_bytes=int(info.free), used_bytes=int(info.used)
        )

    def close(self) -> None:
        self._call("nvmlShutdown")

    def _call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as error:
            raise GpuBackendError(f"NVML {function}{args or ''} failed: {error}") from error


class SimulatedProvider:
    """Reads the simulated GPUs of a `tidegate sim-vllm` instance from its `/sim/gpus` endpoint."""

    name = "sim"

    def __init__(self, base_url: str, timeout_s: float = 2.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s

    def device_count(self) -> int:
        return len(self._gpus())

    def lacks_simulated_gpus(self) -> bool:
        """True when the server answers `/sim/gpus` with 404, as a real vLLM does (it reports no GPU
        memory). An unreachable server is not judged: a simulator may still be starting."""
        try:
            status = requests.get(f"{self.base_url}/sim/gpus", timeout=self._timeout_s).status_code
        except requests.RequestException:
            return False
        return status == 404

    def memory(self, index: int) -> GpuMemory:
        gpus = self._gpus()
        if not 0 <= index < len(gpus):
            raise GpuBackendError(
                f"GPU index {index} does not exist; the simulator at {self.base_url} has {len(gpus)} GPUs"
            )
        gpu = gpus[index]
        return GpuMemory(
            index=index,
            total_bytes=int(gpu["total_bytes"]),
            free_bytes=int(gpu["free_bytes"]),
            used_bytes=int(gpu["used_bytes"]),
        )

    def _gpus(self) -> list[dict[str, Any]]:
        url = f"{self.base_url}/sim/gpus"
        try:
            response = requests.get(url, timeout=self._timeout_s)
            response.raise_for_status()
            gpus = response.json()
        except (requests.RequestException, ValueError) as error:
            raise GpuBackendError(f"cannot read simulated GPU memory from {url}: {error}") from error
        if not isinstance(gpus, list):
            raise GpuBackendError(f"{url} answered {type(gpus).__name__}; expected a list of GPUs")
        return gpus


def make_provider(backend: Backend, sim_url: str | None) -> GpuMemoryProvider:
    """The configured provider; `auto` takes NVML when it initialises, else the simulator at `sim_url`.

    `auto` against a real vLLM on a machine without NVML (vLLM-CPU) raises GpuBackendError, so the
    caller sizes batches from vLLM's metrics alone instead of polling an endpoint that is not there.
    """
    if backend == "nvml":
        provider: GpuMemoryProvider = NvmlProvider()
    elif backend == "sim":
        if not sim_url:
            raise GpuBackendError("TIDEGATE_GPU_BACKEND=sim needs the simulator's URL (TIDEGATE_VLLM_URL)")
        provider = SimulatedProvider(sim_url)
    elif backend == "auto":
        try:
            provider = NvmlProvider()
        except GpuBackendError as nvml_error:
            if not sim_url:
                raise GpuBackendError(
                    f"TIDEGATE_GPU_BACKEND=auto found no usable GPU backend: {nvml_error}; "
                    "and no simulator URL was given for the sim backend"
                ) from nvml_error
            provider = SimulatedProvider(sim_url)
            if provider.lacks_simulated_gpus():
                raise GpuBackendError(
                    f"TIDEGATE_GPU_BACKEND=auto found no usable GPU backend: {nvml_error}; and "
                    f"{provider.base_url}/sim/gpus answered 404 (a real vLLM, which reports no GPU memory)"
                ) from nvml_error
            log.info("NVML is not available (%s); using the simulated GPUs at %s", nvml_error, sim_url)
    else:
        raise GpuBackendError(f"TIDEGATE_GPU_BACKEND={backend!r} is not accepted; use nvml|sim|auto")
    source = f"simulator at {sim_url}" if provider.name == "sim" else f"{provider.device_count()} GPUs"
    log.info("GPU memory backend: %s (%s)", provider.name, source)
    return provider
