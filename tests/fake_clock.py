"""One stand-in for shared/clock.py, so a test moves time instead of sleeping through it."""

from __future__ import annotations

import pytest

from shared import clock


class FakeClock:
    """Both `clock.now` and `clock.monotonic` read `at`, which only `advance` moves.

    Start it at the real time where Redis keeps real TTLs beside the patched scores."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.at = start

    def __call__(self) -> float:
        return self.at

    def advance(self, seconds: float) -> float:
        self.at += seconds
        return self.at

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeClock:
        monkeypatch.setattr(clock, "now", self)
        monkeypatch.setattr(clock, "monotonic", self)
        return self
