"""HTTP request count and latency by route and status on the API's /metrics.

prometheus-fastapi-instrumentator does the measuring; the route label is the route's template
(`/v1/tickets/{ticket_id}`), and paths no route matches share one label, so a scan of random URLs
cannot grow the series without bound.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator, metrics

from producer.api.answer_timing import AnswerTiming, answer_histogram
from shared.metrics import LATENCY_BUCKETS

NAMESPACE = "tidegate"
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, *LATENCY_BUCKETS[2:])
NOT_MEASURED = ["/metrics"]
"""Scrapes are Prometheus's own traffic, not the branches'."""


def observed_registry(registry: CollectorRegistry) -> CollectorRegistry:
    """Where this process's observations go: `registry` itself, or with PROMETHEUS_MULTIPROC_DIR
    set a throwaway one (the values live in the shared files, which `registry` reads)."""
    return CollectorRegistry() if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else registry


def time_answers(app: FastAPI, registry: CollectorRegistry) -> None:
    """Time every answer by status class (producer/api/answer_timing.py); add it last, so it is the
    outermost layer and the other layers' work is inside the figure."""
    app.add_middleware(AnswerTiming, histogram=answer_histogram(observed_registry(registry)))


def instrument(app: FastAPI, registry: CollectorRegistry) -> None:
    """Count and time every request of `app` into `registry` (the one its /metrics serves).

    With PROMETHEUS_MULTIPROC_DIR set, the values live in the shared files and `registry` reads them
    through its multiprocess collector; registering them there as well would export them twice.
    """
    target = observed_registry(registry)
    instrumentator = Instrumentator(
        should_group_status_codes=False,
        should_ignore_untemplated=False,
        should_group_untemplated=True,
        excluded_handlers=NOT_MEASURED,
        registry=target,
    )
    instrumentator.add(
        metrics.requests(
            metric_namespace=NAMESPACE,
            metric_doc="HTTP requests answered by the API, by route, method and status.",
            registry=target,
        ),
        metrics.latency(
            metric_namespace=NAMESPACE,
            metric_doc="Seconds the API took to answer, by route, method and status.",
            buckets=HTTP_BUCKETS,
            registry=target,
        ),
    )
    instrumentator.instrument(app)
