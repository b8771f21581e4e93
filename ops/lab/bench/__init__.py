"""Benchmarks: how fast the queue is, and how the whole system behaves under overload."""
