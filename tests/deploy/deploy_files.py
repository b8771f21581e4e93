"""What the deployment tests share: file locations, the metric and settings names the team fixed,
a PromQL metric-name extractor and `${VAR:-default}` interpolation as Compose does it."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tidegate.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
PROMETHEUS_DIR = REPO / "ops" / "deploy" / "prometheus"
GRAFANA_DIR = REPO / "ops" / "deploy" / "grafana"
K8S_DIR = REPO / "ops" / "deploy" / "k8s" / "base"
K8S_SHARED_GPU_DIR = REPO / "ops" / "deploy" / "k8s" / "shared-gpu"
ALERT_TESTS = Path(__file__).with_name("prometheus_alerts_test.yml")

CLI_COMMANDS = frozenset(COMMANDS)

_TIDEGATE_GAUGES = {
    "tidegate_queue_depth",
    "tidegate_queue_depth_all_types",
    "tidegate_inflight",
    "tidegate_oldest_wait_seconds",
    "tidegate_alarm_level",
    "tidegate_mode",
    "tidegate_desired_workers",
    "tidegate_drain_rate",
    "tidegate_batch_limit",
    "tidegate_gpu_free_bytes",
    "tidegate_gpu_total_bytes",
    "tidegate_kv_cache_usage_ratio",
    "tidegate_workers_alive",
    "tidegate_worker_inflight",
    "tidegate_concurrency_limit",
    "tidegate_redis_up",
    "tidegate_memory_guard",
    "tidegate_redis_memory_used_bytes",
    "tidegate_redis_memory_budget_bytes",
    "tidegate_build_info",
    "tidegate_breaker_level",
    "tidegate_fallback_version_mismatch",
    "tidegate_rollout_wave",
}
_TIDEGATE_COUNTERS = {
    "tidegate_tickets_total",
    "tidegate_tickets_submitted_total",
    "tidegate_vllm_errors_total",
    "tidegate_preemptions_total",
    "tidegate_rollout_calls_total",
    "tidegate_rollout_shadow_total",
}
_TIDEGATE_HISTOGRAMS = {
    "tidegate_queue_wait_seconds",
    "tidegate_time_to_first_token_seconds",
    "tidegate_e2e_time_to_first_token_seconds",
    "tidegate_latency_seconds",
}
# vLLM's own names (as recent vLLM exports them, and the simulator mirrors).
_VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:cache_config_info",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
}
_VLLM_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
}


TIDEGATE_FAMILIES = frozenset(
    _TIDEGATE_GAUGES | {name.removesuffix("_total") for name in _TIDEGATE_COUNTERS} | _TIDEGATE_HISTOGRAMS
)
"""The metric families the deployment files may read, as prometheus-client names them."""


def _with_histogram_series(names: set[str]) -> set[str]:
    return {f"{name}{suffix}" for name in names for suffix in ("_bucket", "_sum", "_count")}


KNOWN_METRICS = frozenset(
    _TIDEGATE_GAUGES
    | _TIDEGATE_COUNTERS
    | _with_histogram_series(_TIDEGATE_HISTOGRAMS)
    | _VLLM_METRICS
    | _with_histogram_series(_VLLM_HISTOGRAMS)
    | {"up"}  # Prometheus' own per-target series
)

_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:$])[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
)
_NUMBER_WORDS = frozenset({"inf", "nan"})


REDIS_STATE = frozenset(
    {
        "tidegate_redis_up",
        "tidegate_queue_depth",
        "tidegate_oldest_wait_seconds",
        "tidegate_queue_depth_all_types",
        "tidegate_inflight",
        "tidegate_alarm_level",
        "tidegate_mode",
        "tidegate_desired_workers",
        "tidegate_drain_rate",
        "tidegate_memory_guard",
        "tidegate_redis_memory_used_bytes",
        "tidegate_redis_memory_budget_bytes",
        "tidegate_tickets_total",
        "tidegate_tickets_submitted_total",
        "tidegate_tickets_shed_total",
        "tidegate_tickets_expired_before_start_total",
        "tidegate_workers_alive",
        "tidegate_batch_limit",
        "tidegate_gpu_free_bytes",
        "tidegate_gpu_total_bytes",
        "tidegate_kv_cache_usage_ratio",
        "tidegate_worker_inflight",
        "tidegate_breaker_level",
        "tidegate_fallback_version_mismatch",
        "tidegate_rollout_wave",
        "tidegate_rollout_calls_total",
    }
)
"""Series read from Redis at scrape time, each carrying its `queue` label (test_metrics_contract checks it)."""


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, labels and strings removed)."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if word in _KEYWORDS or word.lower() in _NUMBER_WORDS:
            continue
        names.add(word)
    return names


def unknown_metrics(expr: str) -> set[str]:
    return metric_names(expr) - KNOWN_METRICS


_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}")


REQUIRED_ENV = {"REDIS_PASSWORD": "example-password"}
"""What an operator must set before compose starts (the file refuses to run without it)."""


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Resolve `${VAR}`, `${VAR:-default}`, `${VAR-default}` and `${VAR:?error}` as Compose does, from
    `env` only; a required variable that is missing raises ValueError with the file's message."""
    env = env or {}

    def replace(match: re.Match[str]) -> str:
        name, op, default = match.group("name"), match.group("op"), match.group("default") or ""
        if op in (":?", "?"):
            if not env.get(name):
                raise ValueError(f"{name}: {default}")
            return env[name]
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")

    return _INTERPOLATION.sub(replace, value)


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_yaml_documents(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


@cache
def compose() -> dict[str, Any]:
    """docker-compose.yml with YAML anchors and merge keys resolved (PyYAML does both)."""
    data: dict[str, Any] = load_yaml(COMPOSE_FILE)
    return data


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose()["services"]
    return services


def vllm_flags(args: list[str]) -> dict[str, str | None]:
    """`--flag value` pairs of a vLLM command line; a flag followed by another flag has no value."""
    flags: dict[str, str | None] = {}
    for index, token in enumerate(args):
        if not token.startswith("--"):
            continue
        following = args[index + 1] if index + 1 < len(args) else None
        flags[token] = following if following is not None and not following.startswith("--") else None
    return flags


def policy_thresholds() -> dict[str, int]:
    from shared.policy import load_policy

    alarms = load_policy(None).alarms
    return {"yellow": alarms.yellow, "orange": alarms.orange, "red": alarms.red}
