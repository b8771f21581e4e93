"""`/metrics` in Prometheus text with the names and labels vLLM's metrics documentation lists.

A collector reads the engines' state and accumulators at scrape time, registered in the app's own
registry so several simulators can live in one process. Latency histograms are in model seconds: what
the simulated GPU would show, whatever the time scale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ops.lab.sim.config import SimConfig
from ops.lab.sim.engine import Engine
from ops.lab.sim.stats import Histogram

# vLLM 0.32 exports these reasons; an aborted request is not counted under "abort" (OBSERVED.md).
FINISH_REASONS = ("abort", "error", "length", "repetition", "stop")
# (EngineStats attribute, vLLM metric name, vLLM help text)
HISTOGRAMS = (
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    (
        "tpot",
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
    ),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    (
        "queue_time",
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
    ),
)


Reading = Callable[[Engine, SimConfig], float]
# (family kind, metric name, help text, how to read it from one engine)
SCALARS: tuple[tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], str, str, Reading], ...] = (
    (
        GaugeMetricFamily,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        lambda e, c: len(e.scheduler.running),
    ),
    (
        GaugeMetricFamily,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        lambda e, c: len(e.scheduler.waiting),
    ),
    (
        GaugeMetricFamily,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        lambda e, c: e.scheduler.used_blocks / c.kv_blocks,
    ),
    (
        CounterMetricFamily,
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        lambda e, c: e.stats.preemptions,
    ),
    (
        CounterMetricFamily,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        lambda e, c: e.stats.prompt_tokens,
    ),
    (
        CounterMetricFamily,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        lambda e, c: e.stats.generation_tokens,
    ),
    # Not vLLM metrics: a real OOM kills the process and its counters; the simulator survives its own,
    # so benchmarks can count them; vLLM itself does not count aborts.
    (
        CounterMetricFamily,
        "tidegate_sim_oom_crashes",
        "Simulated CUDA out-of-memory crashes of the engine.",
        lambda e, c: e.stats.oom_crashes,
    ),
    (
        CounterMetricFamily,
        "tidegate_sim_aborted_requests",
        "Requests aborted because their client disconnected (vLLM itself does not count these).",
        lambda e, c: e.stats.aborted,
    ),
)


class VllmCollector(Collector):
    """Exports each engine's gauges, counters and histograms, labelled with the engine (GPU) index."""

    def __init__(self, config: SimConfig, engines: Sequence[Engine]) -> None:
        self._config = config
        self._engines = engines

    def _labels(self, engine: Engine) -> dict[str, str]:
        # vLLM labels every family with its engine index, "0" on a single-engine server.
        return {"model_name": self._config.model, "engine": str(engine.gpu)}

    def collect(self) -> Iterable[Metric]:
        names = list(self._labels(self._engines[0]))
        scalars = [
            (kind(name, documentation, labels=names), read) for kind, name, documentation, read in SCALARS
        ]
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        histograms = {
            key: HistogramMetricFamily(name, documentation, labels=names)
            for key, name, documentation in HISTOGRAMS
        }
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*names, *self._cache_labels()],
        )
        for engine in self._engines:
            values = list(self._labels(engine).values())
            for family, read in scalars:
                family.add_metric(values, read(engine, self._config))
            for reason in FINISH_REASONS:
                success.add_metric([*values, reason], engine.stats.finished[reason])
            for key, histogram_family in histograms.items():
                histogram: Histogram = getattr(engine.stats, key)
                histogram_family.add_metric(values, histogram.cumulative(), histogram.total)
            cache.add_metric([*values, *self._cache_labels().values()], 1.0)
        yield from (*(family for family, _ in scalars), success, *histograms.values(), cache)

    def _cache_labels(self) -> dict[str, str]:
        return {
            "block_size": str(self._config.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "False",
            "gpu_memory_utilization": str(self._config.profile.gpu_memory_utilization),
            "kv_cache_memory_bytes": str(self._config.kv_cache_bytes),
            "kv_cache_size_tokens": str(self._config.kv_blocks * self._config.block_size),
            "num_cpu_blocks": str(self._config.swap_blocks),
            "num_gpu_blocks": str(self._config.kv_blocks),
            "swap_space": str(self._config.profile.swap_space_bytes / 1024**3),
        }


def build_registry(config: SimConfig, engines: Sequence[Engine]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VllmCollector(config, engines))
    return registry
