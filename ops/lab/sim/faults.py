"""Injected faults for tests and drills: a share of requests answered with an error status, and
extra latency before every answer. Set at start (`--error-rate`, `--error-status`,
`--extra-latency-s`) and changed at run time with `POST /sim/faults`, so a test can open a breaker
and close it again against one simulator."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from http import HTTPStatus

_KNOWN_STATUSES = frozenset(int(status) for status in HTTPStatus)
FIELDS = ("error_rate", "error_status", "extra_latency_s")
MAX_EXTRA_LATENCY_S = 600.0


class FaultError(ValueError):
    """A fault setting that cannot be used; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Faults:
    error_rate: float = 0.0
    error_status: int = 500
    extra_latency_s: float = 0.0

    def checked(self) -> Faults:
        """Self, or FaultError naming the first field out of range."""
        if not 0.0 <= self.error_rate <= 1.0:
            raise FaultError("error_rate", f"error_rate={self.error_rate} is not accepted; use 0 to 1")
        if not 400 <= self.error_status <= 599 or self.error_status not in _KNOWN_STATUSES:
            raise FaultError(
                "error_status",
                f"error_status={self.error_status} is not accepted; use an HTTP status 400-599",
            )
        if not 0.0 <= self.extra_latency_s <= MAX_EXTRA_LATENCY_S:
            raise FaultError(
                "extra_latency_s",
                f"extra_latency_s={self.extra_latency_s} is not accepted; use 0 to {MAX_EXTRA_LATENCY_S:g} seconds",
            )
        return self

    def updated(self, changes: Mapping[str, object]) -> Faults:
        """A copy with `changes` (a JSON object of some of FIELDS) applied and checked."""
        values: dict[str, float | int] = {}
        for name, value in changes.items():
            if name not in FIELDS:
                raise FaultError(name, f"unknown field {name!r}; accepted: {', '.join(FIELDS)}")
            number_ok = isinstance(value, int | float) and not isinstance(value, bool)
            if name == "error_status" and not (isinstance(value, int) and not isinstance(value, bool)):
                raise FaultError(name, f"error_status must be an integer HTTP status; got {value!r}")
            if not number_ok:
                raise FaultError(name, f"{name} must be a number; got {value!r}")
            values[name] = value  # type: ignore[assignment]
        return replace(self, **values).checked()  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


class FaultInjector:
    """The faults in force, shared by every request handler of one simulator."""

    def __init__(self, faults: Faults, seed: int = 0) -> None:
        self._faults = faults.checked()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    @property
    def faults(self) -> Faults:
        with self._lock:
            return self._faults

    def set(self, faults: Faults) -> None:
        with self._lock:
            self._faults = faults.checked()

    async def before_request(self) -> int | None:
        """Wait out the extra latency; the status to fail this request with, or None."""
        delay = self.faults.extra_latency_s
        if delay > 0:
            await asyncio.sleep(delay)
        with self._lock:  # read again: a fault set while this request waited applies to it, as
            faults = self._faults  # a server that breaks fails the requests it is holding
            fail = faults.error_rate > 0 and self._rng.random() < faults.error_rate
        return faults.error_status if fail else None
