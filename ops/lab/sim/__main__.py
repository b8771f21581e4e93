"""`python -m ops.lab.sim`: the same as `tidegate sim-vllm`."""

from ops.lab.sim.cli import app

app(prog_name="tidegate sim-vllm")
