"""The side-by-side table and the PNG, from figures built the way a run builds them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.console import Console

from ops.lab.bench.figures import Books, SystemFigures, system_figures
from ops.lab.bench.plot import PlotSeries, plot_runs
from ops.lab.bench.report import (
    arms_table,
    comparison_table,
    harness_line,
    per_class_table,
    summary_line,
    verdict_lines,
)
from ops.lab.bench.timeline import Sample
from ops.lab.traffic.accounting import Ledger
from ops.lab.traffic.records import TicketRecord

TYPES = ["loan_approval", "complaint"]
SLO = {"loan_approval": 2.0, "complaint": 10.0}


def records(count: int, first: float) -> list[TicketRecord]:
    return [
        TicketRecord(
            index=i,
            request_id=f"r{i}",
            type=TYPES[i % 2],
            branch_id="branch-001",
            planned_at=i * 0.1,
            slo_seconds=SLO[TYPES[i % 2]],
            submissions=1,
            outcome="done" if i % 5 else "expired",
            first_submit_at=first + i * 0.1,
            finished_at=first + i * 0.1 + 0.5 + (i % 7),
        )
        for i in range(count)
    ]


def figures(name: str, crashes: int) -> tuple[SystemFigures, list[TicketRecord]]:
    recs = records(40, 1000.0)
    ledger = Ledger(
        "clients",
        {t: {"submitted": 20, "done": sum(1 for r in recs if r.type == t and r.outcome == "done"),
             "expired": sum(1 for r in recs if r.type == t and r.outcome == "expired")} for t in TYPES},
    )  # fmt: skip
    books = Books.from_ledger(ledger, recs)
    made = system_figures(
        name,
        TYPES,
        SLO,
        recs,
        books=books,
        oom_crashes=crashes,
        preemptions=0,
        goodput_tokens_per_s=1234.0,
        slo_goodput_tokens_per_s=700.0,
        capacity_tokens_per_s=2000.0,
        cpu_cores={"harness": 0.2},
    )
    return made, recs


def test_the_table_puts_both_systems_side_by_side_per_type() -> None:
    ours, _ = figures("tidegate", 0)
    theirs, _ = figures("baseline", 3)
    console = Console(record=True, width=200)
    console.print(comparison_table([ours, theirs], TYPES, "overload"))
    text = console.export_text()
    for label in (
        "offered",
        "done within SLO",
        "latency p99 s",
        "OOM crashes",
        "busy in the surge",
        "SLO goodput in the surge",
        "retries sent",
    ):
        assert label in text
    header = next(line for line in text.splitlines() if "tidegate" in line)
    assert header.count("tidegate") == 3 and header.count("baseline") == 3  # loan, complaint, all
    crash_line = next(line for line in text.splitlines() if "OOM crashes" in line)
    cells = [cell.strip() for cell in crash_line.split("│") if cell.strip()]
    assert cells[-2:] == ["0", "3"]
    assert "62%" in text  # 1234 / 2000 tokens per second
    assert "35%" in text  # 700 / 2000: the SLO goodput
    assert ours.books.holds and "holds" in text


def test_ttft_rows_appear_only_when_the_branches_streamed() -> None:
    plain, recs = figures("tidegate", 0)
    console = Console(record=True, width=200)
    console.print(comparison_table([plain], TYPES, "overload"))
    assert "TTFT p50" not in console.export_text()
    streamed = [replace(r, client_ttft_s=0.01 * (r.index + 1)) for r in recs]
    ours = system_figures(
        "tidegate",
        TYPES,
        SLO,
        streamed,
        books=plain.books,
        oom_crashes=0,
        preemptions=0,
        goodput_tokens_per_s=1.0,
        slo_goodput_tokens_per_s=1.0,
        capacity_tokens_per_s=2.0,
        cpu_cores={},
    )
    loans = [r.client_ttft_s for r in streamed if r.type == "loan_approval" and r.outcome == "done"]
    assert ours.rows["loan_approval"].ttft_p99_s == round(max(v for v in loans if v is not None), 3)
    console = Console(record=True, width=200)
    console.print(comparison_table([ours], TYPES, "overload"))
    ttft_line = next(line for line in console.export_text().splitlines() if "TTFT p99" in line)
    assert f"{ours.rows['loan_approval'].ttft_p99_s:.2f}" in ttft_line


def test_the_summary_line_puts_slo_goodput_beside_busy_and_the_answers() -> None:
    ours, recs = figures("tidegate", 0)
    complaints = sum(1 for r in recs if r.type == "complaint" and r.outcome == "done")
    assert summary_line(ours) == (
        f"tidegate: busy 62%, SLO goodput 35% of capacity in the surge; answered "
        f"{ours.answered['loan_approval']} loan_approval, {complaints} complaint"
    )


def test_verdict_lines_mark_each_check() -> None:
    lines = verdict_lines({"tidegate": {"zero OOM crashes": True, "busy >= 90%": False}})
    assert lines == ["ok    tidegate: zero OOM crashes", "SHORT tidegate: busy >= 90%"]


def test_the_plot_is_a_png_with_a_column_per_system(tmp_path: Path) -> None:
    samples = [Sample(float(t), t % 9, 3, t % 4, 3, 0, 0.5, t // 20) for t in range(40)]
    _, recs = figures("tidegate", 0)
    series = [
        PlotSeries("tidegate", samples, recs, 1000.0, [float(t % 5) for t in range(40)]),
        PlotSeries(
            "baseline",
            [replace(s, alarm_level=None) for s in samples],
            recs,
            1000.0,
            [],
        ),
    ]
    path = plot_runs(series, SLO, tmp_path / "out" / "overload.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000


def test_every_arm_gets_a_row_per_class_with_its_shed_codes_and_goodput_beside_the_shed_rate() -> None:
    ours, recs = figures("tidegate", 0)
    codes = {"loan_approval": {"429 scheduler_queue_full": 3}, "complaint": {"expired": 4, "503": 0}}
    smg = system_figures(
        "smg",
        TYPES,
        SLO,
        recs,
        books=ours.books,
        oom_crashes=0,
        preemptions=0,
        goodput_tokens_per_s=1000.0,
        slo_goodput_tokens_per_s=900.0,
        capacity_tokens_per_s=2000.0,
        cpu_cores={"smg": 0.3, "harness": 0.1},
        shed_codes=codes,
    )
    assert smg.rows["complaint"].shed == {"expired": 4}  # a zero count is left out
    assert smg.rows["all"].shed == {"429 scheduler_queue_full": 3, "expired": 4}
    assert smg.shed_rate == round(1 - smg.rows["all"].done / smg.rows["all"].offered, 4) > 0
    console = Console(width=240, record=True)
    console.print(per_class_table([ours, smg], TYPES, "side by side"))
    console.print(arms_table([ours, smg]))
    text = console.export_text()
    rows = [line for line in text.splitlines() if " smg " in line]
    assert len(rows) == len(TYPES) + 2  # a row per class and "all", and one in the per-arm table
    assert "429 scheduler_queue_full 3" in text and "expired 4" in text
    assert "45%" in text and "smg 0.30, harness 0.10" in text  # SLO goodput 900 / 2000


def test_every_arm_shows_its_client_and_whether_the_harness_kept_up() -> None:
    ours, _ = figures("tidegate", 0)
    streamed = replace(
        ours,
        client="openai",
        send_lag={"p50_s": 0.0012, "p99_s": 0.0071, "max_s": 0.031},
        cpu_cores={"harness": 0.2, "harness_in_surge": 0.45},
    )
    seed = replace(ours, name="fifo", client="seed", send_lag={}, cpu_cores={})
    console = Console(width=260, record=True)
    console.print(arms_table([streamed, seed]))
    console.print(harness_line(streamed), harness_line(seed), sep="\n")
    text = console.export_text()
    assert "OpenAI, streamed" in text and "no OpenAI door" in text
    assert "0.001/0.007/0.031" in text and "-/-/-" in text
    assert harness_line(streamed) == (
        "tidegate harness (OpenAI, streamed): send lag p50/p99/max 0.001/0.007/0.031 s, CPU 0.20 (surge 0.45) cores"
    )
    assert harness_line(seed).endswith("send lag p50/p99/max -/-/- s, CPU - cores")
