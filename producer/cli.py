"""`tidegate enqueue`, `tidegate ticket`, `tidegate status`: the producer side on the command line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis
import typer
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from producer.live_view import render_queues
from producer.producer import Producer, SubmitResult
from producer.status import operator_status
from shared.cli_support import (
    EXIT_BAD_INPUT,
    fail,
    load_settings,
    parse_queue_names,
    print_json,
    redis_failure,
)
from shared.config import Settings
from shared.errors import TicketValidationError
from shared.models import Ticket
from shared.queue import TicketQueue
from shared.redis_conn import RedisUnavailable, connect_from

enqueue_app = typer.Typer(add_completion=False)
ticket_app = typer.Typer(add_completion=False)
status_app = typer.Typer(add_completion=False)

FILE_BATCH = 500


def _producer(settings: Settings) -> Producer:
    try:
        return Producer.from_settings(settings)
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)


def _result_doc(result: SubmitResult) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": result.ticket_id, "outcome": result.outcome}
    if result.ticket is not None:
        doc.update(status=result.ticket.status.value, priority=result.ticket.priority)
        doc["expires_at"] = result.ticket.expires_at
    if result.outcome == "rejected":  # the shed code is the `code` of the HTTP answer's error
        doc.update(code=result.shed_code, reason=result.reason)
        doc["retry_after"] = result.retry_after
    return doc


@enqueue_app.command()
def enqueue(
    ticket_type: str | None = typer.Option(None, "--type", help="ticket type from the policy"),
    branch: str | None = typer.Option(None, "--branch", help="branch id, e.g. 0412"),
    prompt: str | None = typer.Option(None, help="prompt text (a text completion)"),
    max_tokens: int | None = typer.Option(None, "--max-tokens"),
    urgent_level: int = typer.Option(0, "--urgent-level", help="0-5, loan approvals"),
    vip_level: int = typer.Option(0, "--vip-level", help="0-5, complaints"),
    bulk: bool = typer.Option(False, "--bulk", help="a bulk archive query (pushed back)"),
    ttl: float | None = typer.Option(None, "--ttl", help="seconds; default from the type's policy"),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key"),
    callback_url: str | None = typer.Option(None, "--callback-url"),
    file: Path | None = typer.Option(None, "--file", help="JSONL file, one ticket object per line"),
    queue: str | None = typer.Option(None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Submit one ticket from flags, or many from --file tickets.jsonl."""
    settings = load_settings(queue_name=queue)
    if file is not None:
        _enqueue_file(settings, file, as_json)
        return
    missing = [flag for flag, value in (("--type", ticket_type), ("--branch", branch)) if not value]
    if prompt is None:
        missing.append("--prompt")
    if missing:
        fail(f"missing {', '.join(missing)} (or give --file)", EXIT_BAD_INPUT)
    data: dict[str, Any] = {
        "type": ticket_type,
        "branch_id": branch,
        "prompt": prompt,
        "urgent_level": urgent_level,
        "vip_level": vip_level,
        "is_bulk": bulk,
    }
    optional = {"max_tokens": max_tokens, "ttl_seconds": ttl, "idempotency_key": idempotency_key}
    optional["callback_url"] = callback_url
    data.update({k: v for k, v in optional.items() if v is not None})
    producer = _producer(settings)
    try:
        result = producer.submit(data)
    except TicketValidationError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except redis.RedisError as exc:
        redis_failure(exc)
    if as_json:
        print_json(_result_doc(result))
    elif result.outcome == "rejected":
        typer.echo(f"{result.ticket_id} rejected: {result.reason} (retry after {result.retry_after}s)")
    else:
        typer.echo(result.ticket_id)
    if result.outcome == "rejected":
        raise typer.Exit(1)


def _parse_line(producer: Producer, number: int, line: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(data, dict):
        return None, f"line {number}: expected a JSON object, got {type(data).__name__}"
    try:
        producer.validate(data)
    except TicketValidationError as exc:
        return None, f"line {number}: {exc}"
    return data, None


def _enqueue_file(settings: Settings, path: Path, as_json: bool) -> None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        fail(f"cannot read --file {path}: {exc.strerror}", EXIT_BAD_INPUT)
    producer = _producer(settings)
    errors: list[str] = []
    results: list[SubmitResult] = []
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    progress = Progress(
        TextColumn("enqueue"), BarColumn(), MofNCompleteColumn(), disable=as_json, transient=True
    )
    with progress:
        task = progress.add_task("enqueue", total=len(numbered))
        for start in range(0, len(numbered), FILE_BATCH):
            chunk = numbered[start : start + FILE_BATCH]
            good: list[dict[str, Any]] = []
            for number, line in chunk:
                data, error = _parse_line(producer, number, line)
                if error:
                    errors.append(error)
                elif data is not None:
                    good.append(data)
            try:
                results.extend(producer.submit_many(good))
            except redis.RedisError as exc:
                redis_failure(exc)
            progress.advance(task, len(chunk))
    queued = sum(r.outcome == "queued" for r in results)
    existing = sum(r.outcome == "existing" for r in results)
    rejected = sum(r.outcome == "rejected" for r in results)
    summary = {
        "lines": len(numbered),
        "queued": queued,
        "existing": existing,
        "rejected": rejected,
        "invalid": len(errors),
        "errors": errors,
        "tickets": [_result_doc(r) for r in results],
    }
    if as_json:
        print_json(summary)
    else:
        for error in errors:
            typer.echo(f"error: {error}", err=True)
        typer.echo(
            f"{len(numbered)} lines: {queued} queued, {existing} already queued (idempotent), "
            f"{rejected} rejected, {len(errors)} invalid"
        )
    if errors:
        raise typer.Exit(EXIT_BAD_INPUT)


def ticket_document(ticket: Ticket) -> dict[str, Any]:
    """The public view of a ticket: what a branch may read."""
    doc = ticket.model_dump(mode="json", exclude_none=True)
    doc["queue_wait_seconds"] = ticket.queue_wait_seconds
    doc["total_seconds"] = ticket.total_seconds
    return doc


@ticket_app.command()
def ticket(
    ticket_id: str = typer.Argument(..., help="the ticket id printed by enqueue"),
    queue: str | None = typer.Option(None, "--queue"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show one ticket: status, priority, result or error, timings."""
    settings = load_settings(queue_name=queue)
    try:
        found = TicketQueue(connect_from(settings), settings.policy, settings.queue_name).get(ticket_id)
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    if found is None:
        fail(f"no ticket {ticket_id!r} (unknown, or past its retention)", EXIT_BAD_INPUT)
    doc = ticket_document(found)
    if as_json:
        print_json(doc)
        return
    table = Table(show_header=False, box=None)
    for key in ("id", "type", "branch_id", "status", "priority", "attempts", "worker", "error", "result"):
        if doc.get(key) is not None:
            table.add_row(key, str(doc[key]))
    for key in ("created_at", "started_at", "finished_at", "expires_at"):
        if doc.get(key) is not None:
            table.add_row(key, time.strftime("%H:%M:%S", time.localtime(doc[key])) + f" ({doc[key]:.3f})")
    for key in ("queue_wait_seconds", "total_seconds"):
        if doc.get(key) is not None:
            table.add_row(key, f"{doc[key]:.3f}")
    Console().print(table)


def status_documents(settings: Settings, names: tuple[str, ...]) -> list[dict[str, Any]]:
    client = connect_from(settings)
    return [operator_status(client, settings.policy, name) for name in names]


@status_app.command()
def status(
    queue: list[str] | None = typer.Option(
        None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME); repeat it, or a comma list, to show several"
    ),
    watch: bool = typer.Option(False, "--watch", help="refresh every second until Ctrl-C"),
    redis_url: str | None = typer.Option(None, "--redis-url", help="TIDEGATE_REDIS_URL"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Depth per type, alarm level (in colour) and transitions, mode, workers, recent sheds.

    With several queues: a row per queue, then each queue's view; `--json` prints `{"queues": [...]}`,
    one document per queue (one queue prints its document alone).
    """
    names = parse_queue_names(queue)
    settings = load_settings(queue_name=names[0] if names else None, redis_url=redis_url)
    names = names or (settings.queue_name,)
    try:
        docs = status_documents(settings, names)
        if as_json:
            print_json(docs[0] if len(docs) == 1 else {"queues": docs})
            return
        if not watch:
            Console().print(render_queues(docs))
            return
        with Live(render_queues(docs), refresh_per_second=2) as live:
            while True:
                time.sleep(1)
                live.update(render_queues(status_documents(settings, names)))
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    except KeyboardInterrupt:
        return
