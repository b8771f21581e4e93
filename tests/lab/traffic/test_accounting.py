"""The two-sided books: Redis's outcome counters against what each branch was answered."""

from __future__ import annotations

from ops.lab.traffic.accounting import check_accounting
from ops.lab.traffic.records import TicketRecord, percentile, type_figures

TYPES = ["loan_approval", "complaint"]


def record(
    index: int, ticket_type: str, outcome: str, rejections: int = 0, latency: float = 1.0
) -> TicketRecord:
    accepted = outcome != "rejected"
    return TicketRecord(
        index=index,
        request_id=f"r{index}",
        type=ticket_type,
        branch_id="branch-001",
        planned_at=0.0,
        slo_seconds=2.0,
        submissions=rejections + (1 if accepted else 0),
        rejections=rejections,
        retries=rejections if accepted else max(rejections - 1, 0),
        ticket_id=f"t{index}" if accepted else None,
        outcome=outcome,
        latency_s=latency if outcome == "done" else None,
    )


RECORDS = [
    record(1, "loan_approval", "done", latency=0.5),
    record(2, "loan_approval", "done", latency=3.0),
    record(3, "complaint", "done", rejections=2),
    record(4, "complaint", "rejected", rejections=3),
    record(5, "complaint", "expired"),
]
COUNTS = {
    "loan_approval:submitted": 2,
    "loan_approval:done": 2,
    "complaint:submitted": 7,
    "complaint:done": 1,
    "complaint:rejected": 5,
    "complaint:expired": 1,
}


def test_books_that_agree_hold() -> None:
    check = check_accounting(COUNTS, RECORDS, TYPES)
    assert check.holds, check.mismatches
    assert check.redis.submitted() == check.clients.submitted() == 9
    assert "holds (Redis 9 = 9, branches 9 = 9" in check.line()


def test_a_lost_ticket_is_caught_on_both_sides() -> None:
    # Redis says a complaint was submitted that never ended, and the branches never saw it.
    counts = dict(COUNTS, **{"complaint:submitted": 8})
    check = check_accounting(counts, RECORDS, TYPES)
    assert not check.holds
    assert "Redis: complaint does not balance" in check.mismatches
    assert "complaint submitted: clients 7, Redis 8" in check.mismatches
    assert "DOES NOT HOLD" in check.line()


def test_outcomes_that_disagree_are_named() -> None:
    counts = dict(COUNTS, **{"complaint:expired": 0, "complaint:failed": 1})
    check = check_accounting(counts, RECORDS, TYPES)
    assert "complaint expired: clients 1, Redis 0" in check.mismatches
    assert "complaint failed: clients 0, Redis 1" in check.mismatches


def test_open_and_errored_requests_break_the_books() -> None:
    unfinished = record(6, "loan_approval", "done")
    unfinished.outcome = None
    errored = record(7, "loan_approval", "done")
    errored.outcome, errored.submissions = "error", 0
    counts = dict(COUNTS, **{"loan_approval:submitted": 3})
    check = check_accounting(counts, [*RECORDS, unfinished, errored], TYPES)
    assert check.open_records == 1 and check.client_errors == 1
    assert not check.holds


def test_type_figures_count_each_submission_and_the_slo() -> None:
    loans = type_figures("loan_approval", RECORDS)
    assert (loans.submitted, loans.count("done"), loans.within_slo) == (2, 2, 1)
    complaints = type_figures("complaint", RECORDS)
    assert complaints.count("rejected") == 5 and complaints.gave_up == 1 and complaints.retries == 4
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    assert percentile([], 50) is None
