"""What the demo shows while it runs: a rich screen refreshed twice a second, or (`--no-live`) one
plain line every few seconds for logs and CI.

Everything shown comes from two places: the time series sampled from Redis (depth, alarm, workers)
and the branches' own records (outcomes, latency percentiles).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ops.lab.demo.summary import seconds, type_table
from ops.lab.traffic.records import TypeFigures
from ops.lab.traffic.timeseries import Sample, TimeSeries
from ops.lab.traffic.workload import LoadProfile
from producer.live_view import LEVEL_STYLES, bar, level_badge, transition, workers_panel
from shared.policy import Policy

SIDE_BY_SIDE_WIDTH = 130


@dataclass(frozen=True)
class ViewState:
    """One frame's inputs."""

    elapsed: float
    profile: LoadProfile
    capacity: float
    series: TimeSeries
    figures: dict[str, TypeFigures]
    draining: bool


def _phase_line(state: ViewState) -> Text:
    load = state.profile.load_at(state.elapsed)
    phase = "draining the backlog" if state.draining else state.profile.phase(state.elapsed)
    text = Text(f"t = {state.elapsed:5.1f} s of {state.profile.duration:.0f} s   ", style="bold")
    text.append(f"phase: {phase}   ", style="bold magenta" if phase == "surge" else "bold")
    if not state.draining:
        text.append(f"offered {load:.0%} of capacity ({load * state.capacity:.1f} tickets/s)")
    return text


def _depth_panel(sample: Sample | None, policy: Policy) -> RenderableType:
    table = Table.grid(padding=(0, 1))
    table.add_column(width=14)
    table.add_column()
    table.add_column(justify="right")
    red = policy.alarms.red
    scale = red * 1.5
    if sample is None:
        return Panel("waiting for the first sample…", title="queue")
    for name, depth in sample.depth_by_type.items():
        table.add_row(name, bar(depth, scale), str(depth))
    table.add_row(
        "total", bar(sample.depth, scale, style=LEVEL_STYLES.get(sample.level, "cyan")), str(sample.depth)
    )
    table.add_row("in flight", bar(sample.inflight, scale, style="blue"), str(sample.inflight))
    level = Text("alarm ", style="bold")
    level.append(level_badge(sample.level))
    level.append(
        f"  at {policy.alarms.yellow}/{policy.alarms.orange}/{policy.alarms.red}   mode {sample.mode}"
    )
    figures = Text()
    if sample.drain_rate is not None:
        figures.append(f"drain {sample.drain_rate:.1f}/s   ")
    if sample.desired_workers is not None:
        figures.append(f"scale-out signal: {sample.desired_workers} workers")
    level = Text("\n").join([level, figures]) if figures else level
    return Panel(Group(table, level), title="queue depth", title_align="left", expand=False)


def _workers_panel(sample: Sample | None) -> RenderableType:
    return workers_panel(sample.workers if sample else [])


def _alarm_line(state: ViewState, last: int = 5) -> Text:
    text = Text("alarm transitions: ", style="bold")
    changes = state.series.alarms[-last:]
    if not changes:
        text.append("none yet", style="dim")
    for i, change in enumerate(changes):
        if i:
            text.append(" · ", style="dim")
        text.append(f"{change.t:.0f}s ")
        text.append(transition(change.previous, change.level))
        text.append(f" ({change.depth})", style="dim")
    return text


def render_live(state: ViewState, policy: Policy, header: str, width: int = 160) -> RenderableType:
    """One frame, about 22 lines: depth and workers side by side when the terminal is wide enough."""
    sample = state.series.latest
    depth, workers = _depth_panel(sample, policy), _workers_panel(sample)
    panels: RenderableType = Group(depth, workers)
    if width >= SIDE_BY_SIDE_WIDTH:
        side_by_side = Table.grid(padding=(0, 1))
        side_by_side.add_row(depth, workers)
        panels = side_by_side
    table = type_table(state.figures, title="Branch requests so far (not yet ended: other)")
    table.box = box.SIMPLE_HEAD
    return Group(Text(header, style="dim"), _phase_line(state), panels, table, _alarm_line(state))


def _short(name: str) -> str:
    return name.split("_")[0][:4]


def plain_line(state: ViewState) -> str:
    """One line for `--no-live`: time and phase, depth and alarm, workers, outcomes, p99 and TTFT p99
    per type."""
    sample = state.series.latest
    phase = "drain" if state.draining else state.profile.phase(state.elapsed)
    parts = [f"t={state.elapsed:5.1f}s {phase:8}"]
    if sample is not None:
        by_type = " ".join(f"{_short(name)} {depth}" for name, depth in sample.depth_by_type.items())
        parts.append(f"depth {sample.depth:3d} ({by_type}) {sample.level:6} running {sample.inflight:3d}")
        limits = "/".join("-" if w.batch_limit is None else str(w.batch_limit) for w in sample.workers)
        kv = "/".join("-" if w.kv_usage is None else f"{w.kv_usage:.0%}" for w in sample.workers)
        parts.append(f"batch {limits} KV {kv}")
    totals = {o: sum(f.count(o) for f in state.figures.values()) for o in ("done", "rejected", "expired")}
    parts.append(" ".join(f"{o} {n}" for o, n in totals.items()))
    p99 = " ".join(f"{_short(name)} {seconds(f.p99_s)}" for name, f in state.figures.items())
    parts.append(f"p99 {p99}")
    ttft = " ".join(f"{_short(name)} {seconds(f.e2e_ttft_p99_s)}" for name, f in state.figures.items())
    parts.append(f"TTFT p99 {ttft}")
    return " | ".join(parts)
