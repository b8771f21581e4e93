"""`tidegate bench gateway`: what the OpenAI front door adds to time to first token, and how many
concurrent streams one API process holds.

Two parts, one stack (simulator, one worker, one API process; no monitor, so nothing is shed):
- low load: the same streamed chat call, one at a time, alternating direct to the simulator and
  through tidegate, timed to the first content chunk with the same client code, so the difference
  is what the gateway adds (admission, queue, worker, live stream, relay);
- many streams: N streamed calls opened while no worker runs, so all of them wait at once; the
  API's resident memory is read then, a worker is started and every stream must complete. The API's
  CPU time over the whole part divided by the chunks it relayed is an upper bound on the cost per
  chunk (it includes admitting the N calls).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ops.lab.bench.cpu import process_cpu_seconds
from ops.lab.demo.run import delete_queue_keys
from ops.lab.stack.stack import SimSettings, Stack, StackConfig, WorkerSettings
from producer.api.keys import ApiKeyStore, Role
from shared.policy import default_policy_text
from shared.redis_conn import make_client

PROMPT = [{"role": "user", "content": "Summarise the account activity of customer 7781."}]


@dataclass(frozen=True)
class GatewayOptions:
    calls: int = 40
    """Low-load calls each way."""
    streams: int = 1000
    """Concurrent streams in the second part."""
    max_tokens: int = 16
    time_scale: float = 20.0
    """Simulated GPU speed-up: short answers, so the second part is about the API, not the GPU."""
    max_batch: int = 256


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _first_token_seconds(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]
) -> float:
    """Seconds from sending a streamed chat call to its first content chunk (the rest is drained)."""
    started = time.perf_counter()
    first: float | None = None
    with client.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"{url} streamed no content")
    return first


def low_load(stack: Stack, key: str, options: GatewayOptions) -> dict[str, Any]:
    sim_url = stack.vllm_urls[0]
    body = {"messages": PROMPT, "max_tokens": options.max_tokens, "stream": True}
    with httpx.Client(timeout=30) as client:
        model = client.get(sim_url + "/v1/models").json()["data"][0]["id"]
        Call = tuple[str, dict[str, Any], dict[str, str]]
        direct_call: Call = (sim_url + "/v1/chat/completions", {**body, "model": model}, {})
        gateway_call: Call = (
            stack.api_url + "/v1/chat/completions",
            {**body, "model": "tidegate"},
            {"Authorization": f"Bearer {key}"},
        )
        for call in (direct_call, gateway_call):  # warm both paths' connections and caches
            _first_token_seconds(client, *call)
        direct: list[float] = []
        gateway: list[float] = []
        for _ in range(options.calls):
            direct.append(_first_token_seconds(client, *direct_call))
            gateway.append(_first_token_seconds(client, *gateway_call))
    ms = {name: [v * 1000 for v in values] for name, values in (("direct", direct), ("gateway", gateway))}
    out: dict[str, Any] = {"calls": options.calls}
    for name, values in ms.items():
        out[name] = {"p50_ms": statistics.median(values), "p99_ms": _percentile(values, 0.99)}
    out["added_p50_ms"] = out["gateway"]["p50_ms"] - out["direct"]["p50_ms"]
    out["added_p99_ms"] = out["gateway"]["p99_ms"] - out["direct"]["p99_ms"]
    out["ratio_p50"] = out["gateway"]["p50_ms"] / out["direct"]["p50_ms"]
    return out


async def _one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> int:
    """Chunks of one streamed call, read to its end."""
    chunks = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks += 1
    return chunks


async def _wait_queued(stack: Stack, tasks: list[asyncio.Task[int]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while int(stack.redis.zcard(stack.queue_keys.pending)) < len(tasks):  # type: ignore[arg-type]
        failed = [t for t in tasks if t.done() and t.exception() is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} calls failed while opening: {failed[0].exception()!r}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {len(tasks)} calls reached the queue within {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def _many(stack: Stack, key: str, options: GatewayOptions, api_pid: int) -> dict[str, Any]:
    """N streams opened while no worker runs (so all wait at once), then a worker drains them."""
    url = stack.api_url + "/v1/chat/completions"
    body = {
        "model": "tidegate",
        "messages": PROMPT,
        "max_tokens": options.max_tokens,
        "stream": True,
        "tidegate": {"type": "archive_query"},  # the type with room for N queued tickets
    }
    limits = httpx.Limits(max_connections=options.streams + 10, max_keepalive_connections=0)
    stack.stop_worker(0)
    rss_before = _rss_bytes(api_pid)
    cpu_before = process_cpu_seconds(api_pid)
    started = time.monotonic()
    async with httpx.AsyncClient(
        timeout=300, limits=limits, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        tasks = [asyncio.create_task(_one_stream(client, url, body)) for _ in range(options.streams)]
        await _wait_queued(stack, tasks, 120)
        await asyncio.sleep(1.0)  # every call past admission and waiting on its stream
        rss_open = _rss_bytes(api_pid)
        opened_seconds = time.monotonic() - started
        stack.start_worker(0)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    seconds = time.monotonic() - started
    cpu_after = process_cpu_seconds(api_pid)
    completed = [r for r in results if isinstance(r, int) and r > 0]
    chunks = sum(completed)
    out: dict[str, Any] = {
        "streams": options.streams,
        "completed": len(completed),
        "failed": options.streams - len(completed),
        "seconds_to_open_all": round(opened_seconds, 2),
        "seconds_total": round(seconds, 2),
        "chunks_relayed": chunks,
        "rss_idle_mib": None if rss_before is None else round(rss_before / 2**20, 1),
        "rss_all_open_mib": None if rss_open is None else round(rss_open / 2**20, 1),
    }
    if rss_before is not None and rss_open is not None:
        out["kib_per_open_stream"] = round((rss_open - rss_before) / options.streams / 1024, 1)
    if cpu_before is not None and cpu_after is not None and chunks:
        out["api_cpu_seconds"] = round(cpu_after - cpu_before, 2)
        out["api_cpu_us_per_chunk"] = round((cpu_after - cpu_before) / chunks * 1e6, 1)
    errors = [repr(r) for r in results if isinstance(r, BaseException)][:3]
    if errors:
        out["first_errors"] = errors
    return out


def _policy_without_alarms(run_dir: Path, streams: int) -> Path:
    """The default policy with its alarm thresholds above N queued calls: nothing is shed here."""
    text = default_policy_text()
    alarms = "[alarms]\nyellow = 30\norange = 50\nred = 80\n"
    if alarms not in text:
        raise RuntimeError("the default policy's [alarms] table changed shape; update the gateway bench")
    high = f"[alarms]\nyellow = {streams * 10}\norange = {streams * 20}\nred = {streams * 30}\n"
    path = run_dir / "policy.toml"
    path.write_text(text.replace(alarms, high), encoding="utf-8")
    return path


def run_gateway_bench(redis_url: str, run_dir: Path, options: GatewayOptions) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    config = StackConfig(
        policy_file=str(_policy_without_alarms(run_dir, options.streams)),
        redis_url=redis_url,
        queue_name=f"bench-gateway-{uuid.uuid4().hex[:8]}",
        run_dir=run_dir,
        gpus=1,
        sim=SimSettings(time_scale=options.time_scale, max_num_seqs=options.max_batch),
        worker=WorkerSettings(max_batch=options.max_batch, log_level="warning"),
        start_monitor=False,
    )
    with Stack(config) as stack:
        try:
            key, _ = ApiKeyStore(stack.redis, stack.queue_keys).create(
                Role.BRANCH, "0001", "bench gateway", default_type="complaint"
            )
            api_pid = next(c.pid for c in stack.children if c.name == "api" and c.pid is not None)
            result = {"options": options.__dict__, "low_load": low_load(stack, key, options)}
            result["many_streams"] = asyncio.run(_many(stack, key, options, api_pid))
        finally:
            stack.stop()  # the processes first, so nothing writes the queue again
            with make_client(redis_url) as client:
                delete_queue_keys(client, config.queue_name)
    return result
