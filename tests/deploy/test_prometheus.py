"""Prometheus scrape config and alert rules: structure here, and promtool when it is installed
(Debian's `prometheus` package): `check config`, `check rules`, and the rule unit tests in
prometheus_alerts_test.yml, which feed series and assert when each alert fires."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deploy_files import (
    ALERT_TESTS,
    PROMETHEUS_DIR,
    REPO,
    load_yaml,
    metric_names,
    policy_thresholds,
    unknown_metrics,
)
from worker.config import WorkerConfig

CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES = PROMETHEUS_DIR / "alerts.yml"
SEVERITIES = {"info", "warning", "critical"}
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)


def rules() -> dict[str, dict[str, Any]]:
    groups = load_yaml(RULES)["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def scrape_jobs() -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in load_yaml(CONFIG)["scrape_configs"]}


def test_metric_name_extraction() -> None:
    """The checks below are only as good as this: it finds names and skips functions and labels."""
    expr = 'sum by (type) (rate(tidegate_tickets_total{outcome="failed"}[5m])) / on(type) group_left other_metric'
    assert metric_names(expr) == {"tidegate_tickets_total", "other_metric"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))") == {
        "x_bucket"
    }
    assert unknown_metrics("tidegate_queue_depth_totl > 30") == {"tidegate_queue_depth_totl"}


def test_scrape_jobs_cover_every_process() -> None:
    jobs = scrape_jobs()
    assert jobs["tidegate-api"]["static_configs"][0]["targets"] == ["api:8080"]
    assert jobs["tidegate-monitor"]["static_configs"][0]["targets"] == ["monitor:9108"]
    (workers,) = jobs["tidegate-worker"]["dns_sd_configs"]
    assert (workers["names"], workers["port"]) == (["workers"], 9109)
    (vllm,) = jobs["vllm"]["dns_sd_configs"]
    assert "vllm" in vllm["names"] and vllm["port"] == 8000
    assert load_yaml(CONFIG)["rule_files"] == ["alerts.yml"]


def test_alert_rules_are_complete() -> None:
    found = rules()
    expected = {
        "TidegateQueueDepthYellow",
        "TidegateQueueDepthOrange",
        "TidegateQueueDepthRed",
        "TidegateWorkerDown",
        "TidegateKvCacheHigh",
        "TidegateTicketFailureRate",
        "TidegateVllmErrors",
    }
    assert expected <= set(found)
    for name, rule in found.items():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name} needs an explicit `for:` duration"
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_alert_expressions_use_known_metrics() -> None:
    for name, rule in rules().items():
        assert metric_names(rule["expr"]), f"{name} reads no metric"
        assert not unknown_metrics(rule["expr"]), f"{name} reads unknown {unknown_metrics(rule['expr'])}"


def test_depth_thresholds_follow_the_policy() -> None:
    """The alert thresholds are the policy's alarm thresholds, so an edit to one shows up here."""
    found = rules()
    for level, threshold in policy_thresholds().items():
        expr = found[f"TidegateQueueDepth{level.capitalize()}"]["expr"]
        assert re.fullmatch(
            rf"max by \(queue\) \(tidegate_queue_depth_all_types\) > {threshold}", expr.strip()
        ), expr
        assert found[f"TidegateQueueDepth{level.capitalize()}"]["labels"]["alarm"] == level


def test_kv_alert_uses_the_high_watermark() -> None:
    watermark = WorkerConfig.model_fields["kv_high_watermark"].default
    assert rules()["TidegateKvCacheHigh"]["expr"].endswith(f"> {watermark}")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=REPO)


@needs_promtool
def test_promtool_check_config_and_rules() -> None:
    result = promtool("check", "config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_rule_unit_tests() -> None:
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_rule_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """The unit tests bite: lowering the yellow threshold makes them fail."""
    rules_dir = tmp_path / "ops" / "deploy" / "prometheus"
    tests_dir = tmp_path / "tests" / "deploy"
    rules_dir.mkdir(parents=True)
    tests_dir.mkdir(parents=True)
    yellow = policy_thresholds()["yellow"]
    text = RULES.read_text().replace(
        f"max by (queue) (tidegate_queue_depth_all_types) > {yellow}",
        "max by (queue) (tidegate_queue_depth_all_types) > 5",
    )
    (rules_dir / "alerts.yml").write_text(text)
    shutil.copy(ALERT_TESTS, tests_dir / ALERT_TESTS.name)
    result = promtool("test", "rules", str(tests_dir / ALERT_TESTS.name))
    assert result.returncode != 0
    assert "TidegateQueueDepthYellow" in result.stdout + result.stderr
