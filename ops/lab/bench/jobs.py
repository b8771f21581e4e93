"""Jobs the benchmarks hand to RQ (they must be importable by an RQ worker)."""

from __future__ import annotations


def noop() -> None:
    """An RQ job that does nothing, to measure RQ's own overhead."""
