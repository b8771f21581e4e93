"""The API's own answer time for one status class, read from its /metrics between two moments.

The API times every answer inside the server (producer/api/http_metrics.py); a bench phase's share
is the difference of two scrapes of the histogram, and its quantile is interpolated within the
bucket that holds it, as Prometheus's `histogram_quantile` does (so it is only as fine as the
buckets around it).
"""

from __future__ import annotations

import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from producer.api.http_metrics import ANSWER_SECONDS

Buckets = dict[float, float]
"""Upper bound (seconds, +Inf last) → cumulative count."""


def answer_buckets(base_url: str, status_class: str) -> Buckets:
    """The cumulative buckets of the API's answer-time histogram for `status_class` now."""
    return histogram_buckets(base_url, ANSWER_SECONDS, status_class=status_class)


def histogram_buckets(base_url: str, histogram: str, **labels: str) -> Buckets:
    """The cumulative buckets of the API's histogram `histogram` now, summed over the series that
    carry `labels`."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    out: Buckets = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == histogram + "_bucket" and all(
                sample.labels.get(name) == value for name, value in labels.items()
            ):
                bound = float(sample.labels["le"])
                out[bound] = out.get(bound, 0.0) + sample.value
    return out


def quantile_ms(before: Buckets, after: Buckets, q: float) -> float:
    """The `q` quantile (0..1) in milliseconds of what was observed between the two scrapes; 0 for
    none; the highest finite bound when it falls in the +Inf bucket."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return 0.0
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower * 1000
            inside = cumulative - below
            fraction = (rank - below) / inside if inside > 0 else 1.0
            return (lower + (bound - lower) * fraction) * 1000
        lower, below = bound, cumulative
    return lower * 1000


def quantile_bucket(before: Buckets, after: Buckets, q: float) -> tuple[float, float] | None:
    """The bounds (seconds) of the bucket that holds the `q` quantile between the two scrapes, which
    is how far `quantile_ms` can be trusted; None for no observations."""
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0.0) if bounds else 0.0
    if total <= 0:
        return None
    lower = 0.0
    for bound in bounds:
        if after[bound] - before.get(bound, 0.0) >= q * total:
            return lower, bound
        lower = bound
    return lower, math.inf
