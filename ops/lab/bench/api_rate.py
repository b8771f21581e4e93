"""API accept rate beside the direct Python producer, and how fast a 429 is answered.

    python -m ops.lab.bench.api_rate --runs 3 --seconds 5 --threads 16 --workers 2

Each run starts `tidegate api --workers N` on a free port against its own queue, with a policy
whose caps and alarm thresholds are out of reach so admission always admits (the figure is the
HTTP path's speed, not the shedding). Then, in the same run and on the same Redis:
- accept rate: threads with keep-alive sessions POST loan approvals to /v1/tickets for `seconds`;
- direct rate: the same threads call `Producer.submit` in this process for `seconds`;
- 429 time: the red alarm is published (refreshed as the monitor would) and complaints are POSTed,
  first by one client alone (the answer's own time), then by all threads at once (time under load),
  then by `storm_clients` clients retrying soon after every 429 (ops/lab/bench/api_storm.py);
  each shed answer's round trip is timed on the client, and inside the server by the API's own
  answer-time histogram (its 429 class, scraped from /metrics before and after each phase);
- the books: every 202 is a queued ticket and every 429 a rejected one in the queue's counts.
Medians over runs are printed; every run's figures are kept in the JSON output.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import typer
from redis import Redis

from ops.lab.bench.api_storm import StormAnswers, storm
from ops.lab.bench.cpu import machine_cpu_seconds, process_cpu_seconds
from ops.lab.bench.server_time import answer_buckets, quantile_ms
from ops.lab.procs.ports import free_port, http_ok
from producer.api.keys import ApiKeyStore, Role
from producer.producer import Producer
from shared.keys import QueueKeys
from shared.policy import default_policy_text, parse_policy
from shared.queue import TicketQueue
from shared.redis_conn import make_client, resolve_redis_url

app = typer.Typer(add_completion=False)

OUT_OF_REACH = 100_000_000
START_TIMEOUT_S = 30.0
LOAN = {"type": "loan_approval", "prompt": "Approve a 20k loan for client 991?", "urgent_level": 2}
COMPLAINT = {"type": "complaint", "prompt": "My card was charged twice."}
PATH = "/v1/tickets"


def roomy_policy_text() -> str:
    """The default policy with caps and alarm thresholds no run reaches."""
    text = re.sub(r"(?m)^cap = \d+", f"cap = {OUT_OF_REACH}", default_policy_text())
    for level, factor in (("yellow", 1), ("orange", 2), ("red", 3)):
        text = re.sub(rf"(?m)^{level} = \d+", f"{level} = {OUT_OF_REACH * factor}", text)
    return text


@dataclass(frozen=True)
class RunFigures:
    api_accepts_per_s: float
    direct_accepts_per_s: float
    api_accept_p50_ms: float
    api_accept_p99_ms: float
    shed_alone_p50_ms: float
    shed_alone_p99_ms: float
    shed_p50_ms: float
    shed_p99_ms: float
    shed_answers: int
    api_errors: int
    storm_answers_per_s: float
    storm_p50_ms: float
    storm_p99_ms: float
    storm_other_answers: int
    books_balanced: bool
    server_shed_alone_p99_ms: float
    server_shed_p99_ms: float
    server_storm_p99_ms: float
    generator_cores: float
    """CPU of this process (the load generator) over the whole run, in cores."""
    machine_busy_cores: float
    """Every process on the machine over the run, in cores: ours, the API's and anyone else's."""


@contextmanager
def api_process(env: Mapping[str, str], workers: int) -> Iterator[str]:
    """`tidegate api --workers N` as a child process with `env` added to ours; its base URL once
    /healthz answers. The console script beside this Python, so a venv's own install is what runs."""
    port = free_port()
    tidegate = str(Path(sys.executable).with_name("tidegate"))
    command = [tidegate, "api", "--port", str(port), "--workers", str(workers)]
    command += ["--no-access-log", "--log-level", "warning"]
    process = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not http_ok(base_url + "/healthz"):
            if process.poll() is not None or time.monotonic() > deadline:
                error = process.stderr.read() if process.stderr else ""
                raise RuntimeError(f"`tidegate api` did not start on port {port}: {error}")
            time.sleep(0.1)
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _hammer(
    threads: int, seconds: float, call: Callable[[int], tuple[bool, float]]
) -> tuple[int, int, list[float]]:
    """Run `call(thread_index)` in a loop on `threads` threads: (successes, failures, latencies of successes)."""
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    ok = 0
    failed = 0
    latencies: list[float] = []

    def loop(index: int) -> None:
        nonlocal ok, failed
        mine: list[float] = []
        bad = 0
        while time.monotonic() < stop:
            success, elapsed = call(index)
            if success:
                mine.append(elapsed)
            else:
                bad += 1
        with lock:
            ok += len(mine)
            failed += bad
            latencies.extend(mine)

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return ok, failed, latencies


class KeepAliveClient:
    """One persistent HTTP/1.1 connection with pre-encoded bodies: a load generator light enough that
    the API, not the client, is what is measured on a small machine (`requests` costs several times
    more CPU per call)."""

    def __init__(self, base_url: str, token: str) -> None:
        parts = urlsplit(base_url)
        self.connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: bytes, expect: int) -> tuple[bool, float]:
        started = time.perf_counter()
        try:
            status = self._post(path, body)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closes connections idle past its keep-alive timeout (between phases).
            self.connection.close()
            started = time.perf_counter()
            status = self._post(path, body)
        return status == expect, time.perf_counter() - started

    def _post(self, path: str, body: bytes) -> int:
        self.connection.request("POST", path, body=body, headers=self.headers)
        response = self.connection.getresponse()
        response.read()
        return response.status

    def close(self) -> None:
        self.connection.close()


def _percentile_ms(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def _keep_red_once(redis: Redis, keys: QueueKeys) -> None:
    """Publish the red alarm once, as a live monitor would."""
    now = time.time()
    redis.hset(keys.alarm, mapping={"level": "red", "since": now, "depth": 0, "updated_at": now})
    redis.hset(keys.monitor_state, mapping={"drain_rate": 100.0, "updated_at": now})


def _keep_red(redis: Redis, keys: QueueKeys, stop: threading.Event) -> None:
    """Publish the red alarm as a live monitor would: refreshed well inside its 5 s freshness window."""
    while not stop.is_set():
        _keep_red_once(redis, keys)
        stop.wait(1.0)


def delete_queue(redis: Redis, queue: str) -> None:
    pattern = QueueKeys(queue).prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    batch: list[str] = []
    for key in redis.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            redis.delete(*batch)
            batch = []
    if batch:
        redis.delete(*batch)


def one_run(
    redis_url: str,
    threads: int,
    seconds: float,
    workers: int,
    storm_clients: int = 0,
    storm_pause_s: float = 0.1,
) -> RunFigures:
    queue = f"bench-api-{uuid.uuid4().hex[:10]}"
    keys = QueueKeys(queue)
    redis = make_client(redis_url)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as policy_file:
        policy_file.write(roomy_policy_text())
    policy = parse_policy(roomy_policy_text(), policy_file.name)
    metrics_dir = tempfile.TemporaryDirectory(prefix="tidegate-bench-metrics-")
    cpu_at, machine_at, wall_at = process_cpu_seconds(os.getpid()), machine_cpu_seconds(), time.monotonic()
    try:
        token, _ = ApiKeyStore(redis, keys).create(Role.BRANCH, "0412", "bench")
        env = {
            "TIDEGATE_REDIS_URL": redis_url,
            "TIDEGATE_QUEUE_NAME": queue,
            "TIDEGATE_POLICY_FILE": policy_file.name,
            # Every worker's answer times in one /metrics (the multiprocess collector).
            "PROMETHEUS_MULTIPROC_DIR": metrics_dir.name,
        }
        with api_process(env, workers) as base_url:
            clients = [KeepAliveClient(base_url, token) for _ in range(threads)]
            loan, complaint = json.dumps(LOAN).encode(), json.dumps(COMPLAINT).encode()
            warm, _, _ = _hammer(threads, 1.0, lambda i: clients[i].post(PATH, loan, 202))
            accepted, api_errors, accept_latencies = _hammer(
                threads, seconds, lambda i: clients[i].post(PATH, loan, 202)
            )

            direct_ok = _direct_accepts(Producer(redis, policy, queue), threads, seconds)
            alone_latencies, shed, shed_latencies, stormed, server_p99 = _shed_answers(
                redis, keys, clients, complaint, seconds, (base_url, token, storm_clients, storm_pause_s)
            )
            for client in clients:
                client.close()
        storm_sheds = stormed.statuses.get(429, 0)
        counts = TicketQueue(redis, policy, queue).stats()
        books = (
            counts.outcome_count("loan_approval", "submitted") == warm + accepted + direct_ok
            and counts.outcome_count("complaint", "rejected") == len(alone_latencies) + shed + storm_sheds
            and counts.outcome_count("complaint", "submitted") == len(alone_latencies) + shed + storm_sheds
        )
        return RunFigures(
            api_accepts_per_s=accepted / seconds,
            direct_accepts_per_s=direct_ok / seconds,
            api_accept_p50_ms=_percentile_ms(accept_latencies, 50),
            api_accept_p99_ms=_percentile_ms(accept_latencies, 99),
            shed_alone_p50_ms=_percentile_ms(alone_latencies, 50),
            shed_alone_p99_ms=_percentile_ms(alone_latencies, 99),
            shed_p50_ms=_percentile_ms(shed_latencies, 50),
            shed_p99_ms=_percentile_ms(shed_latencies, 99),
            shed_answers=shed,
            api_errors=api_errors,
            storm_answers_per_s=len(stormed.latencies) / stormed.seconds if stormed.seconds else 0.0,
            storm_p50_ms=_percentile_ms(stormed.latencies, 50),
            storm_p99_ms=_percentile_ms(stormed.latencies, 99),
            storm_other_answers=len(stormed.latencies) - storm_sheds,
            books_balanced=books,
            server_shed_alone_p99_ms=server_p99[0],
            server_shed_p99_ms=server_p99[1],
            server_storm_p99_ms=server_p99[2],
            **_cpu_since(cpu_at, machine_at, wall_at),
        )
    finally:
        delete_queue(redis, queue)
        redis.close()
        Path(policy_file.name).unlink(missing_ok=True)
        metrics_dir.cleanup()


def _cpu_since(
    cpu_at: float | None, machine_at: tuple[float, float] | None, wall_at: float
) -> dict[str, float]:
    """Cores used since the readings: this process, and the whole machine (0 where /proc cannot say)."""
    wall = max(time.monotonic() - wall_at, 1e-9)
    cpu_now, machine_now = process_cpu_seconds(os.getpid()), machine_cpu_seconds()
    generator = (cpu_now - cpu_at) / wall if cpu_now is not None and cpu_at is not None else 0.0
    busy = (machine_now[0] - machine_at[0]) / wall if machine_now and machine_at else 0.0
    return {"generator_cores": round(generator, 2), "machine_busy_cores": round(busy, 2)}


def _direct_accepts(producer: Producer, threads: int, seconds: float) -> int:
    """The same submissions through the in-process producer: the API's baseline."""
    request = producer.validate({**LOAN, "branch_id": "0412"})

    def direct(_: int) -> tuple[bool, float]:
        started = time.perf_counter()
        return producer.submit(request).outcome == "queued", time.perf_counter() - started

    accepted, _, _ = _hammer(threads, seconds, direct)
    return accepted


def _shed_answers(
    redis: Redis,
    keys: QueueKeys,
    clients: list[KeepAliveClient],
    body: bytes,
    seconds: float,
    storm_plan: tuple[str, str, int, float],
) -> tuple[list[float], int, list[float], StormAnswers, tuple[float, float, float]]:
    """429 latencies with the queue held at red: one client alone, then every client at once, then
    the retry storm (`storm_plan`: base URL, key, clients, mean pause; no storm with 0 clients); and
    each phase's p99 inside the server."""
    stop = threading.Event()
    refresher = threading.Thread(target=_keep_red, args=(redis, keys, stop), daemon=True)
    refresher.start()
    time.sleep(0.5)  # past the API's 0.25 s admission cache
    base_url, token, storm_clients, pause_s = storm_plan
    scrapes = [answer_buckets(base_url, "429")]
    try:
        _, _, alone = _hammer(1, seconds / 2, lambda i: clients[i].post(PATH, body, 429))
        scrapes.append(answer_buckets(base_url, "429"))
        shed, _, latencies = _hammer(len(clients), seconds, lambda i: clients[i].post(PATH, body, 429))
        scrapes.append(answer_buckets(base_url, "429"))
        stormed = StormAnswers()
        if storm_clients:
            stormed = storm(base_url, PATH, token, body, storm_clients, seconds, pause_s)
        scrapes.append(answer_buckets(base_url, "429"))
    finally:
        stop.set()
        refresher.join()
    alone_p99, crowd_p99, storm_p99 = (quantile_ms(a, b, 0.99) for a, b in itertools.pairwise(scrapes))
    return alone, shed, latencies, stormed, (alone_p99, crowd_p99, storm_p99)


@app.command()
def main(
    runs: int = typer.Option(3, "--runs", min=1, help="runs; medians are reported"),
    seconds: float = typer.Option(5.0, "--seconds", min=0.5, help="length of each measured phase"),
    threads: int = typer.Option(16, "--threads", min=1, help="client threads (one keep-alive session each)"),
    workers: int = typer.Option(2, "--workers", min=1, help="uvicorn worker processes"),
    storm_clients: int = typer.Option(200, "--storm-clients", min=0, help="retry-storm clients; 0: no storm"),
    storm_pause_ms: float = typer.Option(
        100.0, "--storm-pause-ms", min=0.0, help="a storm client's mean pause between tries"
    ),
    redis_url: str | None = typer.Option(None, "--redis-url", help="default: TIDEGATE_REDIS_URL or local"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Accept rate through HTTP beside the direct Python producer, and the p99 time of a 429."""
    url = resolve_redis_url(redis_url or os.environ.get("TIDEGATE_REDIS_URL"))
    figures = [
        one_run(url, threads, seconds, workers, storm_clients, storm_pause_ms / 1000) for _ in range(runs)
    ]
    medians = {name: statistics.median(getattr(f, name) for f in figures) for name in asdict(figures[0])}
    doc = {
        "runs": runs,
        "seconds": seconds,
        "threads": threads,
        "uvicorn_workers": workers,
        "storm_clients": storm_clients,
        "storm_pause_ms": storm_pause_ms,
        "cpus": os.cpu_count(),
        "median": medians,
        "each_run": [asdict(f) for f in figures],
    }
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    typer.echo(
        f"median of {runs} runs, {threads} threads, {workers} uvicorn workers, {os.cpu_count()} CPUs:\n"
        f"  HTTP API accepts     {medians['api_accepts_per_s']:8.0f} tickets/s "
        f"(p50 {medians['api_accept_p50_ms']:.1f} ms, p99 {medians['api_accept_p99_ms']:.1f} ms)\n"
        f"  Python producer      {medians['direct_accepts_per_s']:8.0f} tickets/s\n"
        f"  429, one client      p50 {medians['shed_alone_p50_ms']:.1f} ms, p99 {medians['shed_alone_p99_ms']:.1f} ms\n"
        f"  429, {threads:2d} clients     p50 {medians['shed_p50_ms']:.1f} ms, p99 {medians['shed_p99_ms']:.1f} ms\n"
        f"  429, {storm_clients} retrying  p50 {medians['storm_p50_ms']:.1f} ms, p99 {medians['storm_p99_ms']:.1f} ms "
        f"({medians['storm_answers_per_s']:.0f} answers/s)\n"
        f"  429 p99 inside the server: one client {medians['server_shed_alone_p99_ms']:.1f} ms, "
        f"{threads} clients {medians['server_shed_p99_ms']:.1f} ms, "
        f"{storm_clients} retrying {medians['server_storm_p99_ms']:.1f} ms\n"
        f"  load generator {medians['generator_cores']:.2f} cores, "
        f"machine busy {medians['machine_busy_cores']:.2f} of {os.cpu_count()} cores\n"
        f"  books balanced in every run: {all(f.books_balanced for f in figures)}"
    )


if __name__ == "__main__":
    app()
