"""The overload figures from branch records: latency from the first submission, books, goodput window."""

from __future__ import annotations

import pytest

from ops.lab.bench.figures import Books, goodput_tokens_per_s, system_figures, type_row
from ops.lab.traffic.accounting import Ledger
from ops.lab.traffic.records import TicketRecord


def record(
    index: int, outcome: str, *, first: float = 100.0, finished: float | None = None, submissions: int = 1
) -> TicketRecord:
    return TicketRecord(
        index=index,
        request_id=f"r{index}",
        type="loan_approval",
        branch_id="branch-001",
        planned_at=0.0,
        slo_seconds=2.0,
        submissions=submissions,
        retries=submissions - 1,
        outcome=outcome,
        first_submit_at=first,
        finished_at=finished,
    )


def test_latency_runs_from_the_first_submission_and_only_answered_requests_count() -> None:
    records = [
        record(0, "done", finished=101.0),
        record(1, "done", finished=103.0, submissions=3),  # two 429s first: 3 s for its branch
        record(2, "rejected", finished=150.0, submissions=5),
        record(3, "expired", finished=130.0),
    ]
    row = type_row("loan_approval", records, 2.0)
    assert (row.offered, row.done, row.rejected, row.expired) == (4, 2, 1, 1)
    assert row.within_slo == 1
    assert row.p50_s == 1.0 and row.p99_s == 3.0
    assert row.submissions == 10 and row.retries == 6


def test_the_all_row_holds_each_request_to_its_own_slo() -> None:
    loan = record(0, "done", finished=101.5)
    archive = TicketRecord(
        index=1,
        request_id="r1",
        type="archive_query",
        branch_id="branch-002",
        planned_at=0.0,
        slo_seconds=60.0,
        submissions=1,
        outcome="done",
        first_submit_at=100.0,
        finished_at=130.0,
    )
    assert type_row("all", [loan, archive], None).within_slo == 2


def test_books_from_a_ledger_name_what_does_not_balance() -> None:
    balanced = Ledger("clients", {"loan_approval": {"submitted": 3, "done": 2, "failed": 1}})
    books = Books.from_ledger(balanced, [record(0, "done", finished=101.0)])
    assert books.holds and "holds" in books.line

    short = Ledger("clients", {"loan_approval": {"submitted": 3, "done": 1}})
    books = Books.from_ledger(short, [record(0, "done", finished=101.0), record(1, "error")])
    assert not books.holds
    assert "loan_approval does not balance" in books.line
    assert "1 requests have no final outcome" in books.line


def test_goodput_counts_tokens_of_requests_answered_inside_the_window() -> None:
    records = [
        record(0, "done", finished=105.0),
        record(1, "done", finished=115.0),  # after the window
        record(2, "failed", finished=106.0),  # not answered: its work was wasted
    ]
    tokens = {0: 1000, 1: 5000, 2: 7000}
    assert goodput_tokens_per_s(records, tokens, (100.0, 110.0)) == 100.0
    with pytest.raises(ValueError, match="window"):
        goodput_tokens_per_s(records, tokens, (110.0, 100.0))


def test_busy_fraction_is_goodput_over_capacity() -> None:
    records = [record(0, "done", finished=101.0)]
    books = Books.from_ledger(Ledger("clients", {"loan_approval": {"submitted": 1, "done": 1}}), records)
    figures = system_figures(
        "tidegate",
        ["loan_approval"],
        {"loan_approval": 2.0},
        records,
        books=books,
        oom_crashes=0,
        preemptions=0,
        goodput_tokens_per_s=900.0,
        capacity_tokens_per_s=1000.0,
        cpu_cores={},
    )
    assert figures.busy_fraction == 0.9
    assert set(figures.rows) == {"loan_approval", "all"}
    assert figures.books.holds and "books" in figures.to_dict()
