"""A server span per HTTP request while tracing is on (shared/tracing.py), continuing the caller's
`traceparent`, so a submission's enqueue span, and through the ticket the worker's, are its children."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import tracing


class TracingMiddleware:
    """Pure ASGI, so a streamed answer's span lasts until its last chunk is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        attributes = {"http.request.method": method, "url.path": scope.get("path", "")}
        with (
            tracing.continued(headers),
            tracing.span(f"{method}", kind="server", attributes=attributes) as span,
        ):

            async def traced(message: Message) -> None:
                if span is not None and message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            try:
                await self.app(scope, receive, traced)
            finally:
                template = getattr(scope.get("route"), "path", None)
                if span is not None and template:
                    span.update_name(f"{method} {template}")  # the template, not the ticket's id
                    span.set_attribute("http.route", template)
