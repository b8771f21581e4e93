"""The layering contracts in pyproject.toml hold on the tree, and they do catch a forbidden import."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")


def _lint(cwd: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract() -> None:
    result = _lint(REPO, REPO / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _copy_packages(destination: Path) -> None:
    for package in ("shared", "producer", "worker", "ops", "tidegate"):
        shutil.copytree(REPO / package, destination / package, ignore=shutil.ignore_patterns("__pycache__"))


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("shared/leak.py", "import producer.producer\n", "shared imports nothing of ours"),
        ("worker/leak.py", "import fastapi\n", "worker imports only shared"),
        ("ops/monitor/leak.py", "import ops.lab.sim.engine\n", "the monitor imports only shared"),
        ("producer/leak.py", "from worker import batch_sizer\n", "producer imports only shared"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    _copy_packages(tmp_path)
    (tmp_path / module).write_text(f'"""A deliberate layering violation."""\n\n{line}')
    config = tmp_path / "importlinter.toml"
    section = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    config.write_text(_as_toml(section))
    result = _lint(tmp_path, config)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    assert contract in result.stdout.replace("\n", " ")


def _as_toml(section: dict[str, object]) -> str:
    """The [tool.importlinter] section written back, for a config file outside the repository."""

    def value(item: object) -> str:
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, list):
            return "[" + ", ".join(value(v) for v in item) + "]"
        return '"' + str(item).replace('"', '\\"') + '"'

    lines = ["[tool.importlinter]"]
    lines += [f"{key} = {value(item)}" for key, item in section.items() if key != "contracts"]
    for contract in section["contracts"]:  # type: ignore[attr-defined]
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{key} = {value(item)}" for key, item in contract.items()]
    return "\n".join(lines) + "\n"
