"""Fault scenarios reuse the worker tests' fast policy and simulators and the monitor's rq queues."""

from tests.monitor.conftest import hook_server, rq_conn, rq_queues
from tests.worker.conftest import fast_policy, fast_policy_file, simulator

__all__ = ["fast_policy", "fast_policy_file", "hook_server", "rq_conn", "rq_queues", "simulator"]
