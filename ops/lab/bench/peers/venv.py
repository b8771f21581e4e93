"""Peer gateways live in virtualenvs of their own, installed by the bench on first use.

They are lab extras, never dependencies of tidegate or of its tests: each one goes into
`~/.cache/tidegate/peers/<name>` (or under `TIDEGATE_PEERS_DIR`) with pip from the package index.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

INSTALL_TIMEOUT_S = 900.0


class PeerUnavailable(RuntimeError):
    """A peer gateway cannot be installed or started here; the message says why and what to do."""


def peers_dir() -> Path:
    return Path(os.environ.get("TIDEGATE_PEERS_DIR") or Path.home() / ".cache" / "tidegate" / "peers")


def peer_executable(
    name: str,
    requirement: str,
    command: str,
    progress: Callable[[str], None] = lambda line: None,
    python: str | Path | None = None,
) -> Path:
    """`command` from the virtualenv `name`, created and filled with `requirement` when it is missing.

    The virtualenv is made with `python` when a peer needs another interpreter than tidegate's own
    (inference-perf needs 3.12), else with this one.
    """
    venv = peers_dir() / name
    executable = venv / "bin" / command
    if executable.exists():
        return executable
    progress(f"{name}: installing {requirement} into {venv} (first use)")
    steps = [
        [str(python or sys.executable), "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement],
    ]
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerUnavailable(f"{name}: `{' '.join(step)}` did not finish: {exc}") from exc
        if done.returncode != 0:
            raise PeerUnavailable(
                f"{name}: `{' '.join(step)}` failed ({done.returncode}): {done.stderr.strip()[-600:]}"
            )
    if not executable.exists():
        raise PeerUnavailable(f"{name}: installed {requirement} but {executable} is missing")
    return executable
