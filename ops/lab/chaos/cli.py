"""`tidegate chaos`: run the fault drill on a local stack and report each step."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False)


@app.command()
def chaos(
    quick: Annotated[
        bool, typer.Option("--quick", help="Short faults (5 s stall, 3 s outages), for CI.")
    ] = False,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Folder for the stack's logs and Redis files [default: a temporary one]."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Worker kill -9, Redis restart, simulator crash, error burst, slow answers, Redis stall on a
    stack of its own; exit 0 when every ticket was in exactly one state after every step."""
    from ops.lab.chaos.drill import Drill

    folder = run_dir or Path(tempfile.mkdtemp(prefix="tidegate-chaos-"))
    out = (lambda line: print(line, file=sys.stderr)) if as_json else typer.echo
    drill = Drill(folder, quick=quick, out=out)
    try:
        ok = drill.run()
    except Exception as exc:  # a step that could not run is a failed drill, said in one line
        typer.echo(f"error: the drill could not run: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps({"ok": ok, "run_dir": str(folder), "steps": [r.as_dict() for r in drill.reports]}))
    raise typer.Exit(0 if ok else 1)
