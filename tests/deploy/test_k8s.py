"""Kubernetes manifests: built-in kinds validated against the Kubernetes OpenAPI schemas by
kubernetes-validate (strict: unknown fields fail); the KEDA ScaledObject, whose CRD schema is not
at hand, by structure; `kubectl kustomize` renders the base and the shared-GPU overlay when kubectl
is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ops.monitor.dispatch import ACTIONS_QUEUE, CALLBACKS_QUEUE
from tests.deploy.deploy_files import (
    CLI_COMMANDS,
    K8S_DIR,
    K8S_SHARED_GPU_DIR,
    PROMETHEUS_DIR,
    REPO,
    load_yaml,
    load_yaml_documents,
    policy_thresholds,
    unknown_metrics,
)
from worker.config import WorkerConfig

ALERTS = PROMETHEUS_DIR / "alerts.yml"
KUBERNETES_VERSION = "1.30"  # the oldest release the base is meant to apply to
DRA_KUBERNETES_VERSION = "1.34"  # resource.k8s.io/v1, which the shared-GPU overlay needs
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
SETTINGS_ENV = frozenset(f"TIDEGATE_{name.upper()}" for name in WorkerConfig.model_fields)
"""Every variable a process reads: the worker's settings extend the shared ones."""
OPERATOR_GROUPS = ("keda.sh/", "monitoring.coreos.com/")
"""Custom resources (KEDA, Prometheus operator) whose CRD schemas are not at hand: checked by structure."""
MANIFESTS = sorted(path for path in K8S_DIR.glob("*.yaml") if path.name != "kustomization.yaml")


def resources() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in MANIFESTS for doc in load_yaml_documents(path)]


def resource(kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in resources() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def tidegate_containers() -> list[tuple[str, dict[str, Any]]]:
    return [
        (doc["metadata"]["name"], container)
        for _, doc in resources()
        if doc["kind"] == "Deployment"
        for container in containers(doc).values()
        if container["image"].startswith("tidegate:")
    ]


def test_every_manifest_has_identity() -> None:
    assert MANIFESTS
    for path, doc in resources():
        assert doc["apiVersion"] and doc["kind"], path
        assert doc["metadata"]["name"], path
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tidegate", path


def test_builtin_kinds_match_the_kubernetes_schema() -> None:
    checked = 0
    for path, doc in resources():
        if doc["apiVersion"].startswith(OPERATOR_GROUPS):
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )
        checked += 1
    custom = [doc for _, doc in resources() if doc["apiVersion"].startswith(OPERATOR_GROUPS)]
    assert len(custom) == 5, "the ScaledObject, two ServiceMonitors, a PodMonitor, a PrometheusRule"
    assert checked == len(resources()) - len(custom)


def test_schema_validation_catches_a_typo() -> None:
    worker = resource("Deployment", "tidegate-worker")
    worker["spec"]["template"]["spec"]["containers"][1]["livenesProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml(K8S_DIR / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == [path.name for path in MANIFESTS]
    assert kustomization["namespace"] == resource("Namespace", "tidegate")["metadata"]["name"]


def test_worker_pod_owns_one_gpu_and_probes_both_containers() -> None:
    worker = resource("Deployment", "tidegate-worker")
    pod = containers(worker)
    assert set(pod) == {"vllm", "worker"}
    gpus = [c["resources"].get("limits", {}).get("nvidia.com/gpu", 0) for c in pod.values()]
    assert sum(gpus) == 1, "one GPU per worker pod"
    assert pod["vllm"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    for container in pod.values():
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in container, f"{container['name']} lacks {probe}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert pod["worker"][probe]["exec"]["command"] == ["tidegate", "worker", "--check"]
    args = pod["worker"]["args"]
    assert args[: args.index("--gpu") + 2] == ["worker", "--gpu", "0"]
    assert args[args.index("--vllm-url") + 1] == "http://127.0.0.1:8000"
    assert worker["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 60, "time to return leased tickets on shutdown"


def test_tidegate_containers_run_real_commands_with_known_settings() -> None:
    found = tidegate_containers()
    assert {name for name, _ in found} == {
        "tidegate-api",
        "tidegate-monitor",
        "tidegate-rq-worker",
        "tidegate-worker",
    }
    for name, container in found:
        if "command" not in container:
            assert container["args"][0] in CLI_COMMANDS, f"{name} runs `tidegate {container['args'][0]}`"
        for env in container.get("env", []):
            if env["name"].startswith("TIDEGATE_"):
                assert env["name"] in SETTINGS_ENV, f"{name} sets {env['name']}, unknown to Settings"
        assert {"secretRef": {"name": "tidegate-redis"}} in container["envFrom"], (
            f"{name} lacks the Redis URL"
        )
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        assert mounts["/etc/tidegate"] == "policy", f"{name} does not mount the policy"


def test_rq_worker_serves_the_action_queues() -> None:
    rq = containers(resource("Deployment", "tidegate-rq-worker"))["rq-worker"]
    assert rq["command"] == ["rq"]
    assert rq["args"][:2] == ["worker", "--with-scheduler"]
    assert rq["args"][rq["args"].index("--url") + 1] == "$(TIDEGATE_REDIS_URL)"
    assert rq["args"][-2:] == [ACTIONS_QUEUE, CALLBACKS_QUEUE]


def test_secret_holds_the_redis_url() -> None:
    secret = resource("Secret", "tidegate-redis")
    assert set(secret["stringData"]) == {"TIDEGATE_REDIS_URL"}
    assert secret["stringData"]["TIDEGATE_REDIS_URL"].startswith("redis://")


def test_policy_configmap_is_the_default_policy() -> None:
    configmap = resource("ConfigMap", "tidegate-policy")
    shipped = tomllib.loads(configmap["data"]["policy.toml"])
    default = tomllib.loads((REPO / "shared" / "default_policy.toml").read_text(encoding="utf-8"))
    assert shipped == default, "ops/deploy/k8s/configmap-policy.yaml drifted from shared/default_policy.toml"


def test_api_service_routes_to_the_api_port() -> None:
    service = resource("Service", "tidegate-api")
    api = containers(resource("Deployment", "tidegate-api"))["api"]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in api["ports"]}
    assert (
        service["spec"]["selector"]
        == resource("Deployment", "tidegate-api")["spec"]["selector"]["matchLabels"]
    )
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/livez", "liveness must not depend on Redis"


def test_monitor_has_a_standby() -> None:
    """Monitors elect an acting one through a Redis lock, so a second replica is a hot standby."""
    monitor = resource("Deployment", "tidegate-monitor")
    assert monitor["spec"]["replicas"] >= 2


def test_keda_scales_workers_on_queue_depth() -> None:
    scaled = resource("ScaledObject", "tidegate-worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "tidegate-worker")
    assert 1 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    # KEDA rejects trigger metadata that is not a string, a classic mistake with `threshold: 30`.
    assert all(isinstance(value, str) for value in metadata.values()), metadata
    assert "tidegate_queue_depth_all_types" in metadata["query"]
    assert not unknown_metrics(metadata["query"])
    assert int(metadata["threshold"]) == policy_thresholds()["yellow"]
    assert metadata["serverAddress"].startswith("http")


def kustomize(folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@needs_kubectl
def test_kustomize_renders_the_base() -> None:
    rendered = kustomize(K8S_DIR)
    assert sorted(doc["kind"] for doc in rendered) == sorted(doc["kind"] for _, doc in resources())
    for doc in rendered:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "tidegate", doc["metadata"]["name"]


def test_shared_gpu_claim_template_matches_the_schema() -> None:
    (template,) = load_yaml_documents(K8S_SHARED_GPU_DIR / "resourceclaimtemplate.yaml")
    kubernetes_validate.validate(template, DRA_KUBERNETES_VERSION, strict=True)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 1


@needs_kubectl
def test_shared_gpu_overlay_gives_both_containers_one_gpu() -> None:
    rendered = kustomize(K8S_SHARED_GPU_DIR)
    for doc in rendered:
        if not doc["apiVersion"].startswith(OPERATOR_GROUPS):
            kubernetes_validate.validate(doc, DRA_KUBERNETES_VERSION, strict=True)
    (worker,) = [
        doc
        for doc in rendered
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "tidegate-worker"
    ]
    (template,) = [doc for doc in rendered if doc["kind"] == "ResourceClaimTemplate"]
    (claim,) = worker["spec"]["template"]["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    pod = containers(worker)
    for container in pod.values():
        assert container["resources"]["claims"] == [{"name": claim["name"]}], container["name"]
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {}), container["name"]
        assert "nvidia.com/gpu" not in container["resources"].get("requests", {}), container["name"]
    backend = {env["name"]: env.get("value") for env in pod["worker"]["env"]}["TIDEGATE_GPU_BACKEND"]
    assert backend == "nvml"


def _pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def _port_names(deployment: dict[str, Any]) -> set[str]:
    return {p["name"] for c in containers(deployment).values() for p in c.get("ports", []) if "name" in p}


def test_disruption_budgets_keep_a_pod_of_each_service() -> None:
    budgets = [doc for _, doc in resources() if doc["kind"] == "PodDisruptionBudget"]
    assert {b["metadata"]["name"] for b in budgets} == {"tidegate-api", "tidegate-monitor", "tidegate-worker"}
    for budget in budgets:
        deployment = resource("Deployment", budget["metadata"]["name"])
        selector = budget["spec"]["selector"]["matchLabels"]
        assert selector.items() <= _pod_labels(deployment).items(), budget["metadata"]["name"]
        if "minAvailable" in budget["spec"]:
            assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"], (
                "a drain could never proceed"
            )
        else:
            assert budget["spec"]["maxUnavailable"] >= 1


def test_prometheus_operator_scrapes_every_component_under_the_rules_job_names() -> None:
    rule_jobs = set(re.findall(r'job="([^"]+)"', ALERTS.read_text()))
    seen_jobs: set[str] = set()
    for _, doc in resources():
        if doc["kind"] == "ServiceMonitor":
            (service,) = [
                svc
                for _, svc in resources()
                if svc["kind"] == "Service"
                and doc["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
            ]
            ports = {p["name"] for p in service["spec"]["ports"]}
            assert {e["port"] for e in doc["spec"]["endpoints"]} <= ports, doc["metadata"]["name"]
            seen_jobs.add(service["metadata"]["labels"][doc["spec"]["jobLabel"]])
        elif doc["kind"] == "PodMonitor":
            deployment = resource("Deployment", doc["metadata"]["name"])
            assert doc["spec"]["selector"]["matchLabels"].items() <= _pod_labels(deployment).items()
            assert {e["port"] for e in doc["spec"]["podMetricsEndpoints"]} <= _port_names(deployment)
            seen_jobs.add(_pod_labels(deployment)[doc["spec"]["jobLabel"]])
    assert rule_jobs <= seen_jobs, (
        f"rules read up{{job=...}} for {sorted(rule_jobs - seen_jobs)}, never scraped"
    )


def test_prometheus_rule_carries_the_alert_rules_file() -> None:
    (rule,) = [doc for _, doc in resources() if doc["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == load_yaml(ALERTS)["groups"], (
        "ops/deploy/k8s/base/prometheus-operator.yaml differs from ops/deploy/prometheus/alerts.yml"
    )


def test_the_worker_keeps_a_week_of_image_history_for_a_one_command_rollback() -> None:
    worker = resource("Deployment", "tidegate-worker")
    assert worker["spec"]["revisionHistoryLimit"] >= 7, "at least a week of daily releases to undo to"
    guide = (REPO / "ops" / "deploy" / "README.md").read_text(encoding="utf-8")
    assert "kubectl -n tidegate rollout undo deployment/tidegate-worker" in guide
