"""`tidegate keys create | list | revoke`: branch and operator API keys."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

import redis
import typer
from rich.console import Console
from rich.table import Table

from producer.api.keys import ApiKey, ApiKeyError, ApiKeyStore, Role
from shared.audit import os_user
from shared.cli_support import EXIT_BAD_INPUT, fail, load_settings, print_json, redis_failure
from shared.keys import QueueKeys
from shared.redis_conn import RedisUnavailable, connect_from

T = TypeVar("T")

app = typer.Typer(add_completion=False, help="Manage branch API keys.")

QueueOption = typer.Option(None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME)")
JsonOption = typer.Option(False, "--json", help="print one JSON document")
ActorOption = typer.Option(os_user(), "--actor", help="who asks; recorded in the audit trail")


def _store(queue: str | None) -> ApiKeyStore:
    settings = load_settings(queue_name=queue)
    try:
        client = connect_from(settings)
    except RedisUnavailable as exc:
        redis_failure(exc)
    return ApiKeyStore(client, QueueKeys(settings.queue_name))


def _doc(key: ApiKey) -> dict[str, Any]:
    doc = asdict(key)
    doc["role"] = key.role.value
    doc["revoked"] = key.revoked
    return doc


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return ""
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@app.command()
def create(
    branch: str | None = typer.Option(None, "--branch", help="the branch the key submits for, e.g. 0412"),
    operator: bool = typer.Option(False, "--operator", help="an operator key (reads everything, sets mode)"),
    label: str = typer.Option("", "--label", help="a note for the listing, e.g. who holds it"),
    default_type: str | None = typer.Option(
        None,
        "--default-type",
        help="ticket type of OpenAI-style calls with this key that name none, e.g. complaint",
    ),
    queue: str | None = QueueOption,
    actor: str = ActorOption,
    as_json: bool = JsonOption,
) -> None:
    """Create a key. The key is printed once and stored only as a hash: keep it now.

    A branch's first key also creates the branch's callback signing secret, printed once too.
    """
    if operator == (branch is not None):
        fail("give exactly one of --branch ID or --operator", EXIT_BAD_INPUT)
    settings = load_settings(queue_name=queue)
    if default_type is not None and default_type not in settings.policy.types:
        fail(
            f"--default-type {default_type!r} is not a ticket type; known types: "
            + ", ".join(settings.policy.type_names),
            EXIT_BAD_INPUT,
        )
    store = _store(queue)
    secret: str | None = None
    try:
        token, record = store.create(
            Role.OPERATOR if operator else Role.BRANCH, branch, label, default_type=default_type, actor=actor
        )
        if branch is not None:
            secret = store.create_callback_secret(branch)
    except ApiKeyError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except redis.RedisError as exc:
        redis_failure(exc)
    if as_json:
        print_json({"key": token, **_doc(record), "callback_secret": secret})
        return
    owner = "operator" if operator else f"branch {branch}"
    typer.echo(f"created key {record.key_id} for {owner}; it is shown only now:")
    typer.echo(token)
    if secret is not None:
        typer.echo(f"callback signing secret of branch {branch} (Standard Webhooks), shown only now:")
        typer.echo(secret)


@app.command("list")
def list_keys(
    branch: str | None = typer.Option(None, "--branch", help="only this branch's keys"),
    queue: str | None = QueueOption,
    as_json: bool = JsonOption,
) -> None:
    """List keys (ids, roles, branches, default types, revocations); secrets are never stored, so
    never shown."""
    store = _store(queue)
    try:
        found = store.list_keys(branch)
    except redis.RedisError as exc:
        redis_failure(exc)
    if as_json:
        print_json({"keys": [_doc(k) for k in found]})
        return
    table = Table("id", "role", "branch", "default type", "label", "created", "revoked")
    for key in found:
        table.add_row(
            key.key_id,
            key.role.value,
            key.branch_id or "",
            key.default_type or "",
            key.label,
            _when(key.created_at),
            _when(key.revoked_at),
        )
    Console().print(table)


def _stored(change: Callable[[], T]) -> T:
    """Run one key-store change; a refused change exits 2 and a Redis failure exits 1."""
    try:
        return change()
    except ApiKeyError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except redis.RedisError as exc:
        redis_failure(exc)


@app.command()
def revoke(
    key_id: str = typer.Argument(..., help="the key's id from `tidegate keys list`"),
    queue: str | None = QueueOption,
    actor: str = ActorOption,
    as_json: bool = JsonOption,
) -> None:
    """Revoke a key: the API answers 401 to it within a second."""
    store = _store(queue)
    record = _stored(lambda: store.revoke(key_id, actor))
    if as_json:
        print_json(_doc(record))
        return
    typer.echo(f"revoked key {record.key_id} ({record.role.value} {record.branch_id or ''})".rstrip())


@app.command("rotate-secret")
def rotate_secret(
    branch: str = typer.Option(..., "--branch", help="the branch whose callback signing secret to replace"),
    queue: str | None = QueueOption,
    actor: str = ActorOption,
    as_json: bool = JsonOption,
) -> None:
    """Replace a branch's callback signing secret; the new one is printed once, the old stops signing."""
    store = _store(queue)
    secret = _stored(lambda: store.rotate_callback_secret(branch, actor))
    if as_json:
        print_json({"branch_id": branch, "callback_secret": secret})
        return
    typer.echo(f"new callback signing secret of branch {branch} (Standard Webhooks), shown only now:")
    typer.echo(secret)
