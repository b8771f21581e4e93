"""inference-perf's figures beside tidegate's own for the same requests, and where they part.

Each side is summarised the same way (numpy's linear percentiles, as inference-perf computes them;
rates over the span from the first request to the last answer); only the clocks differ. The
relative difference is (inference-perf − tidegate) / tidegate. The issue's bar is agreement within
10% on TTFT p50 and on the answered count; the other rows are shown, not judged.

Each answer names its ticket, so the requests pair one to one, and the gap between the two TTFTs
splits into the time before the ticket existed (client send → `created_at`) and the time after the
worker saw the first token (`first_token_at` → the client's first chunk), on one machine where the
client's monotonic clock and tidegate's wall clock are one offset apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ops.lab.bench.iperf.report import ClientRequest, ClientSummary
from ops.lab.bench.iperf.tickets import TicketTimes

AGREEMENT = 0.10


def linear_percentile(values: Sequence[float], q: float) -> float | None:
    """numpy's default percentile (q in 0..100, linear between ranks); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Figures:
    """One side's summary of the run (seconds; tokens per second)."""

    answered: int
    ttft_p50: float | None
    ttft_p99: float | None
    latency_p50: float | None
    latency_p99: float | None
    output_tokens_per_s: float | None
    good: int | None
    """Answered within the type's SLO."""


def client_figures(summary: ClientSummary) -> Figures:
    return Figures(
        answered=summary.answered,
        ttft_p50=summary.ttft_p50,
        ttft_p99=summary.ttft_p99,
        latency_p50=summary.latency_p50,
        latency_p99=summary.latency_p99,
        output_tokens_per_s=summary.output_tokens_per_s,
        good=summary.good,
    )


def ticket_figures(tickets: Sequence[TicketTimes]) -> Figures:
    answered = [t for t in tickets if t.answered]
    ttfts = [t.ttft for t in answered if t.ttft is not None]
    latencies = [t.latency for t in answered if t.latency is not None]
    finished = [t.finished_at for t in answered if t.finished_at is not None]
    span = max(finished) - min(t.created_at for t in answered) if finished else 0.0
    tokens = [t.completion_tokens for t in answered if t.completion_tokens is not None]
    return Figures(
        answered=len(answered),
        ttft_p50=linear_percentile(ttfts, 50),
        ttft_p99=linear_percentile(ttfts, 99),
        latency_p50=linear_percentile(latencies, 50),
        latency_p99=linear_percentile(latencies, 99),
        output_tokens_per_s=sum(tokens) / span if span > 0 and tokens else None,
        good=sum(t.in_time for t in answered),
    )


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    """`s` (shown in ms), `requests` or `tokens/s`."""
    client: float | None
    tidegate: float | None
    gated: bool
    """Part of the issue's bar (TTFT p50, answered count)."""

    @property
    def difference(self) -> float | None:
        if self.client is None or self.tidegate is None or self.tidegate == 0:
            return None
        return (self.client - self.tidegate) / self.tidegate

    @property
    def agrees(self) -> bool:
        return self.difference is not None and abs(self.difference) <= AGREEMENT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"difference": self.difference, "agrees": self.agrees}


ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("answered", "answered", "requests", True),
    ("ttft_p50", "TTFT p50", "s", True),
    ("ttft_p99", "TTFT p99", "s", False),
    ("latency_p50", "latency p50", "s", False),
    ("latency_p99", "latency p99", "s", False),
    ("output_tokens_per_s", "output tokens/s", "tokens/s", False),
    ("good", "goodput: answered within the type's SLO", "requests", False),
)


def compare(client: Figures, own: Figures) -> list[Row]:
    def value(figures: Figures, key: str) -> float | None:
        found = getattr(figures, key)
        return None if found is None else float(found)

    return [
        Row(key, label, unit, value(client, key), value(own, key), gated) for key, label, unit, gated in ROWS
    ]


def agreement_holds(rows: Sequence[Row]) -> bool:
    return all(row.agrees for row in rows if row.gated)


@dataclass(frozen=True)
class Spread:
    """p50 and p99 of one per-request difference, in milliseconds."""

    p50_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Spread:
        def ms(q: float) -> float | None:
            found = linear_percentile(seconds, q)
            return None if found is None else round(found * 1000, 2)

        return cls(ms(50), ms(99))


@dataclass(frozen=True)
class Gap:
    """Where the client's times and the tickets' part, request by request."""

    paired: int
    unpaired_requests: int
    """Requests not paired with an answered ticket: failed ones, and shed ones."""
    unpaired_tickets: int
    """Tickets no request named."""
    shed_answers: int
    """Requests the client counted as answered whose ticket tidegate shed (a degraded 200)."""
    ttft: Spread
    """Client TTFT − ticket TTFT."""
    latency: Spread
    """Client latency − ticket latency."""
    before_ticket: Spread | None
    """Client send → ticket `created_at`: the HTTP request's way in."""
    after_first_token: Spread | None
    """Worker's `first_token_at` → the client's first chunk: the token's way out."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def per_request_gap(
    requests: Sequence[ClientRequest], tickets: Sequence[TicketTimes], wall_minus_monotonic: float | None
) -> Gap:
    """Pair requests with their tickets by id; `wall_minus_monotonic` puts the client's clock on
    tidegate's (None where they cannot be aligned: then only the differences of durations)."""
    by_id = {t.id: t for t in tickets}
    named = [(r, by_id.get(r.ticket_id or "")) for r in requests if r.ok]
    pairs = [(r, t) for r, t in named if t is not None and t.answered]
    ttft, latency, before, after = [], [], [], []
    for request, ticket in pairs:
        if request.first_token is not None and ticket.ttft is not None:
            ttft.append((request.first_token - request.start) - ticket.ttft)
        if ticket.latency is not None:
            latency.append((request.end - request.start) - ticket.latency)
        if wall_minus_monotonic is not None:
            before.append(ticket.created_at - (request.start + wall_minus_monotonic))
            if request.first_token is not None and ticket.first_token_at is not None:
                after.append(request.first_token + wall_minus_monotonic - ticket.first_token_at)
    named_ids = {r.ticket_id for r in requests}
    return Gap(
        paired=len(pairs),
        unpaired_requests=len(requests) - len(pairs),
        unpaired_tickets=sum(1 for t in tickets if t.id not in named_ids),
        shed_answers=sum(1 for _, t in named if t is not None and t.status == "rejected"),
        ttft=Spread.of(ttft),
        latency=Spread.of(latency),
        before_ticket=Spread.of(before) if wall_minus_monotonic is not None else None,
        after_first_token=Spread.of(after) if wall_minus_monotonic is not None else None,
    )
