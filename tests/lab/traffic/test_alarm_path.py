from __future__ import annotations

import itertools

import pytest
from redis import Redis

from ops.lab.traffic.alarm_path import alarm_path
from ops.lab.traffic.timeseries import AlarmChange, events_trimmed_after
from shared.keys import QueueKeys


def changes(*levels: str) -> list[AlarmChange]:
    """One transition between each pair of `levels`, a second apart."""
    return [
        AlarmChange(t=float(i), at=1_000.0 + i, previous=a, level=b, depth=0)
        for i, (a, b) in enumerate(itertools.pairwise(levels))
    ]


def test_a_surge_that_rises_holds_and_comes_down_once_holds() -> None:
    path = alarm_path(changes("green", "yellow", "orange", "red", "orange", "yellow", "green"))
    assert path.holds
    assert (path.transitions, path.rises, path.red_entries, path.rises_after_fall) == (6, 3, 1, 0)
    assert path.levels == ("green", "yellow", "orange", "red", "orange", "yellow", "green")
    assert "up, hold, down" in path.line()


def test_red_orange_red_is_cycling_and_counts_each_return() -> None:
    path = alarm_path(changes("green", "orange", "red", "orange", "red", "orange", "red", "green"))
    assert not path.holds
    assert path.red_entries == 3
    assert path.rises_after_fall == 2
    assert "CYCLING (2 rises after a fall)" in path.line()


def test_a_fall_then_a_rise_below_red_is_cycling_too() -> None:
    path = alarm_path(changes("green", "yellow", "green", "yellow"))
    assert not path.holds
    assert path.red_entries == 0


def test_no_transitions_is_green_throughout_and_holds() -> None:
    path = alarm_path([])
    assert path.holds
    assert path.levels == ()
    assert path.line().endswith("green throughout")
    assert path.to_dict()["holds"] is True


def test_an_unknown_level_is_an_error_not_a_guess() -> None:
    with pytest.raises(KeyError):
        alarm_path(changes("green", "purple"))


def test_a_path_missing_transitions_is_unproven_not_holding() -> None:
    path = alarm_path(changes("green", "yellow", "orange"), complete=False)
    assert not path.holds
    assert "UNPROVEN" in path.line()
    assert path.to_dict()["holds"] is False


def test_a_trimmed_event_stream_is_told_from_the_id_it_was_read_after(
    redis_client: Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    assert not events_trimmed_after(redis_client, keys, "-")  # no stream yet
    ids = [redis_client.xadd(keys.events, {"kind": "alarm", "n": str(n)}) for n in range(3)]
    assert not events_trimmed_after(redis_client, keys, "-")
    redis_client.xtrim(keys.events, maxlen=2, approximate=False)  # drops the first
    assert events_trimmed_after(redis_client, keys, "-")
    assert not events_trimmed_after(redis_client, keys, str(ids[1]))  # read from a kept entry: all there
