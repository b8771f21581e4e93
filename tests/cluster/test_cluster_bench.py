"""`tidegate bench queue --cluster` on the session's cluster, at a size that only proves it runs."""

from __future__ import annotations

import os
import subprocess
import sys

from ops.lab.bench.cluster_bench import run, spread_names
from tests.redis_cluster import RedisClusterHarness


def test_spread_names_land_on_every_master_and_both_layouts_drain(
    redis_cluster_harness: RedisClusterHarness,
) -> None:
    url = redis_cluster_harness.seed_url
    names = spread_names(url, "bench-test")
    owners = {redis_cluster_harness.master_of("{tidegate:" + n + "}:pending").port for n in names}
    assert len(names) == len(owners) == 3
    doc = run(url, tickets=300, consumers=3, repeat=1).to_dict()
    assert doc["masters"] == 3
    assert doc["drain_per_second"]["one_queue"] > 0 and doc["drain_per_second"]["spread"] > 0
    assert doc["ratio_spread_to_one_queue"] > 0


def test_the_cluster_flag_names_the_settings_it_needs_on_a_single_redis(redis_url: str) -> None:
    env = {**os.environ, "TIDEGATE_REDIS_URL": redis_url, "TIDEGATE_REDIS_CLUSTER": "false"}
    done = subprocess.run(
        [sys.executable, "-c", "from tidegate.cli import main; main()", "bench", "queue", "--cluster"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "TIDEGATE_REDIS_CLUSTER=true" in done.stderr
    assert done.stdout == ""
