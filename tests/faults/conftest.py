"""Fault scenarios reuse the worker tests' fast policy and simulators."""

from tests.worker.conftest import fast_policy, fast_policy_file, simulator

__all__ = ["fast_policy", "fast_policy_file", "simulator"]
