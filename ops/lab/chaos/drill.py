"""`tidegate chaos`: a scripted fault drill on the local stack (ops/lab/stack), as the design's
monthly chaos drills run it: worker kill -9, Redis restart, simulator crash, an error burst that
opens the breaker, slow answers, a Redis stall. Traffic flows through the API the whole time; after
each step the drill prints what the system did and whether the books balanced (every ticket in
exactly one state, none lost, none done twice), and at the end waits for every ticket to end.

It owns its Redis (a `redis-server` with AOF on a free loopback port; the restart is a clean
shutdown, so the AOF holds every write) so it
can restart and stall it, and a policy with short leases and breaker windows so each step shows
its effect in seconds.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
import requests

from ops.lab.chaos.books import Books, read_books
from ops.lab.procs.children import ChildProcess, child_env
from ops.lab.procs.ports import free_port
from ops.lab.stack import Stack, StackConfig
from ops.lab.stack.stack import SimSettings, WorkerSettings
from shared.control import read_events
from shared.policy import default_policy_text, parse_policy
from shared.redis_conn import make_client

DRILL_POLICY_EDITS = {
    "lease_seconds = 30 ": "lease_seconds = 4 ",
    "min_requests = 10 ": "min_requests = 5 ",
    "instant = { window_seconds = 1,": "instant = { window_seconds = 2,",
    "open_seconds = 30 }": "open_seconds = 3 }",
    "sustained = { window_seconds = 60,": "sustained = { window_seconds = 6,",
    "deep = { window_seconds = 300,": "deep = { window_seconds = 12,",
}
SUBMIT_INTERVAL_SECONDS = 0.1
SETTLE_SECONDS = 60.0


def drill_policy_text() -> str:
    text = default_policy_text()
    for old, new in DRILL_POLICY_EDITS.items():
        if old not in text:
            raise RuntimeError(f"the default policy changed: {old!r} not found for the drill's policy")
        text = text.replace(old, new)
    parse_policy(text, "drill policy")  # fail here, not in a child
    return text


class DrillRedis:
    """A redis-server with AOF that the drill may restart (cleanly: nothing is lost) and stall.

    fsync once a second rather than on every write: on a busy disk an fsync per write can hold a
    reply past the clients' read timeout, which would be a fault the drill did not inject."""

    def __init__(self, run_dir: Path) -> None:
        self.port = free_port()
        self.run_dir = run_dir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.child: ChildProcess | None = None

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(self.run_dir)]
        self.child = ChildProcess("redis", command, self.run_dir / "redis.log", env=child_env()).start()
        client = make_client(self.url)
        try:
            self.child.wait_ready(lambda: _pings(client), 15, "answering PING")
        finally:
            client.close()

    def stop(self) -> None:
        if self.child is not None:
            self.child.signal(signal.SIGCONT)
            self.child.stop(grace_seconds=5)
            self.child = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class Traffic:
    """Tickets submitted through the API at a steady pace, and what each submit got back."""

    api_url: str
    key: str
    ids: list[str] = field(default_factory=list)
    answers: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.key}"
        i = 0
        while not self.stop.is_set():
            kind = "loan_approval" if i % 5 == 0 else "complaint"
            body = {"type": kind, "prompt": f"drill ticket {i} " * 6, "max_tokens": 16}
            try:
                reply = session.post(self.api_url + "/v1/tickets", json=body, timeout=15)
                label = str(reply.status_code)
                if reply.status_code in (202, 429) and "id" in reply.json():
                    self.ids.append(reply.json()["id"])
                elif reply.status_code == 429:
                    self.ids.append(reply.json()["error"].get("ticket_id") or "")
                    label += ":" + str(reply.json()["error"].get("code"))
            except requests.RequestException:
                label = "no answer"
            self.answers[label] = self.answers.get(label, 0) + 1
            i += 1
            self.stop.wait(SUBMIT_INTERVAL_SECONDS)


@dataclass
class StepReport:
    name: str
    did: str
    books: Books
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.name,
            "system": self.did,
            "books": self.books.summary(),
            "balanced": self.books.balanced,
            "seconds": round(self.seconds, 1),
        }


def describe_events(events: list[dict[str, str]]) -> str:
    """The events of one step in a few words: breaker transitions, pages, alarm moves."""
    seen: dict[str, int] = {}
    for event in events:
        kind = event.get("kind", "")
        label = f"breaker {event.get('transition')}" if kind == "breaker" else kind
        seen[label] = seen.get(label, 0) + 1
    return ", ".join(f"{label} ×{n}" if n > 1 else label for label, n in sorted(seen.items())) or "no events"


Step = Callable[["Drill"], None]


class Drill:
    """Runs the steps against a stack of its own; `quick` keeps each fault short (CI)."""

    def __init__(self, run_dir: Path, *, quick: bool, out: Callable[[str], None] = print) -> None:
        self.run_dir = run_dir
        self.quick = quick
        self.out = out
        self.outage_seconds = 3.0 if quick else 20.0
        self.stall_seconds = 5.0 if quick else 40.0
        policy = parse_policy(drill_policy_text())
        self.lease_seconds = policy.queue.lease_seconds
        self.open_seconds = policy.breaker.instant.open_seconds
        self.redis = DrillRedis(run_dir)
        self.stack: Stack
        self.reports: list[StepReport] = []

    def run(self) -> bool:
        """Every step, then the wait for every ticket to end; True when the books always balanced."""
        from ops.lab.chaos.steps import STEPS

        self.run_dir.mkdir(parents=True, exist_ok=True)
        policy_file = self.run_dir / "drill_policy.toml"
        policy_file.write_text(drill_policy_text(), encoding="utf-8")
        self.redis.start()
        config = StackConfig(
            redis_url=self.redis.url,
            queue_name="drill",
            run_dir=self.run_dir,
            gpus=2,
            sim=SimSettings(time_scale=20),
            worker=WorkerSettings(grace_seconds=2, heartbeat_seconds=0.5, resize_seconds=1, block_seconds=1),
            policy_file=str(policy_file),
        )
        self.stack = Stack(config)
        try:
            self.stack.start()
            traffic = Traffic(self.stack.api_url, self.stack.branch_key("drill-branch"))
            thread = threading.Thread(target=traffic.run, name="drill-traffic", daemon=True)
            thread.start()
            time.sleep(2.0)
            for name, step in STEPS:
                self._step(name, step, traffic)
            traffic.stop.set()
            thread.join(20)
            return self._final(traffic)
        finally:
            self.stack.stop()
            self.redis.stop()

    def _books(self, traffic: Traffic) -> Books:
        client = make_client(self.redis.url)
        try:
            return read_books(client, self.stack.queue_keys, [i for i in traffic.ids if i])
        finally:
            client.close()

    def _events_since(self, since: float) -> list[dict[str, str]]:
        client = make_client(self.redis.url)
        try:
            return [
                e for e in read_events(client, self.stack.queue_keys, 500) if float(e.get("at", 0)) >= since
            ]
        finally:
            client.close()

    def every_circuit_opened(self, since: float) -> bool:
        """Whether each simulator's breaker has opened since `since` (the error burst's goal)."""
        opened = {
            e.get("endpoint")
            for e in self._events_since(since)
            if e.get("kind") == "breaker" and e.get("transition") == "instant:opened"
        }
        return all(url.split("://", 1)[1] in opened for url in self.stack.vllm_urls)

    def _step(self, name: str, step: Callable[[Drill], str], traffic: Traffic) -> None:
        started, answers_before = time.time(), dict(traffic.answers)
        self.out(f"-> {name} ...")
        action = step(self)
        time.sleep(1.0)
        answers = {k: v - answers_before.get(k, 0) for k, v in traffic.answers.items()}
        api = ", ".join(f"{n}×{k}" for k, n in sorted(answers.items()) if n) or "no submits"
        did = f"{action}; events: {describe_events(self._events_since(started))}; API answered {api}"
        report = StepReport(name, did, self._books(traffic), time.time() - started)
        self.reports.append(report)
        self.out(f"   {report.did}")
        self.out(f"   books {report.books.summary()}")

    def _final(self, traffic: Traffic) -> bool:
        started = time.time()
        self.out("-> waiting for every ticket to end ...")
        books = self._books(traffic)
        while books.open_tickets and time.time() - started < SETTLE_SECONDS:
            time.sleep(0.5)
            books = self._books(traffic)
        final = StepReport(
            "all tickets ended", f"{len(traffic.ids)} tickets submitted", books, time.time() - started
        )
        if books.open_tickets:
            final.books.misplaced.append(f"{books.open_tickets} tickets still open")
        self.reports.append(final)
        self.out(f"   books {final.books.summary()}")
        ok = all(r.books.balanced for r in self.reports)
        self.out("the books balanced after every step" if ok else "the books did NOT balance")
        return ok
