"""The seed's system before tidegate, as the overload benchmark's baseline.

One Redis LIST in arrival order and a fixed number of consumer threads, each popping the oldest job
and calling the model server's OpenAI API directly with `requests`: no admission control, no
priorities, no batch sizing and no backoff. Nothing in the list expires: a client that gave up leaves
its job behind and a consumer still runs it later, which is the wasted work that made the seed's
retries hurt. After an error the consumer takes the next job at once, so a crashed GPU's 503s drain
the list as fast as errors come back.

Replies go to a callback in this process (the branch clients of the benchmark live here too); how
an answer travels back does not change what the queue and the GPUs do.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import requests
from redis import Redis

log = logging.getLogger(__name__)

POP_TIMEOUT_SECONDS = 1
"""Consumers block this long per pop, so a stop request is noticed within a second."""
CONNECT_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class BaselineJob:
    """One request as the seed's clients queued it: a prompt and a token limit, nothing else.

    `id` names one attempt: a client that retries queues a new job, and its earlier one stays queued.
    """

    id: str
    type: str
    prompt: str
    max_tokens: int
    queued_at: float


@dataclass(frozen=True)
class BaselineReply:
    """What a consumer sends back: the model's usage on success, the HTTP status and message otherwise."""

    job_id: str
    ok: bool
    status_code: int
    """HTTP status of the model server; 0 when it could not be reached or did not answer in time."""
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    queued_at: float
    started_at: float
    finished_at: float


class FifoBaseline:
    """A Redis LIST feeding `concurrency` consumer threads per model server URL, round robin.

    Every key lives under `{<prefix>}` so a run deletes exactly what it created (`cleanup`).
    """

    def __init__(
        self,
        redis_url: str,
        model_urls: Sequence[str],
        on_reply: Callable[[BaselineReply], None],
        *,
        concurrency: int,
        prefix: str | None = None,
        model: str | None = None,
        request_timeout_s: float = 120.0,
    ) -> None:
        if not model_urls:
            raise ValueError("model_urls is empty; give the URL of at least one model server")
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency} is not accepted; it must be at least 1")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s={request_timeout_s} is not accepted; it must be above 0")
        self.model_urls = [url.rstrip("/") for url in model_urls]
        self.on_reply = on_reply
        self.concurrency = concurrency
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.prefix = prefix or f"bench-fifo-{uuid.uuid4().hex[:10]}"
        self.fifo_key = f"{{{self.prefix}}}:fifo"
        self.redis = Redis.from_url(redis_url, decode_responses=True)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.requests_sent = 0
        self.busy = 0

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> FifoBaseline:
        """Start `concurrency` consumers for each model server."""
        for url in self.model_urls:
            for index in range(self.concurrency):
                thread = threading.Thread(
                    target=self._consume, args=(url,), name=f"fifo-consumer-{index}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return self

    def request_stop(self) -> None:
        """Stop taking jobs; a consumer finishes (or fails) the request in hand, then exits."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the consumers to exit; False when some are still busy."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def cleanup(self) -> None:
        """Delete every key this baseline created."""
        self.redis.delete(self.fifo_key)
        self.redis.close()

    # -- the client side ---------------------------------------------------------------------------

    def submit(self, job: BaselineJob) -> None:
        """Append `job` to the FIFO; the seed accepted everything."""
        self.redis.rpush(self.fifo_key, json.dumps(asdict(job)))

    def depth(self) -> int:
        length: Any = self.redis.llen(self.fifo_key)
        return int(length)

    # -- the consumer side -------------------------------------------------------------------------

    def _consume(self, model_url: str) -> None:
        session = requests.Session()
        try:
            while not self._stop.is_set():
                item: Any = self.redis.blpop([self.fifo_key], timeout=POP_TIMEOUT_SECONDS)
                if item is None:
                    continue
                job = BaselineJob(**json.loads(item[1]))
                with self._lock:
                    self.busy += 1
                    self.requests_sent += 1
                try:
                    reply = self._run(session, model_url, job)
                finally:
                    with self._lock:
                        self.busy -= 1
                self.on_reply(reply)
        except Exception:
            log.exception("baseline consumer for %s stopped on an unexpected error", model_url)
            raise
        finally:
            session.close()

    def _run(self, session: requests.Session, model_url: str, job: BaselineJob) -> BaselineReply:
        started = time.time()
        body: dict[str, Any] = {"prompt": job.prompt, "max_tokens": job.max_tokens}
        if self.model:
            body["model"] = self.model
        try:
            response = session.post(
                f"{model_url}/v1/completions",
                json=body,
                headers={"X-Request-Id": job.id},
                timeout=(CONNECT_TIMEOUT_SECONDS, self.request_timeout_s),
            )
        except requests.RequestException as exc:
            return _failure(job, started, 0, f"{type(exc).__name__}: {exc}")
        if response.status_code != 200:
            return _failure(job, started, response.status_code, _error_message(response))
        try:
            usage = response.json()["usage"]
            prompt_tokens, completion_tokens = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
        except (ValueError, KeyError, TypeError) as exc:
            return _failure(job, started, response.status_code, f"unreadable completion body: {exc}")
        return BaselineReply(
            job.id, True, 200, None, prompt_tokens, completion_tokens, job.queued_at, started, time.time()
        )


def _failure(job: BaselineJob, started: float, status: int, error: str) -> BaselineReply:
    return BaselineReply(job.id, False, status, error, 0, 0, job.queued_at, started, time.time())


def _error_message(response: requests.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"
