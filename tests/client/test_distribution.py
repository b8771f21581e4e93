"""tidegate-client is its own distribution: it needs only httpx, imports none of the server's
libraries, and its typed results carry every field the server's documents have."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from importlib import metadata

import pytest
import tidegate_client
from pydantic import BaseModel

from producer.api import schemas

SERVER_LIBRARIES = ("redis", "pydantic", "fastapi", "starlette", "requests", "rq", "shared", "producer")


def test_it_requires_only_httpx() -> None:
    requires = metadata.requires("tidegate-client") or []
    assert [r.split(">")[0].split("=")[0].strip() for r in requires] == ["httpx"]


def test_the_server_distribution_depends_on_it() -> None:
    requires = [r.split(">")[0].split(";")[0].strip() for r in metadata.requires("tidegate") or []]
    assert "tidegate-client" in requires


def test_importing_it_loads_no_server_library() -> None:
    code = (
        "import sys, tidegate_client; "
        f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({SERVER_LIBRARIES!r}))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == ""


@pytest.mark.parametrize(
    ("client_type", "server_model"),
    [
        (tidegate_client.TicketAccepted, schemas.TicketAccepted),
        (tidegate_client.TicketView, schemas.TicketView),
        (tidegate_client.TicketTimings, schemas.TicketTimings),
        (tidegate_client.CancelResult, schemas.CancelResult),
        (tidegate_client.BatchItemResult, schemas.BatchItemResult),
        (tidegate_client.BatchResult, schemas.BatchResult),
        (tidegate_client.ErrorDetail, schemas.ErrorObject),
        (tidegate_client.ValidationIssue, schemas.ValidationIssue),
        (tidegate_client.TypeDepth, schemas.TypeDepth),
        (tidegate_client.QueuesView, schemas.QueuesView),
    ],
)
def test_typed_results_carry_every_server_field(client_type: type, server_model: type[BaseModel]) -> None:
    assert {f.name for f in dataclasses.fields(client_type)} == set(server_model.model_fields)
