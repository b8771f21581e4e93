"""Calling an operator's hook: a shell command (figures in its environment) or an http(s) URL (JSON)."""

from __future__ import annotations

import os
import shlex
import subprocess

import requests

STDERR_TAIL = 400


class HookFailed(RuntimeError):
    """The hook could not be run or reported failure; the message says which hook and why."""


def run_hook(name: str, hook: str, payload: dict[str, str | int | float], timeout: float) -> str:
    """Run `hook` once with `payload`; returns a one-line description of what happened."""
    if hook.startswith(("http://", "https://")):
        return _post(name, hook, payload, timeout)
    return _command(name, hook, payload, timeout)


def _post(name: str, url: str, payload: dict[str, str | int | float], timeout: float) -> str:
    try:
        response = requests.post(url, json=payload, timeout=timeout)
    except requests.RequestException as exc:
        raise HookFailed(f"{name} {url}: request failed: {exc}") from exc
    if response.status_code >= 300:
        raise HookFailed(f"{name} {url}: answered HTTP {response.status_code}, expected 2xx")
    return f"{name}: POST {url} -> {response.status_code}"


def _command(name: str, command: str, payload: dict[str, str | int | float], timeout: float) -> str:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise HookFailed(f"{name} {command!r}: cannot be parsed as a command line: {exc}") from exc
    if not argv:
        raise HookFailed(f"{name} {command!r}: names no program to run")
    env = dict(os.environ)
    env.update({f"TIDEGATE_{key.upper()}": str(value) for key, value in payload.items()})
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise HookFailed(f"{name} {command!r}: no such program {argv[0]!r}") from exc
    except subprocess.TimeoutExpired as exc:
        raise HookFailed(f"{name} {command!r}: still running after {timeout} s, stopped") from exc
    if done.returncode != 0:
        tail = done.stderr.strip()[-STDERR_TAIL:]
        raise HookFailed(f"{name} {command!r}: exited {done.returncode}" + (f": {tail}" if tail else ""))
    return f"{name}: {argv[0]} exited 0"
