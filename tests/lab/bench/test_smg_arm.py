"""The SMG arm, quickly: SMG's priority scheduler in front of one simulator answers each class.

SMG is a lab extra (`pip install smg`, about 150 MB, into ~/.cache/tidegate/peers/smg), never a
dependency of tidegate's tests. This test runs when that virtualenv is already there, or when
TIDEGATE_TEST_SMG=1 allows it to be installed (about 30 s); otherwise, or when the install fails, it
is skipped with the reason. Once installed it takes a few seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import requests

from ops.lab.bench.open_loop import OpenLoopPlayer, OpenLoopSettings
from ops.lab.bench.peer_runs import worker_batch
from ops.lab.bench.peers.smg import PRIORITY_HEADER, SmgGateway, smg_class, smg_command
from ops.lab.bench.peers.venv import PeerUnavailable, peers_dir
from ops.lab.sim.process import SimulatorProcess
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy


def _smg() -> Path:
    if not (peers_dir() / "smg" / "bin" / "smg").exists() and os.environ.get("TIDEGATE_TEST_SMG") != "1":
        pytest.skip("SMG is not installed under ~/.cache/tidegate/peers/smg; TIDEGATE_TEST_SMG=1 installs it")
    try:
        return smg_command()
    except PeerUnavailable as exc:
        pytest.skip(f"SMG cannot be installed here: {exc}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_smg_admits_each_class_through_its_priority_scheduler(tmp_path: Path, policy: Policy) -> None:
    executable = _smg()
    types = ("loan_approval", "complaint", "archive_query")
    plan = [
        PlannedArrival(index, index * 0.05, types[index % 3], f"b{index}", prompt_tokens=20, max_tokens=8)
        for index in range(6)
    ]
    with SimulatorProcess(time_scale=20) as sim:
        gateway = SmgGateway([sim.base_url], worker_batch(), tmp_path).start(executable)
        try:
            workers = requests.get(f"{gateway.url}/workers", timeout=5).json()["workers"]

            def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
                body = {"model": workers[0]["model_id"], "prompt": "hello", "max_tokens": arrival.max_tokens}
                return gateway.url, body, {PRIORITY_HEADER: smg_class(policy, arrival.type)}

            player = OpenLoopPlayer(
                plan, policy, shape, OpenLoopSettings(honouring=frozenset(), drain_timeout_s=30)
            )
            player.start()
            assert player.wait(60), "the SMG arm's player did not finish"
            player.close()
            metrics = requests.get(f"{gateway.url}/metrics", timeout=5)
        finally:
            gateway.stop()
    assert workers[0]["labels"]["max_running_requests"] == str(worker_batch())
    assert [r.outcome for r in player.records.values()] == ["done"] * len(plan), player.shed_codes
    assert sum(player.usage.values()) > 0
    if metrics.status_code == 200:  # the scheduler's own count, when the main port serves /metrics
        assert 'smg_scheduler_admit_total{class="bulk",outcome="admitted"}' in metrics.text
