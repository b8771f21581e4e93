"""Run `tidegate worker` with one of its mechanisms taken out, for the overload benchmark's ablations.

Not a product setting: a mechanism that earns its place has no switch to turn it off, so the lab
replaces the worker's factory for it in this process and then runs the ordinary command line.

    python -m ops.lab.bench.ablation --ablate throttle worker --gpu 0 ...
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import worker.worker


def _no_throttle() -> None:
    worker.worker.make_throttle = lambda config, policy: None


ABLATIONS: dict[str, Callable[[], None]] = {"throttle": _no_throttle}
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
