"""The machine a benchmark ran on, recorded with its figures: a number means little without it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import redis


def _memory_total() -> str | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 1024**2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return platform.processor() or None


def describe_machine(redis_url: str | None = None) -> dict[str, Any]:
    """CPUs, memory, OS, Python and (when given a URL) the Redis server's version."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory": _memory_total(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average_1_5_15_min": [round(value, 2) for value in os.getloadavg()]
        if hasattr(os, "getloadavg")
        else None,
    }
    if redis_url:
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=2, decode_responses=True)
        try:
            server: Any = client.info("server")
            info["redis"] = str(server.get("redis_version", "unknown"))
        except redis.RedisError as exc:
            info["redis"] = f"unknown ({exc})"
        finally:
            client.close()
    return info
