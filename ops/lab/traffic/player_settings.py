"""How the simulated branches behave: how they retry a shed request, poll and give up."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field
from typing import Literal

RetryMode = Literal["retry-after", "fixed", "none"]
RETRY_MODES: tuple[RetryMode, ...] = ("retry-after", "fixed", "none")


@dataclass(frozen=True)
class RetryPolicy:
    """How a shed branch retries: as told (`retry-after`), after a fixed pause, or not at all."""

    mode: RetryMode = "retry-after"
    fixed_delay_s: float = 1.0
    max_attempts: int = 5
    jitter: float = 0.1
    """Each pause is stretched by up to this fraction, so branches do not retry in lockstep."""

    def __post_init__(self) -> None:
        if self.mode not in RETRY_MODES:
            raise ValueError(f"retry mode {self.mode!r} is not accepted; use {'|'.join(RETRY_MODES)}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts} is not accepted; use at least 1")
        if self.fixed_delay_s < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(
                f"fixed_delay_s={self.fixed_delay_s} must be ≥ 0 and jitter={self.jitter} in [0, 1]"
            )

    def delay(self, retry_after: float | None, rng: random.Random) -> float | None:
        """Seconds before the next attempt, or None when this client does not retry."""
        if self.mode == "none":
            return None
        base = self.fixed_delay_s if self.mode == "fixed" or retry_after is None else retry_after
        return base * (1 + rng.uniform(0, self.jitter))


@dataclass(frozen=True)
class PlayerSettings:
    clients: int = 24
    """Client threads sending requests at once."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    poll_first_s: float = 0.5
    poll_growth: float = 1.5
    poll_max_s: float = 3.0
    request_timeout_s: float = 15.0
    drain_timeout_s: float = 60.0
    """After the last planned arrival, how long to wait for tickets to end before cancelling them."""
    run_tag: str = field(default_factory=lambda: f"traffic-{secrets.token_hex(4)}")
    """Prefix of idempotency keys, unique per run so two runs on one queue never collide."""

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError(f"clients={self.clients} is not accepted; use at least 1")
