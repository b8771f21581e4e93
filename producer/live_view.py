"""Terminal pieces shared by `tidegate status --watch` and the demo's live screen: level colours,
bars, the workers panel and an alarm transition, so both draw the same queue the same way.

Here rather than in the lab because producer code may not import the lab; the demo imports these.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from rich.console import Group
from rich.panel import Panel
from rich.table import Column, Table
from rich.text import Text

from shared.live_workers import WorkerView

LEVEL_STYLES = {"green": "green", "yellow": "yellow", "orange": "dark_orange", "red": "bold red"}
LEVEL_ORDER = ("green", "yellow", "orange", "red")
KV_HOT = 0.85
KV_WARM = 0.6
BAR_WIDTH = 30
GIB = 1024**3


class WorkerFigures(Protocol):
    """What a worker row shows; the registry's `WorkerView` and the demo's samples both have it."""

    @property
    def worker_id(self) -> str: ...
    @property
    def batch_limit(self) -> int | None: ...
    @property
    def inflight(self) -> int | None: ...
    @property
    def kv_usage(self) -> float | None: ...
    @property
    def gpu_free_bytes(self) -> int | None: ...


def level_style(level: str) -> str:
    return LEVEL_STYLES.get(level, "")


def bar(value: float, scale: float, width: int = BAR_WIDTH, style: str = "cyan") -> Text:
    filled = 0 if scale <= 0 else min(width, round(width * value / scale))
    text = Text("█" * filled, style=style)
    text.append("·" * (width - filled), style="dim")
    return text


def level_badge(level: str) -> Text:
    """The level as a coloured block, readable at a glance: ` RED ` on red."""
    return Text(f" {level.upper()} ", style="reverse " + level_style(level))


def transition(previous: str, level: str) -> Text:
    text = Text(previous, style=level_style(previous))
    text.append("→")
    text.append(level, style=level_style(level))
    return text


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def workers_panel(
    workers: Sequence[WorkerFigures],
    gpus: Sequence[str] | None = None,
    bounds: Sequence[str | None] = (),
    limits: Sequence[int | None] = (),
) -> Panel:
    """Batch limit, in flight, KV cache (a bar coloured by how full) and GPU free memory per worker.

    `gpus`, `limits` (the adaptive throttle's limit) and `bounds` (what binds the next claim), when
    given, add their columns.
    """
    table = Table(header_style="bold", expand=False, box=None)
    table.add_column("worker")
    if gpus is not None:
        table.add_column("GPU")
    table.add_column("batch limit", justify="right")
    if limits:
        table.add_column("concurrency limit", justify="right")
    if bounds:
        table.add_column("bound by")
    table.add_column("in flight", justify="right")
    table.add_column("KV cache")
    table.add_column("GPU free", justify="right")
    table.add_column("KV", justify="right")
    for i, w in enumerate(workers):
        usage = w.kv_usage or 0.0
        style = "red" if usage > KV_HOT else "yellow" if usage > KV_WARM else "green"
        row: list[str | Text] = [w.worker_id]
        if gpus is not None:
            row.append(gpus[i])
        row.append(_dash(w.batch_limit))
        if limits:
            row.append(_dash(limits[i]))
        if bounds:
            row.append(_dash(bounds[i]))
        row += [
            _dash(w.inflight),
            bar(usage, 1.0, width=16, style=style),
            "-" if w.gpu_free_bytes is None else f"{w.gpu_free_bytes / GIB:.1f} GiB",
            "-" if w.kv_usage is None else f"{usage:.0%}",
        ]
        table.add_row(*row)
    title = f"workers ({len(workers)} alive)" if gpus is not None else "workers"
    return Panel(table, title=title, title_align="left", expand=False)


# ---- `tidegate status` -------------------------------------------------------------------------------
def _clock(at: float | str | None) -> str:
    return "-" if at in (None, "") else time.strftime("%H:%M:%S", time.localtime(float(at)))


def _worker_rows(doc: dict[str, Any]) -> list[WorkerView]:
    fields = WorkerView.__dataclass_fields__
    return [
        WorkerView(**{k: v for k, v in w.items() if k in fields}, heartbeat_deadline=0.0)
        for w in doc["workers"]
    ]


def _head(doc: dict[str, Any]) -> Table:
    head = Table(show_header=False, box=None)
    level = level_badge(doc["level"])
    level.append(f"  {doc['level_source']}", style="dim")
    if doc.get("level_since"):
        level.append(f", since {_clock(doc['level_since'])}", style="dim")
    head.add_row("level", level)
    mode = doc["mode"]
    head.add_row("mode", Text(mode, style="bold red" if mode == "critical-only" else "green"))
    thresholds = doc["thresholds"]
    figures = (
        f"{doc['depth']}   (alarms at {thresholds['yellow']}/{thresholds['orange']}/{thresholds['red']})"
    )
    head.add_row("depth", figures)
    head.add_row("in flight", str(doc["inflight"]))
    drain = doc.get("drain_rate")
    head.add_row("drain", "-" if drain is None else f"{drain:.1f}/s")
    sheds = doc["sheds"]
    by_code = ", ".join(f"{code} {n}" for code, n in sheds["by_code"].items()) or "none"
    head.add_row(f"sheds (last {sheds['window_seconds'] // 60} min)", by_code)
    head.add_row("redis memory", _memory_line(doc))
    rollout = doc.get("rollout")
    if rollout:
        line = f"{rollout['version']} {rollout['status']}, wave {rollout['wave']}"
        if rollout.get("shadow_fraction"):
            line += f", shadow {rollout['shadow_fraction']:.0%}"
        head.add_row("rollout", line)
    return head


def _memory_line(doc: dict[str, Any]) -> Text:
    used, budget = doc["redis_used_memory"], doc["redis_memory_budget"]
    if used is None:
        return Text("unknown (no live monitor)", style="dim")
    line = Text(f"{used / 2**20:.1f} MiB" + (f" of {budget / 2**20:.1f} MiB" if budget else " (no budget)"))
    if doc["memory_guard"]:
        line.append(" memory guard on: non-critical intake shed", style="bold red")
    return line


def _types(doc: dict[str, Any]) -> Table:
    types = Table(
        Column("type", no_wrap=True), "queued", "", "oldest wait s", "done", "rejected", "expired", "failed"
    )
    scale = doc["thresholds"]["red"] * 1.5
    outcomes = doc["outcomes"]
    for t, depth in doc["depth_by_type"].items():
        types.add_row(
            t,
            str(depth),
            bar(depth, scale, width=10),
            f"{doc['oldest_wait_seconds'][t]:.1f}",
            *(str(outcomes.get(f"{t}:{o}", 0)) for o in ("done", "rejected", "expired", "failed")),
        )
    return types


def render_status(doc: dict[str, Any], refreshed_at: float | None = None) -> Group:
    """`tidegate status` from `producer.status.operator_status`: level in its colour, types, workers,
    the last transitions and events, and when this was read."""
    rows = _worker_rows(doc)
    workers = workers_panel(
        rows,
        gpus=[w.gpu for w in rows],
        bounds=[w.bound for w in rows],
        limits=[w.concurrency_limit for w in rows],
    )
    transitions = Table("time", "alarm transition", "depth", title="last transitions", title_justify="left")
    for event in doc["transitions"]:
        transitions.add_row(
            _clock(event.get("at")),
            transition(event.get("from", "?"), event.get("to", "?")),
            event.get("depth", ""),
        )
    events = Table("time", "event", "detail", title="last events", title_justify="left")
    for event in doc["events"]:
        detail = ", ".join(f"{k} {v}" for k, v in event.items() if k not in ("id", "at", "kind"))
        events.add_row(_clock(event.get("at")), event.get("kind", ""), detail)
    footer = Text(
        f"queue {doc['queue']} · refreshed {_clock(refreshed_at or doc['generated_at'])}", style="dim"
    )
    return Group(_head(doc), _types(doc), workers, transitions, events, footer)


def render_queues(docs: list[dict[str, Any]]) -> Group:
    """`tidegate status --queue a --queue b`: one row per queue, then each queue's own view."""
    if len(docs) == 1:
        return render_status(docs[0])
    table = Table("queue", "level", "mode", "depth", "in flight", "delayed", "workers", title="queues")
    for doc in docs:
        table.add_row(
            doc["queue"],
            level_badge(doc["level"]),
            doc["mode"],
            str(doc["depth"]),
            str(doc["inflight"]),
            str(doc["delayed"]),
            str(doc["workers_alive"]),
        )
    return Group(table, *(render_status(doc) for doc in docs))
