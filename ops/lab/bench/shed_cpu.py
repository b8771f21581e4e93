"""CPU per 429 inside the API process: the shed shortcut beside the route, interleaved.

    python -m ops.lab.bench.shed_cpu --rounds 5 --requests 300

Two apps of this version serve one private queue held at red, one with the shed shortcut and one
without; each round sends `requests` complaint POSTs straight into each app's ASGI callable (no
sockets, no HTTP parsing, one event loop) and reads this process's CPU time around them, the two
apps taking turns so a busy machine slows both alike. Each shed still writes its rejected record to
Redis (that round trip's wait is not CPU). Medians over rounds are printed, microseconds per request.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import typer
from fastapi import FastAPI

from ops.lab.bench.api_rate import COMPLAINT, _keep_red_once, delete_queue
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


async def _round(target: FastAPI, token: str, body: bytes, n: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per request over `n` sequential POSTs, each answered 429."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        status = await _post(target, token, body)
        if status != 429:
            raise RuntimeError(f"expected 429, got {status}")
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


@app.command()
def main(
    rounds: int = typer.Option(5, "--rounds", min=1),
    requests: int = typer.Option(300, "--requests", min=1, help="POSTs per app per round"),
    redis_url: str | None = typer.Option(None, "--redis-url", help="default: TIDEGATE_REDIS_URL or local"),
) -> None:
    """Microseconds of this process's CPU per 429: the shortcut beside the route."""
    url = resolve_redis_url(redis_url or os.environ.get("TIDEGATE_REDIS_URL"))
    queue = f"bench-shed-{uuid.uuid4().hex[:10]}"
    redis = make_client(url)
    settings = Settings(redis_url=url, queue_name=queue)
    token, _ = ApiKeyStore(redis, QueueKeys(queue)).create(Role.BRANCH, "0412", "bench")
    _keep_red_once(redis, QueueKeys(queue))
    apps = {
        "shortcut": create_app(
            settings, auth_cache_seconds=LONG_CACHE_S, admission_cache_seconds=LONG_CACHE_S
        ),
        "route": create_app(
            settings,
            auth_cache_seconds=LONG_CACHE_S,
            admission_cache_seconds=LONG_CACHE_S,
            shed_shortcut=False,
        ),
    }
    body = json.dumps(COMPLAINT).encode()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in apps}

    async def run() -> None:
        for target in apps.values():
            await _round(target, token, body, 20)  # warms the caches (the route answers the first)
        for _ in range(rounds):
            for name, target in apps.items():
                figures[name].append(await _round(target, token, body, requests))

    try:
        asyncio.run(run())
    finally:
        delete_queue(redis, queue)
        redis.close()
    for name, values in figures.items():
        cpu = statistics.median(v[0] for v in values)
        wall = statistics.median(v[1] for v in values)
        each = " · ".join(f"{v[0]:.0f}" for v in values)
        typer.echo(f"{name:9s} CPU {cpu:6.0f} µs/429 (rounds {each}), wall {wall:6.0f} µs/429")


if __name__ == "__main__":
    app()
