"""Admission tests drive a real monitor, so they share the monitor tests' fixtures."""

from tests.monitor.conftest import fake_clock, make_monitor, rq_conn, rq_queues

__all__ = ["fake_clock", "make_monitor", "rq_conn", "rq_queues"]
