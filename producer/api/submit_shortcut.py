"""The submit shortcut: a single POST /v1/tickets that every step of the route would take without
asking Redis is answered here, before FastAPI's routing, dependency and validation machinery.

Nothing is decided here. The shortcut takes a request only when the caller's key is in the
authenticator's cache, the body parses into `TicketBody`, its headers are ones it reads as the
route declares them, and `submission_request` (the route's own) accepts it. It then answers through
`answer_submission`, the route's own, so the ticket is admitted or refused, recorded, counted and
readable as on the route. Anything else (an unknown key, a bad body or header) goes on to the route
with the body replayed, so its answer is the route's by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.api.context import ApiContext
from producer.api.errors import ApiError, error_answer, error_response
from producer.api.routes_tickets import (
    DEADLINE_HEADER,
    DEADLINE_MS_MAX,
    IDEMPOTENCY_KEY_MAX,
    Invalid,
    answer_submission,
    submission_request,
)
from producer.api.schemas import TicketBody

PATH = "/v1/tickets"
DEADLINE_NAME = DEADLINE_HEADER.lower().encode()
TIDEGATE_HEADERS = b"x-tidegate-"
SHORTCUT_HEADERS = {DEADLINE_NAME}
"""The tidegate headers the shortcut reads as the route does; any other `X-Tidegate-*` header
goes to the route, which alone knows what it may mean."""


@dataclass
class SubmitShortcut:
    """The shortcut's state: the API's context, the route it answers for (its template labels the
    answer's metrics as the route's would be), and how many answers it gave (for tests and logs)."""

    context: ApiContext
    route: BaseRoute
    answered: int = 0

    def applies(self, scope: Scope) -> bool:
        return bool(scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == PATH)


class SubmitShortcutMiddleware:
    """Pure ASGI middleware; placed inside the body size limit so a body it reads is bounded."""

    def __init__(self, app: ASGIApp, shortcut: SubmitShortcut) -> None:
        self.app = app
        self.shortcut = shortcut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.shortcut.applies(scope):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        principal = self.shortcut.context.authenticator.cached(_bearer(headers.get(b"authorization")))
        content_type = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        idempotency_key = headers.get(b"idempotency-key")
        deadline = headers.get(DEADLINE_NAME)
        deadline_ms = _deadline_ms(deadline) if deadline is not None else None
        if (
            principal is None
            or content_type != b"application/json"
            or any(name.startswith(TIDEGATE_HEADERS) and name not in SHORTCUT_HEADERS for name in headers)
            or (idempotency_key is not None and not 0 < len(idempotency_key) <= IDEMPOTENCY_KEY_MAX)
            or (deadline is not None and deadline_ms is None)
        ):
            await self.app(scope, receive, send)
            return
        body, whole = await _read_body(receive)
        if not whole:  # the client left before sending its body: the route sees what it would have
            await self.app(scope, _replay(body, receive, whole), send)
            return
        context = self.shortcut.context
        try:
            parsed = TicketBody.model_validate_json(body)
            key = idempotency_key.decode("latin-1") if idempotency_key is not None else None
            request = submission_request(context, principal, parsed, key, deadline_ms)
        except (ValidationError, Invalid, ApiError, UnicodeDecodeError):
            await self.app(scope, _replay(body, receive, whole), send)
            return
        try:
            response = await answer_submission(context, request)
        except ApiError as exc:
            response = error_response(exc.status, exc.error, exc.headers)
        except Exception as exc:  # Redis trouble: the same 503 the route's handlers give
            response = await error_answer(Request(scope), exc)
        self.shortcut.answered += 1
        scope["route"] = self.shortcut.route
        await response(scope, receive, send)


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The first value of each header, by lower-case name (ASGI servers give names lower-cased)."""
    out: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        out.setdefault(name, value)
    return out


def _deadline_ms(value: bytes) -> int | None:
    """The deadline header's milliseconds when it is a plain integer the route accepts; None when
    the route must judge it."""
    if not value.isdigit() or len(value) > len(str(DEADLINE_MS_MAX)):
        return None
    deadline_ms = int(value)
    return deadline_ms if 1 <= deadline_ms <= DEADLINE_MS_MAX else None


def _bearer(value: bytes | None) -> str | None:
    """The token of `Authorization: Bearer <token>`, as FastAPI's HTTPBearer reads it."""
    if not value:
        return None
    scheme, _, token = value.decode("latin-1").partition(" ")
    return token if scheme.lower() == "bearer" and token else None


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body, and whether it arrived whole (False: the client disconnected first)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _replay(body: bytes, receive: Receive, whole: bool) -> Receive:
    """A receive that hands the route the body already read, then the connection's own messages."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if not whole:
        pending = [{"type": "http.disconnect"}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed
