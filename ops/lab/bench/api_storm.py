"""A retry storm against the API: many keep-alive clients, each sending again soon after every
answer, on one asyncio loop (hundreds of threads would measure the load generator instead).

A client waits a random 0 to 2 × `pause_s` after each answer (mean `pause_s`), far sooner than the
Retry-After it was given, as a badly behaved branch system would; every answer's round trip and
status is recorded.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class StormAnswers:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0


def request_bytes(host: str, path: str, token: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    await reader.readexactly(length)
    return status


async def _client(
    host: str, port: int, request: bytes, stop_at: float, pause_s: float, seed: int, out: StormAnswers
) -> None:
    rng = random.Random(seed)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        await asyncio.sleep(rng.uniform(0, 2 * pause_s))  # clients do not start in lockstep
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            writer.write(request)
            status = await _read_answer(reader)
            out.latencies.append(time.perf_counter() - started)
            out.statuses[status] = out.statuses.get(status, 0) + 1
            await asyncio.sleep(rng.uniform(0, 2 * pause_s))
    finally:
        writer.close()


def storm(
    base_url: str, path: str, token: str, body: bytes, clients: int, seconds: float, pause_s: float
) -> StormAnswers:
    """`clients` clients POSTing `body` for `seconds`, each pausing about `pause_s` between tries."""
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = request_bytes(f"{host}:{port}", path, token, body)
    out = StormAnswers()

    async def run() -> None:
        stop_at = time.monotonic() + seconds
        await asyncio.gather(
            *(_client(host, port, request, stop_at, pause_s, i, out) for i in range(clients))
        )

    started = time.monotonic()
    asyncio.run(run())
    out.seconds = time.monotonic() - started
    return out
