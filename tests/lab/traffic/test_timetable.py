"""The players' timetable: due order, popping only what is due, waking early, refusing once closed."""

from __future__ import annotations

import threading
import time

from ops.lab.traffic.timetable import Timetable


def test_items_come_out_by_due_time_then_push_order() -> None:
    timetable: Timetable[str] = Timetable()
    for due, item in [(3.0, "c"), (1.0, "a1"), (2.0, "b"), (1.0, "a2"), (1.0, "a3")]:
        assert timetable.push(due, item)
    assert len(timetable) == 5
    assert timetable.pop_due(10.0) == ["a1", "a2", "a3", "b", "c"]
    assert len(timetable) == 0


def test_pop_due_takes_only_what_is_due() -> None:
    timetable: Timetable[int] = Timetable()
    for due in (5.0, 1.0, 3.0, 2.0):
        timetable.push(due, int(due))
    assert timetable.pop_due(0.5) == []
    assert timetable.pop_due(2.0) == [1, 2]  # due exactly now counts as due
    assert len(timetable) == 2
    assert timetable.pop_due(4.0) == [3]
    assert timetable.pop_due(5.0) == [5]
    assert not timetable


def test_wait_ends_when_the_earliest_item_is_due() -> None:
    timetable: Timetable[str] = Timetable()
    timetable.push(time.monotonic() + 0.2, "soon")
    timetable.push(time.monotonic() + 60, "later")
    timetable.pop_due(time.monotonic())  # clears the wake-up the pushes left
    started = time.monotonic()
    timetable.wait(30)
    assert 0.15 <= time.monotonic() - started < 10
    assert timetable.pop_due(time.monotonic()) == ["soon"]


def test_a_push_wakes_a_waiter_early() -> None:
    timetable: Timetable[str] = Timetable()
    timetable.push(time.monotonic() + 60, "later")
    timetable.pop_due(time.monotonic())
    woke = threading.Event()

    def waiter() -> None:
        timetable.wait(30)
        woke.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert not woke.wait(0.2)  # nothing due for a minute: still asleep
    timetable.push(time.monotonic(), "now")
    assert woke.wait(10)
    thread.join(10)
    assert timetable.pop_due(time.monotonic()) == ["now"]


def test_wake_ends_a_wait_without_an_item() -> None:
    timetable: Timetable[str] = Timetable()
    timetable.pop_due(time.monotonic())
    timetable.wake()  # a wake-up after the last pop is not lost, even before the wait begins
    started = time.monotonic()
    timetable.wait(30)
    assert time.monotonic() - started < 10


def test_a_closed_timetable_drops_what_is_pending_and_refuses_pushes() -> None:
    timetable: Timetable[str] = Timetable()
    timetable.push(1.0, "pending")
    assert not timetable.closed
    timetable.close()
    assert timetable.closed
    assert len(timetable) == 0
    assert not timetable.push(0.0, "refused")
    assert timetable.pop_due(10.0) == []
