"""The worker's periodic chores, on one thread: reap, resize, read the monitor, heartbeat.

- reap every second (lock-guarded in Redis, so many workers calling it cost one sweep);
- sample GPU memory and vLLM's `/metrics` every `resize_seconds` and recompute the batch limit;
- read whether service is degraded (the control state admission reads; caps max_tokens);
- write the heartbeat with the figures the monitor and admission read;
- read every endpoint's served model every 30 s, to pair fallbacks by model version.
A failure of one chore is logged and retried on the next round; it never stops the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
import requests

from shared.control import read_control_state
from worker.batch_sizer import BatchSizer, SizerInputs
from worker.gpu_memory import GpuBackendError, GpuMemory, GpuMemoryProvider
from worker.inflight import InFlight
from worker.queue_set import Queues, RegistrySet
from worker.registry import WorkerRegistry
from worker.vllm_metrics import VllmMetrics, VllmMetricsError, scrape

log = logging.getLogger(__name__)

REAP_INTERVAL_SECONDS = 1.0
PAIR_INTERVAL_SECONDS = 30.0
"""How often each endpoint's /v1/models is read again to check the fallback's model version."""


@dataclass
class Observed:
    """The latest figures, for the heartbeat and the worker's gauges."""

    gpu: GpuMemory | None = None
    vllm: VllmMetrics | None = None


class Housekeeping:
    def __init__(
        self,
        *,
        queue: Queues,
        worker_id: str,
        gpu_index: int,
        sizer: BatchSizer,
        inflight: InFlight,
        registry: WorkerRegistry | RegistrySet,
        gpu_provider: GpuMemoryProvider | None,
        vllm_url: str,
        heartbeat_seconds: float,
        resize_seconds: float,
        info: Callable[[], dict[str, str | int | float | None]],
        on_degraded: Callable[[bool], None],
        pair_fallbacks: Callable[[], None] | None = None,
    ) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.gpu_index = gpu_index
        self.sizer = sizer
        self.inflight = inflight
        self.registry = registry
        self.gpu_provider = gpu_provider
        self.vllm_url = vllm_url
        self.heartbeat_seconds = heartbeat_seconds
        self.resize_seconds = resize_seconds
        self.info = info
        self.on_degraded = on_degraded
        self.pair_fallbacks = pair_fallbacks
        self.observed = Observed()
        self._failing: set[str] = set()
        self.session = requests.Session()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="housekeeping", daemon=True)
        self._tick = min(REAP_INTERVAL_SECONDS, heartbeat_seconds, resize_seconds)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._tick + 10)
        self.session.close()

    def _loop(self) -> None:
        next_resize = next_beat = next_reap = 0.0
        next_pair = time.monotonic() + PAIR_INTERVAL_SECONDS  # the worker paired once at start
        while not self._stop.is_set():
            now = time.monotonic()
            if self.pair_fallbacks is not None and now >= next_pair:
                self._guard("fallback pairing", self.pair_fallbacks)
                next_pair = now + PAIR_INTERVAL_SECONDS
            if now >= next_reap:
                self._guard("reap", self.reap)
                next_reap = now + REAP_INTERVAL_SECONDS
            if now >= next_resize:
                self._guard("resize", self.resize)
                next_resize = now + self.resize_seconds
            if now >= next_beat:
                self._guard("heartbeat", self.heartbeat)
                next_beat = now + self.heartbeat_seconds
            wake = min(next_reap, next_resize, next_beat) - time.monotonic()
            self._stop.wait(max(wake, 0.01))

    def guarded(self, chore: str, action: Callable[[], object]) -> None:
        """Run one chore now; a failure is logged, never raised."""
        self._guard(chore, action)

    def _guard(self, chore: str, action: Callable[[], object]) -> None:
        try:
            action()
        except (redis.RedisError, GpuBackendError, OSError) as exc:
            log.warning("%s failed (%s); retrying next round", chore, exc)
        except Exception:
            log.exception("%s failed unexpectedly; retrying next round", chore)

    def reap(self) -> None:
        self.queue.reap(self.worker_id, REAP_INTERVAL_SECONDS)

    def resize(self) -> None:
        """Sample GPU memory and vLLM, then recompute the batch limit."""
        gpu: GpuMemory | None = None
        if self.gpu_provider is not None:
            try:
                gpu = self.gpu_provider.memory(self.gpu_index)
                self._recovered("gpu", f"GPU {self.gpu_index} memory readable again")
            except (GpuBackendError, requests.RequestException, ValueError) as exc:
                self._failed("gpu", f"GPU {self.gpu_index} memory unreadable ({exc}); sizing from vLLM alone")
        vllm: VllmMetrics | None = None
        try:
            vllm = scrape(self.session, self.vllm_url, engine=str(self.gpu_index))
            self._recovered("vllm", f"{self.vllm_url}/metrics readable again")
        except VllmMetricsError as exc:
            self._failed("vllm", f"{exc}; sizing without vLLM's KV figures")
        self.observed = Observed(gpu=gpu, vllm=vllm)
        self.sizer.update(
            SizerInputs(
                gpu_free_bytes=gpu.free_bytes if gpu else None,
                gpu_total_bytes=gpu.total_bytes if gpu else None,
                vllm=vllm,
                own_inflight=self.inflight.count(),
                own_reserved_tokens=self.inflight.reserved_tokens(),
            )
        )

    def _failed(self, source: str, message: str) -> None:
        # Logged when a source starts failing, not every round: a vLLM without GPU figures
        # (vLLM-CPU, or no NVML) would otherwise fill the log.
        if source not in self._failing:
            self._failing.add(source)
            log.warning(message)

    def _recovered(self, source: str, message: str) -> None:
        if source in self._failing:
            self._failing.discard(source)
            log.info(message)

    def heartbeat(self) -> None:
        self.on_degraded(self._service_degraded())
        self.registry.heartbeat(self.info())

    def _service_degraded(self) -> bool:
        """Whether service is degraded, from the same control state admission reads."""
        state, _ = read_control_state(self.queue.redis, self.queue.keys, self.queue.policy.alarms)
        return state.degraded
