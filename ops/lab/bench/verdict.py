"""The overload benchmark's verdict: the overload promise checked, one line per check.

tidegate: no OOM crash, the books balance, the GPU busy on answers still wanted (busy and SLO goodput
in the surge), critical types within their SLO (also those arriving as the peak hits) and never shed,
what was admitted answered in time, and an alarm that rises, holds and comes down once. The FIFO
baseline in tight memory: the seed's failure, shown (crashes, critical answers past their SLO).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ops.lab.bench.figures import ONSET_S, SystemFigures
from shared.policy import Policy

BUSY = 0.9
"""Tokens answered in the surge, of measured capacity."""
SLO_GOODPUT = 0.9
"""Tokens of answers within their SLO in the surge, of measured capacity."""
CRITICAL_WITHIN_SLO = 0.99
"""Share of a critical type's requests answered within its SLO."""
ADMITTED_WITHIN_SLO = 0.95
"""Share of a non-critical type's admitted requests answered within its SLO: admission that knows the
wait takes on only what it can serve in time."""


def tidegate_checks(ours: SystemFigures, types: Sequence[str], policy: Policy) -> dict[str, bool]:
    checks = {
        "zero OOM crashes": ours.oom_crashes == 0,
        "accounting holds": ours.books.holds,
        f"busy fraction in the surge >= {BUSY:.0%}": (ours.busy_fraction or 0.0) >= BUSY,
        f"SLO goodput in the surge >= {SLO_GOODPUT:.0%} of capacity": (
            (ours.slo_goodput_fraction or 0.0) >= SLO_GOODPUT
        ),
        "alarm up, hold, down (no cycling)": ours.alarm is not None and ours.alarm.holds,
    }
    for t in types:
        row = ours.rows[t]
        if not policy.is_critical(t):
            checks[f"{t} admitted and answered within its SLO >= {ADMITTED_WITHIN_SLO:.0%}"] = (
                row.admitted > 0 and row.within_slo >= ADMITTED_WITHIN_SLO * row.admitted
            )
            continue
        checks[f"{t} p99 within its {row.slo_seconds:g} s SLO"] = (
            row.p99_s is not None and row.slo_seconds is not None and row.p99_s <= row.slo_seconds
        )
        checks[f"{t} >= {CRITICAL_WITHIN_SLO:.0%} within its SLO"] = (
            row.offered > 0 and row.within_slo >= CRITICAL_WITHIN_SLO * row.offered
        )
        checks[
            f"{t} arriving in the first {ONSET_S:g} s at the peak >= {CRITICAL_WITHIN_SLO:.0%} within it"
        ] = row.onset_offered > 0 and row.onset_within_slo >= CRITICAL_WITHIN_SLO * row.onset_offered
        checks[f"{t} none rejected"] = (
            row.rejected == 0 and ours.books.by_type.get(t, {}).get("rejected", 0) == 0
        )
    return checks


def baseline_checks(seed: SystemFigures, types: Sequence[str], policy: Policy) -> dict[str, bool]:
    checks = {"OOM crashes happened": seed.oom_crashes > 0, "accounting holds": seed.books.holds}
    for t in types:
        if policy.is_critical(t):
            row = seed.rows[t]
            checks[f"{t} p99 above its {row.slo_seconds:g} s SLO (or none answered)"] = (
                row.p99_s is None or row.slo_seconds is None or row.p99_s > row.slo_seconds
            )
    return checks


def run_verdict(
    figures: Mapping[str, SystemFigures], types: Sequence[str], policy: Policy, memory: str
) -> dict[str, dict[str, bool]]:
    """The checks of the arms that have them: tidegate always, the FIFO baseline in tight memory."""
    verdict: dict[str, dict[str, bool]] = {}
    if "tidegate" in figures:
        verdict["tidegate"] = tidegate_checks(figures["tidegate"], types, policy)
    if "fifo" in figures and memory == "tight":
        verdict["fifo"] = baseline_checks(figures["fifo"], types, policy)
    return verdict
