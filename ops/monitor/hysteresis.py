"""The alarm level as a pure state machine over (depth, time) samples, with hysteresis.

Raising is immediate: a depth above a level's threshold raises to that level at once, and a jump
over several thresholds yields one transition per level crossed (green→yellow, yellow→orange, …) so
every level's action runs and each transition is recorded exactly once. Clearing is slow: a level
drops one step only after depth has stayed below `threshold − clear_margin` for
`clear_hold_seconds` without a break, so depth hovering around a threshold cannot make it flap.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.policy import AlarmLevel, AlarmPolicy


@dataclass(frozen=True)
class Transition:
    previous: AlarmLevel
    level: AlarmLevel
    depth: int
    at: float

    @property
    def raised(self) -> bool:
        return self.level > self.previous


class AlarmTracker:
    """Tracks the alarm level of one queue; feed it every sample with `observe`."""

    def __init__(
        self, alarms: AlarmPolicy, level: AlarmLevel = AlarmLevel.GREEN, since: float | None = None
    ) -> None:
        self.alarms = alarms
        self.level = level
        self.since = since
        # Per raised level: when depth last went below its clear line (None while it is above).
        self._below_since: dict[AlarmLevel, float | None] = {}

    def clear_line(self, level: AlarmLevel) -> int:
        """Depth below which `level` starts counting towards clearing.

        With no margin a level clears once depth no longer exceeds its threshold, so a threshold of 0
        can still clear at depth 0.
        """
        margin = self.alarms.clear_margin
        return self.alarms.threshold(level) - margin if margin > 0 else self.alarms.threshold(level) + 1

    def observe(self, depth: int, now: float) -> list[Transition]:
        """Feed one sample; returns the transitions it causes, oldest first (usually none)."""
        if self.since is None:
            # The level held before any transition began with the first sample, not with each one.
            self.since = now
        transitions: list[Transition] = []
        for level in (AlarmLevel.YELLOW, AlarmLevel.ORANGE, AlarmLevel.RED):
            if level > self.level and depth > self.alarms.threshold(level):
                transitions.append(self._move(level, depth, now))
        self._track_clear_lines(depth, now)
        if not transitions and self.level > AlarmLevel.GREEN:
            below = self._below_since.get(self.level)
            if below is not None and now - below >= self.alarms.clear_hold_seconds:
                transitions.append(self._move(AlarmLevel(self.level - 1), depth, now))
        return transitions

    def _track_clear_lines(self, depth: int, now: float) -> None:
        for level in (AlarmLevel.YELLOW, AlarmLevel.ORANGE, AlarmLevel.RED):
            if level > self.level:
                self._below_since.pop(level, None)
            elif depth < self.clear_line(level):
                if self._below_since.get(level) is None:
                    self._below_since[level] = now
            else:
                self._below_since[level] = None

    def _move(self, level: AlarmLevel, depth: int, now: float) -> Transition:
        transition = Transition(self.level, level, depth, now)
        self.level = level
        self.since = now
        return transition
