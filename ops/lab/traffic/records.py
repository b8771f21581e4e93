"""What the simulated branches saw, one record per planned request, and the figures drawn from them.

A planned request may be submitted several times: every 429 answer is a `rejected` ticket in its own
right (the server keeps a record of it), and the branch retries with a new submission. So the unit
of accounting is the *submission*: `submissions` counts every POST the API answered, `rejections`
those answered 429, and the last one, if accepted, ends in `outcome`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy

OUTCOMES = ("done", "failed", "expired", "cancelled", "rejected")
"""Terminal outcomes, in the order summaries list them."""
REQUEST_ENDS = (
    "within_slo",
    "late",
    "degraded",
    "gave_up",
    "expired",
    "failed",
    "cancelled",
    "error",
    "unfinished",
)
"""How one planned request ended for its branch, retries included: each request has exactly one."""


@dataclass
class TicketRecord:
    index: int
    request_id: str
    type: str
    branch_id: str
    planned_at: float
    """Seconds from the start of the run when the branch meant to send it."""
    slo_seconds: float
    submissions: int = 0
    rejections: int = 0
    retries: int = 0
    rejected_ids: list[str] = field(default_factory=list)
    ticket_id: str | None = None
    """The accepted ticket (None while every submission so far was shed)."""
    status: str | None = None
    """The accepted ticket's last seen status."""
    outcome: str | None = None
    """Final: the accepted ticket's terminal status, `rejected` when the branch gave up, or `error`."""
    first_submit_at: float | None = None
    """Unix time of the first submission."""
    accepted_at: float | None = None
    finished_at: float | None = None
    latency_s: float | None = None
    """Server-side: accepted ticket created → ended."""
    queue_wait_s: float | None = None
    ttft_s: float | None = None
    """Server-side: taken by a worker → first token."""
    e2e_ttft_s: float | None = None
    """Server-side: accepted ticket created → first token, the wait a branch sees before its answer starts."""
    client_ttft_s: float | None = None
    """Streaming branches only: send → first chunk with text, on the branch's clock."""
    client_latency_s: float | None = None
    """Streaming branches only: send → the stream's end."""
    polls: int = 0
    error: str | None = None
    degraded: bool = False
    """The last refusal was the type's degraded answer (a 200 with its friendly text), not a 429."""

    @classmethod
    def planned(cls, arrival: PlannedArrival, policy: Policy) -> TicketRecord:
        """The empty record of a planned request, with its type's SLO from the policy."""
        return cls(
            index=arrival.index,
            request_id=arrival.request_id,
            type=arrival.type,
            branch_id=arrival.branch_id,
            planned_at=arrival.at,
            slo_seconds=policy.type_policy(arrival.type).slo_seconds,
        )

    @property
    def terminal(self) -> bool:
        return self.outcome is not None

    @property
    def accepted(self) -> bool:
        return self.ticket_id is not None

    @property
    def end_to_end_s(self) -> float | None:
        """Client view: first submission (retries included) → the ticket ended."""
        if self.first_submit_at is None or self.finished_at is None or self.outcome != "done":
            return None
        return self.finished_at - self.first_submit_at

    @property
    def seen_ttft_s(self) -> float | None:
        """The branch's view of the wait for the first token: measured if it streamed, else the ticket's."""
        return self.client_ttft_s if self.client_ttft_s is not None else self.e2e_ttft_s

    @property
    def within_slo(self) -> bool:
        return self.outcome == "done" and self.latency_s is not None and self.latency_s <= self.slo_seconds

    @property
    def answered_in_time(self) -> bool:
        """Done within its type's SLO counted from the request's first submission, as the
        deadline is: the retries' wait counts too."""
        if self.outcome != "done":
            return False
        taken = self.end_to_end_s if self.end_to_end_s is not None else self.latency_s
        return taken is not None and taken <= self.slo_seconds

    def end(self) -> str:
        """Which of REQUEST_ENDS this request came to."""
        if self.outcome == "done":
            return "within_slo" if self.answered_in_time else "late"
        if self.outcome == "rejected":
            return "degraded" if self.degraded else "gave_up"
        if self.outcome in ("expired", "failed", "cancelled", "error"):
            return self.outcome
        return "unfinished"

    def submission_outcomes(self) -> dict[str, int]:
        """Each submission's end: one `rejected` per 429, plus the accepted ticket's outcome."""
        counts = {"rejected": self.rejections} if self.rejections else {}
        if self.accepted and self.outcome in OUTCOMES:
            counts[self.outcome] = counts.get(self.outcome, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class TypeFigures:
    """Per-type summary of the client-side records."""

    type: str
    requests: int
    submitted: int
    outcomes: dict[str, int]
    retries: int
    gave_up: int
    within_slo: int
    p50_s: float | None
    p99_s: float | None
    queue_wait_p50_s: float | None
    ttft_p50_s: float | None
    e2e_ttft_p50_s: float | None
    e2e_ttft_p99_s: float | None
    """Time to first token as the branch saw it: its own clock when it streamed, else the ticket's."""
    pending: int
    ends: dict[str, int] = field(default_factory=dict)
    """Unique requests by how they ended (REQUEST_ENDS); they sum to `requests`."""

    def count(self, outcome: str) -> int:
        return self.outcomes.get(outcome, 0)


def type_figures(ticket_type: str, records: Iterable[TicketRecord]) -> TypeFigures:
    mine = [r for r in records if r.type == ticket_type]
    outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
    for record in mine:
        for outcome, count in record.submission_outcomes().items():
            outcomes[outcome] += count
    latencies = [r.latency_s for r in mine if r.outcome == "done" and r.latency_s is not None]
    waits = [r.queue_wait_s for r in mine if r.outcome == "done" and r.queue_wait_s is not None]
    ttfts = [r.ttft_s for r in mine if r.outcome == "done" and r.ttft_s is not None]
    seen = [r.seen_ttft_s for r in mine if r.outcome == "done" and r.seen_ttft_s is not None]
    return TypeFigures(
        type=ticket_type,
        requests=len(mine),
        submitted=sum(r.submissions for r in mine),
        outcomes=outcomes,
        retries=sum(r.retries for r in mine),
        gave_up=sum(1 for r in mine if r.outcome == "rejected"),
        within_slo=sum(1 for r in mine if r.within_slo),
        p50_s=percentile(latencies, 50),
        p99_s=percentile(latencies, 99),
        queue_wait_p50_s=percentile(waits, 50),
        ttft_p50_s=percentile(ttfts, 50),
        e2e_ttft_p50_s=percentile(seen, 50),
        e2e_ttft_p99_s=percentile(seen, 99),
        pending=sum(1 for r in mine if r.submissions and not r.terminal),
        ends=request_ends(mine),
    )


def request_ends(records: Iterable[TicketRecord]) -> dict[str, int]:
    """Unique requests by how they ended, every category present (zeros included)."""
    ends = dict.fromkeys(REQUEST_ENDS, 0)
    for record in records:
        ends[record.end()] += 1
    return ends
