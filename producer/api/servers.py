"""The HTTP servers `tidegate api` can run the app factory on: uvicorn (the default) or granian.

Both serve the same ASGI app from `producer.api.app:create_app`, one app per worker process, with
the same address, workers, TLS files and log level; what differs is the HTTP parsing and the event
loop underneath (ops/lab/bench/RESULTS.md compares them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from shared.logs import uvicorn_log_config

APP_FACTORY = "producer.api.app:create_app"
KEEP_ALIVE_SECONDS = 75
"""How long an idle client connection stays open. Longer than the idle expiry of the clients' own
pools (httpx, and so the `openai` package, keeps idle connections 5 s, as uvicorn's default does):
a server that closes first races a client reusing the connection, and that request fails with
"Server disconnected without sending a response" though the API never read it."""


class HttpServer(enum.StrEnum):
    UVICORN = "uvicorn"
    GRANIAN = "granian"


@dataclass(frozen=True)
class Listen:
    """Where and how the API listens."""

    host: str
    port: int
    workers: int
    log_level: str
    access_log: bool
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


def serve(server: HttpServer, listen: Listen) -> None:
    """Run `server` in the foreground until it is stopped."""
    if server is HttpServer.GRANIAN:
        _granian(listen)
    else:
        _uvicorn(listen)


def _uvicorn(listen: Listen) -> None:
    import uvicorn

    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=listen.host,
        port=listen.port,
        workers=listen.workers,
        log_level=listen.log_level,
        log_config=uvicorn_log_config(listen.log_level),
        access_log=listen.access_log,
        proxy_headers=True,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        ssl_certfile=listen.ssl_certfile,
        ssl_keyfile=listen.ssl_keyfile,
    )


def _granian(listen: Listen) -> None:
    """granian's ASGI interface on its uvloop runtime, HTTP/1.1 only. An idle connection is kept
    until its next request's headers are late by `KEEP_ALIVE_SECONDS`."""
    from granian.constants import Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.server import Server

    Server(
        APP_FACTORY,
        factory=True,
        address=listen.host,
        port=listen.port,
        interface=Interfaces.ASGI,
        workers=listen.workers,
        loop=Loops.uvloop,
        http="1",  # type: ignore[arg-type]
        websockets=False,
        http1_settings=HTTP1Settings(header_read_timeout=KEEP_ALIVE_SECONDS * 1000),
        log_level=listen.log_level,  # type: ignore[arg-type]
        log_access=listen.access_log,
        ssl_cert=Path(listen.ssl_certfile) if listen.ssl_certfile else None,
        ssl_key=Path(listen.ssl_keyfile) if listen.ssl_keyfile else None,
    ).serve()
