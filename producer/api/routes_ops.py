"""Queue state, the operator's mode switch, health and metrics."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Body, Query, Request, Response

from producer.api.auth import require_operator
from producer.api.context import Caller, Context
from producer.api.errors import UNAUTHORIZED, UNREADABLE, error_responses
from producer.api.metrics_access import check_metrics_access
from producer.api.schemas import (
    MODE_BODY_EXAMPLES,
    AlarmLabel,
    AuditEntryView,
    AuditView,
    BreakerSummary,
    HealthView,
    LiveView,
    ModeBody,
    ModeView,
    QueuesView,
    RolloutView,
    TypeDepth,
    WorkerSummary,
    WorkersView,
)
from shared.audit import AUDIT_MAXLEN, read_audit
from shared.breaker_store import BreakerStore, BreakerView
from shared.control import read_control_state, set_mode
from shared.keys import KNOWN_QUEUES
from shared.live_workers import read_live_workers
from shared.metrics import render
from shared.queue import TicketQueue
from shared.rollout_report import rollout_summary

router = APIRouter()


@router.get(
    "/v1/queues",
    response_model=QueuesView,
    responses=error_responses({401: UNAUTHORIZED}, validated=False),
    tags=["queues"],
    summary="Queue depth per type, alarm level, mode and workers",
)
def read_queues(context: Context, principal: Caller) -> QueuesView:
    """Depth per type, alarm level, mode and workers; for operator keys worker details and every
    queue known to this Redis (each with the same view)."""
    own = context.producer.queue
    own_breakers = context.producer.admission.breakers.views()
    view = _queue_view(context, own, own_breakers, principal.is_operator)
    if principal.is_operator:
        names = {str(n) for n in cast("set[str]", context.redis.smembers(KNOWN_QUEUES))}
        view.queues = [
            view.model_copy()
            if name == own.keys.queue
            else _queue_view(
                context,
                queue := TicketQueue(context.redis, context.policy, name),
                BreakerStore(context.redis, queue.keys, context.policy.breaker).views(),
                operator=True,
            )
            for name in sorted(names | {own.keys.queue})
        ]
    return view


def _queue_view(
    context: Context, queue: TicketQueue, breakers: list[BreakerView], operator: bool
) -> QueuesView:
    stats = queue.stats()
    state, _ = read_control_state(context.redis, queue.keys, context.policy.alarms)
    workers = read_live_workers(context.redis, queue.keys)
    details = None
    if operator:
        details = [
            WorkerSummary(
                worker_id=w.worker_id,
                host=w.host,
                gpu=w.gpu,
                model=w.model,
                inflight=w.inflight,
                batch_limit=w.batch_limit,
                kv_usage=w.kv_usage,
            )
            for w in workers
        ]
    return QueuesView(
        queue=queue.keys.queue,
        level=cast("AlarmLabel", state.level.label),
        level_since=state.level_since,
        mode=state.mode,
        depth=stats.depth,
        inflight=stats.inflight,
        drain_rate=state.drain_rate,
        types={
            name: TypeDepth(
                depth=stats.depth_by_type.get(name, 0),
                oldest_wait_seconds=stats.oldest_age_by_type.get(name, 0.0),
                cap=type_policy.cap,
            )
            for name, type_policy in context.policy.types.items()
        },
        workers=WorkersView(alive=len(workers), desired=state.desired_workers, details=details),
        breakers=[BreakerSummary(**view.as_dict()) for view in breakers],
        rollout=_rollout_view(context, queue, operator),
    )


def _rollout_view(context: Context, queue: TicketQueue, operator: bool) -> RolloutView | None:
    summary = rollout_summary(context.redis, queue.keys)
    if summary is None:
        return None
    if not operator:
        summary.update(candidate=None, arms=None)
    return RolloutView.model_validate(summary)


@router.put(
    "/v1/mode",
    response_model=ModeView,
    responses=error_responses({400: UNREADABLE, 401: UNAUTHORIZED, 403: "not an operator key"}),
    tags=["operator"],
    summary="Set the operator mode (normal or critical-only)",
)
def put_mode(
    body: Annotated[ModeBody, Body(openapi_examples=MODE_BODY_EXAMPLES)], context: Context, principal: Caller
) -> ModeView:
    """Operator override: `critical-only` admits only critical types (loan approvals) until `normal`."""
    require_operator(principal)
    previous = set_mode(context.redis, context.producer.queue.keys, body.mode, actor=principal.actor)
    context.producer.admission.invalidate()
    return ModeView(mode=body.mode, previous=previous)


@router.get(
    "/v1/audit",
    response_model=AuditView,
    responses=error_responses({401: UNAUTHORIZED, 403: "not an operator key"}),
    tags=["operator"],
    summary="Operator actions, newest first",
)
def read_audit_trail(
    context: Context,
    principal: Caller,
    limit: Annotated[int, Query(ge=1, le=AUDIT_MAXLEN, description="most entries to return")] = 100,
) -> AuditView:
    """The audit trail: mode switches, key creations and revocations, rollout steps, with who and when."""
    require_operator(principal)
    entries = read_audit(context.redis, context.producer.queue.keys, limit)
    return AuditView(entries=[AuditEntryView(**entry.as_dict()) for entry in entries])


@router.get("/livez", response_model=LiveView, tags=["health"])
async def livez() -> LiveView:
    """200 while this process serves requests; it reads nothing, so a Redis outage restarts no pod."""
    return LiveView(status="ok")


@router.get(
    "/readyz",
    response_model=HealthView,
    responses=error_responses({503: "Redis is unreachable"}),
    tags=["health"],
)
def readyz(context: Context) -> HealthView:
    """200 while Redis answers; 503 otherwise (so a load balancer stops sending tickets here)."""
    context.redis.ping()
    return HealthView(status="ok", redis="ok")


@router.get(
    "/healthz",
    response_model=HealthView,
    responses=error_responses({}, validated=False),
    tags=["health"],
    summary="Liveness and Redis reachability",
)
def healthz(context: Context) -> HealthView:
    """The same as `/readyz`, kept for load balancers configured before the split."""
    return readyz(context)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **error_responses(
            {401: UNAUTHORIZED, 403: "not an operator key", 404: "on its own port"}, validated=False
        ),
    },
    tags=["health"],
    summary="Prometheus metrics",
)
def metrics(context: Context, request: Request) -> Response:
    """Prometheus exposition: queue state read from Redis, plus this process's own metrics.

    Open unless configured otherwise: operator keys only (`TIDEGATE_METRICS_AUTH=operator`), or
    served on a port of its own (`TIDEGATE_METRICS_PORT`). The key is read from the header here, not
    declared as the route's security, because by default a scrape needs none."""
    check_metrics_access(context.settings, context.authenticator, request.headers.get("authorization"))
    body, content_type = render(context.registry)
    return Response(content=body, media_type=content_type)
