"""A running request as other threads see it: whether its first token came, and how to cut it off.

Cutting a request off shuts its socket down, which vLLM sees as a disconnect and answers by freeing
the request's KV blocks.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

import requests


class RequestAborted(Exception):
    """The request was cut off on purpose (cancel, lost lease, expiry, shutdown); `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RequestHandle:
    """What other threads see of a running request: whether its first token came, and `abort`.

    Closing a socket from another thread does not wake a blocked read on Linux; shutting it down
    does, so `abort` shuts down the response's socket and the reading thread sees the stream end.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._closer: Callable[[], None] | None = None
        self.first_token_at: float | None = None
        """Set (once) by the reading thread; shutdown gives back tickets that have none."""

    @property
    def reason(self) -> str | None:
        with self._lock:
            return self._reason

    def abort(self, reason: str) -> bool:
        """Stop the request; False when it was already aborted (the first reason stands)."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            closer = self._closer
        if closer is not None:
            closer()
        return True

    def attach(self, closer: Callable[[], None]) -> None:
        with self._lock:
            self._closer = closer
            aborted = self._reason is not None
        if aborted:
            closer()

    def detach(self) -> None:
        with self._lock:
            self._closer = None

    def check(self) -> None:
        reason = self.reason
        if reason is not None:
            raise RequestAborted(reason)


def shutdown_socket(response: requests.Response) -> Callable[[], None]:
    def close() -> None:
        sock = _socket_of(response)
        if sock is not None:
            # OSError: already closed by the peer, and the reader has its end of stream anyway.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        response.close()

    return close


def _socket_of(response: requests.Response) -> socket.socket | None:
    raw: Any = response.raw
    connection = getattr(raw, "_connection", None) or getattr(raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        return sock
    fp = getattr(getattr(raw, "_fp", None), "fp", None)
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None
