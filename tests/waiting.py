"""The one way a test waits: poll a condition until it holds, bounded, failing with what it awaited.

Never a fixed sleep as synchronisation: a sleep long enough on a loaded machine is a waste on an
idle one, and one short enough on an idle machine fails on a loaded one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INTERVAL = 0.02
"""Seconds between polls; callers that poll a large page (a /metrics scrape) pass a longer one."""


def _poll(
    predicate: Callable[[], T], timeout: float, interval: float, ignoring: tuple[type[BaseException], ...]
) -> tuple[T | None, float | None]:
    start = time.monotonic()
    while True:
        try:
            value = predicate()
        except ignoring:  # not up yet (refused, loading): ask again
            value = None
        took = time.monotonic() - start
        if value:
            return value, took
        if took > timeout:
            return None, None
        time.sleep(interval)  # the poll interval of every wait: the condition is asked again


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    message: str,
    *,
    interval: float = INTERVAL,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `predicate` until it returns something truthy, and return that; after `timeout`
    seconds fail naming `message`. Exceptions of the types in `ignoring` count as not yet."""
    value, took = _poll(predicate, timeout, interval, ignoring)
    if took is None:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
    return value  # type: ignore[return-value]  # truthy, so not None


def seconds_until(
    predicate: Callable[[], object], timeout: float, *, interval: float = INTERVAL
) -> float | None:
    """The seconds until `predicate` held, or None when it did not within `timeout`."""
    return _poll(predicate, timeout, interval, ())[1]


def waited(
    predicate: Callable[[], object], timeout: float, message: str, *, interval: float = INTERVAL
) -> float:
    """The seconds until `predicate` held; fails naming `message` when it did not within `timeout`."""
    took = seconds_until(predicate, timeout, interval=interval)
    if took is None:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
    return took
