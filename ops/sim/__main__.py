"""`python -m ops.sim`: the same as `tidegate sim-vllm`."""

from ops.sim.cli import app

app(prog_name="tidegate sim-vllm")
