"""The overload figures from branch records: latency from the first submission, books, goodput window."""

from __future__ import annotations

import pytest

from ops.lab.bench.figures import Books, goodput_tokens_per_s, system_figures, type_row
from ops.lab.traffic.accounting import Ledger
from ops.lab.traffic.records import TicketRecord


def record(
    index: int,
    outcome: str,
    *,
    first: float = 100.0,
    finished: float | None = None,
    submissions: int = 1,
    type_: str = "loan_approval",
    slo: float = 2.0,
) -> TicketRecord:
    return TicketRecord(
        index=index,
        request_id=f"r{index}",
        type=type_,
        branch_id="branch-001",
        planned_at=0.0,
        slo_seconds=slo,
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
        slo_goodput_tokens_per_s=450.0,
        capacity_tokens_per_s=1000.0,
        cpu_cores={},
    )
    assert figures.busy_fraction == 0.9 and figures.slo_goodput_fraction == 0.45
    assert set(figures.rows) == {"loan_approval", "all"}
    assert figures.books.holds and "books" in figures.to_dict()


def surge_records() -> list[TicketRecord]:
    complaint = {"type_": "complaint", "slo": 10.0}
    return [
        record(0, "done", first=100.0, finished=101.5),  # a loan within its 2 s
        record(1, "done", first=100.0, finished=105.0),  # a loan 5 s late for its branch
        record(2, "done", first=95.0, finished=104.0, **complaint),  # 9 s: within 10
        record(3, "done", first=90.0, finished=108.0, submissions=4, **complaint),  # retried for 18 s
        record(4, "failed", first=101.0, finished=102.0),
        record(5, "done", first=111.0, finished=111.5),  # within its SLO, after the window
        record(6, "rejected", first=100.0, finished=109.0, submissions=5, **complaint),
    ]


def test_slo_goodput_counts_only_answers_within_their_own_types_slo() -> None:
    tokens = {0: 1000, 1: 3000, 2: 2000, 3: 4000, 4: 8000, 5: 500, 6: 700}
    window = (100.0, 110.0)
    assert goodput_tokens_per_s(surge_records(), tokens, window) == 1000.0
    assert goodput_tokens_per_s(surge_records(), tokens, window, slo_only=True) == 300.0


def test_figures_carry_the_slo_goodput_share_and_the_answers_per_type() -> None:
    records = surge_records()
    ledger = Ledger(
        "clients",
        {
            "loan_approval": {"submitted": 4, "done": 3, "failed": 1},
            "complaint": {"submitted": 10, "done": 2, "rejected": 8},
        },
    )
    figures = system_figures(
        "tidegate",
        ["loan_approval", "complaint"],
        {"loan_approval": 2.0, "complaint": 10.0},
        records,
        books=Books.from_ledger(ledger, records),
        oom_crashes=0,
        preemptions=0,
        goodput_tokens_per_s=1000.0,
        slo_goodput_tokens_per_s=300.0,
        capacity_tokens_per_s=1250.0,
        cpu_cores={},
    )
    assert figures.busy_fraction == 0.8 and figures.slo_goodput_fraction == 0.24
    assert figures.answered == {"loan_approval": 3, "complaint": 2}
    assert figures.rows["all"].within_slo == 3  # records 0, 2 and 5
    document = figures.to_dict()
    assert document["slo_goodput_fraction"] == 0.24 and document["answered"]["complaint"] == 2
