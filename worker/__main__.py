"""`python -m worker`: the same as `tidegate worker` (the supervisor starts its children this way)."""

from worker.cli import app

app(prog_name="tidegate worker")
