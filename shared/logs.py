"""One log format for every tidegate process: a JSON object per line on stderr.

Every line carries `time`, `level`, `logger`, `process` and `message`; a line about a ticket also
carries `ticket_id`, `branch_id` and `type` (from `ticket_fields`), and a worker's lines its
`worker`, so one ticket can be followed through the API's and the workers' logs by its id.
`TIDEGATE_LOG_FORMAT=text` gives the old one-line text format for a person at a terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

FORMAT_ENV = "TIDEGATE_LOG_FORMAT"
JSON_FIELDS = "%(levelname)s %(name)s %(process)d %(message)s"
RENAMED = {"levelname": "level", "name": "logger"}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


class _StaticFields(logging.Filter):
    """Adds the same fields (e.g. the worker's id) to every record that does not carry them already."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in self.fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def json_formatter() -> logging.Formatter:
    return JsonFormatter(JSON_FIELDS, rename_fields=RENAMED, timestamp="time")  # ISO 8601, UTC


def formatter() -> logging.Formatter:
    if os.environ.get(FORMAT_ENV, "json").lower() == "text":
        return logging.Formatter(TEXT_FORMAT)
    return json_formatter()


def parse_level(level: str | int) -> int:
    """A level name (`info`) or number as logging's number; ValueError naming what is accepted."""
    if isinstance(level, int):
        return level
    found = logging.getLevelNamesMapping().get(level.upper())
    if found is None:
        raise ValueError(f"log level {level!r} is not accepted; use debug, info, warning or error")
    return found


def configure_logging(
    level: str | int = "info", *, stream: TextIO | None = None, static: dict[str, str] | None = None
) -> logging.Handler:
    """Send every logger's records to one handler in the process's format; returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter())
    if static:
        handler.addFilter(_StaticFields(static))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(parse_level(level))
    # uvicorn and rq bring their own handlers and formats; theirs go through ours instead.
    for name in (*UVICORN_LOGGERS, "rq.worker"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    return handler


def ticket_fields(ticket: Any, worker: str | None = None) -> dict[str, str]:
    """The `extra=` of a log line about `ticket` (anything with id, branch_id and type)."""
    return line_fields(str(ticket.id), str(ticket.branch_id), str(ticket.type), worker)


def line_fields(
    ticket_id: str, branch_id: str, ticket_type: str, worker: str | None = None
) -> dict[str, str]:
    fields = {"ticket_id": ticket_id, "branch_id": branch_id, "type": ticket_type}
    if worker is not None:
        fields["worker"] = worker
    return fields


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's `log_config`: its loggers (access log included) in the JSON line format."""
    factory = "shared.logs.formatter"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"tidegate": {"()": factory}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "tidegate",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {name: {"handlers": [], "propagate": True} for name in UVICORN_LOGGERS},
    }


def tag_process(**fields: str) -> None:
    """Add `fields` (e.g. worker=<id>) to every line this process logs from now on."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_StaticFields(fields))
