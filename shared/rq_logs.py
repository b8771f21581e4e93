"""The rq worker that runs side jobs (branch callbacks, alarm actions) in tidegate's JSON line format.

Deployments start it with rq's own command and its supported hook for this,
`rq worker --worker-class shared.rq_logs.JsonLogWorker ...`, and the monitor's `--rq-worker` child
uses the same class. Every line is one JSON object (`shared.logs`); a line written while a job runs,
rq's own included (dequeued, succeeded, the traceback of a failure), also carries `job_id`, `rq_queue`
and, for a job about a ticket, `ticket_id` from the job's meta (`job_meta`), so a
callback's lines are found by the ticket's id like the API's and the workers'.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from rq import Queue, Worker
from rq.job import Job

from shared.logs import configure_logging

RQ_LOGGERS = ("rq", "rq.worker", "rq.job", "rq.scheduler", "rq.queue")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_current: dict[str, str] = {}
"""The fields of the job this process is handling; a forked work horse inherits them."""


def job_meta(ticket_id: str, queue_name: str) -> dict[str, str]:
    """The meta of a job about one ticket; its log lines carry the `ticket_id`."""
    return {"ticket_id": ticket_id, "ticket_queue": queue_name}


def _job_fields(job: Job, rq_queue: str) -> dict[str, str]:
    fields = {"job_id": str(job.id), "rq_queue": rq_queue}
    meta = job.meta if isinstance(job.meta, dict) else {}
    if meta.get("ticket_id") is not None:
        fields["ticket_id"] = str(meta["ticket_id"])
    return fields


class JobFields(logging.Filter):
    """Adds the current job's fields to each line, and takes rq's terminal colours out of its text."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _current.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        if record.name.startswith("rq") and (record.args or "\x1b" in str(record.msg)):
            record.msg = _COLOUR.sub("", record.getMessage())
            record.args = None
        return True


class JobTrackingQueue(Queue):
    """rq's Queue that notes the job it hands a worker, before the worker logs a line about it."""

    @classmethod
    def dequeue_any(cls, *args: Any, **kwargs: Any) -> tuple[Job, Queue] | None:
        _current.clear()
        result = super().dequeue_any(*args, **kwargs)
        if result is not None:
            _current.update(_job_fields(result[0], result[1].name))
        return result


class JsonLogWorker(Worker):
    """rq's forking Worker, logging JSON lines with each job's fields."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.queue_class is Queue:  # after rq checked the given queues against plain Queue
            self.queue_class = JobTrackingQueue

    def bootstrap(self, logging_level: str | None = "INFO", *args: Any, **kwargs: Any) -> None:
        """Take over logging before rq sets up its own handlers (it adds none once the root has one)."""
        handler = configure_logging(logging_level or "INFO")
        handler.addFilter(JobFields())
        for name in RQ_LOGGERS:
            logger = logging.getLogger(name)
            logger.handlers.clear()
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
        super().bootstrap(logging_level, *args, **kwargs)

    def execute_job(self, job: Job, queue: Queue) -> None:
        try:
            super().execute_job(job, queue)
        finally:
            _current.clear()
