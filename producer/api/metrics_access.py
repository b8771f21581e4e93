"""Who reads the API's /metrics, and where: the settings `metrics_auth` and `metrics_port`.

Queue depth, branch activity and error rates tell an outsider a lot, so a deployment whose API
port faces the branches can keep the figures to operator keys or move them to a port of its own.
The default (open on the API port) keeps existing scrape configurations working.
"""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry

from producer.api.auth import Authenticator, require_operator
from producer.api.errors import api_error
from shared.config import Settings
from shared.metrics import serve

log = logging.getLogger(__name__)


def bearer_token(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header; None for none or another scheme."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def check_metrics_access(settings: Settings, authenticator: Authenticator, authorization: str | None) -> None:
    """Pass, or raise the API error that refuses this scrape (404 on its own port, 401, 403)."""
    token = bearer_token(authorization)
    if settings.metrics_port is not None:
        raise api_error(
            404, f"metrics are served on port {settings.metrics_port}, not here", code="metrics_elsewhere"
        )
    if settings.metrics_auth == "operator":
        require_operator(authenticator.cached(token) or authenticator.authenticate(token))


class MetricsPort:
    """/metrics on a port of its own, for the life of the app (started and stopped by its lifespan)."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str) -> None:
        self.registry = registry
        self.port = port
        self.host = host
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server, self._thread = serve(self.registry, self.port, self.host)
        log.info("metrics served on %s:%d", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
