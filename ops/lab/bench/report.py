"""The overload benchmark's table: both systems side by side, per ticket type, then overall figures."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from ops.lab.bench.figures import ARM_CLIENTS, ONSET_S, SystemFigures, TypeRow

if TYPE_CHECKING:
    from ops.lab.bench.overload import OverloadResult

SHORT_TYPE = {"loan_approval": "loan", "complaint": "complaint", "archive_query": "archive", "all": "all"}


def _seconds(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


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


def _shed(row: TypeRow) -> str:
    return ", ".join(f"{code} {count}" for code, count in sorted(row.shed.items())) or "-"


def _onset(row: TypeRow) -> str:
    return f"{row.onset_within_slo} of {row.onset_offered}" if row.onset_offered else "-"


CLASS_COLUMNS: tuple[tuple[str, Callable[[TypeRow], str]], ...] = (
    ("offered", lambda r: str(r.offered)),
    ("admitted", lambda r: str(r.admitted)),
    ("answered", lambda r: str(r.done)),
    ("within SLO", _within),
    (f"first {ONSET_S:g} s at the peak: within SLO", _onset),
    ("shed / unanswered by code", _shed),
    ("TTFT p50/p99 s", lambda r: f"{_seconds(r.ttft_p50_s)}/{_seconds(r.ttft_p99_s)}"),
    ("e2e p50/p99 s", lambda r: f"{_seconds(r.p50_s)}/{_seconds(r.p99_s)}"),
)


def per_class_table(systems: Sequence[SystemFigures], types: Sequence[str], title: str) -> Table:
    """One row per (class, arm): what each arm did with each ticket type, side by side."""
    caption = (
        "offered: unique requests (retries not counted); admitted: taken on (not refused); within SLO: "
        "answered within the type's SLO from the branch's first submission; first seconds at the peak: "
        "requests planned then, when a step hits hardest; shed by code: submissions refused (429, 503 queue timeout, dropped "
        "connection) and requests ended unanswered (expired at TTL, failed, cancelled); TTFT: a streaming "
        "branch's send of the answered submission to its first text (- where the arm's client does not "
        "stream); e2e: the first submission to the answer's end"
    )
    table = Table("class", "SLO s", "arm", *(name for name, _ in CLASS_COLUMNS), title=title, caption=caption)
    for ticket_type in [*types, "all"]:
        for system in systems:
            row = system.rows[ticket_type]
            slo = "-" if row.slo_seconds is None else f"{row.slo_seconds:g}"
            cells = [cell(row) for _, cell in CLASS_COLUMNS]
            table.add_row(SHORT_TYPE.get(ticket_type, ticket_type), slo, system.name, *cells)
        table.add_section()
    return table


def _harness_cpu(system: SystemFigures) -> str:
    """The bench process's CPU over the arm, and in the surge's plateau where it is busiest."""
    whole, surge = system.cpu_cores.get("harness"), system.cpu_cores.get("harness_in_surge")
    text = "-" if whole is None else f"{whole:.2f}"
    return text if surge is None else f"{text} (surge {surge:.2f})"


def harness_line(system: SystemFigures) -> str:
    """The load generator's own figures for one arm: how late it sent and the CPU it used."""
    lag = system.send_lag
    return (
        f"{system.name} harness ({ARM_CLIENTS.get(system.client, system.client or '-')}): send lag p50/p99/max "
        f"{_seconds(lag.get('p50_s'), 3)}/{_seconds(lag.get('p99_s'), 3)}/{_seconds(lag.get('max_s'), 3)} s, "
        f"CPU {_harness_cpu(system)} cores"
    )


def _alarm(system: SystemFigures) -> str:
    path = system.alarm
    if path is None:
        return "-"
    return f"{path.transitions} ({path.red_entries})" + ("" if path.holds else " cycling")


def arms_table(systems: Sequence[SystemFigures]) -> Table:
    """Per arm: busy and SLO goodput beside the shed rate, OOM crashes and the CPU each process used,
    and whether the harness kept up (its send lag and CPU)."""
    table = Table(
        "arm",
        "client",
        "busy",
        "SLO goodput",
        "shed rate",
        "OOM crashes",
        "preemptions",
        "alarm transitions (red entries)",
        title="per arm, in the surge (goodput ÷ measured capacity)",
    )
    table.add_column("send lag p50/p99/max s", no_wrap=True)
    table.add_column("harness CPU", no_wrap=True)
    table.add_column("CPU cores per process")
    for system in systems:
        cores = ", ".join(
            f"{name} {value:.2f}" for name, value in system.cpu_cores.items() if name != "harness_in_surge"
        )
        lag = system.send_lag
        table.add_row(
            system.name,
            ARM_CLIENTS.get(system.client, system.client or "-"),
            _fraction(system.busy_fraction),
            _fraction(system.slo_goodput_fraction),
            _fraction(system.shed_rate),
            str(system.oom_crashes),
            str(system.preemptions),
            _alarm(system),
            "/".join(_seconds(lag.get(k), 3) for k in ("p50_s", "p99_s", "max_s")),
            _harness_cpu(system),
            cores or "-",
        )
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
    ramp = (
        "the built-in ramp" if s.ramp_s is None else ("a step" if s.ramp_s == 0 else f"a {s.ramp_s:g} s ramp")
    )
    title = (
        f"overload: {s.normal_load:.0%} -> {s.surge_load:.0%} ({ramp}) -> {s.normal_load:.0%} of capacity over "
        f"{s.duration_s:.0f} s, {s.gpus} simulated GPU(s), memory {s.memory} ({s.oom_mode} on OOM)"
    )
    systems = list(result.figures.values())
    types = [t for t in systems[0].rows if t != "all"]
    console.print(per_class_table(systems, types, title))
    console.print(arms_table(systems))
    for system in systems:
        console.print(summary_line(system), highlight=False)
        console.print(harness_line(system), highlight=False)
        console.print(f"{system.name} {system.books.line}", highlight=False)
        cores = ", ".join(f"{name} {value:.2f}" for name, value in system.cpu_cores.items())
        console.print(f"{system.name} CPU (cores): {cores}", highlight=False)
        if system.alarm is not None:
            console.print(f"{system.name} {system.alarm.line()}", highlight=False)
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
