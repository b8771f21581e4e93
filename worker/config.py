"""Everything one worker process needs, resolved from flags, the environment and the policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.model_spec import ModelSpec


@dataclass(frozen=True)
class WorkerConfig:
    gpu: int
    vllm_url: str
    worker_id: str
    queue_name: str = "default"
    extra_queues: tuple[str, ...] = ()
    """Further queues served after `queue_name`, in priority order (worker/queue_set.py)."""
    replica_acks: int = 0
    """Replicas that must hold a finished ticket before the worker moves on (TIDEGATE_REPLICA_ACKS)."""
    fallback_vllm_url: str | None = None
    model: str | None = None
    """Served model name; None = ask vLLM's /v1/models."""
    max_batch: int = 32
    safety_margin: float = 0.15
    kv_high_watermark: float = 0.85
    critical_headroom: float = 0.2
    """Share of the batch limit and KV budget only critical ticket types may use."""
    slo_guard: bool = False
    """While service is degraded, cap other work so critical answers fit their SLO (latency_guard)."""
    adaptive_limit: bool = True
    """Bound the in-flight limit by per-token latency too (`worker/concurrency_limit.py`)."""
    adaptive_tolerance: float = 1.25
    """Short over long per-token latency the adaptive limit tolerates before it shrinks."""
    adaptive_slo: bool = True
    """While critical answers flow, their run times against their SLO move the adaptive limit."""
    preemption: bool = True
    """At the limit, put the newest non-critical ticket back for a waiting critical one."""
    preemption_patience: float = 0.0
    """Share of a critical ticket's SLO it waits for a free slot before a preemption."""
    max_preemptions: int = 2
    """Times one ticket may be put back; after that it runs to the end."""
    prefill_guard_tokens: int = 8192
    """Most prompt tokens of non-critical tickets in prefill at once; 0 = no bound."""
    deadline_service_seconds: float = 0.25
    """The least time an answer takes: a claimed ticket due sooner is ended, not started
    (worker/deadlines.py)."""
    lease_seconds: float = 30.0
    grace_seconds: float = 30.0
    burst: bool = False
    model_spec: ModelSpec = field(default_factory=ModelSpec)
    heartbeat_seconds: float = 2.0
    resize_seconds: float = 2.0
    block_seconds: float = 5.0
    """Longest blocking wait for new work (≤ 10 s, so a lost Redis connection is noticed)."""

    @property
    def queue_names(self) -> tuple[str, ...]:
        """Every queue this worker serves, the first served first."""
        return (self.queue_name, *(q for q in self.extra_queues if q != self.queue_name))

    def __post_init__(self) -> None:
        checks = {
            "gpu": (self.gpu >= 0, "0 or more"),
            "max_batch": (self.max_batch >= 1, "at least 1"),
            "safety_margin": (0 <= self.safety_margin < 1, "0 ≤ margin < 1"),
            "kv_high_watermark": (0 < self.kv_high_watermark <= 1, "0 < watermark ≤ 1"),
            "critical_headroom": (0 <= self.critical_headroom < 1, "0 ≤ share < 1"),
            "max_preemptions": (self.max_preemptions >= 0, "0 or more"),
            "preemption_patience": (0 <= self.preemption_patience < 1, "0 ≤ share < 1"),
            "prefill_guard_tokens": (self.prefill_guard_tokens >= 0, "0 or more (0 = no bound)"),
            "deadline_service_seconds": (self.deadline_service_seconds >= 0, "0 or more"),
            "lease_seconds": (self.lease_seconds > 0, "more than 0"),
            "grace_seconds": (self.grace_seconds >= 0, "0 or more"),
            "heartbeat_seconds": (self.heartbeat_seconds > 0, "more than 0"),
            "resize_seconds": (self.resize_seconds > 0, "more than 0"),
            "block_seconds": (0 < self.block_seconds <= 10, "more than 0 and at most 10"),
        }
        for name, (ok, accepted) in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is not accepted; use {accepted}")
