"""Test support for the monitor tests: a controllable clock, rq queues of the test's own, tickets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from redis import Redis
from rq import Queue, SimpleWorker

from ops.monitor.dispatch import JobOptions
from shared.models import TicketRequest
from shared.queue import TicketQueue


@dataclass(frozen=True)
class RqQueues:
    jobs: JobOptions
    conn: Redis
    tag: str

    @property
    def actions(self) -> Queue:
        return Queue(self.jobs.actions_queue, connection=self.conn)

    @property
    def callbacks(self) -> Queue:
        return Queue(self.jobs.callbacks_queue, connection=self.conn)

    def work(self, *queues: Queue) -> None:
        """Run every queued job now, in this process, as an rq worker in burst mode would."""
        targets = list(queues) or [self.actions]
        SimpleWorker(targets, connection=self.conn, name=f"worker-{self.tag}").work(
            burst=True, logging_level="WARNING"
        )


def ticket(ticket_type: str = "archive_query", **fields: object) -> TicketRequest:
    return TicketRequest.model_validate({"type": ticket_type, "branch_id": "b0412", "prompt": "hi", **fields})


def fill(queue: TicketQueue, count: int, ticket_type: str = "archive_query") -> list[str]:
    """Enqueue `count` tickets directly (no admission), as branches did before the alarm."""
    return [queue.enqueue(ticket(ticket_type)).ticket_id for _ in range(count)]


class Recorder(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return
