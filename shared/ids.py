"""Ticket ids that sort by creation time, so equal sorted-set scores still break ties FIFO."""

from __future__ import annotations

import base64
import os
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
# base64's C encoder writes RFC 4648 base32 digits; one translation makes them Crockford digits,
# so an id costs no Python loop per character.
_FROM_RFC4648 = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())
_ID_LENGTH = 26
_lock = threading.Lock()
_last_ms = 0
_counter = 0


def _b32(value: int, length: int) -> str:
    """`value` as `length` Crockford base32 digits, most significant first (the value fits 160 bits)."""
    digits = base64.b32encode(value.to_bytes(20, "big")).translate(_FROM_RFC4648)
    return digits[-length:].decode()


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
    return _b32((ms << 80) | (counter << 60) | rand, _ID_LENGTH)
