"""The alarm's path through one run: how often the level changed, and whether it cycled.

The promise is a level that rises with a surge, holds and comes down once: a level that falls and
rises again within the run is cycling, whatever the levels. The path is read from the monitor's own
transition events (`read_alarm_changes`), not from a timeline's samples, so a flip shorter than the
sampling interval still counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ops.lab.traffic.timeseries import AlarmChange
from shared.policy import AlarmLevel


@dataclass(frozen=True)
class AlarmPath:
    levels: tuple[str, ...]
    """The levels in the order they were held, starting from the first transition's previous one."""
    transitions: int
    rises: int
    red_entries: int
    rises_after_fall: int
    """Transitions up that came after a transition down: each one is a cycle."""
    complete: bool = True
    """False when the capped event stream dropped transitions of the run: the path is then unproven."""

    @property
    def holds(self) -> bool:
        """Up, hold, down: no level was entered again from below after the level had fallen (and
        no transition of the run is missing)."""
        return self.rises_after_fall == 0 and self.complete

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {"holds": self.holds}

    def line(self) -> str:
        if not self.complete:
            shape = "UNPROVEN (the event stream dropped some of the run's transitions)"
        elif self.holds:
            shape = "up, hold, down"
        else:
            shape = f"CYCLING ({self.rises_after_fall} rises after a fall)"
        return f"alarm: {self.transitions} transitions, red entered {self.red_entries} time(s), {shape}: " + (
            " → ".join(self.levels) or "green throughout"
        )


def alarm_path(changes: Sequence[AlarmChange], complete: bool = True) -> AlarmPath:
    """The path of `changes`, oldest first (`complete`: none of the run's are missing); an unknown
    level name is an error, not a guess."""
    levels: list[str] = []
    rises = red_entries = rises_after_fall = 0
    fallen = False
    for change in changes:
        previous, level = AlarmLevel.parse(change.previous), AlarmLevel.parse(change.level)
        if not levels:
            levels.append(previous.label)
        levels.append(level.label)
        if level > previous:
            rises += 1
            rises_after_fall += fallen
            red_entries += level is AlarmLevel.RED
        elif level < previous:
            fallen = True
    return AlarmPath(tuple(levels), len(changes), rises, red_entries, rises_after_fall, complete)
