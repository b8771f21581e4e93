"""Free loopback ports and HTTP readiness checks for the processes a stack starts."""

from __future__ import annotations

import socket

import requests


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out; the child binds it moments later (a retry covers the race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether GET `url` answers 200 right now."""
    try:
        return requests.get(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False
