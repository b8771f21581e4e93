"""A bench phase's server-side quantile from two scrapes of the answer-time histogram."""

from __future__ import annotations

import math

import pytest

from ops.lab.bench.server_time import quantile_ms

INF = math.inf


def test_quantile_interpolates_within_the_bucket_of_the_phase() -> None:
    before = {0.001: 10.0, 0.005: 10.0, 0.01: 10.0, INF: 10.0}
    after = {0.001: 10.0, 0.005: 110.0, 0.01: 110.0, INF: 110.0}  # 100 answers in (1, 5] ms
    assert quantile_ms(before, after, 0.5) == pytest.approx(3.0)
    assert quantile_ms(before, after, 0.99) == pytest.approx(4.96)


def test_no_answers_read_zero_and_the_inf_bucket_reads_its_lower_bound() -> None:
    assert quantile_ms({}, {0.005: 0.0, INF: 0.0}, 0.99) == 0.0
    assert quantile_ms({}, {0.005: 1.0, INF: 100.0}, 0.99) == pytest.approx(5.0)
