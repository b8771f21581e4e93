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


_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
"""Two digits for each 10-bit value."""
_RANDOM_DIGIT = bytes(_ALPHABET.encode()[byte & 31] for byte in range(256))
"""One digit for each random byte: its low 5 bits (every digit equally likely)."""
_prefix_ms = -1
_prefix = ""


def new_ticket_id() -> str:
    """26 characters: 48-bit milliseconds, a 20-bit per-process counter and 60 random bits.

    Lexicographic order follows creation time (monotonic within a process), like a ULID. The
    fields fall on digit boundaries (2 leading zero bits + 48 = 10 digits, 20 = 4, 60 = 12), so each
    is written on its own: the milliseconds' digits once per millisecond, the counter from a table,
    the random digits straight from random bytes.
    """
    global _last_ms, _counter, _prefix_ms, _prefix
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
        if ms != _prefix_ms:
            _prefix_ms, _prefix = ms, _b32(ms, 10)
        prefix = _prefix
    return (
        prefix
        + _PAIRS[counter >> 10]
        + _PAIRS[counter & 1023]
        + os.urandom(12).translate(_RANDOM_DIGIT).decode()
    )
