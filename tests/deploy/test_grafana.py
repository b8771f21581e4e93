"""The Grafana dashboard and its provisioning: every query reads known metrics, the panels the
operators need are there, the depth panel draws the alarm thresholds, and provisioning points at
the paths and the Prometheus that docker-compose.yml sets up."""

from __future__ import annotations

import json
from typing import Any

from tests.deploy.deploy_files import (
    GRAFANA_DIR,
    REDIS_STATE,
    compose_services,
    load_yaml,
    metric_names,
    policy_thresholds,
    unknown_metrics,
)

DASHBOARD = GRAFANA_DIR / "dashboards" / "tidegate.json"


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def exprs(panel: dict[str, Any]) -> list[str]:
    return [target["expr"] for target in panel["targets"]]


def panel_reading(metric: str) -> list[dict[str, Any]]:
    return [panel for panel in panels() if any(metric in metric_names(expr) for expr in exprs(panel))]


def threshold_values(panel: dict[str, Any]) -> list[float]:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [step["value"] for step in steps if step["value"] is not None]


def test_every_query_reads_known_metrics() -> None:
    for panel in panels():
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for expr in exprs(panel):
            assert metric_names(expr), f"{panel['title']!r}: {expr} reads no metric"
            assert not unknown_metrics(expr), f"{panel['title']!r} reads unknown {unknown_metrics(expr)}"


def test_ids_unique_and_panels_do_not_overlap() -> None:
    all_panels = dashboard()["panels"]
    ids = [panel["id"] for panel in all_panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in all_panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area


def test_depth_panel_per_type_with_alarm_threshold_lines() -> None:
    (depth,) = [panel for panel in panel_reading("tidegate_queue_depth") if panel["type"] == "timeseries"]
    assert any("by (type)" in expr for expr in exprs(depth))
    assert threshold_values(depth) == list(policy_thresholds().values())
    assert depth["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] in {
        "line",
        "dashed",
        "line+area",
    }


def test_alarm_level_names_each_level() -> None:
    (stat,) = [panel for panel in panel_reading("tidegate_alarm_level") if panel["type"] == "stat"]
    (mapping,) = stat["fieldConfig"]["defaults"]["mappings"]
    assert {key: value["text"] for key, value in mapping["options"].items()} == {
        "0": "green",
        "1": "yellow",
        "2": "orange",
        "3": "red",
    }


def test_throughput_by_outcome() -> None:
    assert any(
        "by (outcome)" in expr and "rate(tidegate_tickets_total" in expr
        for panel in panel_reading("tidegate_tickets_total")
        for expr in exprs(panel)
    )


def test_latency_p50_and_p99_per_type() -> None:
    queries = [expr for panel in panel_reading("tidegate_latency_seconds_bucket") for expr in exprs(panel)]
    for quantile in ("0.5", "0.99"):
        assert any(
            expr.startswith(f"histogram_quantile({quantile},") and "by (type, le)" in expr for expr in queries
        ), f"no p{quantile} latency per type"


def test_worker_panels() -> None:
    for metric in ("tidegate_batch_limit", "tidegate_kv_cache_usage_ratio", "tidegate_gpu_free_bytes"):
        assert any("by (worker, gpu)" in expr for panel in panel_reading(metric) for expr in exprs(panel)), (
            metric
        )
    (kv,) = panel_reading("tidegate_kv_cache_usage_ratio")
    assert threshold_values(kv) == [0.85]
    assert panel_reading("tidegate_gpu_total_bytes") == panel_reading("tidegate_gpu_free_bytes")


def test_panels_use_the_provisioned_datasource() -> None:
    (source,) = load_yaml(GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose_services()
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    chooser = variables["datasource"]
    assert (chooser["type"], chooser["query"]) == ("datasource", "prometheus")
    assert chooser["current"]["value"] == source["uid"], "the default is the provisioned datasource"
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_per_type_panels_follow_the_type_variable() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["type"]["definition"] == "label_values(tidegate_queue_depth, type)"
    assert variables["type"]["includeAll"] and variables["type"]["multi"]
    for panel in panels():
        for expr in exprs(panel):
            if "by (type" in expr:
                assert 'type=~"$type"' in expr, f"{panel['title']!r}: {expr} ignores the type variable"


def test_provider_reads_the_mounted_dashboards() -> None:
    (provider,) = load_yaml(GRAFANA_DIR / "provisioning" / "dashboards" / "tidegate.yml")["providers"]
    mounts = dict(volume.split(":")[:2] for volume in compose_services()["grafana"]["volumes"])
    assert mounts["./ops/deploy/grafana/dashboards"] == provider["options"]["path"]
    home = compose_services()["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def test_rollout_panels_show_the_wave_and_each_arms_calls() -> None:
    (wave,) = panel_reading("tidegate_rollout_wave")
    assert any("by (queue, version, status)" in expr for expr in exprs(wave))
    (calls,) = panel_reading("tidegate_rollout_calls_total")
    assert any("by (queue, arm, outcome)" in expr and "rate(" in expr for expr in exprs(calls))


def test_every_figure_read_from_redis_follows_the_queue_variable() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["queue"]["definition"] == "label_values(tidegate_queue_depth_all_types, queue)"
    assert variables["queue"]["includeAll"] and variables["queue"]["multi"]
    for panel in panels():
        for expr in exprs(panel):
            if metric_names(expr) & REDIS_STATE:
                assert 'queue=~"$queue"' in expr, f"{panel['title']!r}: {expr} ignores the queue variable"
