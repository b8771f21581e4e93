"""A request body size limit (413), checked on Content-Length and again on the bytes streamed.

A declared length over the limit is refused before any byte is read; a chunked or lying client is
cut off as soon as the streamed bytes pass it, so no request can make the API buffer more.
"""

from __future__ import annotations

import contextlib
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, declared)
            return
        received = 0
        exceeded = False
        answered = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # The framework may turn the read error into its own answer; ours replaces it.
            nonlocal answered
            if not exceeded:
                answered = answered or message["type"] == "http.response.start"
                await send(message)
            elif not answered:
                answered = True
                await self._refuse(send, received)

        with contextlib.suppress(_TooLarge):
            await self.app(scope, limited_receive, guarded_send)
        if exceeded and not answered:
            await self._refuse(send, received)

    async def _refuse(self, send: Send, size: int) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": (
                        f"request body of {size} bytes or more is over the limit of {self.max_bytes} bytes "
                        "(TIDEGATE_API_MAX_BODY_BYTES); send fewer tickets per batch or a shorter prompt"
                    ),
                    "type": "request_too_large",
                    "param": None,
                    "code": "body_too_large",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
