"""`tidegate audit`: the operator actions recorded on a queue (shared/audit.py), newest first."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import redis
import typer
from rich.console import Console
from rich.table import Table

from shared.audit import AUDIT_MAXLEN, read_audit
from shared.cli_support import load_settings, print_json, redis_failure
from shared.keys import QueueKeys
from shared.redis_conn import RedisUnavailable, connect_from

app = typer.Typer(add_completion=False)


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@app.command()
def audit(
    limit: int = typer.Option(50, "--limit", min=1, max=AUDIT_MAXLEN, help="most entries to show"),
    queue: str | None = typer.Option(None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME)"),
    redis_url: str | None = typer.Option(None, "--redis-url", help="TIDEGATE_REDIS_URL"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Operator actions (mode, keys, rollouts), newest first: who, when, before and after."""
    settings = load_settings(queue_name=queue, redis_url=redis_url)
    try:
        entries = read_audit(connect_from(settings), QueueKeys(settings.queue_name), limit)
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    if as_json:
        print_json({"queue": settings.queue_name, "entries": [e.as_dict() for e in entries]})
        return
    table = Table(
        "time", "actor", "action", "target", "before", "after", title=f"queue {settings.queue_name}"
    )
    for entry in entries:
        table.add_row(
            _when(entry.time),
            entry.actor,
            entry.action,
            entry.target,
            _text(entry.before),
            _text(entry.after),
        )
    Console().print(table)
