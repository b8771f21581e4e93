"""Can this machine carry a benchmark's simulator? Drive one with N closed-loop clients and report.

Starts `tidegate sim-vllm` as a subprocess, keeps `--clients` requests in flight for `--seconds`, and
prints what the clients got and what the simulator spent: its CPU share, and its own model-time view
(mean end-to-end latency, tokens per model second). When the simulator keeps pace, the model-time
figures do not depend on the time scale; when it falls behind they drift, which is the signal to
lower `--time-scale`.

    python -m ops.lab.sim.loadcheck --gpus 4 --clients 64 --time-scale 10 --seconds 8 [--stream]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import asdict, dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

from ops.lab.sim.process import SimulatorProcess


@dataclass(frozen=True)
class LoadReport:
    gpus: int
    clients: int
    time_scale: float
    stream: bool
    wall_s: float
    requests: int
    failed: int
    requests_per_wall_s: float
    sim_cpu_share: float
    mean_e2e_model_s: float
    generated_tokens_per_model_s: float


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metric_sums(base_url: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(requests.get(f"{base_url}/metrics", timeout=10).text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def run(
    *,
    gpus: int,
    clients: int,
    time_scale: float,
    seconds: float,
    stream: bool,
    prompt_tokens: int,
    max_tokens: int,
) -> LoadReport:
    body = {
        "prompt": [1 + i % 1000 for i in range(prompt_tokens)],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    statuses: list[int] = []
    lock = threading.Lock()
    with SimulatorProcess(gpus=gpus, time_scale=time_scale, log_level="warning") as sim:
        pid = sim.pid
        if pid is None:
            raise RuntimeError("the simulator process has no pid")
        deadline = time.monotonic() + seconds

        def client() -> None:
            session = requests.Session()
            while time.monotonic() < deadline:
                response = session.post(
                    f"{sim.base_url}/v1/completions", json=body, stream=stream, timeout=120
                )
                if stream:
                    for _ in response.iter_lines():
                        pass
                with lock:
                    statuses.append(response.status_code)

        cpu_before, started = _cpu_seconds(pid), time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - started
        cpu = _cpu_seconds(pid) - cpu_before
        sums = _metric_sums(sim.base_url)
    finished = sums.get("vllm:e2e_request_latency_seconds_count", 0.0)
    return LoadReport(
        gpus=gpus,
        clients=clients,
        time_scale=time_scale,
        stream=stream,
        wall_s=round(wall, 2),
        requests=len(statuses),
        failed=sum(status != 200 for status in statuses),
        requests_per_wall_s=round(len(statuses) / wall, 1),
        sim_cpu_share=round(cpu / wall, 3),
        mean_e2e_model_s=round(sums.get("vllm:e2e_request_latency_seconds_sum", 0.0) / max(finished, 1.0), 3),
        generated_tokens_per_model_s=round(
            sums.get("vllm:generation_tokens_total", 0.0) / (wall * time_scale), 1
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ops.lab.sim.loadcheck", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    report = run(
        gpus=args.gpus,
        clients=args.clients,
        time_scale=args.time_scale,
        seconds=args.seconds,
        stream=args.stream,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
    )
    print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
