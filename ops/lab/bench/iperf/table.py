"""The comparison as terminal tables, from the results document."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from ops.lab.bench.iperf.compare import AGREEMENT


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return f"{value * 1000:,.1f} ms"
    if unit == "tokens/s":
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def _spread(spread: dict[str, Any] | None) -> str:
    if not spread or spread.get("p50_ms") is None:
        return "—"
    return f"{spread['p50_ms']:.1f} / {spread['p99_ms']:.1f}"


def print_iperf(console: Console, doc: dict[str, Any]) -> None:
    options = doc["options"]
    shape = options["shape"]
    title = (
        f"inference-perf vs tidegate's own: Poisson {shape['rate']:g}/s for {shape['duration_s']} s, "
        f"{shape['prompt_tokens']}/{shape['output_tokens']} tokens, {options['ticket_type']}"
    )
    table = Table("figure", "inference-perf", "tidegate (tickets)", "difference", "within 10%", title=title)
    for row in doc["rows"]:
        difference = "—" if row["difference"] is None else f"{row['difference']:+.1%}"
        verdict = (
            ("yes" if row["agrees"] else "NO") if row["gated"] else ("(yes)" if row["agrees"] else "(no)")
        )
        table.add_row(
            row["label"],
            _value(row["client"], row["unit"]),
            _value(row["tidegate"], row["unit"]),
            difference,
            verdict,
        )
    console.print(table)
    api = doc["tidegate"]["api_e2e_ttft"]
    bucket = api["p50_bucket_s"]
    if bucket:
        high = "∞" if bucket[1] is None else f"{bucket[1] * 1000:g}"
        console.print(
            f"tidegate's API histogram (arrival → first token sent): p50 ≈ {api['p50_ms']:.1f} ms, "
            f"interpolated in its {bucket[0] * 1000:g}–{high} ms bucket, {api['observed']:.0f} observed"
        )
    gap = doc["gap"]
    parts = Table(
        "per request, p50 / p99 ms", "value", title=f"{gap['paired']} requests paired with their tickets"
    )
    parts.add_row("client TTFT − ticket TTFT", _spread(gap["ttft"]))
    parts.add_row("  before the ticket existed (send → created_at)", _spread(gap["before_ticket"]))
    parts.add_row(
        "  after the worker's first token (→ client's first chunk)", _spread(gap["after_first_token"])
    )
    parts.add_row("client latency − ticket latency", _spread(gap["latency"]))
    console.print(parts)
    if gap["shed_answers"]:
        codes = ", ".join(doc["tidegate"]["shed_codes"])
        console.print(
            f"{gap['shed_answers']} request(s) inference-perf counted as answered were shed by tidegate "
            f"({codes}): a degraded 200 with the policy's text"
        )
    client = doc.get("client") or {}
    if client.get("send_lag_p50") is not None and client.get("send_lag_p99") is not None:
        console.print(
            f"inference-perf's send lag behind its Poisson schedule: p50 {client['send_lag_p50'] * 1000:.1f} ms, "
            f"p99 {client['send_lag_p99'] * 1000:.1f} ms"
        )
    cpu = ", ".join(f"{name} {cores:.2f}" for name, cores in doc["cpu_cores"].items())
    load = doc["load_average"]
    console.print(f"CPU (cores): {cpu}")
    console.print(
        f"load average (1/5/15 min): before {' '.join(f'{v:.2f}' for v in load['before'])}, "
        f"after {' '.join(f'{v:.2f}' for v in load['after'])} on {doc['cpus']} CPUs"
    )
    verdict = "holds" if doc["agreement_holds"] else "does NOT hold"
    console.print(f"agreement within {AGREEMENT:.0%} on TTFT p50 and answered count: {verdict}")
