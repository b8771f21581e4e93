"""The overload benchmark's table: both systems side by side, per ticket type, then overall figures."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from ops.lab.bench.figures import SystemFigures, TypeRow

if TYPE_CHECKING:
    from ops.lab.bench.overload import OverloadResult

SHORT_TYPE = {"loan_approval": "loan", "complaint": "complaint", "archive_query": "archive", "all": "all"}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _count_of(row: TypeRow, attribute: str) -> str:
    return str(getattr(row, attribute))


def _within(row: TypeRow) -> str:
    share = f" ({row.within_slo / row.offered:.0%})" if row.offered else ""
    return f"{row.within_slo}{share}"


ROW_METRICS: tuple[tuple[str, Callable[[TypeRow], str]], ...] = (
    ("offered", lambda r: _count_of(r, "offered")),
    ("done", lambda r: _count_of(r, "done")),
    ("done within SLO", _within),
    ("rejected", lambda r: _count_of(r, "rejected")),
    ("expired", lambda r: _count_of(r, "expired")),
    ("failed", lambda r: _count_of(r, "failed")),
    ("cancelled", lambda r: _count_of(r, "cancelled")),
    ("latency p50 s", lambda r: _seconds(r.p50_s)),
    ("latency p95 s", lambda r: _seconds(r.p95_s)),
    ("latency p99 s", lambda r: _seconds(r.p99_s)),
    ("TTFT p50 s (streamed)", lambda r: _seconds(r.ttft_p50_s)),
    ("TTFT p99 s (streamed)", lambda r: _seconds(r.ttft_p99_s)),
    ("submissions", lambda r: _count_of(r, "submissions")),
)


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


OVERALL_METRICS: tuple[tuple[str, Callable[[SystemFigures], str]], ...] = (
    ("OOM crashes", lambda s: str(s.oom_crashes)),
    ("busy in the surge", lambda s: _fraction(s.busy_fraction)),
    ("goodput, tokens/s", lambda s: f"{s.goodput_tokens_per_s:,.0f}"),
    ("SLO goodput in the surge", lambda s: _fraction(s.slo_goodput_fraction)),
    ("SLO goodput, tokens/s", lambda s: f"{s.slo_goodput_tokens_per_s:,.0f}"),
    ("retries sent", lambda s: str(s.retries)),
    ("preemptions", lambda s: str(s.preemptions)),
    ("accounting", lambda s: "holds" if s.books.holds else "BROKEN"),
)


def comparison_table(systems: Sequence[SystemFigures], types: Sequence[str], title: str) -> Table:
    """Metrics down, (type, system) across; overall figures in the "all" columns."""
    columns = [*types, "all"]
    caption = (
        "latency: a branch's first submission to its answer (retries included); rejected: the branch gave "
        "up after 429s; TTFT: a streaming branch's send to its first token; busy: goodput (tokens of answered "
        "requests) in the surge ÷ measured capacity; SLO goodput: the same for answers within their type's SLO"
    )
    table = Table(title=title, caption=caption, show_lines=False)
    table.add_column("metric")
    for ticket_type in columns:
        for system in systems:
            table.add_column(f"{SHORT_TYPE.get(ticket_type, ticket_type)}\n{system.name}", justify="right")
    slo_cells = []
    for ticket_type in columns:
        for system in systems:
            slo = system.rows[ticket_type].slo_seconds
            slo_cells.append("-" if slo is None else f"{slo:g}")
    table.add_row("SLO s", *slo_cells, style="dim")
    for label, cell in ROW_METRICS:
        cells = [cell(system.rows[t]) for t in columns for system in systems]
        if label.startswith("TTFT") and set(cells) == {"-"}:
            continue  # no branch streamed (the tickets client): nothing to show
        table.add_row(label, *cells)
    table.add_section()
    blank = [""] * (len(types) * len(systems))
    for label, overall in OVERALL_METRICS:
        table.add_row(label, *blank, *(overall(system) for system in systems))
    return table


def summary_line(system: SystemFigures) -> str:
    """Busy fraction, SLO goodput and answers per type on one line, the figures runs are compared by."""
    answered = ", ".join(f"{count} {t}" for t, count in system.answered.items())
    return (
        f"{system.name}: busy {_fraction(system.busy_fraction)}, SLO goodput "
        f"{_fraction(system.slo_goodput_fraction)} of capacity in the surge; answered {answered}"
    )


def verdict_lines(verdict: Mapping[str, Mapping[str, bool]]) -> list[str]:
    """One line per check of the issue's "done when", marked ok or SHORT."""
    return [
        f"{'ok   ' if passed else 'SHORT'} {system}: {check}"
        for system, checks in verdict.items()
        for check, passed in checks.items()
    ]


def print_result(console: Console, result: OverloadResult) -> None:
    """The table, the accounting lines, the verdict and where the files are."""
    s = result.scenario
    title = (
        f"overload: {s.normal_load:.0%} -> {s.surge_load:.0%} -> {s.normal_load:.0%} of capacity over "
        f"{s.duration_s:.0f} s, {s.gpus} simulated GPU(s) in crash-on-OOM mode"
    )
    systems = list(result.figures.values())
    types = [t for t in systems[0].rows if t != "all"]
    console.print(comparison_table(systems, types, title))
    for system in systems:
        console.print(summary_line(system), highlight=False)
        console.print(f"{system.name} {system.books.line}", highlight=False)
        cores = ", ".join(f"{name} {value:.2f}" for name, value in system.cpu_cores.items())
        console.print(f"{system.name} CPU (cores): {cores}", highlight=False)
        for note in system.notes:
            console.print(f"{system.name}: {note}", highlight=False)
    for name, memory in result.document.get("redis_memory", {}).items():
        console.print(
            f"{name} Redis memory: start {memory['start_bytes'] / 2**20:.1f} MiB, peak "
            f"{memory['peak_bytes'] / 2**20:.1f} MiB, end {memory['end_bytes'] / 2**20:.1f} MiB; "
            f"{memory['bytes_per_rejected_record']:.0f} B per rejected record "
            f"({memory['rejected_records']} records for {memory['rejected_submissions']} 429s: "
            f"{memory['bytes_per_1000_rejected_submissions'] / 1000:.1f} KB per 1,000), "
            f"{memory['bytes_per_accepted_ticket']:.0f} B per accepted ticket",
            highlight=False,
        )
    for line in verdict_lines(result.verdict):
        console.print(line, highlight=False)
    console.print(
        f"results: {result.results_dir} (results.json, overload.png, *-tickets.jsonl)", highlight=False
    )
