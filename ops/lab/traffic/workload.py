"""A seeded branch-office workload: who sends what, how large, and how fast over time.

Everything here is a pure function of the spec and its seed, so a run can be replayed exactly (only
the timing of the real processes differs). Offered load is a piecewise-linear profile in fractions of
the system's capacity, so "a surge to 250%" means the same thing on any simulator setting.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ops.lab.traffic.prompts import prompt_text

DEFAULT_MIX: Mapping[str, float] = {"loan_approval": 0.2, "complaint": 0.5, "archive_query": 0.3}
URGENT_LEVEL_WEIGHTS = (0.35, 0.2, 0.15, 0.12, 0.1, 0.08)
"""Weights of loan `urgent_level` 0..5: most loans are routine, a few are pressing."""
VIP_LEVEL_WEIGHTS = (0.6, 0.15, 0.1, 0.07, 0.05, 0.03)
"""Weights of complaint `vip_level` 0..5."""
MAX_TOKENS_BY_TYPE: Mapping[str, tuple[tuple[int, float], ...]] = {
    "loan_approval": ((64, 0.3), (128, 0.5), (256, 0.2)),
    "complaint": ((128, 0.3), (256, 0.5), (512, 0.2)),
    "archive_query": ((256, 0.5), (512, 0.5)),
}
"""(max_tokens, weight) per type: a loan decision is short, an archive summary long."""
DEFAULT_MAX_TOKENS = ((128, 0.5), (256, 0.5))


class WorkloadError(ValueError):
    """A workload setting that cannot be used; the message names the field and what is accepted."""


@dataclass(frozen=True)
class LoadPoint:
    at: float
    """Seconds from the start of the run."""
    load: float
    """Offered load as a fraction of capacity (1.0 = exactly what the workers drain)."""


@dataclass(frozen=True)
class LoadProfile:
    """Offered load over time, linear between points and flat after the last one."""

    points: tuple[LoadPoint, ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise WorkloadError("a load profile needs at least one point")
        times = [p.at for p in self.points]
        if times[0] != 0 or any(b <= a for a, b in itertools.pairwise(times)):
            raise WorkloadError(f"load points must start at 0 s and rise strictly; got times {times}")
        if any(p.load < 0 for p in self.points):
            raise WorkloadError(f"loads must be 0 or more; got {[p.load for p in self.points]}")

    @property
    def duration(self) -> float:
        return self.points[-1].at

    @property
    def peak(self) -> float:
        return max(p.load for p in self.points)

    def load_at(self, t: float) -> float:
        if t <= 0:
            return self.points[0].load
        for a, b in itertools.pairwise(self.points):
            if a.at <= t <= b.at:
                return a.load + (b.load - a.load) * (t - a.at) / (b.at - a.at)
        return self.points[-1].load

    @classmethod
    def surge(
        cls,
        duration: float,
        surge: float = 2.5,
        normal: float = 0.6,
        shape: tuple[float, float, float, float] = (0.22, 0.27, 0.62, 0.67),
    ) -> LoadProfile:
        """Normal load, a ramp up to `surge`, a plateau, a ramp down and the recovery at `normal`.

        `shape` holds the fractions of `duration` where the ramp up starts, the plateau starts, the
        plateau ends and the recovery starts.
        """
        if duration <= 0:
            raise WorkloadError(f"duration={duration} is not accepted; use more than 0 seconds")
        if surge < 0 or normal < 0:
            raise WorkloadError(f"surge={surge} and normal={normal} must be 0 or more")
        if not 0 < shape[0] < shape[1] < shape[2] < shape[3] < 1:
            raise WorkloadError(f"shape={shape} is not accepted; use four rising fractions between 0 and 1")
        marks = [0.0, *(duration * s for s in shape), duration]
        loads = [normal, normal, surge, surge, normal, normal]
        return cls(tuple(LoadPoint(at, load) for at, load in zip(marks, loads, strict=True)))

    def phase(self, t: float) -> str:
        """`normal`, `surge` or `recovery` for the live view: surge while above the starting load."""
        base = self.points[0].load
        if self.load_at(t) > base * 1.05 + 1e-9:
            return "surge"
        peak_at = next((p.at for p in self.points if p.load == self.peak), 0.0)
        return "recovery" if t > peak_at and self.peak > base else "normal"


@dataclass(frozen=True)
class WorkloadSpec:
    """What 200 branches send: the type mix, the factor levels, prompt and answer sizes, the load."""

    profile: LoadProfile
    capacity_tickets_per_s: float
    branches: int = 200
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    urgent_level_weights: Sequence[float] = URGENT_LEVEL_WEIGHTS
    vip_level_weights: Sequence[float] = VIP_LEVEL_WEIGHTS
    bulk_fraction: float = 0.3
    prompt_tokens: int = 500
    """Typical prompt: most tickets are about this long (log-normal around it)."""
    prompt_sigma: float = 0.25
    tail_fraction: float = 0.05
    """Share of tickets with a long document attached, log-uniform from `tail_min_tokens` up."""
    tail_min_tokens: int = 2000
    tail_max_tokens: int = 16000
    max_tokens: Mapping[str, Sequence[tuple[int, float]]] = field(
        default_factory=lambda: dict(MAX_TOKENS_BY_TYPE)
    )
    seed: int = 7

    def __post_init__(self) -> None:
        if self.branches < 1:
            raise WorkloadError(f"branches={self.branches} is not accepted; use at least 1")
        if self.capacity_tickets_per_s <= 0:
            raise WorkloadError(
                f"capacity_tickets_per_s={self.capacity_tickets_per_s} is not accepted; use more than 0"
            )
        if not self.mix or any(w < 0 for w in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise WorkloadError(f"mix={dict(self.mix)} is not accepted; use weights ≥ 0 with a positive sum")
        for name, weights in (("urgent", self.urgent_level_weights), ("vip", self.vip_level_weights)):
            if len(weights) != 6 or any(w < 0 for w in weights) or sum(weights) <= 0:
                raise WorkloadError(
                    f"{name}_level_weights={list(weights)} must be 6 weights ≥ 0 for levels 0-5"
                )
        if not 0 <= self.bulk_fraction <= 1 or not 0 <= self.tail_fraction <= 1:
            raise WorkloadError(
                f"bulk_fraction={self.bulk_fraction} and tail_fraction={self.tail_fraction} must be in [0, 1]"
            )
        if not 1 <= self.prompt_tokens <= self.tail_min_tokens <= self.tail_max_tokens:
            raise WorkloadError(
                f"need 1 ≤ prompt_tokens ({self.prompt_tokens}) ≤ tail_min_tokens ({self.tail_min_tokens}) "
                f"≤ tail_max_tokens ({self.tail_max_tokens})"
            )

    @property
    def duration(self) -> float:
        return self.profile.duration

    def rate_at(self, t: float) -> float:
        """Arrivals per second offered at `t`."""
        return self.profile.load_at(t) * self.capacity_tickets_per_s

    def max_tokens_choices(self, ticket_type: str) -> Sequence[tuple[int, float]]:
        return self.max_tokens.get(ticket_type, DEFAULT_MAX_TOKENS)

    def branch_ids(self) -> list[str]:
        width = max(3, len(str(self.branches)))
        return [f"branch-{i:0{width}d}" for i in range(1, self.branches + 1)]


@dataclass(frozen=True)
class PlannedArrival:
    """One ticket a branch will submit `at` seconds into the run."""

    index: int
    at: float
    type: str
    branch_id: str
    prompt_tokens: int
    max_tokens: int
    urgent_level: int = 0
    vip_level: int = 0
    is_bulk: bool = False

    @property
    def request_id(self) -> str:
        return f"r{self.index:06d}"

    def body(self) -> dict[str, Any]:
        """The JSON body of POST /v1/tickets (the API key names the branch)."""
        body: dict[str, Any] = {
            "type": self.type,
            "prompt": prompt_text(self.type, self.branch_id, self.index, self.prompt_tokens),
            "max_tokens": self.max_tokens,
        }
        if self.urgent_level:
            body["urgent_level"] = self.urgent_level
        if self.vip_level:
            body["vip_level"] = self.vip_level
        if self.is_bulk:
            body["is_bulk"] = True
        return body


def _weighted(rng: random.Random, choices: Sequence[Any], weights: Sequence[float]) -> Any:
    return rng.choices(list(choices), weights=list(weights), k=1)[0]


def sample_prompt_tokens(spec: WorkloadSpec, rng: random.Random) -> int:
    if rng.random() < spec.tail_fraction:
        low, high = math.log(spec.tail_min_tokens), math.log(spec.tail_max_tokens)
        return round(math.exp(rng.uniform(low, high)))
    tokens = round(rng.lognormvariate(math.log(spec.prompt_tokens), spec.prompt_sigma))
    return min(max(tokens, 16), spec.tail_min_tokens - 1)


def _ticket(
    spec: WorkloadSpec, rng: random.Random, index: int, at: float, branches: list[str]
) -> PlannedArrival:
    types = list(spec.mix)
    ticket_type = _weighted(rng, types, [spec.mix[t] for t in types])
    sizes = spec.max_tokens_choices(ticket_type)
    return PlannedArrival(
        index=index,
        at=at,
        type=ticket_type,
        branch_id=branches[rng.randrange(len(branches))],
        prompt_tokens=sample_prompt_tokens(spec, rng),
        max_tokens=_weighted(rng, [s for s, _ in sizes], [w for _, w in sizes]),
        urgent_level=_weighted(rng, range(6), spec.urgent_level_weights)
        if ticket_type == "loan_approval"
        else 0,
        vip_level=_weighted(rng, range(6), spec.vip_level_weights) if ticket_type == "complaint" else 0,
        is_bulk=ticket_type == "archive_query" and rng.random() < spec.bulk_fraction,
    )


def plan_arrivals(spec: WorkloadSpec) -> list[PlannedArrival]:
    """Poisson arrivals whose rate follows the load profile (thinning), each with its ticket drawn.

    Times and tickets come from separate seeded streams, so changing the load profile does not
    reshuffle which branch sends what.
    """
    return list(iter_arrivals(spec))


def iter_arrivals(spec: WorkloadSpec) -> Iterator[PlannedArrival]:
    times = random.Random(f"{spec.seed}:times")
    tickets = random.Random(f"{spec.seed}:tickets")
    branches = spec.branch_ids()
    peak_rate = spec.profile.peak * spec.capacity_tickets_per_s
    if peak_rate <= 0:
        return
    t = 0.0
    index = 0
    while True:
        t += times.expovariate(peak_rate)
        if t >= spec.duration:
            return
        if times.random() * peak_rate <= spec.rate_at(t):
            yield _ticket(spec, tickets, index, t, branches)
            index += 1


@dataclass(frozen=True)
class PlanSummary:
    """What a plan holds, for the run header and for tests of the generator."""

    total: int
    by_type: dict[str, int]
    tail: int
    prompt_tokens_median: int
    prompt_tokens_max: int
    branches_used: int


def summarize(plan: Sequence[PlannedArrival], spec: WorkloadSpec) -> PlanSummary:
    sizes = sorted(a.prompt_tokens for a in plan)
    return PlanSummary(
        total=len(plan),
        by_type=dict(Counter(a.type for a in plan)),
        tail=sum(1 for s in sizes if s >= spec.tail_min_tokens),
        prompt_tokens_median=sizes[len(sizes) // 2] if sizes else 0,
        prompt_tokens_max=sizes[-1] if sizes else 0,
        branches_used=len({a.branch_id for a in plan}),
    )


def sample_tickets(spec: WorkloadSpec, count: int) -> list[PlannedArrival]:
    """`count` tickets drawn from the spec's mix and sizes, ignoring time (for capacity estimates)."""
    rng = random.Random(f"{spec.seed}:sample")
    branches = spec.branch_ids()
    return [_ticket(spec, rng, index, 0.0, branches) for index in range(count)]
