"""inference-perf, the Kubernetes serving working group's load generator, as a lab extra.

It needs Python 3.12 or newer while tidegate runs on 3.11, so its virtualenv is made with another
interpreter (`TIDEGATE_PYTHON312`, else `python3.12`/`python3.13` on PATH, else a pyenv one), on
first use, into `~/.cache/tidegate/peers/inference-perf` like the peer gateways. It runs offline:
the tokenizer that builds its prompts is the lab's test-model tokenizer read from disk, or, where
that model is not built, one trained here with the same recipe (`ops/lab/vllm_cpu/build_model.py`).
"""

from __future__ import annotations

import glob
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ops.lab.bench.peers.venv import PeerUnavailable, peer_executable, peers_dir
from ops.lab.procs.children import ChildProcess, child_env, log_tail
from ops.lab.vllm_cpu.paths import model_dir

REQUIREMENT = "inference-perf==0.7.0"
NAME = "inference-perf"
PYTHON_ENV = "TIDEGATE_PYTHON312"
TOKENIZER_TIMEOUT_S = 600.0
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SOURCE_ROOT = Path(__file__).resolve().parents[4]
"""The folder holding the `ops` package, so the peer's interpreter can import the tokenizer recipe."""


def python312() -> Path:
    """An interpreter of Python 3.12 or newer to make the virtualenv with."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            raise PeerUnavailable(f"{PYTHON_ENV}={named!r} is not a file; name a Python 3.12+ interpreter")
        return Path(named)
    for command in ("python3.12", "python3.13"):
        found = shutil.which(command)
        if found and _runs(found):  # a pyenv shim is on PATH whether or not its version is active
            return Path(found)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    for pattern in ("3.12*/bin/python3.12", "3.13*/bin/python3.13"):
        matches = sorted(glob.glob(str(pyenv / pattern)))
        if matches:
            return Path(matches[-1])
    raise PeerUnavailable(
        f"inference-perf needs Python 3.12 or newer and none was found: set {PYTHON_ENV} to one, put "
        f"python3.12 on PATH, or install one with pyenv under {pyenv}"
    )


def _runs(python: str) -> bool:
    try:
        return subprocess.run([python, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def inference_perf_command(progress: Callable[[str], None] = lambda line: None) -> Path:
    """The `inference-perf` executable, installed into its own virtualenv first when it is missing."""
    return peer_executable(NAME, REQUIREMENT, "inference-perf", progress, python=python312())


def tokenizer_dir(executable: Path, progress: Callable[[str], None] = lambda line: None) -> Path:
    """A Hugging Face tokenizer folder on disk: the lab model's, else one trained here once."""
    if (model_dir() / "tokenizer.json").is_file():
        return model_dir()
    out = peers_dir() / "inference-perf-tokenizer"
    if (out / "tokenizer.json").is_file():
        return out
    progress(f"{NAME}: no test model at {model_dir()}; training its tokenizer alone into {out}")
    script = (
        "import sys; from ops.lab.vllm_cpu.build_model import corpus_files, train_tokenizer; "
        "train_tokenizer(corpus_files()).save_pretrained(sys.argv[1])"
    )
    python = executable.with_name("python")
    env = child_env({**OFFLINE, "PYTHONPATH": str(SOURCE_ROOT)})
    try:
        done = subprocess.run(
            [str(python), "-c", script, str(out)],
            capture_output=True,
            text=True,
            timeout=TOKENIZER_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{NAME}: training the tokenizer did not finish: {exc}") from exc
    if done.returncode != 0 or not (out / "tokenizer.json").is_file():
        raise PeerUnavailable(
            f"{NAME}: training the tokenizer into {out} failed ({done.returncode}): {done.stderr[-600:]}"
        )
    return out


@dataclass(frozen=True)
class ToolRun:
    """How one inference-perf run went: its exit code, wall time and CPU (its worker processes too)."""

    exit_code: int
    wall_s: float
    cpu_s: float
    log_path: Path

    @property
    def cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(executable: Path, config: Path, log_path: Path, timeout_s: float) -> ToolRun:
    """Run `inference-perf --config_file CONFIG` to its end (or kill it after `timeout_s`).

    Its CPU is what the reaped child and the workers it reaped used: the growth of this process's
    RUSAGE_CHILDREN over the run, so nothing else of ours may be reaped meanwhile (the stack's
    processes run on until after it).
    """
    cpu_before = _children_cpu_s()
    started = time.monotonic()
    child = ChildProcess(
        NAME, [str(executable), "--config_file", str(config)], log_path, env=child_env(OFFLINE)
    ).start()
    try:
        while child.poll() is None:
            if time.monotonic() - started > timeout_s:
                child.stop(5.0)
                raise PeerUnavailable(
                    f"{NAME} ran past {timeout_s:.0f} s and was stopped; log {log_path}:\n{log_tail(log_path)}"
                )
            time.sleep(0.5)
    finally:
        code = child.stop(5.0)
    wall = time.monotonic() - started
    return ToolRun(code if code is not None else -1, wall, _children_cpu_s() - cpu_before, log_path)
