"""Every knob of one worker process, declared once: type, bound, default, help and `TIDEGATE_*` name.

`WorkerConfig` is a pydantic-settings model: the process-wide `Settings` (Redis, queue, lease,
fallback endpoints) plus what only a worker has (its vLLM and GPU, batch and memory knobs, timings).
`tidegate worker`'s options, their help and the supervisor's child arguments are derived from it
(worker/cli_options.py), so a knob added here is a flag, a variable and a child argument at once.
Precedence: flags, then the environment (and `.env`), then the field's default or the policy's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from shared.config import QUEUE_NAME_PATTERN, Settings
from worker.model_spec import ModelSpec, load_model_spec
from worker.registry import default_worker_id


@dataclass(frozen=True)
class Flag:
    """How a setting appears on `tidegate worker`'s command line, where not derived from its name."""

    name: str | None = None
    """The option's name; None: `--` and the field's name with dashes."""
    many: bool = False
    """Repeatable, each value a comma list; the setting holds the comma-joined list."""
    via: str | None = None
    """No option of its own: it is given through this other field's option."""
    more_help: str = ""


SHARED_FLAGS: dict[str, Flag] = {
    "queue_name": Flag(
        "--queue", many=True, more_help="Repeat it, or a comma list, to serve several queues in that order."
    ),
    "fallback_vllm_url": Flag(),
    "lease_seconds": Flag(),
}
"""The process-wide settings (shared/config.py declares them) a worker takes as options too."""

QueueName = Annotated[str, StringConstraints(pattern=QUEUE_NAME_PATTERN)]


class WorkerConfig(Settings):
    """One worker process's settings; its own fields below are options of `tidegate worker`."""

    gpu: int = Field(default=0, ge=0, description="GPU index this worker serves")
    vllm_url: Annotated[str, Flag(many=True, more_help="Repeat it, or a comma list, one per GPU.")] = Field(
        default="http://127.0.0.1:8000", description="the local vLLM endpoint"
    )
    gpu_backend: Literal["nvml", "sim", "auto"] = Field(default="auto", description="GPU memory source")
    max_batch: int = Field(default=32, ge=1, le=1024, description="most tickets a worker keeps in flight")
    safety_margin: float = Field(default=0.15, ge=0, lt=1, description="share of GPU memory kept free")
    kv_high_watermark: float = Field(
        default=0.85, gt=0, le=1, description="KV-cache usage above which the batch shrinks"
    )
    critical_headroom: float = Field(
        default=0.2,
        ge=0,
        lt=1,
        description="share of each worker's batch and KV budget kept for critical types",
    )
    preemption: bool = Field(
        default=True,
        description="a worker out of room (at its limit, or without KV budget for it) puts its newest "
        "non-critical ticket back in the queue (no attempt used) so a waiting critical ticket starts now",
    )
    gpus: str | None = Field(
        default=None,
        pattern=r"^(all|[1-9][0-9]*)$",
        description="all, or N: one supervised worker process per GPU (unset: this process is the worker)",
    )
    extra_queues: Annotated[tuple[QueueName, ...], Flag(via="queue_name")] = Field(
        default=(), description="further queues served after queue_name, in that priority order"
    )
    model: str | None = Field(default=None, description="served model name (unset: asked from /v1/models)")
    burst: bool = Field(default=False, description="drain the queue, then exit")
    grace_seconds: float = Field(
        default=30.0, ge=0, description="on SIGTERM, time running tickets get to finish"
    )
    model_config_file: Annotated[str | None, Flag("--model-config")] = Field(
        default=None, description="the model's config.json (or its directory), for KV bytes per token"
    )
    kv_layers: int | None = Field(default=None, ge=1, description="override: transformer layers")
    kv_heads: int | None = Field(default=None, ge=1, description="override: KV heads")
    head_dim: int | None = Field(default=None, ge=1, description="override: head dimension")
    kv_dtype_bytes: int | None = Field(
        default=None, ge=1, description="override: bytes per KV element (2 = fp16)"
    )
    deadline_service_seconds: float = Field(
        default=0.25,
        ge=0,
        description="the least time an answer takes: a claimed ticket due sooner is ended, not started",
    )
    max_preemptions: int = Field(
        default=2, ge=0, description="times one ticket may be put back; after that it runs to the end"
    )
    worker_metrics_port: Annotated[int, Flag("--metrics-port")] = Field(
        default=0, ge=0, le=65535, description="serve the worker's Prometheus /metrics here; 0 = off"
    )
    worker_id: str = Field(
        default_factory=lambda data: default_worker_id(data["gpu"]),
        description="registry name (default HOST-gpuN)",
    )
    heartbeat_seconds: float = Field(default=2.0, gt=0, description="registry heartbeat interval")
    resize_seconds: float = Field(default=2.0, gt=0, description="how often the batch size is recomputed")
    block_seconds: float = Field(
        default=5.0,
        gt=0,
        le=10,
        description="longest blocking wait for work (short, so a lost Redis connection is noticed)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="log level")
    model_spec: Annotated[ModelSpec, Flag(via="model_config_file")] = Field(
        default_factory=ModelSpec, description="the model's shape, read from model_config_file"
    )

    @model_validator(mode="before")
    @classmethod
    def _queue_list(cls, data: Any) -> Any:
        """`queue_name` may be a comma list (the `--queue` option, or the variable): the first is
        served first, the others become `extra_queues`."""
        if isinstance(data, dict) and isinstance(data.get("queue_name"), str) and "," in data["queue_name"]:
            first, *others = [name.strip() for name in data["queue_name"].split(",") if name.strip()]
            extra = [name for name in (*others, *data.get("extra_queues", ())) if name != first]
            data = {**data, "queue_name": first, "extra_queues": tuple(dict.fromkeys(extra))}
        return data

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _model_shape(self) -> WorkerConfig:
        """The model's shape from its config file and the overrides, unless given whole (tests)."""
        if "model_spec" not in self.model_fields_set:
            overrides = (self.kv_layers, self.kv_heads, self.head_dim, self.kv_dtype_bytes)
            if self.model_config_file is not None or any(v is not None for v in overrides):
                spec = load_model_spec(self.model_config_file).with_overrides(
                    layers=self.kv_layers,
                    kv_heads=self.kv_heads,
                    head_dim=self.head_dim,
                    dtype_bytes=self.kv_dtype_bytes,
                )
                self.model_spec = spec
        return self

    @property
    def queue_names(self) -> tuple[str, ...]:
        """Every queue this worker serves, the first served first."""
        return (self.queue_name, *(q for q in self.extra_queues if q != self.queue_name))

    @property
    def gpu_count(self) -> int | None:
        """`--gpus N` as a number; None for `all` (or no supervisor)."""
        return None if self.gpus in (None, "all") else int(self.gpus)

    @property
    def vllm_urls(self) -> list[str]:
        """The endpoints in `vllm_url` (a comma list under a supervisor: one per GPU)."""
        return [url.strip() for url in self.vllm_url.split(",") if url.strip()]
