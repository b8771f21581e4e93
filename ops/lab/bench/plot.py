"""The overload benchmark's PNG: depth, alarm level and latency per type over time, one column per system.

Drawn on a bare `Figure` (matplotlib's Agg canvas, no pyplot): no display, no global backend state,
so the plot is made the same way on a laptop, in CI and on a headless GPU node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ops.lab.bench.timeline import Sample
from ops.lab.traffic.records import TicketRecord

TYPE_COLOURS = {"loan_approval": "tab:red", "complaint": "tab:blue", "archive_query": "tab:green"}
LEVEL_NAMES = ("green", "yellow", "orange", "red")


@dataclass(frozen=True)
class PlotSeries:
    """One system's run: its samples, its requests and when it started (unix seconds)."""

    name: str
    samples: Sequence[Sample]
    records: Sequence[TicketRecord]
    started_at: float
    arrivals_per_s: Sequence[float]
    """Planned arrivals in each one-second bin from the start (the offered load)."""


def plot_runs(series: Sequence[PlotSeries], slo_by_type: Mapping[str, float], path: Path) -> Path:
    """Draw every system side by side and save the PNG at `path`."""
    figure = Figure(figsize=(7 * len(series), 10))
    axes = figure.subplots(3, len(series), sharex="col", squeeze=False)
    for column, run in enumerate(series):
        _depth(axes[0][column], run)
        _alarms(axes[1][column], run)
        _latency(axes[2][column], run, slo_by_type)
        axes[0][column].set_title(run.name)
        axes[2][column].set_xlabel("seconds since the run started")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


def _depth(ax: Axes, run: PlotSeries) -> None:
    times = [s.t for s in run.samples]
    ax.plot(times, [s.depth if s.depth is not None else float("nan") for s in run.samples], label="queued")
    ax.plot(
        times,
        [s.inflight if s.inflight is not None else float("nan") for s in run.samples],
        label="in flight",
        alpha=0.7,
    )
    ax.set_ylabel("tickets")
    offered = ax.twinx()
    offered.plot(
        [t + 0.5 for t in range(len(run.arrivals_per_s))],
        run.arrivals_per_s,
        color="grey",
        alpha=0.5,
        linewidth=0.8,
        label="offered / s",
    )
    offered.set_ylabel("offered tickets / s", color="grey")
    lines, labels = ax.get_legend_handles_labels()
    more_lines, more_labels = offered.get_legend_handles_labels()
    ax.legend(lines + more_lines, labels + more_labels, loc="upper left", fontsize="small")


def _alarms(ax: Axes, run: PlotSeries) -> None:
    levels = [(s.t, s.alarm_level) for s in run.samples if s.alarm_level is not None]
    if levels:
        ax.step([t for t, _ in levels], [level for _, level in levels], where="post", label="alarm level")
    else:
        ax.text(0.5, 0.6, "no alarms in this system", transform=ax.transAxes, ha="center", color="grey")
    ax.set_yticks(range(len(LEVEL_NAMES)), LEVEL_NAMES)
    ax.set_ylim(-0.3, len(LEVEL_NAMES) - 0.7)
    previous = 0
    for sample in run.samples:
        crashes = sample.oom_crashes or 0
        if crashes > previous:
            ax.axvline(sample.t, color="black", linestyle=":", linewidth=1.0)
        previous = max(previous, crashes)
    ax.set_ylabel(f"alarm level\n(dotted: OOM crash, {previous} in all)")
    kv = [(s.t, s.kv_usage_max) for s in run.samples if s.kv_usage_max is not None]
    if kv:
        usage = ax.twinx()
        usage.plot([t for t, _ in kv], [v for _, v in kv], color="purple", alpha=0.4, linewidth=0.8)
        usage.set_ylim(0, 1.05)
        usage.set_ylabel("KV cache used (fullest GPU)", color="purple")


def _latency(ax: Axes, run: PlotSeries, slo_by_type: Mapping[str, float]) -> None:
    for ticket_type, colour in TYPE_COLOURS.items():
        points = [
            (r.finished_at - run.started_at, r.finished_at - r.first_submit_at)
            for r in run.records
            if r.type == ticket_type
            and r.outcome == "done"
            and r.finished_at is not None
            and r.first_submit_at is not None
        ]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=4, color=colour, label=ticket_type)
        if ticket_type in slo_by_type:
            ax.axhline(slo_by_type[ticket_type], color=colour, linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("latency of answered requests, s\n(dashed: SLO per type)")
    ax.legend(loc="upper left", fontsize="small", markerscale=3)
