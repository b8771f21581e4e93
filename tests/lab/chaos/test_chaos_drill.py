"""`tidegate chaos --quick`: the whole drill on a stack of its own, in CI time, books balanced."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

QUICK_BUDGET_SECONDS = 180
TIDEGATE = [sys.executable, "-c", "from tidegate.cli import main; main()"]


@pytest.mark.slow
@pytest.mark.timeout(QUICK_BUDGET_SECONDS + 60)
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_quick_drill_balances_the_books_after_every_step(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [*TIDEGATE, "chaos", "--quick", "--json", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=QUICK_BUDGET_SECONDS + 60,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == [
        "worker kill -9",
        "Redis restart",
        "simulator crash",
        "error burst",
        "slow answers",
        "Redis stall",
        "all tickets ended",
    ]
    assert all(s["balanced"] for s in report["steps"]), report["steps"]
    assert "breaker instant:opened" in steps["error burst"]["system"]
    # Refusing new tickets needs every primary open at once (tests/faults covers it); here the
    # two endpoints' circuits open and close on their own clocks.
    assert "503" in steps["Redis stall"]["system"]
    assert (
        "running" not in steps["all tickets ended"]["books"]
        and "queued" not in steps["all tickets ended"]["books"]
    )
    assert took < QUICK_BUDGET_SECONDS
    assert "-> worker kill -9" in done.stderr  # each step is printed as it runs


def test_chaos_help_names_the_quick_drill() -> None:
    done = subprocess.run(
        [*TIDEGATE, "chaos", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--quick" in done.stdout
