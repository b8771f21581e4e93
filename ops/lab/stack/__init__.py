"""The tidegate processes on one machine: simulator, workers, monitor and API, started and stopped together."""

from ops.lab.procs.children import ChildError, ChildProcess
from ops.lab.stack.stack import Engine, SimSettings, Stack, StackConfig, WorkerSettings

__all__ = ["ChildError", "ChildProcess", "Engine", "SimSettings", "Stack", "StackConfig", "WorkerSettings"]
