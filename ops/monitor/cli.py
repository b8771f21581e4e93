"""`tidegate monitor`: watch queue depth, raise and clear alarms, dispatch their actions to rq."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import redis
import typer

from ops.monitor.dispatch import ACTIONS_QUEUE, CALLBACKS_QUEUE, JobOptions, rq_connection
from ops.monitor.loop import Monitor, MonitorConfig, TickResult
from ops.monitor.rq_worker import start_worker_process, stop_worker_process, work
from ops.monitor.scaling import ScalingConfig
from shared.cli_support import (
    EXIT_BAD_INPUT,
    fail,
    load_settings,
    parse_queue_names,
    print_json,
    redis_failure,
)
from shared.logs import configure_logging
from shared.metrics import build_registry, serve
from shared.redis_conn import RedisUnavailable, connect_from, resolve_redis_url

app = typer.Typer(add_completion=False)
log = logging.getLogger("tidegate.monitor")


def _summary(result: TickResult) -> str:
    role = "acting" if result.acting else "standby"
    if result.error:
        return f"{role}: {result.error}"
    level = result.level.label if result.level is not None else "unknown"
    parts = [role, f"level {level}"]
    if result.sample is not None:
        parts += [
            f"depth {result.sample.depth}",
            f"in flight {result.sample.stats.inflight}",
            f"drain {result.sample.drain_rate:.2f}/s",
            f"workers {result.sample.workers_alive} (want {result.desired_workers})",
        ]
    parts += [f"{t.previous.label} -> {t.level.label} at depth {t.depth}" for t in result.transitions]
    return " | ".join(parts)


def _log_changes(result: TickResult, previous: list[bool]) -> None:
    if result.error:
        log.warning(_summary(result))
    elif result.transitions or previous[0] != result.acting:
        log.info(_summary(result))
    previous[0] = result.acting


@app.command()
def monitor(
    queue: list[str] | None = typer.Option(
        None, "--queue", help="queue name (TIDEGATE_QUEUE_NAME); repeat it, or a comma list, to watch several"
    ),
    interval: float = typer.Option(1.0, "--interval", min=0.05, help="seconds between samples"),
    metrics_port: int = typer.Option(9108, "--metrics-port", min=0, max=65535, help="/metrics port; 0 = off"),
    lock_ttl: float = typer.Option(
        5.0, "--lock-ttl", min=0.5, help="seconds within which a standby replaces a dead acting monitor"
    ),
    target_drain_seconds: float = typer.Option(
        30.0, "--target-drain-seconds", min=1.0, help="scale out so the backlog drains within this long"
    ),
    max_workers: int = typer.Option(64, "--max-workers", min=1, help="most workers the scale-out asks for"),
    rq_worker: bool = typer.Option(
        False, "--rq-worker", help="also run an rq worker for the action and callback jobs"
    ),
    actions_queue: str = typer.Option(ACTIONS_QUEUE, "--actions-queue", help="rq queue for alarm actions"),
    callbacks_queue: str = typer.Option(
        CALLBACKS_QUEUE, "--callbacks-queue", help="rq queue for ticket callbacks"
    ),
    once: bool = typer.Option(False, "--once", help="take one sample, act if no other monitor does, exit"),
    as_json: bool = typer.Option(False, "--json", help="with --once: print the sample as one JSON document"),
) -> None:
    """Sample depth every interval; the monitor holding the lock publishes alarms and acts.

    With several queues, each is watched by its own monitor (its own lock, alarms and actions) on a
    thread of this process, and /metrics reports every queue.
    """
    names = parse_queue_names(queue)
    settings = load_settings(queue_name=names[0] if names else None)
    names = names or (settings.queue_name,)
    if lock_ttl <= interval:
        fail(f"--lock-ttl {lock_ttl} must exceed --interval {interval}, or the lock lapses", EXIT_BAD_INPUT)
    configure_logging("info")
    if settings.redis_cluster and not settings.rq_redis_url:
        fail("TIDEGATE_RQ_REDIS_URL: required on a Cluster (rq's jobs need a single Redis)", EXIT_BAD_INPUT)
    if rq_worker and settings.redis_sentinels and not settings.rq_redis_url:
        fail(
            "--rq-worker with Sentinels: set TIDEGATE_RQ_REDIS_URL, or run rq's worker on its own",
            EXIT_BAD_INPUT,
        )
    try:
        url = settings.rq_redis_url or (
            None if settings.redis_sentinels else resolve_redis_url(settings.redis_url)
        )
        client = connect_from(settings)
        client.ping()
        rq_conn = rq_connection(url) if url else connect_from(settings, decode_responses=False)
    except (RedisUnavailable, redis.RedisError) as exc:
        redis_failure(exc)
    jobs = JobOptions(actions_queue=actions_queue, callbacks_queue=callbacks_queue)
    config = MonitorConfig(
        interval_seconds=interval,
        lock_ttl_seconds=lock_ttl,
        scaling=ScalingConfig(target_drain_seconds=target_drain_seconds, max_workers=max_workers),
        jobs=jobs,
    )
    runners = [Monitor(client, rq_conn, settings.policy, name, config) for name in names]
    queues = [jobs.actions_queue, jobs.callbacks_queue]
    if once:
        _once(runners, url if rq_worker else None, queues, as_json)
        return
    if metrics_port:
        try:
            serve(build_registry(client, settings.policy, names), metrics_port)
        except OSError as exc:
            fail(f"cannot serve metrics on --metrics-port {metrics_port}: {exc.strerror}")
    worker = start_worker_process(url or "", queues) if rq_worker else None
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        _run_all(runners, stop, interval)
    finally:
        if worker is not None:
            stop_worker_process(worker)


def _once(runners: list[Monitor], rq_url: str | None, rq_queues: list[str], as_json: bool) -> None:
    """One sample of each queue (and, with an rq worker, its jobs); exit 1 when any failed."""
    results = [(runner, runner.tick()) for runner in runners]
    for runner in runners:
        runner.close()
    if rq_url is not None:
        work(rq_url, rq_queues, burst=True)
    docs = [{"monitor": r.monitor_id, "queue": r.queue_name, **result.to_dict()} for r, result in results]
    if as_json:
        print_json(docs[0] if len(docs) == 1 else {"queues": docs})
    else:
        for runner, result in results:
            prefix = f"{runner.queue_name}: " if len(runners) > 1 else ""
            typer.echo(prefix + _summary(result))
    if any(result.error for _, result in results):
        raise typer.Exit(1)


def _run_all(runners: list[Monitor], stop: threading.Event, interval: float) -> None:
    """Each queue's monitor on a thread of its own until `stop`; each gives its lock up on the way out."""
    threads = []
    for runner in runners:
        acting = [False]
        log.info("monitor %s watching queue %s every %.2f s", runner.monitor_id, runner.queue_name, interval)
        thread = threading.Thread(
            target=runner.run,
            args=(stop, lambda result, acting=acting: _log_changes(result, acting)),
            name=f"monitor-{runner.queue_name}",
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    dead: list[str] = []
    while not dead and not stop.wait(0.5):
        dead = [r.queue_name for r, t in zip(runners, threads, strict=True) if not t.is_alive()]
    stop.set()
    for runner, thread in zip(runners, threads, strict=True):
        thread.join(timeout=interval + 10)
        log.info("monitor %s stopped", runner.monitor_id)
    if dead:  # a crash in one queue's loop (logged with its traceback) stops the process, as with one queue
        fail(f"the monitor of queue {dead[0]} stopped unexpectedly; see the log above")
