"""Finding the interpreter and tokenizer inference-perf needs; nothing here installs it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from ops.lab.bench.iperf import tool
from ops.lab.bench.peers import venv
from ops.lab.bench.peers.venv import PeerUnavailable


def test_a_named_interpreter_is_used_and_a_missing_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = tmp_path / "python3.12"
    python.write_text("")
    monkeypatch.setenv(tool.PYTHON_ENV, str(python))
    assert tool.python312() == python
    monkeypatch.setenv(tool.PYTHON_ENV, str(tmp_path / "absent"))
    with pytest.raises(PeerUnavailable, match=tool.PYTHON_ENV):
        tool.python312()


def test_a_pyenv_interpreter_is_found_when_none_is_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = tmp_path / "versions" / "3.12.1" / "bin" / "python3.12"
    found.parent.mkdir(parents=True)
    found.write_text("")
    monkeypatch.delenv(tool.PYTHON_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    assert tool.python312() == found
    found.unlink()
    with pytest.raises(PeerUnavailable, match=r"Python 3\.12 or newer"):
        tool.python312()


def test_a_shim_on_path_that_cannot_run_gives_way_to_pyenvs_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3.12"  # pyenv's shim when 3.12 is installed but not the active version
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    found = tmp_path / "versions" / "3.12.1" / "bin" / "python3.12"
    found.parent.mkdir(parents=True)
    found.write_text("")
    monkeypatch.delenv(tool.PYTHON_ENV, raising=False)
    monkeypatch.setenv("PATH", str(shims))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    assert tool.python312() == found


def test_the_peer_virtualenv_is_made_with_the_interpreter_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEGATE_PEERS_DIR", str(tmp_path))
    steps: list[list[str]] = []

    def run(step: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        steps.append(step)
        if "pip" in step:
            executable = tmp_path / "inference-perf" / "bin" / "inference-perf"
            executable.parent.mkdir(parents=True, exist_ok=True)
            executable.write_text("")
        return subprocess.CompletedProcess(step, 0, "", "")

    monkeypatch.setattr(venv.subprocess, "run", run)
    found = venv.peer_executable("inference-perf", tool.REQUIREMENT, "inference-perf", python="/opt/py312")
    assert found == tmp_path / "inference-perf" / "bin" / "inference-perf"
    assert steps[0] == ["/opt/py312", "-m", "venv", str(tmp_path / "inference-perf")]
    assert steps[1][-1] == "inference-perf==0.7.0"
    steps.clear()
    venv.peer_executable("inference-perf", tool.REQUIREMENT, "inference-perf", python="/opt/py312")
    assert steps == []  # installed once, reused after


def test_the_lab_models_tokenizer_is_used_when_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("TIDEGATE_VLLM_MODEL_DIR", str(tmp_path))
    assert tool.tokenizer_dir(tmp_path / "bin" / "inference-perf") == tmp_path
