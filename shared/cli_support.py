"""What every tidegate command shares: loading settings, printing JSON, failing with exit codes.

CONTRACT.md: errors go to stderr with exit code 2 for bad input and 1 for other failures.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from pydantic import ValidationError

from shared.config import QUEUE_NAME_PATTERN, Settings
from shared.policy import PolicyError
from shared.redis_conn import RedisUnavailable

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment with command-line overrides; bad values exit 2."""
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        settings.policy  # noqa: B018 - load the policy now so a bad file fails at start
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        fail(f"invalid setting {field}: {first['msg']}", EXIT_BAD_INPUT)
    except PolicyError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    return settings


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def redis_failure(exc: Exception) -> NoReturn:
    if isinstance(exc, RedisUnavailable):
        fail(str(exc))
    fail(f"Redis error: {exc}")


def parse_queue_names(values: Sequence[str] | None) -> tuple[str, ...]:
    """`--queue a --queue b,c` -> `("a", "b", "c")`, first seen first; exit 2 naming a bad name."""
    names: list[str] = []
    for value in values or []:
        for name in (piece.strip() for piece in value.split(",")):
            if not name or name in names:
                continue
            if not re.match(QUEUE_NAME_PATTERN, name):
                fail(f"--queue: {name!r} is not a queue name (letters, digits, _ . -, 1-64)", EXIT_BAD_INPUT)
            names.append(name)
    return tuple(names)
