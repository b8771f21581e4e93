"""`tidegate rollout`: start a model rollout in canary waves, watch it, pause, resume, roll it back.

The state lives in Redis (shared/rollout_store.py); workers route by it and the acting monitor
judges each wave, so these commands only write a step and print what the queue holds. `start`
first reads the version the candidate serves (vLLM's `--served-model-name name:version`) and
refuses another one than `--version`; a candidate it cannot reach only earns a warning.
`report --plot` draws the latency per arm with the lab's matplotlib module, loaded only then
(the way the worker loads pynvml), so the monitor runs without the lab installed.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
import requests
import typer

from shared.audit import os_user
from shared.cli_support import EXIT_BAD_INPUT, fail, load_settings, print_json, redis_failure
from shared.config import Settings
from shared.keys import QueueKeys
from shared.redis_conn import RedisUnavailable, connect_from
from shared.rollout import RolloutState
from shared.rollout_report import rollout_report, rollout_summary
from shared.rollout_store import RolloutError, RolloutStore

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Model rollouts: shadow traffic, canary waves by branch digit, automatic rollback.",
)

PLOT_MODULE = "ops.lab.bench.rollout_plot"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

QUEUE_OPTION = typer.Option(None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME)")
JSON_OPTION = typer.Option(False, "--json", help="print one JSON document")


def parse_duration(text: str, field: str) -> float:
    """`2h`, `30m`, `90s`, `1.5h` or plain seconds; exit 2 naming the field otherwise."""
    match = _DURATION.match(text)
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)] if match else 0.0
    if seconds <= 0:
        fail(f"{field}: {text!r} is not a positive duration like 2h, 30m, 90s or 45", EXIT_BAD_INPUT)
    return seconds


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(f"--candidate: {url!r} is not an http(s) URL of a vLLM endpoint", EXIT_BAD_INPUT)
    return url.rstrip("/")


def served_version(url: str, timeout: float = 3.0) -> tuple[str | None, str]:
    """The candidate's model version (after the last `:` of its served name) and what was found."""
    try:
        response = requests.get(url + "/v1/models", timeout=timeout)
        names = [str(m["id"]) for m in response.json().get("data") or []]
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"could not read {url}/v1/models ({exc.__class__.__name__})"
    if not names:
        return None, f"{url}/v1/models lists no model"
    name = names[0]
    return (name.rpartition(":")[2] if ":" in name else None), f"it serves {name!r}"


def _check_version(url: str, version: str, verify: bool) -> None:
    """Refuse a candidate that serves another version; warn when it cannot be read."""
    if not verify:
        return
    served, found = served_version(url)
    if served is None:
        typer.echo(f"warning: cannot check the candidate's version: {found}", err=True)
    elif served != version:
        fail(f"--version: {version!r} is not the candidate's version; {found}", EXIT_BAD_INPUT)


def _store(settings: Settings) -> RolloutStore:
    return RolloutStore(connect_from(settings), QueueKeys(settings.queue_name))


def _line(state: RolloutState) -> str:
    doc = state.to_dict()
    text = f"rollout {state.id}: version {state.version} at {state.candidate_url}, {state.status.value}"
    if state.active:
        text += f", wave {state.wave} of 0-9"
    if state.shadow_fraction:
        text += f", shadow {state.shadow_fraction:.0%}"
    if doc["reason"]:
        text += f" ({doc['reason']})"
    return text


def _step(queue: str | None, as_json: bool, action: Any) -> None:
    settings = load_settings(queue_name=queue)
    try:
        state = action(_store(settings))
    except RolloutError as exc:
        fail(str(exc))
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    if as_json:
        print_json({"queue": settings.queue_name, **state.to_dict()})
    else:
        typer.echo(_line(state))


@app.command("start")
def start_command(
    candidate: str = typer.Option(..., "--candidate", help="the candidate's vLLM URL"),
    version: str = typer.Option(..., "--version", help="the candidate's model version"),
    interval: str = typer.Option("2h", "--interval", help="length of each wave: 2h, 30m, 90s ..."),
    shadow: float = typer.Option(
        0.0, "--shadow", help="share of answered tickets also sent to the candidate"
    ),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="check the version the candidate serves"),
    queue: str | None = QUEUE_OPTION,
    actor: str = typer.Option(os_user(), "--actor", help="who asks; recorded in the audit trail"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Start wave 0: branches whose id ends in 0 run on the candidate; one more digit per interval."""
    url = _check_url(candidate)
    seconds = parse_duration(interval, "--interval")
    if not 0.0 <= shadow <= 1.0:
        fail(f"--shadow: {shadow} is not a fraction between 0 and 1", EXIT_BAD_INPUT)
    if not version.strip():
        fail("--version: must name the candidate's model version", EXIT_BAD_INPUT)
    _check_version(url, version, verify)
    _step(
        queue,
        as_json,
        lambda store: store.start(
            candidate_url=url, version=version, interval_seconds=seconds, shadow_fraction=shadow, actor=actor
        ),
    )


@app.command("pause")
def pause_command(
    queue: str | None = QUEUE_OPTION,
    actor: str = typer.Option(os_user(), "--actor", help="who asks; recorded in the audit trail"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Hold the current wave: its branches stay on the candidate, no wave advances."""
    _step(queue, as_json, lambda store: store.pause(actor))


@app.command("resume")
def resume_command(
    queue: str | None = QUEUE_OPTION,
    actor: str = typer.Option(os_user(), "--actor", help="who asks; recorded in the audit trail"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run the held wave on; the time it was paused does not count towards its interval."""
    _step(queue, as_json, lambda store: store.resume(actor))


@app.command("rollback")
def rollback_command(
    reason: str = typer.Option("rolled back by the operator", "--reason"),
    queue: str | None = QUEUE_OPTION,
    actor: str = typer.Option(os_user(), "--actor", help="who asks; recorded in the audit trail"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Send every branch back to the primary now; running requests finish where they are."""
    _step(queue, as_json, lambda store: store.rollback(actor, reason))


def _read(queue: str | None, reader: Any) -> tuple[Settings, Any]:
    settings = load_settings(queue_name=queue)
    try:
        doc = reader(connect_from(settings), QueueKeys(settings.queue_name))
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    if doc is None:
        fail(f"no rollout was started on queue {settings.queue_name}")
    return settings, doc


@app.command("status")
def status_command(queue: str | None = QUEUE_OPTION, as_json: bool = JSON_OPTION) -> None:
    """The rollout's status, wave and both arms' figures in that wave."""
    settings, doc = _read(queue, rollout_summary)
    if as_json:
        print_json({"queue": settings.queue_name, **doc})
        return
    typer.echo(
        f"rollout {doc['id']}: version {doc['version']} at {doc['candidate']}, {doc['status']}, wave {doc['wave']}"
    )
    for arm in doc["arms"].values():
        typer.echo(
            f"  {arm['arm']:<9} calls {arm['calls']:>6}  errors {arm['error_rate']:.1%}  "
            f"shed {arm['shed_rate']:.1%}  TTFT p95 {_seconds(arm['ttft_p95_seconds'])}"
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _print_report(doc: dict[str, Any]) -> None:
    shadow = doc["shadow"]
    typer.echo(_line_from(doc["rollout"]))
    typer.echo(f"shadow A/B over {shadow['records']} tickets (similarity mean {shadow['similarity_mean']})")
    typer.echo(
        f"  {'arm':<9} {'answers':>7} {'errors':>6} {'TTFT p50':>10} {'TTFT p95':>10} {'TPOT p50':>10} "
        f"{'total p50':>10} {'total p95':>10} {'tokens':>7}"
    )
    for row in shadow["arms"]:
        tokens = "-" if row["completion_tokens_mean"] is None else f"{row['completion_tokens_mean']:.1f}"
        typer.echo(
            f"  {row['arm']:<9} {row['answers']:>7} {row['errors']:>6} {_seconds(row['ttft_p50_seconds']):>10} "
            f"{_seconds(row['ttft_p95_seconds']):>10} {_seconds(row['tpot_p50_seconds']):>10} "
            f"{_seconds(row['total_p50_seconds']):>10} {_seconds(row['total_p95_seconds']):>10} {tokens:>7}"
        )
    typer.echo("canary waves:")
    for wave in doc["waves"]:
        cand, ctrl = wave["candidate"], wave["primary"]
        typer.echo(
            f"  wave {wave['wave']}: candidate {cand['calls']} calls, {cand['error_rate']:.1%} errors, "
            f"TTFT p95 {_seconds(cand['ttft_p95_seconds'])}; control {ctrl['calls']} calls, "
            f"{ctrl['error_rate']:.1%} errors, TTFT p95 {_seconds(ctrl['ttft_p95_seconds'])}"
        )


def _line_from(rollout: dict[str, Any]) -> str:
    return (
        f"rollout {rollout['id']}: version {rollout['version']}, {rollout['status']}, wave {rollout['wave']}"
    )


@app.command("report")
def report_command(
    queue: str | None = QUEUE_OPTION,
    plot: Path | None = typer.Option(
        None, "--plot", help="also draw latency per arm to this PNG (needs [lab])"
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """The A/B comparison of candidate and control: shadow answers and each canary wave."""
    settings, doc = _read(queue, rollout_report)
    if plot is not None:
        try:
            plotter = importlib.import_module(PLOT_MODULE)
        except ImportError as exc:
            fail(f"--plot needs the lab's plotting libraries (pip install 'tidegate[lab]'): {exc}")
        plotter.plot_rollout(doc, plot)
    if as_json:
        print_json({"queue": settings.queue_name, **doc, "plot": str(plot) if plot else None})
        return
    _print_report(doc)
    if plot is not None:
        typer.echo(f"plot written to {plot}")
