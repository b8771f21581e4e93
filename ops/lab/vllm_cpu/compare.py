"""Replay one seeded workload against real vLLM-CPU and the simulator, and compare latency percentiles.

The workload is open-loop: requests arrive as a Poisson process whatever the server does, each with
its own random token-id prompt and `ignore_eos`, so both servers do exactly the same work. The prompt
lengths are the workload; their token ids are drawn afresh for every replay, because vLLM's prefix
cache (on by default) would otherwise serve a repeated replay's prompts from the cache. Both run the same engine settings; the simulator runs the `cpu-llama-80m`
profile in real time, so wall-clock latencies compare directly. vLLM gets one unmeasured replay first.

    python -m ops.lab.vllm_cpu.compare --requests 40 --rate 1.5 --rounds 3 --seed 1
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import requests

from ops.lab.sim.process import SimulatorProcess
from ops.lab.sim.profiles import get_profile
from ops.lab.vllm_cpu.calibrate import calibrate, fixed_work_body
from ops.lab.vllm_cpu.server import VllmCpuServer

PROFILE = "cpu-llama-80m"
KV_BLOCKS = 64
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 2048
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Request:
    at: float
    prompt_tokens: int
    max_tokens: int
    vocab: int

    def prompt(self, salt: str) -> list[int]:
        rng = random.Random(f"{salt}-{self.at}")
        return [rng.randrange(10, self.vocab) for _ in range(self.prompt_tokens)]


@dataclass(frozen=True)
class Outcome:
    ttft: float
    e2e: float
    tokens: int


def workload(count: int, rate: float, seed: int, vocab: int) -> list[Request]:
    """Poisson arrivals; prompts log-uniform over 32-512 tokens, outputs uniform over 16-128."""
    rng = random.Random(seed)
    at = 0.0
    out: list[Request] = []
    for _ in range(count):
        at += rng.expovariate(rate)
        length = round(math.exp(rng.uniform(math.log(32), math.log(512))))
        out.append(Request(at=at, prompt_tokens=length, max_tokens=rng.randint(16, 128), vocab=vocab))
    return out


def send(base_url: str, model: str, request: Request, salt: str) -> Outcome:
    body = fixed_work_body(model, request.prompt(salt), request.max_tokens)
    sent = time.monotonic()
    first: float | None = None
    chunks = 0
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=TIMEOUT_S) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                chunks += 1
                if first is None:
                    first = time.monotonic()
    done = time.monotonic()
    if first is None:
        raise RuntimeError(f"no token came back for a {request.prompt_tokens}-token prompt")
    return Outcome(ttft=first - sent, e2e=done - sent, tokens=chunks)


def replay(base_url: str, model: str, requests_: list[Request], salt: str) -> list[Outcome]:
    outcomes: list[Outcome | None] = [None] * len(requests_)
    errors: list[str] = []
    start = time.monotonic()

    def run(index: int) -> None:
        request = requests_[index]
        time.sleep(max(0.0, start + request.at - time.monotonic()))
        try:
            outcomes[index] = send(base_url, model, request, salt)
        except (requests.RequestException, RuntimeError) as error:
            errors.append(f"request {index}: {error}")

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(requests_))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(requests_)} requests failed: {errors[:3]}")
    return [outcome for outcome in outcomes if outcome is not None]


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@contextmanager
def real_server() -> Iterator[str]:
    profile = get_profile(PROFILE)
    with VllmCpuServer(
        kv_cache_bytes=KV_BLOCKS * profile.block_bytes,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy="fcfs",
        served_model_name=profile.model,
    ) as server:
        yield server.base_url


@contextmanager
def sim_server(**overrides: float) -> Iterator[str]:
    flags: dict[str, object] = {
        "profile": PROFILE,
        "kv_blocks": KV_BLOCKS,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_model_len": MAX_MODEL_LEN,
        "scheduling_policy": "fcfs",
        "time_scale": 1.0,
        "log_level": "warning",
        **overrides,
    }
    with SimulatorProcess(**flags) as sim:  # type: ignore[arg-type]  # flags are --option values
        yield sim.base_url


def fitted_overrides(base_url: str, model: str, vocab: int) -> dict[str, float]:
    """The simulator flags that `calibrate` fits to the server as it runs right now."""
    fitted = calibrate(base_url, model, vocab, decode_tokens=96, seed=7)
    return {
        "decode_step_s": fitted.decode_step_s,
        "per_seq_slowdown": fitted.per_seq_slowdown_s,
        "prefill_tokens_per_s": fitted.prefill_tokens_per_s,
        "decode_attention_s": fitted.decode_attention_s,
        "prefill_attention_s": fitted.prefill_attention_s,
    }


def _ttft(outcome: Outcome) -> float:
    return outcome.ttft


def _e2e(outcome: Outcome) -> float:
    return outcome.e2e


def _tpot(outcome: Outcome) -> float:
    return (outcome.e2e - outcome.ttft) / max(1, outcome.tokens - 1)


Replay = tuple[str, float, list[Outcome]]
METRICS = (
    ("TTFT p50 (s)", _ttft, 50, 1.0),
    ("TTFT p99 (s)", _ttft, 99, 1.0),
    ("e2e latency p50 (s)", _e2e, 50, 1.0),
    ("e2e latency p99 (s)", _e2e, 99, 1.0),
    ("time per output token p50 (ms)", _tpot, 50, 1e3),
)


def table(rounds: list[Replay]) -> str:
    """Each figure is the median over rounds: one round disturbed by other work on the machine is outvoted."""
    rows = ["| metric | vLLM-CPU | simulator | simulator / vLLM |", "|---|---|---|---|"]
    for label, pick, q, unit in METRICS:
        value = {
            server: statistics.median(
                percentile([pick(o) for o in outcomes], q) for name, _, outcomes in rounds if name == server
            )
            for server in ("vLLM-CPU", "simulator")
        }
        real, sim = value["vLLM-CPU"], value["simulator"]
        rows.append(f"| {label} | {real * unit:.3f} | {sim * unit:.3f} | {sim / real:.2f} |")
    rows += [
        "",
        "| round | server | 1-min load before | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, (name, before, outcomes) in enumerate(rounds, start=1):
        figures = [percentile([pick(o) for o in outcomes], q) for _, pick, q, _ in METRICS[:4]]
        rows.append(f"| {index} | {name} | {before:.1f} | " + " | ".join(f"{f:.3f}" for f in figures) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.lab.vllm_cpu.compare", description=__doc__)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=1.5, help="mean arrivals per second")
    parser.add_argument("--rounds", type=int, default=3, help="replays per server, alternating")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="fit the simulator to the real server first, in today's conditions, instead of the profile",
    )
    args = parser.parse_args(argv)
    profile = get_profile(PROFILE)
    load = workload(args.requests, args.rate, args.seed, profile.vocab_size)
    rounds: list[Replay] = []
    with real_server() as real_url:
        overrides = fitted_overrides(real_url, profile.model, profile.vocab_size) if args.calibrate else {}
        # The first replay after startup ran 5-8% slower than later ones (first-use allocations and
        # kernel set-up); one unmeasured replay keeps that out of the rounds.
        replay(real_url, profile.model, load, "warm-up")
        with sim_server(**overrides) as sim_url:
            urls = {"vLLM-CPU": real_url, "simulator": sim_url}
            for round_ in range(args.rounds):
                # Alternate which server goes first, so drift in the machine's load falls on both alike.
                order = list(urls) if round_ % 2 == 0 else list(reversed(urls))
                for name in order:
                    before = os.getloadavg()[0]
                    outcomes = replay(urls[name], profile.model, load, f"{name}-{round_}")
                    rounds.append((name, before, outcomes))
    print(
        f"{args.requests} requests x {args.rounds} rounds, Poisson {args.rate}/s, seed {args.seed}, "
        f"{MAX_NUM_SEQS} seqs, {KV_BLOCKS} KV blocks, fcfs\n"
    )
    if overrides:
        print("simulator fitted first: " + ", ".join(f"{k}={v:.5g}" for k, v in overrides.items()) + "\n")
    print(table(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
