"""The demo's summary counts unique branch requests: each ends in exactly one category (answered
within SLO, late, degraded, refused until it gave up, or another end), retries are their own column,
and the categories sum to the requests planned."""

from __future__ import annotations

import json
from dataclasses import replace

from rich.console import Console

from ops.lab.demo.summary import DemoReport, print_report
from ops.lab.traffic.accounting import check_accounting
from ops.lab.traffic.alarm_path import alarm_path
from ops.lab.traffic.records import TicketRecord, type_figures
from ops.lab.traffic.timeseries import AlarmChange

TYPES = ["loan_approval", "complaint"]


def request(index: int, ticket_type: str, outcome: str | None, **fields: object) -> TicketRecord:
    record = TicketRecord(
        index=index,
        request_id=f"r{index}",
        type=ticket_type,
        branch_id="0412",
        planned_at=0.0,
        slo_seconds=2.0,
        outcome=outcome,
    )
    for name, value in fields.items():
        setattr(record, name, value)
    return record


RECORDS = [
    # Answered in 0.5 s from its only try: within SLO.
    request(1, "loan_approval", "done", submissions=1, ticket_id="t1", first_submit_at=100.0,
            finished_at=100.5, latency_s=0.5),
    # The ticket itself took 1 s, but its first try was refused 1.5 s earlier: 2.5 s > 2 s, late.
    request(2, "complaint", "done", submissions=3, rejections=2, retries=2, ticket_id="t2",
            first_submit_at=100.0, finished_at=102.5, latency_s=1.0),
    # Refused five times (four retries), then given up.
    request(3, "complaint", "rejected", submissions=5, rejections=5, retries=4),
    # Its last answer was the type's degraded 200.
    request(4, "complaint", "rejected", submissions=1, rejections=1, degraded=True),
    request(5, "complaint", "expired", submissions=1, ticket_id="t5"),
    # Planned but never sent before the run ended.
    request(6, "complaint", None),
]  # fmt: skip


def report(planned: int) -> DemoReport:
    counts = {"loan_approval:submitted": 1, "loan_approval:done": 1, "complaint:submitted": 10,
              "complaint:done": 1, "complaint:rejected": 8, "complaint:expired": 1}  # fmt: skip
    return DemoReport(
        queue="demo-test",
        redis="test",
        engine="sim",
        duration_s=10.0,
        elapsed_s=10.0,
        capacity_tickets_per_s=1.0,
        capacity_note="",
        peak_load=2.0,
        figures={t: type_figures(t, RECORDS) for t in TYPES},
        alarms=[],
        peak_level="green",
        accounting=check_accounting(counts, RECORDS, TYPES),
        critical_types=["loan_approval"],
        api_url="",
        metrics_urls={},
        run_dir="/tmp/x",
        measured_drain_peak=None,
        planned_requests=planned,
    )


def test_each_request_ends_once_and_the_categories_sum_to_the_plan() -> None:
    assert [r.end() for r in RECORDS] == [
        "within_slo",
        "late",
        "gave_up",
        "degraded",
        "expired",
        "unfinished",
    ]
    complaints = type_figures("complaint", RECORDS)
    assert complaints.requests == 5 and sum(complaints.ends.values()) == 5
    assert complaints.retries == 6 and complaints.submitted == 10  # retries counted apart
    summary = report(planned=len(RECORDS))
    assert summary.requests_balance
    assert summary.requests_line() == (
        "requests: 6 planned = within SLO 1 + late 1 + degraded 1 + refused, gave up 1 + expired 1 "
        "+ unfinished 1: balances"
    )
    doc = json.loads(json.dumps(summary.to_dict(), default=str))
    assert doc["requests"] == {
        "planned": 6,
        "ends": {"within_slo": 1, "late": 1, "degraded": 1, "gave_up": 1, "expired": 1, "failed": 0,
                 "cancelled": 0, "error": 0, "unfinished": 1},
    }  # fmt: skip
    assert doc["checks"]["requests_balance"] is True


def test_a_request_missing_from_the_records_breaks_the_balance() -> None:
    summary = report(planned=7)
    assert not summary.requests_balance
    assert summary.requests_line().endswith("DOES NOT BALANCE (6 counted)")
    assert (False, summary.requests_line()) in summary.check_lines()


def test_the_table_shows_requests_by_end_and_retries_apart() -> None:
    console = Console(width=200, record=True, color_system=None)
    print_report(console, report(planned=len(RECORDS)))
    text = console.export_text()
    assert "Branch requests by type" in text
    total = next(line for line in text.splitlines() if line.startswith("│ total"))
    cells = [cell.strip() for cell in total.split("│")[1:-1]]
    # type, requests, within SLO, late, degraded, gave up, other, retries
    assert cells[:8] == ["total", "6", "1 (17%)", "1 (17%)", "1 (17%)", "1 (17%)", "2", "6"]
    assert "✔ requests: 6 planned" in text


def test_an_alarm_that_enters_red_twice_is_marked_cycling_in_the_checks() -> None:
    cycling = [
        AlarmChange(float(t), 1_000.0 + t, a, b, 80)
        for t, (a, b) in enumerate(
            [("green", "orange"), ("orange", "red"), ("red", "orange"), ("orange", "red")]
        )
    ]
    summary = replace(report(planned=6), alarms=cycling, peak_level="red")
    line = next(line for ok, line in summary.check_lines() if line.startswith("alarm: 4 transitions"))
    assert (False, line) in summary.check_lines()
    assert "red entered 2 time(s), CYCLING (1 rises after a fall)" in line
    held = replace(summary, alarms=cycling[:3])
    assert (True, alarm_path(cycling[:3]).line()) in held.check_lines()
    assert held.to_dict()["checks"]["alarm_path"]["holds"] is True
