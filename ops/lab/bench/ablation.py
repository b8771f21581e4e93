"""Run `tidegate worker` or `tidegate monitor` with mechanisms taken out, for the overload
benchmark's ablations.

Not a product setting: a mechanism that earns its place has no switch to turn it off, so the lab
replaces what decides it in this process and then runs the ordinary command line. Each ablation
patches what it needs in whichever process runs it (the worker's and the monitor's parts both).

    python -m ops.lab.bench.ablation --ablate throttle worker --gpu 0 ...
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import ops.monitor.sampler
import worker.worker
from shared.models import Ticket
from worker.deadlines import StartRule


def _no_throttle() -> None:
    worker.worker.make_throttle = lambda config, policy: None


def _never_too_late(self: StartRule, ticket: Ticket, now: float) -> bool:
    return False


def _no_deadline_rules() -> None:
    """Issue 29's deadline rules out: no early refusal (the monitor publishes no service rate, and
    the enqueue script admits on no evidence) and no ticket ended unstarted past its deadline."""
    StartRule.too_late = _never_too_late  # type: ignore[method-assign]
    sample = ops.monitor.sampler.Sampler.sample

    def without_service_rate(
        self: ops.monitor.sampler.Sampler, now: float | None = None
    ) -> ops.monitor.sampler.Sample:
        return dataclasses.replace(sample(self, now), service_rate=0.0, service_peak=0.0)

    ops.monitor.sampler.Sampler.sample = without_service_rate  # type: ignore[method-assign]


ABLATIONS: dict[str, Callable[[], None]] = {"throttle": _no_throttle, "deadlines": _no_deadline_rules}
"""Mechanisms the lab can take out; those with a product setting (`--critical-headroom 0`,
`--no-preemption`) are given as worker options instead."""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    while len(args) >= 2 and args[0] == "--ablate":
        name = args[1]
        if name not in ABLATIONS:
            raise SystemExit(f"--ablate {name}: not one of {', '.join(sorted(ABLATIONS))}")
        ABLATIONS[name]()
        args = args[2:]
    from tidegate.cli import main as tidegate_main

    sys.argv = ["tidegate", *args]
    tidegate_main()


if __name__ == "__main__":
    main()
