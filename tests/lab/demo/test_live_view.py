"""The live screen and the --no-live line render what the run is doing, from synthetic frames."""

from __future__ import annotations

from rich.console import Console

from ops.lab.demo.live import ViewState, plain_line, render_live
from ops.lab.traffic.records import TicketRecord, type_figures
from ops.lab.traffic.timeseries import AlarmChange, Sample, TimeSeries, WorkerPoint
from ops.lab.traffic.workload import LoadProfile
from shared.policy import Policy

GIB = 1024**3


def frame(policy: Policy, elapsed: float) -> ViewState:
    sample = Sample(
        t=elapsed,
        depth_by_type={"loan_approval": 2, "complaint": 51, "archive_query": 33},
        inflight=27,
        level="red",
        mode="normal",
        drain_rate=9.6,
        desired_workers=4,
        workers=[
            WorkerPoint("demo-gpu0", 12, 12, 0.91, 7 * GIB),
            WorkerPoint("demo-gpu1", 15, 14, 0.2, 7 * GIB),
        ],
        counts={"loan_approval:done": 40},
    )
    series = TimeSeries([sample], [AlarmChange(30.0, 0.0, "orange", "red", 81)])
    records = [
        TicketRecord(
            1,
            "r1",
            "loan_approval",
            "branch-001",
            1.0,
            2.0,
            1,
            0,
            0,
            [],
            "t1",
            "done",
            "done",
            latency_s=1.5,
            e2e_ttft_s=0.25,
        ),
        TicketRecord(2, "r2", "complaint", "branch-002", 2.0, 10.0, 2, 2, 1, [], None, None, "rejected"),
    ]
    figures = {name: type_figures(name, records) for name in policy.type_names}
    return ViewState(elapsed, LoadProfile.surge(90, 2.5), 9.4, series, figures, draining=elapsed > 90)


def test_live_screen_shows_depth_alarm_workers_and_outcomes(policy: Policy) -> None:
    console = Console(record=True, width=140, color_system=None)
    console.print(render_live(frame(policy, 40.0), policy, "tidegate demo · test"))
    text = console.export_text()
    assert "phase: surge" in text and "offered 250% of capacity (23.5 tickets/s)" in text
    assert " RED " in text and "at 30/50/80" in text and "drain 9.6/s" in text
    assert "scale-out signal: 4 workers" in text
    assert "complaint" in text and "51" in text and "in flight" in text
    assert "demo-gpu0" in text and "91%" in text and "7.0 GiB" in text
    assert "30s orange→red (81)" in text
    assert "1.50 s" in text  # the loan's latency as p50 and p99
    assert "TTFT p50" in text and "TTFT p99" in text
    loan_row = next(line for line in text.splitlines() if line.strip().startswith("loan_approval"))
    assert loan_row.count("250 ms") == 2  # created → first token, as p50 and p99


def test_plain_line_sums_up_a_frame(policy: Policy) -> None:
    line = plain_line(frame(policy, 95.0))
    assert line.startswith("t= 95.0s drain")
    assert "depth  86 (loan 2 comp 51 arch 33) red" in line
    assert "batch 12/15 KV 91%/20%" in line
    assert "done 1 rejected 2 expired 0" in line
    assert "p99 loan 1.50 s comp - arch -" in line
    assert "TTFT p99 loan 250 ms comp - arch -" in line
