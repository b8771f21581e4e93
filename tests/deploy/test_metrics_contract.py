"""The metric names the alert rules, dashboard and autoscaler read are the ones the code exports:
a /metrics registry built by shared.metrics over a real (empty, private) queue in Redis is parsed
and every family the deployment files rely on must be in it."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from shared.metrics import build_registry
from shared.policy import Policy
from tests.deploy.deploy_files import REDIS_STATE, TIDEGATE_FAMILIES


def test_deployment_metrics_are_exported(redis_client: Redis, policy: Policy, queue_name: str) -> None:
    registry = build_registry(redis_client, policy, queue_name)
    exposition = generate_latest(registry).decode()
    exported = {family.name for family in text_string_to_metric_families(exposition)}
    missing = TIDEGATE_FAMILIES - exported
    assert not missing, f"the deployment files read {sorted(missing)}, which shared.metrics does not export"


def test_exactly_the_figures_read_from_redis_carry_the_queue_label(
    redis_client: Redis, policy: Policy, queue_name: str
) -> None:
    exposition = generate_latest(
        build_registry(redis_client, policy, queue_name, include_process=False)
    ).decode()
    samples = [s for family in text_string_to_metric_families(exposition) for s in family.samples]
    labelled = {s.name for s in samples if s.labels.get("queue") == queue_name}
    assert labelled <= REDIS_STATE, f"{sorted(labelled - REDIS_STATE)} carry a queue label; list them"
    unlabelled = {s.name for s in samples if s.name in REDIS_STATE and "queue" not in s.labels}
    assert not unlabelled, f"{sorted(unlabelled)} are read from Redis but carry no queue label"
