"""The `tidegate` command: a lazy group so each subcommand imports only what it needs.

Each entry maps a command name to the Typer app that implements it, in the package that owns the
work (`producer/` submits, `worker/` runs, `ops/` operates). Loading lazily keeps `tidegate --help`
fast and lets a worker node run without importing the API's dependencies.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

import typer
from typer.core import TyperGroup

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ops.lab.demo.cli:app", "Run everything on one machine with embedded defaults and a live view."),
    "api": ("producer.api.cli:app", "Serve the branch-office HTTP API."),
    "worker": ("worker.cli:app", "Run one GPU worker per GPU against vLLM."),
    "monitor": ("ops.monitor.cli:app", "Watch queue depth, raise alarms, run their actions."),
    "enqueue": ("producer.cli:enqueue_app", "Submit one ticket from flags, or many from --file."),
    "status": ("producer.cli:status_app", "Show depth per type, in-flight, alarm level and mode."),
    "ticket": ("producer.cli:ticket_app", "Show one ticket's status, result and timings."),
    "sim-vllm": ("ops.lab.sim.cli:app", "Serve the vLLM-compatible simulator."),
    "bench": (
        "ops.lab.bench.cli:app",
        "Benchmarks: overload scenario, queue speed and the OpenAI front door.",
    ),
    "keys": ("producer.api.keys_cli:app", "Manage branch API keys."),
    "mode": ("ops.monitor.mode_cli:app", "Operator override of admission (normal, critical-only)."),
    "audit": (
        "ops.monitor.audit_cli:app",
        "Operator actions (mode, keys, rollouts): who, when, what changed.",
    ),
    "chaos": ("ops.lab.chaos.cli:app", "Fault drill on a local stack: kills, restarts, errors, stalls."),
    "rollout": ("ops.monitor.rollout_cli:app", "Model rollouts: shadow traffic, canary waves, rollback."),
}


def load_command(name: str) -> Any:
    """The click command behind `name`, importing its module now."""
    module_name, attr = COMMANDS[name][0].split(":")
    typer_app = getattr(importlib.import_module(module_name), attr)
    command = typer.main.get_command(typer_app)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """Typer's group, with subcommands imported on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, help_text) in COMMANDS.items()])


app = typer.Typer(
    cls=LazyGroup,
    add_completion=False,
    rich_markup_mode=None,
    help="tidegate: a Redis-backed priority work queue that keeps LLM inference alive under overload.",
)


def version() -> str:
    """The installed distribution's version (a source tree run without installing says so)."""
    try:
        return importlib.metadata.version("tidegate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tidegate {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """tidegate: a Redis-backed priority work queue that keeps LLM inference alive under overload."""


def main() -> None:
    """Console entry point."""
    app(prog_name="tidegate")
