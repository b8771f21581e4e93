"""Canary waves of a model rollout, decided without I/O.

A rollout moves through waves 0..9. Wave k routes to the candidate every branch whose digit is k
or lower, so a branch joins at its own wave and stays: a branch ending in 3 runs on the candidate
from wave 3 on. After wave 9 every branch is on the candidate and the rollout is complete.

A branch's digit is the last character of its id when that is a digit; otherwise (`hq`,
`branch-x`) it is the first byte of the id's SHA-256 modulo 10, which is stable across
processes, hosts and Python versions (unlike `hash()`), so every worker routes the branch alike.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import StrEnum

WAVES = 10
"""Waves 0..9; a rollout past wave 9 is complete (everyone on the candidate)."""
LAST_WAVE = WAVES - 1

ARMS = ("candidate", "primary")
"""The two arms compared: the candidate endpoint and the control (the primary)."""


class RolloutStatus(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    """The wave holds: its branches stay on the candidate, nothing advances until resumed."""
    ROLLED_BACK = "rolled_back"
    COMPLETE = "complete"


ACTIVE = frozenset({RolloutStatus.RUNNING, RolloutStatus.PAUSED})
"""Statuses in which the candidate serves the started waves and shadow traffic flows."""


def branch_digit(branch_id: str) -> int:
    """The digit that puts a branch in a wave: its id's last character, or a stable hash digit."""
    last = branch_id[-1:] if branch_id else ""
    if last.isascii() and last.isdigit():
        return int(last)
    return hashlib.sha256(branch_id.encode("utf-8")).digest()[0] % 10


def routes_to_candidate(branch_id: str, status: RolloutStatus, wave: int) -> bool:
    """Whether a ticket of `branch_id` runs on the candidate while the rollout is `status` at `wave`."""
    if status is RolloutStatus.COMPLETE:
        return True
    if status not in ACTIVE:
        return False
    return branch_digit(branch_id) <= wave


@dataclass(frozen=True)
class RolloutState:
    """One queue's rollout as stored in its `rollout` hash."""

    id: str
    candidate_url: str
    version: str
    interval_seconds: float
    shadow_fraction: float
    status: RolloutStatus
    wave: int
    started_at: float
    wave_started_at: float
    actor: str = "operator"
    paused_at: float | None = None
    ended_at: float | None = None
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def wave_due_at(self) -> float:
        """When the running wave's interval is over and it is judged."""
        return self.wave_started_at + self.interval_seconds

    def advanced(self, at: float) -> RolloutState:
        """The next wave starting at `at`, or the complete rollout after the last one."""
        if self.wave >= LAST_WAVE:
            return replace(self, status=RolloutStatus.COMPLETE, ended_at=at, wave=WAVES)
        return replace(self, wave=self.wave + 1, wave_started_at=at)

    def paused(self, at: float) -> RolloutState:
        return replace(self, status=RolloutStatus.PAUSED, paused_at=at)

    def resumed(self, at: float) -> RolloutState:
        """Running again with the wave's remaining time kept: the pause does not count."""
        held = at - self.paused_at if self.paused_at is not None else 0.0
        return replace(
            self, status=RolloutStatus.RUNNING, paused_at=None, wave_started_at=self.wave_started_at + held
        )

    def rolled_back(self, at: float, reason: str) -> RolloutState:
        return replace(self, status=RolloutStatus.ROLLED_BACK, ended_at=at, reason=reason)

    def to_redis(self) -> dict[str, str]:
        fields = {
            "id": self.id,
            "candidate_url": self.candidate_url,
            "version": self.version,
            "interval_seconds": repr(self.interval_seconds),
            "shadow_fraction": repr(self.shadow_fraction),
            "status": self.status.value,
            "wave": str(self.wave),
            "started_at": repr(self.started_at),
            "wave_started_at": repr(self.wave_started_at),
            "actor": self.actor,
            "paused_at": "" if self.paused_at is None else repr(self.paused_at),
            "ended_at": "" if self.ended_at is None else repr(self.ended_at),
            "reason": self.reason,
        }
        return fields

    @classmethod
    def from_redis(cls, raw: dict[str, str]) -> RolloutState | None:
        """The stored state, or None for an empty or unreadable hash."""
        try:
            return cls(
                id=raw["id"],
                candidate_url=raw["candidate_url"],
                version=raw["version"],
                interval_seconds=float(raw["interval_seconds"]),
                shadow_fraction=float(raw["shadow_fraction"]),
                status=RolloutStatus(raw["status"]),
                wave=int(raw["wave"]),
                started_at=float(raw["started_at"]),
                wave_started_at=float(raw["wave_started_at"]),
                actor=raw.get("actor", "operator"),
                paused_at=float(raw["paused_at"]) if raw.get("paused_at") else None,
                ended_at=float(raw["ended_at"]) if raw.get("ended_at") else None,
                reason=raw.get("reason", ""),
            )
        except (KeyError, ValueError):
            return None

    def to_dict(self) -> dict[str, object]:
        """The state for `--json`, `tidegate status` and `/v1/queues`."""
        return {
            "id": self.id,
            "candidate": self.candidate_url,
            "version": self.version,
            "status": self.status.value,
            "wave": self.wave,
            "waves": WAVES,
            "interval_seconds": self.interval_seconds,
            "shadow_fraction": self.shadow_fraction,
            "started_at": self.started_at,
            "wave_started_at": self.wave_started_at,
            "next_wave_at": self.wave_due_at() if self.status is RolloutStatus.RUNNING else None,
            "ended_at": self.ended_at,
            "reason": self.reason or None,
            "actor": self.actor,
        }
