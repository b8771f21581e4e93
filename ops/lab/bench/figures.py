"""The overload benchmark's figures for one system, from what its branches saw and what its GPUs did.

Latency is the branch's view: first submission to the answer, retries and Retry-After waits included,
so a system cannot look fast by shedding a request and serving its third attempt. A request's outcome
is its final one (`rejected` = its branch gave up after 429s); submissions are counted apart, each
ending in exactly one outcome, which is the accounting the benchmark checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ops.lab.traffic.accounting import AccountingCheck, Ledger
from ops.lab.traffic.alarm_path import AlarmPath
from ops.lab.traffic.records import OUTCOMES, TicketRecord, percentile


@dataclass(frozen=True)
class TypeRow:
    """One ticket type (or all of them) on one system."""

    type: str
    offered: int
    done: int
    within_slo: int
    rejected: int
    expired: int
    failed: int
    cancelled: int
    errors: int
    """Requests whose client failed itself (no answer from the API at all)."""
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    """Time to first token as a streaming branch saw it (`--client openai`); None otherwise."""
    submissions: int
    retries: int
    slo_seconds: float | None
    shed: dict[str, int] = field(default_factory=dict)
    """Submissions shed, or requests ended unanswered, by code ("429", "503 scheduler_queue_timeout",
    "expired", ...), as the arm reports them."""
    admitted: int = 0
    """Requests the system took on (any outcome but refused or a client error): the share of these
    answered within their SLO is what admission promised."""
    onset_offered: int = 0
    """Requests planned in the first moments at the peak (`ONSET_S`), when a step hits hardest."""
    onset_within_slo: int = 0


def _latencies(records: Iterable[TicketRecord]) -> list[float]:
    return [
        r.finished_at - r.first_submit_at
        for r in records
        if r.outcome == "done" and r.finished_at is not None and r.first_submit_at is not None
    ]


ONSET_S = 10.0
"""Seconds from the start of the surge's plateau whose arrivals are counted apart: a step's first
moments, before any measure of the surge has caught up, are where a gateway lets loans slip."""

REFUSED = frozenset({"rejected", "error", "open"})
"""Outcomes of a request its system never took on (`open`: no outcome recorded)."""


def type_row(
    name: str,
    records: Sequence[TicketRecord],
    slo_seconds: float | None,
    shed: Mapping[str, int] | None = None,
    onset_at: float | None = None,
) -> TypeRow:
    """`onset_at`: when the surge's plateau starts, in seconds of the plan (None: no onset figures)."""
    outcomes = Counter(r.outcome or "open" for r in records)
    onset = (
        [r for r in records if onset_at <= r.planned_at < onset_at + ONSET_S] if onset_at is not None else []
    )
    latencies = _latencies(records)
    ttfts = [r.client_ttft_s for r in records if r.outcome == "done" and r.client_ttft_s is not None]
    within = sum(1 for value in latencies if slo_seconds is not None and value <= slo_seconds)
    if slo_seconds is None:  # the "all types" row: each request against its own type's SLO
        within = sum(1 for r in records if met_slo(r))
    return TypeRow(
        type=name,
        offered=len(records),
        done=outcomes["done"],
        within_slo=within,
        rejected=outcomes["rejected"],
        expired=outcomes["expired"],
        failed=outcomes["failed"],
        cancelled=outcomes["cancelled"],
        errors=outcomes["error"],
        p50_s=_round(percentile(latencies, 50)),
        p95_s=_round(percentile(latencies, 95)),
        p99_s=_round(percentile(latencies, 99)),
        ttft_p50_s=_round(percentile(ttfts, 50)),
        ttft_p99_s=_round(percentile(ttfts, 99)),
        submissions=sum(r.submissions for r in records),
        retries=sum(r.retries for r in records),
        slo_seconds=slo_seconds,
        shed={code: count for code, count in (shed or {}).items() if count},
        admitted=sum(count for outcome, count in outcomes.items() if outcome not in REFUSED),
        onset_offered=len(onset),
        onset_within_slo=sum(1 for r in onset if met_slo(r)),
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class Books:
    """Whether every submission ended in exactly one outcome: done + rejected + expired + cancelled +
    failed = submitted, per type, by every ledger the system keeps."""

    holds: bool
    line: str
    by_type: dict[str, dict[str, int]]
    """type -> {"submitted": n, "done": n, ...}, from the first ledger (the server's when it keeps one)."""

    @classmethod
    def from_check(cls, check: AccountingCheck) -> Books:
        """tidegate: Redis's counters and the branches' records, which must also agree."""
        return cls(check.holds, check.line(), check.redis.by_type)

    @classmethod
    def from_ledger(cls, ledger: Ledger, records: Sequence[TicketRecord]) -> Books:
        """A system that keeps no counts of its own: the branches' ledger alone must balance."""
        problems = [f"{t} does not balance" for t in ledger.unbalanced()]
        unfinished = sum(1 for r in records if r.outcome not in OUTCOMES)
        if unfinished:
            problems.append(f"{unfinished} requests have no final outcome")
        formula = "done + rejected + expired + cancelled + failed = submitted"
        figures = f"branches {ledger.ended()} = {ledger.submitted()}"
        if problems:
            line = f"accounting: {formula}: DOES NOT HOLD ({figures}): " + "; ".join(problems)
        else:
            line = f"accounting: {formula}: holds ({figures}, per type too)"
        return cls(not problems, line, ledger.by_type)


def met_slo(record: TicketRecord) -> bool:
    """Answered within its own type's SLO, counted from the branch's first submission."""
    return (
        record.outcome == "done"
        and record.finished_at is not None
        and record.first_submit_at is not None
        and record.finished_at - record.first_submit_at <= record.slo_seconds
    )


def goodput_tokens_per_s(
    records: Sequence[TicketRecord],
    tokens_by_index: Mapping[int, int],
    window: tuple[float, float],
    *,
    slo_only: bool = False,
) -> float:
    """Tokens (prompt + completion) of requests answered inside `window` (unix seconds), per second.

    With `slo_only`, only answers that met their type's SLO count: an answer that came too late did
    work the branch could not use.
    """
    start, end = window
    if end <= start:
        raise ValueError(f"window={window} is empty; its end must come after its start")
    total = sum(
        tokens_by_index.get(r.index, 0)
        for r in records
        if r.outcome == "done"
        and r.finished_at is not None
        and start <= r.finished_at < end
        and (met_slo(r) or not slo_only)
    )
    return total / (end - start)


@dataclass(frozen=True)
class SystemFigures:
    """Everything the report shows for one system."""

    name: str
    rows: dict[str, TypeRow]
    """Per type, plus "all"."""
    oom_crashes: int
    preemptions: int
    retries: int
    goodput_tokens_per_s: float
    busy_fraction: float | None
    slo_goodput_tokens_per_s: float
    slo_goodput_fraction: float | None
    """Tokens of answers within their type's SLO in the surge, over capacity: the busy fraction's useful share."""
    answered: dict[str, int]
    """Requests answered (done) per type over the whole run."""
    books: Books
    cpu_cores: dict[str, float]
    notes: tuple[str, ...] = ()
    shed_rate: float | None = None
    """Share of offered requests that got no answer: goodput is read beside it (dropping work inflates it)."""
    client: str = ""
    """How the arm's branches called it (`ARM_CLIENTS`)."""
    send_lag: dict[str, float | None] = field(default_factory=dict)
    """How late the branches' first sends were against the plan (p50_s, p99_s, max_s): with the harness's
    CPU in `cpu_cores`, whether the load generator kept up."""
    alarm: AlarmPath | None = None
    """The alarm's path through the run; None for a system without alarms."""

    def to_dict(self) -> dict[str, object]:
        """Every field, the alarm's path with its verdict (`holds`), which `asdict` alone leaves out."""
        return asdict(self) | {"alarm": self.alarm.to_dict() if self.alarm is not None else None}


def system_figures(
    name: str,
    types: Sequence[str],
    slo_by_type: Mapping[str, float],
    records: Sequence[TicketRecord],
    *,
    books: Books,
    oom_crashes: int,
    preemptions: int,
    goodput_tokens_per_s: float,
    slo_goodput_tokens_per_s: float,
    capacity_tokens_per_s: float,
    cpu_cores: Mapping[str, float],
    notes: Sequence[str] = (),
    shed_codes: Mapping[str, Mapping[str, int]] | None = None,
    client: str = "",
    send_lag: Mapping[str, float | None] | None = None,
    alarm: AlarmPath | None = None,
    onset_at: float | None = None,
) -> SystemFigures:
    codes = shed_codes or {}
    rows = {
        t: type_row(t, [r for r in records if r.type == t], slo_by_type[t], codes.get(t), onset_at)
        for t in types
    }
    everything: Counter[str] = Counter()
    for by_code in codes.values():
        everything.update(by_code)
    rows["all"] = type_row("all", records, None, everything, onset_at)
    busy = _share(goodput_tokens_per_s, capacity_tokens_per_s)
    slo_share = _share(slo_goodput_tokens_per_s, capacity_tokens_per_s)
    return SystemFigures(
        name=name,
        rows=rows,
        oom_crashes=oom_crashes,
        preemptions=preemptions,
        retries=rows["all"].retries,
        goodput_tokens_per_s=round(goodput_tokens_per_s, 1),
        busy_fraction=busy,
        slo_goodput_tokens_per_s=round(slo_goodput_tokens_per_s, 1),
        slo_goodput_fraction=slo_share,
        answered={t: rows[t].done for t in types},
        books=books,
        cpu_cores=dict(cpu_cores),
        notes=tuple(notes),
        shed_rate=round(1 - rows["all"].done / rows["all"].offered, 4) if rows["all"].offered else None,
        client=client,
        send_lag=dict(send_lag or {}),
        alarm=alarm,
    )


ARM_CLIENTS = {
    "openai": "OpenAI, streamed",
    "completions": "OpenAI, whole answers",
    "tickets": "tickets: submit, poll",
    "seed": "the seed's clients (no OpenAI door)",
}
"""How an arm's branches call it, as the report names it."""


def send_lag_figures(lags: Sequence[float]) -> dict[str, float | None]:
    """How late the sends were against the plan: the harness kept up when p99 stays small."""
    return {
        "p50_s": _lag(percentile(lags, 50)),
        "p99_s": _lag(percentile(lags, 99)),
        "max_s": _lag(max(lags, default=None)),
    }


def record_send_lags(records: Iterable[TicketRecord], started_at: float) -> list[float]:
    """Each request's first send against its planned time, for the players that record no lag of their own."""
    return [
        max(0.0, r.first_submit_at - started_at - r.planned_at)
        for r in records
        if r.first_submit_at is not None
    ]


def _lag(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _share(tokens_per_s: float, capacity_tokens_per_s: float) -> float | None:
    return round(tokens_per_s / capacity_tokens_per_s, 4) if capacity_tokens_per_s > 0 else None
