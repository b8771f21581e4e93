"""What every request handler needs, built once per process by the app factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, cast

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry
from redis import Redis

from producer.api.auth import Authenticator, Principal
from producer.api.keys import ApiKeyStore
from producer.api.openai.hub import LiveHub
from producer.api.openai.models import ModelCatalog
from producer.producer import Producer
from shared.config import Settings
from shared.policy import Policy


@dataclass(frozen=True)
class ApiContext:
    settings: Settings
    redis: Redis
    producer: Producer
    key_store: ApiKeyStore
    authenticator: Authenticator
    registry: CollectorRegistry
    hub: LiveHub
    models: ModelCatalog

    @property
    def policy(self) -> Policy:
        return self.producer.policy


bearer = HTTPBearer(auto_error=False, description="a branch's API key, or an operator key")


# Dependencies are async so FastAPI runs them on the event loop: a request then costs one threadpool
# hop (the route) instead of one per dependency. Only a key missing from the cache reads Redis, and
# that read goes to the threadpool.
async def get_context(request: Request) -> ApiContext:
    return cast("ApiContext", request.app.state.context)


async def get_principal(
    context: Annotated[ApiContext, Depends(get_context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    token = credentials.credentials if credentials else None
    principal = context.authenticator.cached(token)
    if principal is not None:
        return principal
    return await run_in_threadpool(context.authenticator.authenticate, token)


Context = Annotated[ApiContext, Depends(get_context)]
Caller = Annotated[Principal, Depends(get_principal)]
