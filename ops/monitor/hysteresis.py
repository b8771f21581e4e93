"""The alarm level as a pure state machine over (depth, time) samples, with hysteresis.

The level follows a smoothed measure, not the last sample: depth averaged over `window_seconds`
(time-weighted: each sample holds until the next), so a worker claiming a batch, which moves a
hundred tickets out of the queue at once and lets arrivals refill it within half a second, moves the
measure little. Raising is immediate once the measure is above a level's threshold, and a jump over
several thresholds yields one transition per level crossed (green→yellow, yellow→orange, …) so every
level's action runs and each transition is recorded exactly once. Clearing is slow: a level drops
one step only after the measure has stayed below `threshold − clear_margin` for `clear_hold_seconds`
without a break. A minimum dwell keeps a surge's walk monotone: no step down within
`min_dwell_seconds` of the last change, and no step up within it after a step down.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from shared.policy import AlarmLevel, AlarmPolicy


@dataclass(frozen=True)
class Transition:
    previous: AlarmLevel
    level: AlarmLevel
    depth: int
    """The measure (smoothed depth) that caused it."""
    at: float

    @property
    def raised(self) -> bool:
        return self.level > self.previous


class DepthWindow:
    """Depth averaged over the last `seconds`, each sample holding until the next one; with no time
    between the samples yet (or `seconds` = 0) the measure is the latest sample."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, depth: int, now: float) -> int:
        if self._samples and now < self._samples[-1][0]:
            self._samples.clear()  # the clock went back: start over
        self._samples.append((now, depth))
        start = now - self.seconds
        while len(self._samples) > 1 and self._samples[1][0] <= start:
            self._samples.popleft()
        area = 0.0
        for (at, held), (until, _) in zip(self._samples, list(self._samples)[1:], strict=False):
            area += held * (until - max(at, start))
        span = now - max(self._samples[0][0], start)
        return depth if span <= 0 else round(area / span)


class AlarmTracker:
    """Tracks the alarm level of one queue; feed it every sample with `observe`."""

    def __init__(
        self, alarms: AlarmPolicy, level: AlarmLevel = AlarmLevel.GREEN, since: float | None = None
    ) -> None:
        self.alarms = alarms
        self.level = level
        self.since = since
        self.window = DepthWindow(alarms.window_seconds)
        self._stepped_down = False
        """The last change was a step down (a step up then waits out the dwell)."""
        # Per raised level: when the measure last went below its clear line (None while it is above).
        self._below_since: dict[AlarmLevel, float | None] = {}

    def clear_line(self, level: AlarmLevel) -> int:
        """Measure below which `level` starts counting towards clearing.

        With no margin a level clears once the measure no longer exceeds its threshold, so a threshold
        of 0 can still clear at depth 0.
        """
        margin = self.alarms.clear_margin
        return self.alarms.threshold(level) - margin if margin > 0 else self.alarms.threshold(level) + 1

    def _dwelt(self, now: float) -> bool:
        return self.since is None or now - self.since >= self.alarms.min_dwell_seconds

    def observe(self, depth: int, now: float) -> list[Transition]:
        """Feed one sample; returns the transitions it causes, oldest first (usually none)."""
        if self.since is None:
            # The level held before any transition began with the first sample, not with each one.
            self.since = now
        measure = self.window.add(depth, now)
        transitions: list[Transition] = []
        if not self._stepped_down or self._dwelt(now):
            for level in (AlarmLevel.YELLOW, AlarmLevel.ORANGE, AlarmLevel.RED):
                if level > self.level and measure > self.alarms.threshold(level):
                    transitions.append(self._move(level, measure, now))
        self._track_clear_lines(measure, now)
        if not transitions and self.level > AlarmLevel.GREEN and self._dwelt(now):
            below = self._below_since.get(self.level)
            if below is not None and now - below >= self.alarms.clear_hold_seconds:
                transitions.append(self._move(AlarmLevel(self.level - 1), measure, now))
        return transitions

    def _track_clear_lines(self, measure: int, now: float) -> None:
        for level in (AlarmLevel.YELLOW, AlarmLevel.ORANGE, AlarmLevel.RED):
            if level > self.level:
                self._below_since.pop(level, None)
            elif measure < self.clear_line(level):
                if self._below_since.get(level) is None:
                    self._below_since[level] = now
            else:
                self._below_since[level] = None

    def _move(self, level: AlarmLevel, measure: int, now: float) -> Transition:
        transition = Transition(self.level, level, measure, now)
        self._stepped_down = level < self.level
        self.level = level
        self.since = now
        return transition
