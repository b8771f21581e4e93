"""The live stream of a ticket's answer: what the worker writes and the API relays.

A Redis Stream per ticket (`QueueKeys.live`) rather than pub/sub, so a reader that connects late or
reconnects (an API restart) reads from where it left off, and a bounded length and an expiry, so a
stream nobody reads costs nothing for long. Entries are flat field maps; `kind` says which.
"""

from __future__ import annotations

from enum import StrEnum

EXTRA_ENTRIES = 16
"""Room beyond one entry per token for the end and retry markers."""
LINGER_SECONDS = 60.0
"""How long a finished stream stays readable for a reader that reconnects."""


class LiveKind(StrEnum):
    TOKEN = "token"
    """`text`: the next piece of the answer."""
    RETRY = "retry"
    """The attempt failed and the ticket went back to the queue; the answer starts over."""
    END = "end"
    """`status` (done | failed), `finish_reason`, `prompt_tokens`, `completion_tokens`, `error`."""


def max_entries(max_tokens: int) -> int:
    """The stream's length cap: one entry per token it may write, plus the markers."""
    return max(max_tokens, 1) + EXTRA_ENTRIES


def expiry_seconds(remaining_ttl: float) -> int:
    """Whole seconds a stream lives: the ticket's remaining time plus the linger."""
    return max(int(remaining_ttl + LINGER_SECONDS), 1)
