"""CPU per submission inside the API process: the submit shortcut beside the route, interleaved.

    python -m ops.lab.bench.submit_cpu --answer 429 --rounds 5 --requests 300
    python -m ops.lab.bench.submit_cpu --answer 202 --rounds 5 --requests 300

Two apps of this version serve one private queue, one with the submit shortcut and one without;
each round sends `requests` POSTs straight into each app's ASGI callable (no sockets, no HTTP
parsing, one event loop) and reads this process's CPU time around them, the two apps taking turns
so a busy machine slows both alike. `--answer 429`: complaints to a queue held at red, each shed
still writing its rejected record to Redis; `--answer 202`: loans accepted into a queue whose caps
and alarm thresholds no run reaches. The Redis round trip's wait is not CPU. Medians over rounds
are printed, microseconds per request.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import typer
from fastapi import FastAPI

from ops.lab.bench.api_rate import COMPLAINT, LOAN, _keep_red_once, delete_queue, roomy_policy_text
from producer.api.app import create_app
from producer.api.keys import ApiKeyStore, Role
from shared.config import Settings
from shared.keys import QueueKeys
from shared.redis_conn import make_client, resolve_redis_url

app = typer.Typer(add_completion=False)
LONG_CACHE_S = 3600.0


async def _post(target: FastAPI, token: str, body: bytes) -> int:
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/tickets",
        "raw_path": b"/v1/tickets",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"bench"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await target(scope, receive, send)
    return status


async def _round(target: FastAPI, token: str, body: bytes, n: int, answer: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per request over `n` sequential POSTs, each answered `answer`."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        status = await _post(target, token, body)
        if status != answer:
            raise RuntimeError(f"expected {answer}, got {status}")
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


@app.command()
def main(
    answer: int = typer.Option(429, "--answer", help="429: sheds at red; 202: accepted loans"),
    rounds: int = typer.Option(5, "--rounds", min=1),
    requests: int = typer.Option(300, "--requests", min=1, help="POSTs per app per round"),
    redis_url: str | None = typer.Option(None, "--redis-url", help="default: TIDEGATE_REDIS_URL or local"),
) -> None:
    """Microseconds of this process's CPU per answer: the shortcut beside the route."""
    if answer not in (202, 429):
        raise typer.BadParameter("202 or 429", param_hint="--answer")
    url = resolve_redis_url(redis_url or os.environ.get("TIDEGATE_REDIS_URL"))
    queue = f"bench-submit-{uuid.uuid4().hex[:10]}"
    redis = make_client(url)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as policy_file:
        policy_file.write(roomy_policy_text())
    settings = Settings(
        redis_url=url, queue_name=queue, policy_file=policy_file.name if answer == 202 else None
    )
    token, _ = ApiKeyStore(redis, QueueKeys(queue)).create(Role.BRANCH, "0412", "bench")
    if answer == 429:
        _keep_red_once(redis, QueueKeys(queue))
    apps = {
        "shortcut": create_app(
            settings, auth_cache_seconds=LONG_CACHE_S, admission_cache_seconds=LONG_CACHE_S
        ),
        "route": create_app(
            settings,
            auth_cache_seconds=LONG_CACHE_S,
            admission_cache_seconds=LONG_CACHE_S,
            submit_shortcut=False,
        ),
    }
    body = json.dumps(COMPLAINT if answer == 429 else LOAN).encode()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in apps}

    async def run() -> None:
        for target in apps.values():
            await _round(target, token, body, 20, answer)  # warms the caches (the route answers the first)
        for _ in range(rounds):
            for name, target in apps.items():
                figures[name].append(await _round(target, token, body, requests, answer))

    try:
        asyncio.run(run())
    finally:
        delete_queue(redis, queue)
        redis.close()
        Path(policy_file.name).unlink(missing_ok=True)
    for name, values in figures.items():
        cpu = statistics.median(v[0] for v in values)
        wall = statistics.median(v[1] for v in values)
        each = " · ".join(f"{v[0]:.0f}" for v in values)
        typer.echo(f"{name:9s} CPU {cpu:6.0f} µs/{answer} (rounds {each}), wall {wall:6.0f} µs/{answer}")


if __name__ == "__main__":
    app()
