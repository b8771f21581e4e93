"""Read vLLM's `/metrics`: KV-cache usage, its size in blocks, running and waiting requests and
preemptions, the figures the batch sizer decides from.

Parsed with prometheus_client's own text parser rather than by hand, so label quoting and
escaping follow the exposition format exactly. With data-parallel engines behind one endpoint
(an `engine` label), a worker reads its own engine when it is there and the sum otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""Current name first; the second is what vLLM before 0.10 exported."""


class VllmMetricsError(RuntimeError):
    """The endpoint did not answer, or answered without the metrics a worker needs."""


@dataclass(frozen=True)
class EngineSample:
    kv_usage: float = 0.0
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    running: int = 0
    waiting: int = 0
    preemptions: float = 0.0


@dataclass(frozen=True)
class VllmMetrics:
    """One scrape, already narrowed to the engine this worker feeds."""

    kv_usage: float
    num_gpu_blocks: int | None
    block_size: int | None
    running: int
    waiting: int
    preemptions: float

    @property
    def kv_capacity_tokens(self) -> int | None:
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    @property
    def free_kv_tokens(self) -> int | None:
        capacity = self.kv_capacity_tokens
        if capacity is None:
            return None
        return int(capacity * (1.0 - min(max(self.kv_usage, 0.0), 1.0)))


def parse_metrics(text: str, engine: str | None = None) -> VllmMetrics:
    """The figures of `engine` (its `engine` label) when present, else of all engines together."""
    by_engine: dict[str, dict[str, float]] = defaultdict(dict)
    cache_info: dict[str, tuple[int, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.labels.get("engine", "")
            name = sample.name
            if name in KV_USAGE_NAMES:
                by_engine[key].setdefault("kv_usage", sample.value)
            elif name == "vllm:num_requests_running":
                by_engine[key]["running"] = sample.value
            elif name == "vllm:num_requests_waiting":
                by_engine[key]["waiting"] = sample.value
            elif name == "vllm:num_preemptions_total":
                by_engine[key]["preemptions"] = sample.value
            elif name == "vllm:cache_config_info":
                blocks = sample.labels.get("num_gpu_blocks", "")
                size = sample.labels.get("block_size", "")
                if blocks.isdigit() and size.isdigit():
                    cache_info[key] = (int(blocks), int(size))
    if not by_engine:
        raise VllmMetricsError("no vllm: metrics found (is this a vLLM /metrics endpoint?)")
    picked = [engine] if engine is not None and engine in by_engine else sorted(by_engine)
    samples = [_engine_sample(by_engine[k], cache_info.get(k)) for k in picked]
    return _combine(samples)


def _engine_sample(values: dict[str, float], cache: tuple[int, int] | None) -> EngineSample:
    return EngineSample(
        kv_usage=values.get("kv_usage", 0.0),
        num_gpu_blocks=cache[0] if cache else None,
        block_size=cache[1] if cache else None,
        running=int(values.get("running", 0)),
        waiting=int(values.get("waiting", 0)),
        preemptions=values.get("preemptions", 0.0),
    )


def _combine(samples: list[EngineSample]) -> VllmMetrics:
    """Sum counts and blocks; KV usage weighted by each engine's blocks (plain mean when unknown)."""
    known_blocks = [s.num_gpu_blocks for s in samples if s.num_gpu_blocks is not None]
    blocks = sum(known_blocks) if len(known_blocks) == len(samples) else None
    if blocks:
        usage = sum(s.kv_usage * (s.num_gpu_blocks or 0) for s in samples) / blocks
    else:
        usage = sum(s.kv_usage for s in samples) / len(samples)
    sizes = {s.block_size for s in samples if s.block_size is not None}
    return VllmMetrics(
        kv_usage=usage,
        num_gpu_blocks=blocks,
        block_size=sizes.pop() if len(sizes) == 1 else None,
        running=sum(s.running for s in samples),
        waiting=sum(s.waiting for s in samples),
        preemptions=sum(s.preemptions for s in samples),
    )


def scrape(
    session: requests.Session, base_url: str, *, engine: str | None = None, timeout: float = 2.0
) -> VllmMetrics:
    """GET `<base_url>/metrics` and parse it; VllmMetricsError names the URL on any failure."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        response = session.get(url, timeout=timeout)
    except requests.RequestException as exc:
        raise VllmMetricsError(f"cannot read {url}: {exc}") from exc
    if response.status_code != 200:
        raise VllmMetricsError(f"{url} answered HTTP {response.status_code}")
    try:
        return parse_metrics(response.text, engine)
    except ValueError as exc:
        raise VllmMetricsError(f"{url}: unparseable metrics ({exc})") from exc
