"""Ticket ids that sort by creation time, so equal sorted-set scores still break ties FIFO."""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
_lock = threading.Lock()
_last_ms = 0
_counter = 0


def _b32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_ticket_id() -> str:
    """26 characters: 48-bit milliseconds, a 20-bit per-process counter and 60 random bits.

    Lexicographic order follows creation time (monotonic within a process), like a ULID.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _counter += 1
            if _counter >= 1 << 20:
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _counter = 0
        counter = _counter
    rand = int.from_bytes(os.urandom(8), "big") >> 4
    return _b32(ms, 10) + _b32(counter, 4) + _b32(rand, 12)
