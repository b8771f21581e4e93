"""The end-of-run report: a table per ticket type, the alarm transitions, the checks the demo exists
to show (alarms fired in the surge, loan approvals never shed, every request and every ticket
accounted for) and where everything ran. One `DemoReport` feeds both the terminal table and `--json`.

The table counts unique branch requests, each by how it ended for its branch (answered within its SLO
counted from the first try, answered late, given the degraded answer, refused until it gave up, or
otherwise); retries are a column of their own, so the rows sum to the requests planned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ops.lab.traffic.accounting import AccountingCheck
from ops.lab.traffic.alarm_path import AlarmPath, alarm_path
from ops.lab.traffic.records import REQUEST_ENDS, TypeFigures
from ops.lab.traffic.timeseries import AlarmChange
from ops.lab.traffic.workload import LoadProfile
from producer.live_view import LEVEL_ORDER, LEVEL_STYLES


@dataclass(frozen=True)
class DemoReport:
    queue: str
    redis: str
    engine: str
    duration_s: float
    elapsed_s: float
    capacity_tickets_per_s: float
    capacity_note: str
    peak_load: float
    figures: dict[str, TypeFigures]
    alarms: list[AlarmChange]
    peak_level: str
    accounting: AccountingCheck
    critical_types: list[str]
    api_url: str
    metrics_urls: dict[str, str]
    run_dir: str
    measured_drain_peak: float | None
    profile: LoadProfile | None = None
    interrupted: bool = False
    cancelled_leftovers: int = 0
    notes: list[str] = field(default_factory=list)
    planned_requests: int | None = None
    """Requests in the plan; None: the sum of the figures' requests (nothing to check it against)."""

    # ---- requests, by how they ended -----------------------------------------------------------
    def request_ends(self) -> dict[str, int]:
        totals = dict.fromkeys(REQUEST_ENDS, 0)
        for figures in self.figures.values():
            for end, n in figures.ends.items():
                totals[end] += n
        return totals

    @property
    def planned(self) -> int:
        return self.planned_requests if self.planned_requests is not None else self.requests_counted

    @property
    def requests_counted(self) -> int:
        return sum(self.request_ends().values())

    @property
    def requests_balance(self) -> bool:
        return self.requests_counted == self.planned

    def requests_line(self) -> str:
        ends = self.request_ends()
        parts = [f"{label} {ends[end]}" for end, label in END_LABELS.items() if end in MAIN_ENDS or ends[end]]
        verdict = (
            "balances" if self.requests_balance else f"DOES NOT BALANCE ({self.requests_counted} counted)"
        )
        return f"requests: {self.planned} planned = " + " + ".join(parts) + f": {verdict}"

    # ---- the checks ----------------------------------------------------------------------------
    def alarms_in_surge(self) -> list[AlarmChange]:
        """Alarms raised from green while the offered load was above normal."""
        if self.profile is None:
            return []
        return [a for a in self.alarms if a.previous == "green" and self.profile.phase(a.t) == "surge"]

    @cached_property
    def alarm_path(self) -> AlarmPath:
        """The level's path through the run (the report is built once the run has ended)."""
        return alarm_path(self.alarms)

    @property
    def alarm_fired(self) -> bool:
        return LEVEL_ORDER.index(self.peak_level) >= LEVEL_ORDER.index("yellow")

    @property
    def critical_rejected(self) -> int:
        """Submissions of critical types (loan approvals) that were answered 429."""
        return sum(self.figures[t].count("rejected") for t in self.critical_types if t in self.figures)

    def check_lines(self) -> list[tuple[bool, str]]:
        first = next((a for a in self.alarms if a.previous == "green"), None)
        if not self.alarm_fired:
            fired = "alarms: none fired (depth never passed the yellow threshold)"
        else:
            fired = f"alarms: fired, peak {self.peak_level}, {len(self.alarms)} transitions"
            if first is not None:
                when = " during the surge" if first in self.alarms_in_surge() else ""
                fired += (
                    f"; first {first.previous} → {first.level} at {first.t:.1f} s{when} (depth {first.depth})"
                )
        names = ", ".join(self.critical_types) or "critical types"
        critical = f"{names} rejected: {self.critical_rejected}" + (
            " (never shed)" if self.critical_rejected == 0 else " (SHED)"
        )
        path = self.alarm_path
        return [
            (self.alarm_fired, fired),
            (path.holds and path.red_entries <= 1, path.line()),
            (self.critical_rejected == 0, critical),
            (self.requests_balance, self.requests_line()),
            (self.accounting.holds, self.accounting.line()),
        ]

    # ---- JSON --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "redis": self.redis,
            "engine": self.engine,
            "duration_s": self.duration_s,
            "elapsed_s": round(self.elapsed_s, 2),
            "interrupted": self.interrupted,
            "capacity_tickets_per_s": round(self.capacity_tickets_per_s, 3),
            "capacity_note": self.capacity_note,
            "measured_drain_peak": self.measured_drain_peak,
            "peak_load": self.peak_load,
            "types": {name: asdict(f) for name, f in self.figures.items()},
            "alarms": [
                {**asdict(a), "phase": self.profile.phase(a.t) if self.profile else None} for a in self.alarms
            ],
            "peak_level": self.peak_level,
            "checks": {
                "alarm_fired": self.alarm_fired,
                "alarms_raised_in_surge": len(self.alarms_in_surge()),
                "alarm_path": self.alarm_path.to_dict(),
                "critical_rejected": self.critical_rejected,
                "accounting_holds": self.accounting.holds,
                "accounting_line": self.accounting.line(),
                "accounting_mismatches": self.accounting.mismatches,
                "requests_balance": self.requests_balance,
            },
            "requests": {"planned": self.planned, "ends": self.request_ends()},
            "ledgers": {"redis": self.accounting.redis.by_type, "clients": self.accounting.clients.by_type},
            "cancelled_leftovers": self.cancelled_leftovers,
            "api_url": self.api_url,
            "docs_url": f"{self.api_url}/docs" if self.api_url else None,
            "metrics_urls": self.metrics_urls,
            "run_dir": self.run_dir,
            "notes": self.notes,
        }


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


END_LABELS = {
    "within_slo": "within SLO",
    "late": "late",
    "degraded": "degraded",
    "gave_up": "refused, gave up",
    "expired": "expired",
    "failed": "failed",
    "cancelled": "cancelled",
    "error": "error",
    "unfinished": "unfinished",
}
MAIN_ENDS = ("within_slo", "late", "degraded", "gave_up")
"""Always a column; the other ends are one "other" column, named in the line under the table."""


def type_table(figures: dict[str, TypeFigures], title: str = "Branch requests by type") -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("type", no_wrap=True, min_width=13)
    table.add_column("requests", justify="right")
    for header in ("answered\nwithin SLO", "answered\nlate", "degraded", "refused,\ngave up", "other"):
        table.add_column(header, justify="right")
    table.add_column("retries", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    # What a branch waits before its answer starts (ticket created → first token), per type.
    table.add_column("TTFT p50", justify="right")
    table.add_column("TTFT p99", justify="right")
    totals = dict.fromkeys((*MAIN_ENDS, "requests", "other", "retries"), 0)

    def share(n: int, of: int) -> str:
        return f"{n} ({n / of:.0%})" if of else str(n)

    for name, f in figures.items():
        other = f.requests - sum(f.ends.get(e, 0) for e in MAIN_ENDS)
        table.add_row(
            name,
            str(f.requests),
            *(share(f.ends.get(e, 0), f.requests) for e in MAIN_ENDS),
            str(other),
            str(f.retries),
            seconds(f.p50_s),
            seconds(f.p99_s),
            seconds(f.e2e_ttft_p50_s),
            seconds(f.e2e_ttft_p99_s),
        )
        for e in MAIN_ENDS:
            totals[e] += f.ends.get(e, 0)
        totals["requests"] += f.requests
        totals["other"] += other
        totals["retries"] += f.retries
    table.add_section()
    table.add_row(
        "total",
        str(totals["requests"]),
        *(share(totals[e], totals["requests"]) for e in MAIN_ENDS),
        str(totals["other"]),
        str(totals["retries"]),
        *[""] * 4,
        style="bold",
    )
    return table


def alarm_table(alarms: list[AlarmChange], profile: LoadProfile | None) -> Table:
    table = Table(title="Alarm transitions", title_justify="left", header_style="bold")
    table.add_column("at", justify="right")
    table.add_column("from → to")
    table.add_column("depth", justify="right")
    if profile is not None:
        table.add_column("phase")
    for a in alarms:
        row: list[str | Text] = [f"{a.t:.1f} s", _levels(a.previous, a.level), str(a.depth)]
        if profile is not None:
            row.append(profile.phase(a.t))
        table.add_row(*row)
    if not alarms:
        table.add_row("-", "no transitions", "-", *(["-"] if profile is not None else []))
    return table


def _levels(previous: str, level: str) -> Text:
    text = Text()
    text.append(previous, style=LEVEL_STYLES.get(previous, ""))
    text.append(" → ")
    text.append(level, style=LEVEL_STYLES.get(level, ""))
    return text


def render_report(report: DemoReport) -> RenderableType:
    parts: list[RenderableType] = [
        Text(
            f"\ntidegate demo summary: {report.elapsed_s:.0f} s, queue {report.queue}, {report.engine}, "
            f"{report.redis}" + (" (interrupted)" if report.interrupted else ""),
            style="bold",
        ),
        Text(
            f"capacity {report.capacity_tickets_per_s:.1f} tickets/s ({report.capacity_note}); "
            f"peak offered {report.peak_load:.0%}; measured drain peak "
            + (f"{report.measured_drain_peak:.1f}/s" if report.measured_drain_peak is not None else "-")
        ),
        type_table(report.figures),
        alarm_table(report.alarms, report.profile),
    ]
    for ok, line in report.check_lines():
        parts.append(Text(("✔ " if ok else "✘ ") + line, style="green" if ok else "bold red"))
    if report.cancelled_leftovers:
        parts.append(Text(f"{report.cancelled_leftovers} tickets still open at the end were cancelled"))
    where = Table.grid(padding=(0, 2))
    where.add_column(style="bold")
    where.add_column()
    if report.api_url:
        where.add_row("API", f"{report.api_url}  (docs {report.api_url}/docs)")
    for name, url in report.metrics_urls.items():
        where.add_row(f"metrics {name}", url)
    where.add_row("logs and data", report.run_dir)
    parts += [Text("\nServed at (while the demo ran):", style="bold"), where]
    parts += [Text(note, style="dim") for note in report.notes]
    return Group(*parts)


def print_report(console: Console, report: DemoReport) -> None:
    console.print(render_report(report))
