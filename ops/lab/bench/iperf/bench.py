"""`tidegate bench inference-perf`: inference-perf drives the front door once; its figures beside tidegate's.

One fresh stack (one simulated GPU, its worker, the monitor, the API) on a queue of its own, one
branch key whose default type makes each call a ticket of that type, one inference-perf run at a
Poisson rate below capacity. Then inference-perf's report, the queue's tickets and the API's
first-token histogram are read, and the comparison, the per-request gap, each process's CPU and
the machine's load average go into `results.json` beside every log.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ops.lab.bench.cpu import CpuMeter
from ops.lab.bench.iperf.compare import (
    agreement_holds,
    client_figures,
    compare,
    per_request_gap,
    ticket_figures,
)
from ops.lab.bench.iperf.config import LoadShape, Target, write_config
from ops.lab.bench.iperf.report import read_report
from ops.lab.bench.iperf.tickets import outcome_counts, read_tickets
from ops.lab.bench.iperf.tool import inference_perf_command, run_tool, tokenizer_dir
from ops.lab.bench.peers.venv import PeerUnavailable
from ops.lab.bench.server_time import histogram_buckets, quantile_bucket, quantile_ms
from ops.lab.bench.sim_probe import served_model
from ops.lab.procs.children import log_tail
from ops.lab.stack.stack import SimSettings, Stack, StackConfig
from producer.api.keys import ApiKeyStore, Role
from shared.metrics import E2E_TIME_TO_FIRST_TOKEN_SECONDS
from shared.policy import Policy

BRANCH = "iperf01"
RUN_OVERHEAD_S = 300.0
"""What inference-perf may take beyond its load: loading, generating prompts, the last answers, the report."""
E2E_TTFT = next(iter(E2E_TIME_TO_FIRST_TOKEN_SECONDS.describe())).name


@dataclass(frozen=True)
class IperfOptions:
    shape: LoadShape = field(default_factory=LoadShape)
    ticket_type: str = "complaint"
    profile: str = "a100-7b"
    time_scale: float = 1.0
    """Simulated GPU speed; 1 is the profile's own (an A100 serving a 7B model)."""


def wall_minus_monotonic() -> float | None:
    """The offset from the client's clock (perf_counter, CLOCK_MONOTONIC: one per machine on Linux)
    to tidegate's (wall time); None where perf_counter is another clock."""
    if sys.platform != "linux" or "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
        return None
    return time.time() - time.perf_counter()


def run_iperf_bench(
    redis_url: str,
    policy: Policy,
    run_dir: Path,
    options: IperfOptions,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run once and return the results document (also written to `run_dir/results.json`)."""
    slo_seconds = policy.type_policy(options.ticket_type).slo_seconds
    executable = inference_perf_command(progress)
    tokenizer = tokenizer_dir(executable, progress)
    run_dir.mkdir(parents=True, exist_ok=True)
    report_dir = run_dir / "reports"
    stack_config = StackConfig(
        redis_url=redis_url,
        queue_name=f"bench-iperf-{uuid.uuid4().hex[:8]}",
        run_dir=run_dir,
        gpus=1,
        sim=SimSettings(profile=options.profile, time_scale=options.time_scale),
    )
    shape = options.shape
    with Stack(stack_config) as stack:
        key, _ = ApiKeyStore(stack.redis, stack.queue_keys).create(
            Role.BRANCH, BRANCH, "bench inference-perf", default_type=options.ticket_type
        )
        target = Target(stack.api_url, key, served_model(stack.vllm_urls[0]), tokenizer, slo_seconds)
        config = write_config(run_dir / "inference-perf.yaml", shape, target, report_dir)
        progress(
            f"inference-perf: Poisson {shape.rate:g}/s for {shape.duration_s} s, {shape.prompt_tokens}-token "
            f"prompts, {shape.output_tokens} tokens out, as {options.ticket_type} tickets; config {config}"
        )
        histogram_before = histogram_buckets(stack.api_url, E2E_TTFT, type=options.ticket_type)
        meter = CpuMeter({child.name: child.pid for child in stack.children if child.pid is not None})
        load_before = os.getloadavg()
        meter.start()
        tool = run_tool(executable, config, run_dir / "inference-perf.log", shape.duration_s + RUN_OVERHEAD_S)
        cores = meter.stop()
        load_after = os.getloadavg()
        histogram_after = histogram_buckets(stack.api_url, E2E_TTFT, type=options.ticket_type)
        if tool.exit_code != 0:
            raise PeerUnavailable(
                f"inference-perf exited with code {tool.exit_code}; log {tool.log_path}:\n"
                f"{log_tail(tool.log_path)}"
            )
        summary, requests = read_report(report_dir)
        named = [r.ticket_id for r in requests if r.ticket_id]
        tickets, missing = read_tickets(stack.redis, stack.queue_keys, named)
        counts = outcome_counts(stack.redis, stack.queue_keys, options.ticket_type)
        queue = stack.queue_name
    rows = compare(client_figures(summary), ticket_figures(tickets))
    gap = per_request_gap(requests, tickets, wall_minus_monotonic())
    bucket = quantile_bucket(histogram_before, histogram_after, 0.5)
    document: dict[str, Any] = {
        "options": asdict(options) | {"requests": shape.requests},
        "queue": queue,
        "slo_seconds": slo_seconds,
        "agreement_holds": agreement_holds(rows),
        "rows": [row.to_dict() for row in rows],
        "client": asdict(summary),
        "tidegate": {
            "tickets": len(tickets),
            "statuses": {s: sum(t.status == s for t in tickets) for s in sorted({t.status for t in tickets})},
            "shed_codes": sorted(t.shed_code for t in tickets if t.shed_code),
            "named_but_unknown": missing,
            "counts": counts,
            "api_e2e_ttft": {
                "observed": (
                    histogram_after.get(float("inf"), 0.0) - histogram_before.get(float("inf"), 0.0)
                ),
                "p50_ms": round(quantile_ms(histogram_before, histogram_after, 0.5), 2),
                "p50_bucket_s": [b if math.isfinite(b) else None for b in bucket] if bucket else None,
            },
        },
        "gap": gap.to_dict(),
        "cpu_cores": cores | {"inference-perf": round(tool.cores, 3)},
        "inference_perf_wall_s": round(tool.wall_s, 1),
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "cpus": os.cpu_count(),
        "results_dir": str(run_dir),
    }
    (run_dir / "results.json").write_text(json.dumps(document, indent=2), encoding="utf-8")
    return document
