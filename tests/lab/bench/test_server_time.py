"""A bench phase's server-side quantile from two scrapes of the answer-time histogram."""

from __future__ import annotations

import math

import pytest

from ops.lab.bench.server_time import quantile_bucket, quantile_ms

INF = math.inf


def test_quantile_interpolates_within_the_bucket_of_the_phase() -> None:
    before = {0.001: 10.0, 0.005: 10.0, 0.01: 10.0, INF: 10.0}
    after = {0.001: 10.0, 0.005: 110.0, 0.01: 110.0, INF: 110.0}  # 100 answers in (1, 5] ms
    assert quantile_ms(before, after, 0.5) == pytest.approx(3.0)
    assert quantile_ms(before, after, 0.99) == pytest.approx(4.96)


def test_no_answers_read_zero_and_the_inf_bucket_reads_its_lower_bound() -> None:
    assert quantile_ms({}, {0.005: 0.0, INF: 0.0}, 0.99) == 0.0
    assert quantile_ms({}, {0.005: 1.0, INF: 100.0}, 0.99) == pytest.approx(5.0)


def test_the_quantiles_bucket_bounds_how_far_it_can_be_trusted() -> None:
    before = {0.05: 3.0, 0.1: 3.0, 0.25: 3.0, INF: 3.0}
    after = {0.05: 6.0, 0.1: 20.0, 0.25: 33.0, INF: 33.0}  # 30 observed: 3, 14 and 13 per bucket
    assert quantile_bucket(before, after, 0.5) == (0.05, 0.1)
    assert quantile_bucket(before, after, 0.99) == (0.1, 0.25)
    assert quantile_bucket({}, {0.1: 0.0, INF: 0.0}, 0.5) is None
    assert quantile_bucket({}, {0.1: 0.0, INF: 2.0}, 0.5) == (0.1, INF)
