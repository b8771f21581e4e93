"""Turning alarm transitions and finished tickets' callbacks into rq jobs.

Jobs are prepared here and enqueued by the caller inside its own Redis transaction, so a transition
and the job that acts on it are written together or not at all.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue, Retry
from rq.queue import EnqueueData

from ops.monitor.actions import ACTIONS, FORWARD_JOBS, page_breaker, restore
from ops.monitor.hysteresis import Transition
from shared.policy import HooksPolicy
from shared.redis_conn import (
    CONNECT_TIMEOUT_SECONDS,
    HEALTH_CHECK_SECONDS,
    READ_TIMEOUT_SECONDS,
    connection_retry,
    resolve_redis_url,
)
from shared.rq_logs import job_meta

ACTIONS_QUEUE = "tidegate-actions"
CALLBACKS_QUEUE = "tidegate-callbacks"
CALLBACK_FUNCTION = "producer.callbacks.deliver_callback"
"""Referenced by name so the monitor does not import the API's HTTP client to hand work to rq."""

FAILED_JOB_TTL = 7 * 86_400
"""Failed actions stay in rq's failed-job registry a week, long enough for an operator to look."""
RESULT_TTL = 86_400
JOB_TIMEOUT_MARGIN = 30


@dataclass(frozen=True)
class JobOptions:
    action_retry_intervals: tuple[int, ...] = (5, 15, 30)
    """Seconds before each retry of a failed action; its length is the number of retries."""
    callback_retry_intervals: tuple[int, ...] = (2, 10, 30, 120, 300)
    actions_queue: str = ACTIONS_QUEUE
    callbacks_queue: str = CALLBACKS_QUEUE


def rq_connection(redis_url: str | None) -> Redis:
    """A client for rq: it stores pickled jobs, so replies must stay bytes (no decode_responses).

    It retries connection errors and times out reads like the queue's own client; rq's worker
    raises the read timeout itself above its blocking pop's.
    """
    return Redis.from_url(
        resolve_redis_url(redis_url),
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=READ_TIMEOUT_SECONDS,
        socket_keepalive=True,
        health_check_interval=HEALTH_CHECK_SECONDS,
        retry=connection_retry(),
    )


def safe_id(text: str) -> str:
    """`text` with every character rq refuses in a job id replaced by `_`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def _retry(intervals: Sequence[int]) -> Retry | None:
    return Retry(max=len(intervals), interval=list(intervals)) if intervals else None


def action_jobs(
    queue_name: str,
    transitions: Sequence[Transition],
    desired_workers: int,
    hooks: HooksPolicy,
    options: JobOptions,
) -> list[EnqueueData]:
    """One job per transition: the raised level's action, or the undo of the cleared level's."""
    jobs = []
    hook_args = hooks.model_dump()
    timeout = int(hooks.timeout_seconds) + JOB_TIMEOUT_MARGIN
    for t in transitions:
        if t.raised:
            func: Any = FORWARD_JOBS[t.level]
            args: tuple[Any, ...] = (queue_name, desired_workers, hook_args)
            name = ACTIONS[t.level].name
        else:
            func = restore
            args = (queue_name, t.previous.label, desired_workers, hook_args)
            name = "restore-" + ACTIONS[t.previous].name
        jobs.append(
            Queue.prepare_data(
                func,
                args=args,
                timeout=timeout,
                result_ttl=RESULT_TTL,
                failure_ttl=FAILED_JOB_TTL,
                description=f"{name} for queue {queue_name}: {t.previous.label} -> {t.level.label} "
                f"at depth {t.depth}",
                job_id=safe_id(f"{queue_name}-{name}-{uuid.uuid4().hex[:12]}"),
                retry=_retry(options.action_retry_intervals),
            )
        )
    return jobs


def page_job(
    queue_name: str, endpoint: str, deep_since: float, hooks: HooksPolicy, options: JobOptions
) -> EnqueueData:
    """The job that pages for one deep breaker episode (retried like the alarm actions)."""
    return Queue.prepare_data(
        page_breaker,
        args=(queue_name, endpoint, deep_since, hooks.model_dump()),
        timeout=int(hooks.timeout_seconds) + JOB_TIMEOUT_MARGIN,
        result_ttl=RESULT_TTL,
        failure_ttl=FAILED_JOB_TTL,
        description=f"page: breaker of {endpoint} at its deep level (queue {queue_name})",
        job_id=safe_id(f"{queue_name}-page-{uuid.uuid4().hex[:12]}"),
        retry=_retry(options.action_retry_intervals),
    )


def callback_job(queue_name: str, ticket_id: str, options: JobOptions) -> EnqueueData:
    """The job that delivers one finished ticket's callback; its id is stable so a re-handover
    (after a crash) replaces the job instead of adding a second delivery."""
    return Queue.prepare_data(
        CALLBACK_FUNCTION,
        args=(queue_name, ticket_id),
        result_ttl=RESULT_TTL,
        failure_ttl=FAILED_JOB_TTL,
        description=f"callback of ticket {ticket_id} (queue {queue_name})",
        job_id=safe_id(f"callback-{queue_name}-{ticket_id}"),
        meta=job_meta(ticket_id, queue_name),  # its log lines carry the ticket's id
        retry=_retry(options.callback_retry_intervals),
    )
