"""Every `tidegate` and `rq` command line in the deployment files parses: the subcommand exists
and each flag and value is one the command accepts. Parsing goes through the real CLIs (click's
make_context converts and validates every parameter) without running the command."""

from __future__ import annotations

from typing import Any

import click
import pytest
from rq.cli.cli import main as rq_cli
from rq.utils import import_attribute
from typer.testing import CliRunner

from ops.monitor.dispatch import ACTIONS_QUEUE, CALLBACKS_QUEUE
from shared.rq_logs import JsonLogWorker
from tests.deploy.deploy_files import (
    K8S_DIR,
    REQUIRED_ENV,
    compose_services,
    interpolate,
    load_yaml_documents,
)
from tidegate.cli import COMMANDS, load_command
from tidegate.cli import app as cli_app

TIDEGATE_IMAGE = "${TIDEGATE_IMAGE:-tidegate:latest}"


def compose_command_lines() -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}
    for name, svc in compose_services().items():
        if svc.get("image") != TIDEGATE_IMAGE:
            continue
        if "entrypoint" not in svc:
            lines[f"compose {name}"] = [interpolate(token, REQUIRED_ENV) for token in svc["command"]]
        test = svc.get("healthcheck", {}).get("test", [])
        if test[:2] == ["CMD", "tidegate"]:
            lines[f"compose {name} healthcheck"] = test[2:]
    return lines


def k8s_command_lines() -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for doc in load_yaml_documents(path):
            if doc.get("kind") != "Deployment":
                continue
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if not container["image"].startswith("tidegate:"):
                    continue
                where = f"k8s {doc['metadata']['name']}/{container['name']}"
                if "command" not in container:
                    lines[where] = container["args"]
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    command: list[str] = container.get(probe, {}).get("exec", {}).get("command", [])
                    if command[:1] == ["tidegate"]:
                        lines[f"{where} {probe}"] = command[1:]
    return lines


COMMAND_LINES = {**compose_command_lines(), **k8s_command_lines()}


def rq_command_lines() -> dict[str, list[str]]:
    lines = {}
    for name, svc in compose_services().items():
        if svc.get("entrypoint") == ["rq"]:
            lines[f"compose {name}"] = [interpolate(token, REQUIRED_ENV) for token in svc["command"]]
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for doc in load_yaml_documents(path):
            if doc.get("kind") == "Deployment":
                for container in doc["spec"]["template"]["spec"]["containers"]:
                    if container.get("command") == ["rq"]:
                        lines[f"k8s {doc['metadata']['name']}/{container['name']}"] = container["args"]
    return lines


RQ_COMMAND_LINES = rq_command_lines()


@pytest.mark.parametrize("where", sorted(RQ_COMMAND_LINES))
def test_rq_command_line_parses(where: str) -> None:
    name, *args = RQ_COMMAND_LINES[where]
    command = rq_cli.get_command(click.Context(rq_cli), name)
    assert command is not None, f"{where}: rq has no command {name!r}"
    context = command.make_context(name, list(args))
    assert context.params["queues"] == (ACTIONS_QUEUE, CALLBACKS_QUEUE)
    assert context.params["with_scheduler"] is True
    # Its lines are JSON with each job's ticket id (tests/producer/api/test_callbacks.py runs it).
    assert import_attribute(context.params["worker_class"]) is JsonLogWorker
    context.close()


def test_every_deployment_is_covered() -> None:
    assert set(RQ_COMMAND_LINES) == {"compose rq-worker", "k8s tidegate-rq-worker/rq-worker"}
    assert sum(where.startswith("compose ") for where in COMMAND_LINES) >= 10
    assert sum(where.startswith("k8s ") for where in COMMAND_LINES) >= 6


@pytest.mark.parametrize("where", sorted(COMMAND_LINES))
def test_command_line_parses(where: str) -> None:
    name, *args = COMMAND_LINES[where]
    assert name in COMMANDS, f"{where}: tidegate has no command {name!r}"
    # A rejected flag or value raises the CLI's usage error, naming it.
    context: Any = load_command(name).make_context(name, list(args))
    context.close()


def test_a_wrong_flag_is_rejected() -> None:
    """make_context really validates: a misspelt flag and a bad value both fail."""
    worker = load_command("worker")
    with pytest.raises(Exception, match="No such option: --vllm-ur"):
        worker.make_context("worker", ["--gpu", "0", "--vllm-ur", "http://vllm:8000"])
    with pytest.raises(Exception, match="valid integer"):
        worker.make_context("worker", ["--gpu", "zero"])


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(cli_app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"tidegate {version('tidegate')}"
