"""The app factory: `uvicorn --factory producer.api.app:create_app` (what `tidegate api` runs).

A factory rather than a module-level app so each uvicorn worker process builds its own Redis pool
and caches, and tests can build an app for their own queue from a Settings object.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.routing import Mount

from producer.api import routes_ops, routes_tickets, ticket_stream
from producer.api.auth import Authenticator
from producer.api.body_size import BodySizeLimit
from producer.api.context import ApiContext
from producer.api.docs import install_docs
from producer.api.errors import install_error_handlers
from producer.api.http_metrics import HttpMetricFamilies, HttpMetrics
from producer.api.keys import ApiKeyStore
from producer.api.metrics_access import MetricsPort
from producer.api.openai import routes as openai_routes
from producer.api.openai.hub import READ_TIMEOUT_SECONDS as HUB_READ_TIMEOUT_SECONDS
from producer.api.openai.hub import LiveHub
from producer.api.openai.models import ModelCatalog
from producer.api.submit_shortcut import PATH as SUBMIT_SHORTCUT_PATH
from producer.api.submit_shortcut import SubmitShortcut, SubmitShortcutMiddleware
from producer.api.tracing_middleware import TracingMiddleware
from producer.api.ui import routes as routes_ui
from producer.producer import Producer
from shared import tracing
from shared.config import Settings
from shared.metrics import build_registry
from shared.policy import Policy
from shared.redis_conn import READ_TIMEOUT_SECONDS, connect_async_from, connect_from

API_VERSION = "1"
DESCRIPTION = """Branch-office API of the tidegate LLM work queue.

Authenticate with `Authorization: Bearer <key>`; a branch reads and cancels only its own tickets.
Every error answers `{"error": {"message", "type", "param", "code"}}`; a 422 names the first bad
field in `param` and lists them all in `issues`. A 429 or 503 carries `Retry-After` in seconds.
"""


def _operation_id(route: APIRoute) -> str:
    """Operation ids a generated client can use as method names: the route function's name."""
    return route.name


def create_app(
    settings: Settings | None = None,
    *,
    auth_cache_seconds: float = 1.0,
    admission_cache_seconds: float = 0.25,
    submit_shortcut: bool = True,
) -> FastAPI:
    """The API for `settings` (default: the environment, TIDEGATE_*). `submit_shortcut=False` leaves
    every submission to the route (tests compare the two answers)."""
    settings = settings or Settings()
    redis = connect_from(settings)
    # The accept path's own asyncio client, with the ordinary read timeout (the hub's outlasts
    # its blocking reads): a submission is one short script call.
    accept_redis = connect_async_from(settings, read_timeout=READ_TIMEOUT_SECONDS)
    producer = Producer(
        redis,
        settings.policy,
        settings.queue_name,
        fallback_configured=bool(settings.fallback_vllm_url),
        admission_cache_seconds=admission_cache_seconds,
        replica_acks=settings.replica_acks,
        async_redis=accept_redis,
    )
    key_store = ApiKeyStore(redis, producer.queue.keys)
    context = ApiContext(
        settings=settings,
        redis=redis,
        producer=producer,
        key_store=key_store,
        authenticator=Authenticator(key_store, settings.operator_key, auth_cache_seconds),
        registry=build_registry(redis, settings.policy, settings.queue_name),
        hub=LiveHub(connect_async_from(settings, read_timeout=HUB_READ_TIMEOUT_SECONDS), producer.queue.keys),
        models=ModelCatalog(redis, producer.queue.keys),
    )

    metrics_port = (
        MetricsPort(context.registry, settings.metrics_port, settings.metrics_host or "127.0.0.1")
        if settings.metrics_port is not None
        else None
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settle_heap()
        context.hub.start()
        if metrics_port is not None:
            metrics_port.start()
        yield
        if metrics_port is not None:
            metrics_port.stop()
        await context.hub.stop()
        await accept_redis.aclose()
        redis.close()

    app = FastAPI(
        title="tidegate",
        version=API_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=_operation_id,
    )
    app.state.context = context
    install_error_handlers(app)
    install_docs(app)
    app.include_router(routes_tickets.router)
    app.include_router(ticket_stream.router)
    app.include_router(routes_ops.router)
    app.include_router(openai_routes.router)
    app.include_router(routes_ui.router)
    app.mount("/ui/static", routes_ui.static_files, name="ui-static")
    if submit_shortcut:
        app.state.submit_shortcut = SubmitShortcut(
            context, route=_route(routes_tickets.router, "POST", SUBMIT_SHORTCUT_PATH)
        )
        app.add_middleware(SubmitShortcutMiddleware, shortcut=app.state.submit_shortcut)
    app.add_middleware(BodySizeLimit, max_bytes=settings.api_max_body_bytes)
    if tracing.enabled() or tracing.configure_tracing("tidegate-api"):
        app.add_middleware(TracingMiddleware)
    mounts = tuple(route.path for route in app.routes if isinstance(route, Mount))
    app.add_middleware(HttpMetrics, families=HttpMetricFamilies(context.registry), mounts=mounts)  # outermost
    _document_policy(app, settings.policy)
    return app


_heap_settled = False


def settle_heap() -> None:
    """Move what start-up built (the app, its routes, schemas and modules) out of the garbage
    collector's sight, once per process: a full collection otherwise walks all of it, a pause of
    tens of milliseconds in the middle of some request's answer."""
    global _heap_settled
    if not _heap_settled:
        gc.collect()
        gc.freeze()
        _heap_settled = True


def _route(router: APIRouter, method: str, path: str) -> APIRoute:
    """The route of `router` that answers `method path` (a ValueError at start-up if not one)."""
    (route,) = [
        route
        for route in router.routes
        if isinstance(route, APIRoute) and route.path == path and method in (route.methods or ())
    ]
    return route


def _document_policy(app: FastAPI, policy: Policy) -> None:
    """Show this deployment's ticket types as an enum, so clients and generated tests see them."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            body = schema["components"]["schemas"]["TicketBody"]
            body["properties"]["type"]["enum"] = policy.type_names
            body["properties"]["type"]["description"] = "a ticket type of the policy"
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
