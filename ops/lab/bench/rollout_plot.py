"""The rollout report's PNG: each shadowed ticket's TTFT and total latency, control beside candidate.

Drawn like the overload benchmark's plot (ops/lab/bench/plot.py): a bare `Figure` on the Agg canvas,
no pyplot, so it renders the same on a headless node. `tidegate rollout report --plot PATH` calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

ARM_COLOURS = {"control": "tab:blue", "candidate": "tab:orange"}
PANELS = (("ttft_seconds", "time to first token (s)"), ("total_seconds", "total latency (s)"))


def plot_rollout(report: Mapping[str, Any], path: Path) -> Path:
    """Draw latency per arm over the rollout's shadow records and save the PNG at `path`."""
    samples: Mapping[str, Sequence[Mapping[str, Any]]] = report["samples"]
    rollout = report["rollout"]
    starts = [float(s["at"]) for arm in samples.values() for s in arm]
    origin = min(starts) if starts else float(rollout["started_at"])
    figure = Figure(figsize=(9, 7))
    axes = figure.subplots(len(PANELS), 1, sharex=True, squeeze=False)
    for row, (field, label) in enumerate(PANELS):
        _panel(axes[row][0], samples, field, label, origin)
    axes[0][0].set_title(f"rollout {rollout['id']}: version {rollout['version']} ({rollout['status']})")
    axes[-1][0].set_xlabel("seconds since the first shadowed ticket")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


def _panel(
    ax: Axes, samples: Mapping[str, Sequence[Mapping[str, Any]]], field: str, label: str, origin: float
) -> None:
    for arm, points in samples.items():
        kept = [(float(p["at"]) - origin, float(p[field])) for p in points if p.get(field) is not None]
        if kept:
            xs, ys = zip(*kept, strict=True)
            ax.scatter(xs, ys, s=8, alpha=0.6, label=f"{arm} ({len(kept)})", color=ARM_COLOURS.get(arm))
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(loc="upper right")
