"""`tidegate api`: serve the branch-office HTTP API with uvicorn.

Flags are written into the TIDEGATE_* environment before uvicorn starts, because with `--workers N`
each worker process builds its own app from the environment (the app factory reads Settings()).
"""

from __future__ import annotations

import os

import typer
import uvicorn

from shared.cli_support import EXIT_BAD_INPUT, fail, load_settings
from shared.config import setting_help
from shared.logs import uvicorn_log_config
from shared.redis_conn import RedisUnavailable, resolve_redis_url

app = typer.Typer(add_completion=False)

DEFAULT_PORT = 8080
KEEP_ALIVE_SECONDS = 75
"""How long an idle client connection stays open. Longer than the idle expiry of the clients' own
pools (httpx, and so the `openai` package, keeps idle connections 5 s, as uvicorn's default does):
a server that closes first races a client reusing the connection, and that request fails with
"Server disconnected without sending a response" though the API never read it."""


@app.command()
def api(
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind (0.0.0.0 for all)"),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="uvicorn worker processes"),
    redis_url: str | None = typer.Option(None, "--redis-url", help="TIDEGATE_REDIS_URL"),
    queue: str | None = typer.Option(None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME)"),
    policy_file: str | None = typer.Option(None, "--policy-file", help="TIDEGATE_POLICY_FILE"),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level"),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log"),
    ssl_certfile: str | None = typer.Option(None, "--ssl-certfile", help=setting_help("ssl_certfile")),
    ssl_keyfile: str | None = typer.Option(None, "--ssl-keyfile", help=setting_help("ssl_keyfile")),
    metrics_auth: str | None = typer.Option(None, "--metrics-auth", help=setting_help("metrics_auth")),
    metrics_port: int | None = typer.Option(None, "--metrics-port", help=setting_help("metrics_port")),
) -> None:
    """Serve the branch-office HTTP API (OpenAPI at /openapi.json, docs at /docs); HTTPS with a
    certificate and its key."""
    settings = load_settings(
        redis_url=redis_url,
        queue_name=queue,
        policy_file=policy_file,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        metrics_auth=metrics_auth,
        metrics_port=metrics_port,
    )
    for flag, path in (("--ssl-certfile", settings.ssl_certfile), ("--ssl-keyfile", settings.ssl_keyfile)):
        if path is not None and not os.path.isfile(path):
            fail(f"{flag}: {path!r} is not a readable file (a PEM certificate or key)", EXIT_BAD_INPUT)
    try:
        url = resolve_redis_url(settings.redis_url)
    except RedisUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    os.environ["TIDEGATE_REDIS_URL"] = url
    os.environ["TIDEGATE_QUEUE_NAME"] = settings.queue_name
    os.environ["TIDEGATE_METRICS_AUTH"] = settings.metrics_auth
    if settings.metrics_port is not None:
        if workers > 1:
            fail(
                "--metrics-port: one process serves it, not --workers "
                f"{workers}; keep /metrics on the API port behind --metrics-auth operator instead",
                EXIT_BAD_INPUT,
            )
        os.environ["TIDEGATE_METRICS_PORT"] = str(settings.metrics_port)
        os.environ["TIDEGATE_METRICS_HOST"] = settings.metrics_host or host
    if settings.policy_file:
        os.environ["TIDEGATE_POLICY_FILE"] = settings.policy_file
    uvicorn.run(
        "producer.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        log_config=uvicorn_log_config(log_level),
        access_log=access_log,
        proxy_headers=True,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
