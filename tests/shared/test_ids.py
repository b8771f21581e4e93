"""Ticket ids: 26 Crockford base32 digits that sort by creation time (milliseconds, then a per-process
counter), with 60 random bits after them."""

from __future__ import annotations

import time

import pytest

from shared import ids

MS = 1_796_643_489_449


def _value(ticket_id: str) -> int:
    value = 0
    for digit in ticket_id:
        value = value * 32 + ids._ALPHABET.index(digit)
    return value


@pytest.fixture
def clock_ms(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The milliseconds `new_ticket_id` reads; the test moves them."""
    now = [MS]
    monkeypatch.setattr(time, "time_ns", lambda: now[0] * 1_000_000)
    monkeypatch.setattr(ids, "_last_ms", 0)
    monkeypatch.setattr(ids, "_counter", 0)
    return now


def test_an_id_holds_its_millisecond_its_counter_and_random_bits(clock_ms: list[int]) -> None:
    first, second = ids.new_ticket_id(), ids.new_ticket_id()
    for ticket_id in (first, second):
        assert len(ticket_id) == 26 and set(ticket_id) <= set(ids._ALPHABET)
    assert _value(first) >> 80 == MS and _value(second) >> 80 == MS
    assert (_value(first) >> 60) & 0xFFFFF == 0 and (_value(second) >> 60) & 0xFFFFF == 1
    assert _value(first) >> 128 == 0  # two leading zero bits: the milliseconds fill 10 digits


def test_ids_sort_by_creation_across_milliseconds_and_a_clock_that_steps_back(clock_ms: list[int]) -> None:
    made = [ids.new_ticket_id() for _ in range(1100)]
    clock_ms[0] += 1
    made += [ids.new_ticket_id() for _ in range(3)]
    clock_ms[0] -= 5  # the wall clock stepped back: ids still rise
    made += [ids.new_ticket_id() for _ in range(3)]
    clock_ms[0] += 10  # past the ids handed out ahead of the clock
    made.append(ids.new_ticket_id())
    assert made == sorted(made) and len(set(made)) == len(made)
    assert [_value(i) >> 80 for i in made[-7:]] == [MS + 1] * 6 + [MS + 6]
    assert (_value(made[1099]) >> 60) & 0xFFFFF == 1099  # the counter crosses a digit pair


def test_the_counter_overflowing_moves_to_the_next_millisecond(
    clock_ms: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ids, "_last_ms", MS)
    monkeypatch.setattr(ids, "_counter", (1 << 20) - 1)
    ticket_id = ids.new_ticket_id()
    assert _value(ticket_id) >> 80 == MS + 1 and (_value(ticket_id) >> 60) & 0xFFFFF == 0


def test_the_random_digits_differ_between_ids_of_one_millisecond(clock_ms: list[int]) -> None:
    tails = {ids.new_ticket_id()[14:] for _ in range(200)}
    assert len(tails) == 200
    assert set("".join(tails)) == set(ids._ALPHABET)  # every digit turns up in 2,400 random ones
