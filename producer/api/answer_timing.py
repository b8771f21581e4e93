"""How long the API took to answer, by status class, timed outside every other layer.

The rule that a shed request is answered within a few milliseconds has to be visible in production,
not only in a bench: this histogram starts when the server hands the request to the app and stops
when the last byte of the answer is handed back, so the framework's own work counts too. A 429 is
its own class (`429`) beside `2xx`, `3xx`, `4xx` (the other client errors) and `5xx`; a streamed
answer counts until its stream ends. Prometheus's scrapes are not timed.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ANSWER_SECONDS = "tidegate_http_answer_seconds"
ANSWER_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Fine around the 5 ms rule, coarse past it."""
NOT_TIMED = frozenset({"/metrics"})


def status_class(status: int) -> str:
    """`429` on its own; every other status by its hundreds (`2xx`, `4xx`, ...)."""
    return "429" if status == 429 else f"{status // 100}xx"


def answer_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        ANSWER_SECONDS,
        "Seconds from a request's arrival at the API to the last byte of its answer, by status class "
        "(2xx, 3xx, 4xx but 429, 429, 5xx).",
        ["status_class"],
        buckets=ANSWER_BUCKETS,
        registry=registry,
    )


class AnswerTiming:
    """Pure ASGI middleware (no per-request task or body copy): the outermost layer of the app."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram
        self._children = {name: histogram.labels(name) for name in ("2xx", "3xx", "4xx", "429", "5xx")}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in NOT_TIMED:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self._observe(status, time.perf_counter() - started)

        await self.app(scope, receive, timed_send)

    def _observe(self, status: int, seconds: float) -> None:
        name = status_class(status)
        child = self._children.get(name) or self.histogram.labels(name)
        child.observe(seconds)
