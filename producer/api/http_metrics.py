"""The API's HTTP metrics, from one pure ASGI layer outside every other: each answer counted and timed
by route, method and status, and timed again by status class for the shedding rule.

- `tidegate_http_requests_total` and `tidegate_http_request_duration_seconds`, labelled `handler`
  (the route's template, `/v1/tickets/{ticket_id}`; paths no route matches share `none`, so a scan of
  random URLs cannot grow the series without bound), `method` and `status`.
- `tidegate_http_answer_seconds{status_class}`: the rule that a shed request is answered within a few
  milliseconds has to be visible in production, not only in a bench. A 429 is its own class beside
  `2xx`, `3xx`, `4xx` (the other client errors) and `5xx`.

The clock starts when the server hands the request to the app and stops at the answer's last byte
(a streamed answer counts until its stream ends), so the framework's own work counts too. The route
is the one the router matched, read from the scope after the call: no second route lookup per
request. Prometheus's scrapes are neither counted nor timed.
"""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.metrics import LATENCY_BUCKETS

NAMESPACE = "tidegate"
ANSWER_SECONDS = "tidegate_http_answer_seconds"
ANSWER_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Fine around the 5 ms rule, coarse past it."""
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, *LATENCY_BUCKETS[2:])
NOT_MEASURED = frozenset({"/metrics"})
"""Scrapes are Prometheus's own traffic, not the branches'."""
UNMATCHED = "none"
"""The handler of a request no route matched."""
STATUS_CLASSES = ("2xx", "3xx", "4xx", "429", "5xx")


def status_class(status: int) -> str:
    """`429` on its own; every other status by its hundreds (`2xx`, `4xx`, ...)."""
    return "429" if status == 429 else f"{status // 100}xx"


def handler_of(scope: Scope, mounts: tuple[str, ...]) -> str:
    """The template of the route that took the request (set in the scope by the router, or by the shed
    shortcut answering on the route's behalf), else the mount whose files it asked for, else `none`."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    return next((mount for mount in mounts if scope["path"].startswith(mount + "/")), UNMATCHED)


def observed_registry(registry: CollectorRegistry) -> CollectorRegistry:
    """Where this process's observations go: `registry` itself, or with PROMETHEUS_MULTIPROC_DIR
    set a throwaway one (the values live in the shared files, which `registry` reads; registering
    them there as well would export them twice)."""
    return CollectorRegistry() if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else registry


class HttpMetricFamilies:
    """The three families, with their label children kept once made (a dict lookup per answer)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        target = observed_registry(registry)
        self.requests = Counter(
            "http_requests_total",
            "HTTP requests answered by the API, by route, method and status.",
            ["handler", "method", "status"],
            namespace=NAMESPACE,
            registry=target,
        )
        self.durations = Histogram(
            "http_request_duration_seconds",
            "Seconds the API took to answer, by route, method and status.",
            ["handler", "method", "status"],
            buckets=HTTP_BUCKETS,
            namespace=NAMESPACE,
            registry=target,
        )
        self.answers = Histogram(
            ANSWER_SECONDS,
            "Seconds from a request's arrival at the API to the last byte of its answer, by status "
            "class (2xx, 3xx, 4xx but 429, 429, 5xx).",
            ["status_class"],
            buckets=ANSWER_BUCKETS,
            registry=target,
        )
        self._classes = {name: self.answers.labels(name) for name in STATUS_CLASSES}
        self._routes: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def observe(self, handler: str, method: str, status: int, seconds: float) -> None:
        key = (handler, method, status)
        children = self._routes.get(key)
        if children is None:
            labels = (handler, method, str(status))
            children = self._routes[key] = (self.requests.labels(*labels), self.durations.labels(*labels))
        children[0].inc()
        children[1].observe(seconds)
        name = status_class(status)
        (self._classes.get(name) or self.answers.labels(name)).observe(seconds)


class HttpMetrics:
    """Pure ASGI middleware (no per-request task, request object or body copy); add it last, so it is
    the outermost layer and the other layers' work is inside its figures."""

    def __init__(self, app: ASGIApp, families: HttpMetricFamilies, mounts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.families = families
        self.mounts = mounts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in NOT_MEASURED:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        finished: float | None = None
        status = 500

        async def timed_send(message: Message) -> None:
            nonlocal status, finished
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = time.perf_counter()

        try:
            await self.app(scope, receive, timed_send)
        finally:
            # An exception escaping the app is answered 500 by the server-error layer outside this one.
            ended = finished if finished is not None else time.perf_counter()
            self.families.observe(handler_of(scope, self.mounts), scope["method"], status, ended - started)
