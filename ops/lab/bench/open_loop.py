"""The overload bench's branch clients for every arm that speaks OpenAI: one asyncio open loop.

One event loop sends every request at its planned time whatever the open requests are doing (an open
loop), so a slow system cannot slow the offered load down; how late each send was is recorded (send
lag), which shows whether the harness kept up. Each request is one `POST /v1/completions` to the
arm's URL (tidegate's front door with the branch's key, the engine, SMG, LiteLLM), answered whole
or streamed (`stream: true` with `include_usage`, read cheaply by `submission.py`, recording the
time to first token of the submission that was answered).

A branch waits for its answer until the ticket's TTL from the policy has passed, as tidegate's
ticket branches do. A shed answer (429, a degraded 200, SMG's 503 `scheduler_*`, a connection
dropped before any text) or an error answer is sent again after Retry-After for the branches that
honour it, after 1 s for the others, at most `max_attempts` times. A request taken on (a 200 stream
began) ends with that submission: done at `[DONE]`, failed on an error event or a cut after text.

Every submission ends in exactly one outcome (`done`, `rejected` for a shed answer, `failed`,
`expired` when the TTL passed while it was open, `cancelled` at the end of the run) and every
submission not done is counted by its code. With `tickets` (tidegate), a submission that carried a
ticket id and did not end done or shed is settled by its ticket's own status (`DELETE`, then `GET
/v1/tickets/{id}` until it has ended), so the branches' books can be checked against Redis's.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from typing import Any

import httpx

from ops.lab.bench.figures import send_lag_figures
from ops.lab.bench.submission import STREAM_FIELDS, Submission, send_streamed, send_whole
from ops.lab.traffic.accounting import Ledger
from ops.lab.traffic.records import OUTCOMES, TicketRecord
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy

log = logging.getLogger(__name__)

BRANCH_KEEPALIVE = 8
"""Idle connections a branch's client keeps for its next call."""
RequestShape = Callable[[PlannedArrival], tuple[str, dict[str, Any], dict[str, str]]]
"""Where and what an arm sends for one arrival: (base URL, the JSON body of /v1/completions, headers)."""


@dataclass(frozen=True)
class OpenLoopSettings:
    """How the branches behave; the same rules for every arm."""

    honouring: frozenset[str]
    """Branches that wait as long as Retry-After says; the others retry after `retry_delay_s`."""
    retry_delay_s: float = 1.0
    max_attempts: int = 5
    drain_timeout_s: float = 60.0
    """After the last planned arrival, how long open requests may still finish before the run ends."""
    stream: bool = False
    """Streamed calls (`--client openai`); else one JSON answer per call."""
    tickets: bool = False
    """The system keeps every call as a ticket readable at `GET /v1/tickets/{id}` (tidegate)."""
    settle_timeout_s: float = 10.0
    """How long a ticket given up on may take to show its end."""


@dataclass(frozen=True)
class _Target:
    base_url: str
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def url(self) -> str:
        return self.base_url + "/v1/completions"

    def ticket_url(self, ticket_id: str) -> str:
        return f"{self.base_url}/v1/tickets/{ticket_id}"


class OpenLoopPlayer:
    """Plays `plan` on its own event loop thread, where `shape` says; one record per planned request."""

    def __init__(
        self, plan: Sequence[PlannedArrival], policy: Policy, shape: RequestShape, settings: OpenLoopSettings
    ) -> None:
        self.plan = sorted(plan, key=lambda a: a.at)
        self.policy = policy
        self.shape = shape
        self.settings = settings
        self.records = {a.index: TicketRecord.planned(a, policy) for a in self.plan}
        self.submission_outcomes: Counter[tuple[str, str]] = Counter()
        """(type, outcome) -> submissions that ended so (a ticket's own status, with `tickets`)."""
        self.shed_codes: Counter[tuple[str, str]] = Counter()
        """(type, code) -> submissions not done, e.g. ("complaint", "429 scheduler_queue_full")."""
        self.usage: dict[int, int] = {}
        """Record index -> prompt + completion tokens of its answer."""
        self.send_lag_s: list[float] = []
        self.open_requests = 0
        self.started_at = 0.0
        self.cancelled_leftovers = 0
        """Tickets still open when the drain ended, cancelled by their branch (`tickets` only)."""
        self._abandoned: list[tuple[httpx.AsyncClient, TicketRecord, _Target, str]] = []
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="open-loop-player", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.started_at = time.time()  # the plan's clock: a slow start of the loop shows as send lag
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        self._thread.join(timeout)

    def send_lag(self) -> dict[str, float | None]:
        return send_lag_figures(self.send_lag_s)

    def ledger(self, types: Sequence[str]) -> Ledger:
        """The branches' books: every submission and how it ended, per type."""
        rows = {t: dict.fromkeys(("submitted", *OUTCOMES), 0) for t in types}
        for (ticket_type, outcome), count in self.submission_outcomes.items():
            rows[ticket_type][outcome] += count
        for record in self.records.values():
            rows[record.type]["submitted"] += record.submissions
        return Ledger("clients", rows)

    def shed_by_type(self, types: Sequence[str]) -> dict[str, dict[str, int]]:
        """type -> code -> submissions not done with that code."""
        shed: dict[str, dict[str, int]] = {t: {} for t in types}
        for (ticket_type, code), count in self.shed_codes.items():
            shed[ticket_type][code] = count
        return shed

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._play())
        except Exception:
            log.exception("the open-loop player stopped on an unexpected error")
        finally:
            self._finished.set()

    async def _play(self) -> None:
        async with AsyncExitStack() as clients:
            # One client per branch office, as each has its own: httpcore's pool does work quadratic in
            # its connections whenever a request starts or ends, so one pool holding every open stream
            # of a surge costs the loop more than the streams do. The SSL context is shared because
            # httpx builds one per client otherwise (tens of milliseconds each; the calls are plain HTTP).
            verify = ssl.create_default_context()
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=BRANCH_KEEPALIVE)
            by_branch: dict[str, httpx.AsyncClient] = {}
            loop = asyncio.get_running_loop()
            t0 = loop.time() - (time.time() - self.started_at)
            tasks = []
            for arrival in self.plan:
                delay = t0 + arrival.at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.send_lag_s.append(max(0.0, loop.time() - t0 - arrival.at))
                client = by_branch.get(arrival.branch_id)
                if client is None:
                    client = httpx.AsyncClient(limits=limits, timeout=None, verify=verify)
                    by_branch[arrival.branch_id] = await clients.enter_async_context(client)
                tasks.append(asyncio.create_task(self._branch(client, arrival)))
            end = t0 + (self.plan[-1].at if self.plan else 0.0) + self.settings.drain_timeout_s
            pending = {task for task in tasks if not task.done()}
            if pending:
                await asyncio.wait(pending, timeout=max(0.0, end - loop.time()))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(self._settle_abandoned(*left) for left in self._abandoned))

    # ---- one branch's request, from its first submission to its outcome ---------------------------
    def _target(self, arrival: PlannedArrival) -> _Target:
        base_url, body, headers = self.shape(arrival)
        return _Target(base_url.rstrip("/"), body | STREAM_FIELDS if self.settings.stream else body, headers)

    async def _branch(self, client: httpx.AsyncClient, arrival: PlannedArrival) -> None:
        loop = asyncio.get_running_loop()
        record = self.records[arrival.index]
        target = self._target(arrival)
        record.first_submit_at = time.time()
        deadline = loop.time() + self.policy.type_policy(arrival.type).ttl_seconds
        attempt, sub = 0, None
        try:
            while True:
                attempt += 1
                record.submissions += 1
                sub = Submission(time.monotonic())
                await self._send(client, target, sub, deadline)
                if self._ends_here(sub):
                    await self._finish(client, record, target, sub)
                    return
                outcome, pause = self._refused(record, sub)
                if attempt >= self.settings.max_attempts or loop.time() + pause >= deadline:
                    self._end(record, outcome, outcome)
                    return
                self.submission_outcomes[(record.type, outcome)] += 1
                record.retries += 1
                sub = None
                await asyncio.sleep(pause)
        except asyncio.CancelledError:
            self._cancelled(client, record, target, sub)
            raise

    def _ends_here(self, sub: Submission) -> bool:
        """Answered, given up, or taken on and broken off; a ticket taken on ends by its own status."""
        if sub.verdict in ("done", "expired") or (sub.admitted and sub.verdict == "error"):
            return True
        return (
            self.settings.tickets and sub.ticket_id is not None and (sub.admitted or sub.verdict == "error")
        )

    async def _send(
        self, client: httpx.AsyncClient, target: _Target, sub: Submission, deadline: float
    ) -> None:
        send = send_streamed if self.settings.stream else send_whole
        self.open_requests += 1
        try:
            async with asyncio.timeout_at(deadline):
                await send(client, target.url, target.body, target.headers, sub)
        except TimeoutError:
            if sub.verdict == "open":
                sub.verdict, sub.code = "expired", "expired"
        except httpx.HTTPError as exc:
            sub.dropped(f"{type(exc).__name__}: {exc}")
        finally:
            self.open_requests -= 1

    def _refused(self, record: TicketRecord, sub: Submission) -> tuple[str, float]:
        """Count a shed or error answer; (the submission's outcome, the pause before the next try)."""
        self.shed_codes[(record.type, sub.code)] += 1
        if sub.verdict == "shed":
            record.rejections += 1
            record.degraded = sub.degraded  # the last refusal's kind decides how a give-up reads
            if sub.ticket_id:
                record.rejected_ids.append(sub.ticket_id)
        else:
            record.error = sub.error
        pause = self.settings.retry_delay_s
        if record.branch_id in self.settings.honouring:
            pause = sub.retry_after or pause
        return ("rejected" if sub.verdict == "shed" else "failed"), pause

    async def _finish(
        self, client: httpx.AsyncClient, record: TicketRecord, target: _Target, sub: Submission
    ) -> None:
        """The request ends with this submission: done, given up at its TTL, or broken off."""
        record.ticket_id = sub.ticket_id or record.ticket_id
        record.client_ttft_s = sub.ttft_s
        if sub.tokens is not None and sub.verdict == "done":
            self.usage[record.index] = sub.tokens
        if sub.verdict == "done":
            record.client_latency_s = time.monotonic() - sub.sent
            self._end(record, "done", "done")
            return
        self.shed_codes[(record.type, sub.code)] += 1
        record.error = sub.error or record.error
        outcome = "expired" if sub.verdict == "expired" else "failed"
        if not (self.settings.tickets and sub.ticket_id):
            self._end(record, outcome, outcome)
            return
        status = await self._ticket_end(client, target, sub.ticket_id)
        if status is None:
            self._end(record, "error", None)
            return
        if outcome == "failed" and status != "done":
            outcome = status  # the system's own word for how the ticket ended (expired, failed, ...)
        self._end(record, outcome, status)

    def _end(self, record: TicketRecord, outcome: str, counted: str | None) -> None:
        """The request's final outcome; `counted` is its last submission's (None: unknown)."""
        if counted is not None:
            self.submission_outcomes[(record.type, counted)] += 1
        record.outcome, record.status, record.finished_at = outcome, outcome, time.time()

    def _cancelled(
        self, client: httpx.AsyncClient, record: TicketRecord, target: _Target, sub: Submission | None
    ) -> None:
        """The run ended with this request open: a ticket is settled after the loop, the rest counted now."""
        if sub is not None:
            if sub.admitted:
                record.ticket_id = sub.ticket_id
            if self.settings.tickets and sub.ticket_id:
                self._abandoned.append((client, record, target, sub.ticket_id))
            else:
                self.submission_outcomes[(record.type, "cancelled")] += 1
        record.outcome, record.status, record.finished_at = "cancelled", "cancelled", time.time()

    # ---- tickets (tidegate) ------------------------------------------------------------------------
    async def _settle_abandoned(
        self, client: httpx.AsyncClient, record: TicketRecord, target: _Target, ticket_id: str
    ) -> None:
        status = await self._ticket_end(client, target, ticket_id)
        if status is None:
            record.outcome, record.status = "error", "error"
            return
        self.submission_outcomes[(record.type, status)] += 1
        if status == "cancelled":
            self.cancelled_leftovers += 1

    async def _ticket_end(self, client: httpx.AsyncClient, target: _Target, ticket_id: str) -> str | None:
        """The ticket's terminal status once it has one, after cancelling it (a no-op if it has ended)."""
        url = target.ticket_url(ticket_id)
        with suppress(httpx.HTTPError):
            await client.delete(url, headers=target.headers)
        deadline = time.monotonic() + self.settings.settle_timeout_s
        pause = 0.05
        while True:
            with suppress(httpx.HTTPError, ValueError, KeyError):
                answer = await client.get(url, headers=target.headers)
                if answer.status_code == 200 and (status := answer.json()["status"]) in OUTCOMES:
                    return str(status)
            if time.monotonic() >= deadline:
                log.warning(
                    "ticket %s showed no end within %.0f s", ticket_id, self.settings.settle_timeout_s
                )
                return None
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
