"""The overload verdict, from figures built the way a run builds them."""

from __future__ import annotations

import itertools
from dataclasses import replace

from ops.lab.bench.figures import ONSET_S, Books, SystemFigures, system_figures
from ops.lab.bench.verdict import run_verdict
from ops.lab.traffic.accounting import Ledger
from ops.lab.traffic.alarm_path import alarm_path
from ops.lab.traffic.records import TicketRecord
from ops.lab.traffic.timeseries import AlarmChange
from shared.policy import load_policy

POLICY = load_policy()
TYPES = ["loan_approval", "complaint"]
SLO = {t: POLICY.type_policy(t).slo_seconds for t in TYPES}
PEAK_AT = 50.0
"""Where the surge's plateau starts in these runs."""


def record(index: int, ticket_type: str, planned_at: float, outcome: str, took_s: float) -> TicketRecord:
    return TicketRecord(
        index=index,
        request_id=f"r{index}",
        type=ticket_type,
        branch_id="branch-001",
        planned_at=planned_at,
        slo_seconds=SLO[ticket_type],
        submissions=1,
        ticket_id=None if outcome == "rejected" else f"t{index}",
        outcome=outcome,
        first_submit_at=1_000.0 + planned_at,
        finished_at=1_000.0 + planned_at + took_s,
    )


def good_records() -> list[TicketRecord]:
    """100 loans, 20 of them in the peak's first seconds, all in time; 100 complaints, 40 refused,
    the 60 admitted answered in time."""
    loans = [record(i, "loan_approval", PEAK_AT + i * ONSET_S / 20 if i < 20 else 100.0 + i, "done", 0.5)
             for i in range(100)]  # fmt: skip
    complaints = [
        record(100 + i, "complaint", 60.0 + i, "rejected" if i < 40 else "done", 3.0) for i in range(100)
    ]
    return loans + complaints


def figures(
    records: list[TicketRecord], *, slo_goodput: float = 1900.0, levels: tuple[str, ...] = ()
) -> SystemFigures:
    ledger = Ledger("clients", {t: {"submitted": sum(1 for r in records if r.type == t)} for t in TYPES})
    changes = [
        AlarmChange(float(i), 1_000.0 + i, a, b, 0) for i, (a, b) in enumerate(itertools.pairwise(levels))
    ]
    return system_figures(
        "tidegate",
        TYPES,
        SLO,
        records,
        books=Books(True, "holds", ledger.by_type),
        oom_crashes=0,
        preemptions=0,
        goodput_tokens_per_s=1900.0,
        slo_goodput_tokens_per_s=slo_goodput,
        capacity_tokens_per_s=2000.0,
        cpu_cores={},
        alarm=alarm_path(changes),
        onset_at=PEAK_AT,
    )


def checks(ours: SystemFigures) -> dict[str, bool]:
    return run_verdict({"tidegate": ours}, TYPES, POLICY, "ample")["tidegate"]


def failed(ours: SystemFigures) -> list[str]:
    return [name for name, passed in checks(ours).items() if not passed]


def test_a_run_that_keeps_every_promise_passes_every_check() -> None:
    ours = figures(good_records(), levels=("green", "yellow", "orange", "red", "orange", "green"))
    assert ours.rows["complaint"].admitted == 60
    assert ours.rows["loan_approval"].onset_offered == 20
    assert failed(ours) == []


def test_slo_goodput_below_nine_tenths_is_short_even_with_the_gpu_busy() -> None:
    assert failed(figures(good_records(), slo_goodput=1700.0)) == [
        "SLO goodput in the surge >= 90% of capacity"
    ]


def test_a_cycling_alarm_is_short() -> None:
    ours = figures(good_records(), levels=("green", "orange", "red", "orange", "red", "green"))
    assert failed(ours) == ["alarm up, hold, down (no cycling)"]
    alarm = ours.to_dict()["alarm"]
    assert isinstance(alarm, dict) and alarm["holds"] is False  # results.json carries the verdict too


def test_admitted_complaints_answered_late_are_short_but_refused_ones_do_not_count() -> None:
    records = good_records()
    late = [replace(r, finished_at=(r.finished_at or 0) + 30) if r.index >= 197 else r for r in records]
    assert failed(figures(late)) == []  # 3 of 60 late: 95% within
    later = [replace(r, finished_at=(r.finished_at or 0) + 30) if r.index >= 196 else r for r in records]
    assert failed(figures(later)) == ["complaint admitted and answered within its SLO >= 95%"]


def test_a_late_loan_in_the_peaks_first_seconds_is_short_though_99_percent_of_all_loans_are_in_time() -> None:
    records = [
        replace(r, finished_at=(r.finished_at or 0) + 5) if r.index == 3 else r for r in good_records()
    ]
    results = checks(figures(records))
    assert results["loan_approval >= 99% within its SLO"]
    assert not results[f"loan_approval arriving in the first {ONSET_S:g} s at the peak >= 99% within it"]
