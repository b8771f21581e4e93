"""One worker for one GPU: the claim loop, the runner pool, the lease keeper and housekeeping,
started together and stopped in order.

Concurrency model: plain threads. The work is waiting on sockets (vLLM over `requests`, Redis
over redis-py, both blocking libraries), at most `max_batch` (32) requests at a time, so a pool
of that many threads is simple, cheap and free of the GIL's cost; asyncio would need async
clients for both and buy nothing at this scale. Threads share only `InFlight` (locked), the
sizer (locked) and events.

Shutdown (SIGTERM/SIGINT, or a burst run that drained the queue): stop claiming; tickets vLLM
has not started on go back to the queue at once (no attempt used); the others get
`grace_seconds` to finish; whatever is still running then is aborted and given back; finally
the worker leaves the registry. A `kill -9` skips all this and loses nothing either: its leases
lapse and the reaper of any other worker returns the tickets.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from redis import Redis

from shared import clock
from shared.breaker_store import BreakerStore
from shared.policy import Policy
from shared.queue import TicketQueue
from worker.batch_sizer import BatchSizer
from worker.breaker_gate import BreakerGate, fallback_urls
from worker.claim_loop import ClaimLoop
from worker.config import WorkerConfig
from worker.deadlines import StartRule
from worker.execution import Executor
from worker.gpu_memory import GpuMemoryProvider
from worker.housekeeping import Housekeeping
from worker.inflight import AbortReason, InFlight, RunningTicket
from worker.leases import LeaseKeeper
from worker.preemption import Preemptor
from worker.queue_endpoints import QueueEndpoint, QueueEndpoints
from worker.queue_set import Queues, QueueSet, RegistrySet
from worker.registry import WorkerRegistry
from worker.result_writer import ResultWriter
from worker.rollout_routing import RolloutRouter
from worker.telemetry import GaugeSnapshot
from worker.throttle import Throttle
from worker.vllm_client import VllmClient, VllmError

log = logging.getLogger(__name__)

ABORT_SETTLE_SECONDS = 10.0
"""How long aborted tickets may take to be written back after the grace period."""
SIGNAL_CHECK_SECONDS = 0.5
"""How often the main thread wakes while it waits for a stop: Python runs a signal's handler only
in the main thread, and a SIGTERM the kernel hands to another thread does not wake a main thread
asleep in a wait without a timeout. (A supervised worker restarted a moment before its SIGTERM once
showed no sign of it in CI; this path, and a log write inside the handler, are ruled out.)"""


def _sizer(config: WorkerConfig, policy: Policy) -> BatchSizer:
    return BatchSizer(
        kv_bytes_per_token=config.model_spec.kv_bytes_per_token,
        max_batch=config.max_batch,
        safety_margin=config.safety_margin,
        kv_high_watermark=config.kv_high_watermark,
        initial_ticket_tokens=policy.queue.default_max_tokens + 512,
    )


def make_throttle(config: WorkerConfig, policy: Policy) -> Throttle | None:
    """The adaptive throttle, when the policy has a critical type whose answers can judge it."""
    if not policy.critical_types:
        return None
    return Throttle(config.max_batch)


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        redis: Redis,
        policy: Policy,
        *,
        gpu_provider: GpuMemoryProvider | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.lease_seconds = (
            policy.queue.lease_seconds if config.lease_seconds is None else config.lease_seconds
        )
        self.queue = TicketQueue(redis, policy, config.queue_name, replica_acks=config.replica_acks)
        """The first queue served (each queue's keys hold its own breakers and rollout)."""
        self.queues: Queues = self.queue
        if len(config.queue_names) > 1:
            self.queues = QueueSet(
                [self.queue]
                + [
                    TicketQueue(redis, policy, n, replica_acks=config.replica_acks)
                    for n in config.queue_names[1:]
                ]
            )
        self.stop_requested = threading.Event()
        self.inflight = InFlight()
        self.sizer = _sizer(config, policy)
        self.primary = VllmClient(config.vllm_url, model=config.model, pool_size=config.max_batch)
        self.fallbacks = [
            VllmClient(url, pool_size=config.max_batch) for url in fallback_urls(config.fallback_vllm_url)
        ]
        self.fallback = self.fallbacks[0] if self.fallbacks else None
        self.endpoints = self._endpoints(redis)
        self.breakers = self.endpoints.first.breakers
        """The first queue's breakers (each queue's are in `endpoints`)."""
        self.rollout = self.endpoints.first.rollout
        self.writer = ResultWriter(self.queues, config.worker_id)
        self.throttle = make_throttle(config, policy)
        self.preemptor = (
            Preemptor(
                queue=self.queues,
                inflight=self.inflight,
                worker_id=config.worker_id,
                max_preemptions=config.max_preemptions,
            )
            if config.preemption
            else None
        )
        self.executor = Executor(
            worker_id=config.worker_id,
            policy=policy,
            primary=self.primary,
            fallback=self.fallback,
            writer=self.writer,
            inflight=self.inflight,
            endpoints=self.endpoints,
            throttle=self.throttle,
            preemptor=self.preemptor,
        )
        self.pool = ThreadPoolExecutor(max_workers=config.max_batch, thread_name_prefix="ticket")
        self.claim_loop = self._claim_loop()
        self.leases = LeaseKeeper(self.queues, self.inflight, self.lease_seconds)
        self.registry: WorkerRegistry | RegistrySet = (
            RegistrySet(redis, self.queues, config.worker_id, config.heartbeat_seconds)
            if isinstance(self.queues, QueueSet)
            else WorkerRegistry(redis, self.queue.keys, config.worker_id, config.heartbeat_seconds)
        )
        self.housekeeping = self._housekeeping(gpu_provider)
        self.started_at = clock.now()
        self.draining = False

    def _endpoints(self, redis: Redis) -> QueueEndpoints:
        """A breaker gate and a rollout router per served queue, in that queue's keys. The ticket
        retry curve paces claims against a failing vLLM too."""
        served = self.queues.queues if isinstance(self.queues, QueueSet) else [self.queue]
        views = []
        for queue in served:
            store = BreakerStore(redis, queue.keys, self.policy.breaker, self.policy.queue)
            gate = BreakerGate(store, self.policy, self.primary, self.fallbacks)
            router = RolloutRouter(
                redis, queue.keys, self.policy, pool_size=self.config.max_batch, breakers=gate
            )
            views.append(QueueEndpoint(queue, gate, router))
        return QueueEndpoints(self.queues, views)

    def _claim_loop(self) -> ClaimLoop:
        return ClaimLoop(
            queue=self.queues,
            worker_id=self.config.worker_id,
            gpu=self.config.gpu,
            sizer=self.sizer,
            inflight=self.inflight,
            writer=self.writer,
            start=self._start_ticket,
            stop=self.stop_requested,
            lease_seconds=self.lease_seconds,
            block_seconds=self.config.block_seconds,
            burst=self.config.burst,
            throttle=self.throttle,
            reserve_share=self.config.critical_headroom,
            preemptor=self.preemptor,
            endpoints=self.endpoints,
            start_rule=StartRule(frozenset(self.policy.critical_types), self.config.deadline_service_seconds),
        )

    def _housekeeping(self, gpu_provider: GpuMemoryProvider | None) -> Housekeeping:
        return Housekeeping(
            queue=self.queues,
            worker_id=self.config.worker_id,
            gpu_index=self.config.gpu,
            sizer=self.sizer,
            inflight=self.inflight,
            registry=self.registry,
            gpu_provider=gpu_provider,
            vllm_url=self.config.vllm_url,
            heartbeat_seconds=self.config.heartbeat_seconds,
            resize_seconds=self.config.resize_seconds,
            info=self._registry_info,
            on_degraded=self._set_degraded,
            pair_fallbacks=self.endpoints.pair,
        )

    # ---- lifecycle ----------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the worker to stop; safe from a signal handler (it only sets an event)."""
        self.stop_requested.set()

    def run(self) -> int:
        """Run until stopped (or drained in burst mode), then shut down in order; returns 0."""
        try:
            model = self.primary.discover_model()
        except VllmError as exc:
            model = "(unknown until vLLM answers)"
            log.warning(
                "vLLM at %s does not answer yet (%s); tickets will wait with backoff",
                self.config.vllm_url,
                exc,
            )
        log.info(
            "worker %s: GPU %d, vLLM %s, model %s, max batch %d, lease %.1f s",
            self.config.worker_id,
            self.config.gpu,
            self.config.vllm_url,
            model,
            self.config.max_batch,
            self.lease_seconds,
        )
        self.housekeeping.resize()
        self.housekeeping.heartbeat()
        self.housekeeping.guarded("fallback pairing", self.endpoints.pair)
        self.leases.start()
        self.housekeeping.start()
        claimer = threading.Thread(target=self._claim_then_signal, name="claim-loop", daemon=True)
        claimer.start()
        while not self.stop_requested.wait(SIGNAL_CHECK_SECONDS):
            pass
        self.shutdown(claimer)
        return 0

    def _claim_then_signal(self) -> None:
        try:
            self.claim_loop.run()
        except Exception:
            log.exception("claim loop crashed; stopping the worker")
        finally:
            self.stop_requested.set()

    def shutdown(self, claimer: threading.Thread | None = None) -> None:
        self.draining = True
        self.stop_requested.set()
        self.inflight.close()
        unstarted = [r for r in self.inflight.snapshot() if not r.started]
        for running in unstarted:
            running.handle.abort(AbortReason.SHUTDOWN)
        if unstarted:
            log.info("shutdown: giving back %d tickets vLLM had not started", len(unstarted))
        grace = self.config.grace_seconds
        if not self.inflight.wait_until_empty(grace):
            rest = self.inflight.snapshot()
            log.warning(
                "shutdown: %d tickets still running after %.1f s grace; giving them back", len(rest), grace
            )
            for running in rest:
                running.handle.abort(AbortReason.SHUTDOWN)
            self.inflight.wait_until_empty(ABORT_SETTLE_SECONDS)
        self.pool.shutdown(wait=True, cancel_futures=False)
        if claimer is not None:
            claimer.join(timeout=self.config.block_seconds + 5)
        self.leases.stop()
        self.housekeeping.stop()
        try:
            self.registry.deregister()
        except Exception as exc:  # Redis gone: the heartbeat TTL removes us anyway
            log.warning("could not leave the registry (%s); the heartbeat TTL will", exc)
        self.endpoints.close()
        self.queues.close()
        self.primary.close()
        for fallback in self.fallbacks:
            fallback.close()
        log.info("worker %s stopped", self.config.worker_id)

    # ---- pieces ---------------------------------------------------------------------------------
    def _start_ticket(self, running: RunningTicket) -> None:
        self.pool.submit(self.executor, running)

    def _set_degraded(self, degraded: bool) -> None:
        self.executor.degraded = degraded

    def gauges(self) -> GaugeSnapshot:
        observed = self.housekeeping.observed
        return GaugeSnapshot(
            batch_limit=self.sizer.limit,
            concurrency_limit=self.throttle.ceiling(self.sizer.limit) if self.throttle is not None else None,
            inflight=self.inflight.count(),
            kv_usage=observed.vllm.kv_usage if observed.vllm else None,
            gpu_free_bytes=observed.gpu.free_bytes if observed.gpu else None,
            gpu_total_bytes=observed.gpu.total_bytes if observed.gpu else None,
        )

    def _registry_info(self) -> dict[str, str | int | float | None]:
        gauges = self.gauges()
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "gpu": self.config.gpu,
            "model": self.primary.model or "",
            "vllm_url": self.config.vllm_url,
            "inflight": gauges.inflight,
            "batch_limit": gauges.batch_limit,
            "concurrency_limit": gauges.concurrency_limit,
            "kv_usage": gauges.kv_usage,
            "gpu_free_bytes": gauges.gpu_free_bytes,
            "gpu_total_bytes": gauges.gpu_total_bytes,
            "bound": self.claim_loop.last_plan.bound.value if self.claim_loop.last_plan else None,
            "state": "draining" if self.draining else "running",
            "started_at": repr(self.started_at),
        }
