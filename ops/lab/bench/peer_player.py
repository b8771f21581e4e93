"""Branch clients for the peer arms: the planned workload sent straight to an OpenAI-compatible URL.

One event loop sends every request at its planned time whatever the open requests are doing (an open
loop), so a slow system cannot slow the offered load down; how late a send was is recorded (send
lag). A branch waits for its answer until the ticket's TTL from the policy has passed, as tidegate's
branches do; a shed answer (429, 503, a dropped connection) is sent again after Retry-After for the
branches that honour it, after 1 s for the others, at most `max_attempts` times.

Every submission ends in exactly one outcome (`done`, `rejected` for a shed answer, `failed` for
another error, `expired` when the TTL passed while it was open, `cancelled` at the end of the run),
and every submission refused or failed is counted by its code (a 429, SMG's `503
scheduler_queue_timeout`, a dead engine's 500/503, a dropped connection), so the books are the
same as the baseline's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ops.lab.traffic.records import TicketRecord, percentile
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy

log = logging.getLogger(__name__)

SHED_PREFIX = "scheduler_"
"""A 503 whose error code starts so is a gateway's queue timeout (SMG), not a dead engine."""
DROPPED = "dropped"
"""The code of a submission whose connection closed without an answer (SMG's preemption does this)."""

RequestShape = Callable[[PlannedArrival], tuple[str, dict[str, Any], dict[str, str]]]
"""Where and what an arm sends for one arrival: (base URL, the JSON body of /v1/completions, headers)."""


@dataclass(frozen=True)
class PeerClientSettings:
    """How the peer arms' branches behave; the same rules tidegate's branches follow."""

    honouring: frozenset[str]
    """Branches that wait as long as Retry-After says; the others retry after `retry_delay_s`."""
    retry_delay_s: float = 1.0
    max_attempts: int = 5
    drain_timeout_s: float = 60.0
    """After the last planned arrival, how long open requests may still finish before the run ends."""


class PeerPlayer:
    """Plays `plan` on its own event loop thread, where `shape` says; one record per planned request."""

    def __init__(
        self,
        plan: Sequence[PlannedArrival],
        policy: Policy,
        shape: RequestShape,
        settings: PeerClientSettings,
    ) -> None:
        self.plan = sorted(plan, key=lambda a: a.at)
        self.policy = policy
        self.shape = shape
        self.settings = settings
        self.records = {a.index: TicketRecord.planned(a, policy) for a in self.plan}
        self.submission_outcomes: Counter[tuple[str, str]] = Counter()
        """(type, outcome) -> submissions that ended so."""
        self.shed_codes: Counter[tuple[str, str]] = Counter()
        """(type, code) -> shed submissions, e.g. ("complaint", "429 scheduler_queue_full")."""
        self.usage: dict[int, int] = {}
        """Record index -> prompt + completion tokens of its answer."""
        self.send_lag_s: list[float] = []
        self.open_requests = 0
        self.started_at = 0.0
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="peer-player", daemon=True)
        self._t0 = 0.0

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        self._thread.join(timeout)

    def send_lag(self) -> dict[str, float | None]:
        """How late the sends were against the plan: the harness keeps up when p99 stays small."""
        return {
            "p50_s": _round(percentile(self.send_lag_s, 50)),
            "p99_s": _round(percentile(self.send_lag_s, 99)),
            "max_s": _round(max(self.send_lag_s, default=None)),
        }

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._play())
        except Exception:
            log.exception("the peer player stopped on an unexpected error")
        finally:
            self._finished.set()

    async def _play(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        async with httpx.AsyncClient(limits=limits, timeout=None) as client:
            self._t0 = time.monotonic()
            self.started_at = time.time()
            tasks = []
            for arrival in self.plan:
                delay = self._t0 + arrival.at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.send_lag_s.append(max(0.0, time.monotonic() - self._t0 - arrival.at))
                tasks.append(asyncio.create_task(self._branch(client, arrival)))
            end = self._t0 + (self.plan[-1].at if self.plan else 0.0) + self.settings.drain_timeout_s
            pending = {task for task in tasks if not task.done()}
            if pending:
                await asyncio.wait(pending, timeout=max(0.0, end - time.monotonic()))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- one branch's request, from its first submission to its outcome ---------------------------
    async def _branch(self, client: httpx.AsyncClient, arrival: PlannedArrival) -> None:
        record = self.records[arrival.index]
        base_url, body, headers = self.shape(arrival)
        url = base_url.rstrip("/") + "/v1/completions"
        record.first_submit_at = time.time()
        deadline = time.monotonic() + self.policy.type_policy(arrival.type).ttl_seconds
        attempt, open_submission = 0, False
        try:
            while True:
                attempt += 1
                record.submissions += 1
                open_submission = True
                self.open_requests += 1
                try:
                    remaining = deadline - time.monotonic()
                    answer = await asyncio.wait_for(client.post(url, json=body, headers=headers), remaining)
                except TimeoutError:
                    self._end(record, "expired")
                    return
                except httpx.HTTPError as exc:
                    answer = None
                    record.error = f"{type(exc).__name__}: {exc}"
                finally:
                    self.open_requests -= 1
                open_submission = False
                code, pause = self._judge(record, answer)
                if code is None:
                    return
                outcome = "failed" if code == "error" else "rejected"
                if attempt >= self.settings.max_attempts or time.monotonic() + pause >= deadline:
                    self._end(record, outcome)
                    return
                self.submission_outcomes[(record.type, outcome)] += 1
                record.retries += 1
                await asyncio.sleep(pause)
        except asyncio.CancelledError:
            if open_submission:
                self.submission_outcomes[(record.type, "cancelled")] += 1
            record.outcome, record.status, record.finished_at = "cancelled", "cancelled", time.time()
            raise

    def _judge(self, record: TicketRecord, answer: httpx.Response | None) -> tuple[str | None, float]:
        """(None, 0) when answered; else (the shed code or "error", the pause before the next try)."""
        if answer is not None and answer.status_code == 200:
            usage = _usage(answer)
            if usage is not None:
                self.usage[record.index] = usage
                self._end(record, "done")
                return None, 0.0
            record.error = f"unreadable completion body: {answer.text[:200]}"
        reason = "" if answer is None else _error_code(answer)
        code = DROPPED if answer is None else f"{answer.status_code} {reason}".strip()
        shed = answer is None or answer.status_code == 429 or reason.startswith(SHED_PREFIX)
        self.shed_codes[(record.type, code)] += 1
        if shed:
            record.rejections += 1
        elif answer is not None:
            record.error = f"HTTP {answer.status_code}: {answer.text[:200]}"
        pause = self.settings.retry_delay_s
        if answer is not None and record.branch_id in self.settings.honouring:
            pause = _retry_after(answer) or pause
        return (code if shed else "error"), pause

    def _end(self, record: TicketRecord, outcome: str) -> None:
        self.submission_outcomes[(record.type, outcome)] += 1
        record.outcome, record.status, record.finished_at = outcome, outcome, time.time()
        if outcome == "expired":
            self.shed_codes[(record.type, "expired")] += 1


def _usage(answer: httpx.Response) -> int | None:
    try:
        usage = answer.json()["usage"]
        return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return None


def _error_code(answer: httpx.Response) -> str:
    """The machine-readable reason a system gave (SMG: `scheduler_queue_full`, ...), or ""."""
    try:
        error: Mapping[str, Any] = answer.json().get("error") or {}
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, Mapping):
        return ""
    reason = str(error.get("code") or error.get("type") or "")
    return "" if reason == str(answer.status_code) else reason


def _retry_after(answer: httpx.Response) -> float | None:
    try:
        return max(0.0, float(answer.headers.get("retry-after", "")))
    except ValueError:
        return None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
