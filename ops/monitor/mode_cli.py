"""`tidegate mode`: the operator's override of admission (normal, or critical-only)."""

from __future__ import annotations

import time
from typing import Any

import redis
import typer

from shared.audit import os_user
from shared.cli_support import load_settings, print_json, redis_failure
from shared.control import Mode, read_events, set_mode
from shared.keys import QueueKeys
from shared.redis_conn import RedisUnavailable, connect_from

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Operator override of admission: critical-only admits only critical types (loan_approval).",
)

MODE_EVENT_SCAN = 500
"""How far back `mode show` looks in the event stream for the last mode change."""


def mode_document(client: redis.Redis, queue_name: str) -> dict[str, Any]:
    """The current mode and the event that set it (if still in the capped stream)."""
    keys = QueueKeys(queue_name)
    raw = client.get(keys.mode)
    current = Mode(raw) if raw in {m.value for m in Mode} else Mode.NORMAL
    changes = [e for e in read_events(client, keys, MODE_EVENT_SCAN) if e.get("kind") == "mode"]
    doc: dict[str, Any] = {"queue": queue_name, "mode": current.value}
    if changes:
        last = changes[0]
        doc.update(since=float(last["at"]), previous=last.get("previous"), actor=last.get("actor"))
    return doc


@app.command("set")
def set_command(
    mode: Mode = typer.Argument(..., help="normal, or critical-only (admit only critical types)"),
    queue: str | None = typer.Option(None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME)"),
    actor: str = typer.Option(os_user(), "--actor", help="who asks; recorded in the audit trail"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Switch the operator mode; it takes effect within a fraction of a second everywhere."""
    settings = load_settings(queue_name=queue)
    try:
        client = connect_from(settings)
        previous = set_mode(client, QueueKeys(settings.queue_name), mode, actor=actor)
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    doc = {"queue": settings.queue_name, "mode": mode.value, "previous": previous.value, "actor": actor}
    if as_json:
        print_json(doc)
    else:
        typer.echo(f"mode {previous.value} -> {mode.value} (queue {settings.queue_name})")


@app.command("show")
def show_command(
    queue: str | None = typer.Option(None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Show the operator mode and who set it when."""
    settings = load_settings(queue_name=queue)
    try:
        doc = mode_document(connect_from(settings), settings.queue_name)
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    if as_json:
        print_json(doc)
        return
    line = f"mode {doc['mode']} (queue {doc['queue']})"
    if "since" in doc:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc["since"]))
        line += f", set by {doc['actor']} at {when} (was {doc['previous']})"
    typer.echo(line)
