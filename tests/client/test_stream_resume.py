"""A ticket's stream that breaks off is reopened by the client with `Last-Event-ID` and goes on
after the last event received: every token exactly once (sync and async), over a real socket to
a peer that cuts the first answer short."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from tidegate_client import (
    AsyncTidegateClient,
    TicketEnd,
    TicketEvent,
    TicketStatus,
    TicketToken,
    TidegateClient,
)

FIRST = b'id: 7-0\nevent: token\ndata: {"text":"Ap"}\n\nid: 7-1\nevent: token\ndata: {"text":"pro"}\n\n'
REST = (
    b'id: 7-2\nevent: token\ndata: {"text":"ved"}\n\n'
    b'id: 7-3\nevent: end\ndata: {"status":"done","finish_reason":"stop","prompt_tokens":3,'
    b'"completion_tokens":3,"error":""}\n\n'
)


class CutShort:
    """The first GET promises more than it sends and closes; the next answers the rest."""

    def __init__(self) -> None:
        self.resumed_after: list[str | None] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                peer.resumed_after.append(self.headers.get("Last-Event-ID"))
                first = len(peer.resumed_after) == 1
                body = FIRST if first else REST
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(body) + (10_000 if first else 0)))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def peer() -> Iterator[CutShort]:
    cut = CutShort()
    cut.thread.start()
    yield cut
    cut.server.shutdown()
    cut.server.server_close()


@pytest.mark.parametrize("client_kind", ["sync", "async"])
def test_a_broken_off_stream_resumes_after_its_last_event(peer: CutShort, client_kind: str) -> None:
    async def read_async() -> list[TicketEvent]:
        async with AsyncTidegateClient(peer.url, "k") as client:
            return [e async for e in client.stream("01abc", timeout=10)]

    if client_kind == "sync":
        with TidegateClient(peer.url, "k") as client:
            events = list(client.stream("01abc", timeout=10))
    else:
        events = asyncio.run(read_async())
    assert [e.text for e in events if isinstance(e, TicketToken)] == ["Ap", "pro", "ved"]
    assert isinstance(events[-1], TicketEnd) and events[-1].status is TicketStatus.DONE
    assert peer.resumed_after == [None, "7-1"]
