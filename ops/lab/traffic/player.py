"""Play a planned workload against the HTTP API as the branches would: submit, retry on 429, poll.

One dispatcher thread keeps a timetable (a heap of due actions: submit request N, poll ticket T) and
hands each due action to a pool of client threads, each with its own keep-alive session. A branch
that is shed (429) tries again after the server's Retry-After (or after a fixed pause, the naive
client), up to `max_attempts`, then gives up. Accepted tickets are polled with a growing interval
until they end; the latency figures are the server's own timings, so coarse polling costs nothing
in accuracy. When the plan is over the player waits `drain_timeout_s` for the backlog, then cancels
what is left, so every submission ends in a terminal state the accounting can count.

(The overload bench's branches through the OpenAI front door are the asyncio open loop in
`ops/lab/bench/open_loop.py`, not this player.)
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import requests
from requests.adapters import HTTPAdapter
from tidegate_client import parse_retry_after

from ops.lab.traffic.player_settings import RETRY_MODES, PlayerSettings, RetryMode, RetryPolicy
from ops.lab.traffic.records import OUTCOMES, TicketRecord, TypeFigures, type_figures
from ops.lab.traffic.timetable import Timetable
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy

log = logging.getLogger(__name__)

__all__ = ["RETRY_MODES", "PlayerSettings", "RetryMode", "RetryPolicy", "TrafficPlayer"]

TRANSPORT_RETRIES = 3
TRANSPORT_PAUSE_S = 0.5


@dataclass(frozen=True)
class _Action:
    kind: Literal["submit", "poll"]
    record: TicketRecord
    attempt: int = 1
    interval: float = 0.0


class TrafficPlayer:
    """Sends `plan` to the API at `api_url`, each ticket with its branch's key from `key_for`."""

    def __init__(
        self,
        api_url: str,
        key_for: Callable[[str], str],
        plan: Sequence[PlannedArrival],
        policy: Policy,
        settings: PlayerSettings | None = None,
        *,
        seed: int = 0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.key_for = key_for
        self.plan = list(plan)
        self.policy = policy
        self.settings = settings or PlayerSettings()
        self.records = [TicketRecord.planned(a, policy) for a in self.plan]
        self._arrivals = {a.index: a for a in self.plan}
        self._rng = random.Random(f"{seed}:retries")
        self._lock = threading.Lock()
        self._timetable: Timetable[_Action] = Timetable()
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._pool = ThreadPoolExecutor(max_workers=self.settings.clients, thread_name_prefix="branch")
        self._busy = 0
        self._thread = threading.Thread(target=self._dispatch, name="traffic-dispatcher", daemon=True)
        self.started_at = 0.0
        self._t0 = 0.0
        self.cancelled_leftovers = 0

    @property
    def duration(self) -> float:
        return max((a.at for a in self.plan), default=0.0)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0 if self._t0 else 0.0

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._t0 = time.monotonic()
        self.started_at = time.time()
        for record in self.records:
            self._timetable.push(self._t0 + record.planned_at, _Action("submit", record))
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every record is terminal (or the player was stopped); False on timeout."""
        return self._finished.wait(timeout)

    def run(self) -> list[TicketRecord]:
        self.start()
        self.wait()
        self.close()
        return self.records

    def stop(self) -> None:
        """Stop sending (Ctrl-C): no new submissions or polls; requests in flight finish."""
        self._stop.set()
        self._timetable.wake()

    def close(self) -> None:
        self.stop()
        self._thread.join(timeout=self.settings.request_timeout_s + 5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for session in self._sessions:
            session.close()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    # ---- reading ----------------------------------------------------------------------------
    def figures(self) -> dict[str, TypeFigures]:
        with self._lock:
            return {t: type_figures(t, self.records) for t in self.policy.type_names}

    def snapshot(self) -> list[TicketRecord]:
        """Copies of the records, consistent with each other."""
        with self._lock:
            return [TicketRecord(**r.to_dict()) for r in self.records]

    # ---- the dispatcher ------------------------------------------------------------------------
    def _dispatch(self) -> None:
        drain_deadline = self._t0 + self.duration + self.settings.drain_timeout_s
        while not self._stop.is_set():
            now = time.monotonic()
            due = self._timetable.pop_due(now)
            with self._lock:
                self._busy += len(due)
                idle = self._busy == 0  # no action in flight, so none can push while we look
            for action in due:
                self._pool.submit(self._run_action, action)
            if idle and not self._timetable and self._all_terminal():
                break
            if now >= drain_deadline:
                self._cancel_leftovers()
                break
            self._timetable.wait(0.2)
        self._finished.set()

    def _all_terminal(self) -> bool:
        with self._lock:
            return all(r.terminal for r in self.records)

    def _run_action(self, action: _Action) -> None:
        try:
            if self._stop.is_set() or self._timetable.closed:
                return
            if action.kind == "submit":
                self._submit(action.record, action.attempt)
            else:
                self._poll(action.record, action.interval)
        except Exception as exc:  # a bug here must not silently stall a ticket: record it
            log.exception("traffic action %s for %s failed", action.kind, action.record.request_id)
            with self._lock:
                action.record.outcome = action.record.outcome or "error"
                action.record.error = f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._busy -= 1
            self._timetable.wake()

    # ---- HTTP ------------------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=2))
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def _request(
        self, method: str, path: str, key: str, *, json: Any = None, headers: dict[str, str] | None = None
    ) -> requests.Response | None:
        """One API call, resent on connection errors (safe: submissions carry an idempotency key)."""
        all_headers = {"Authorization": f"Bearer {key}", **(headers or {})}
        for attempt in range(TRANSPORT_RETRIES):
            try:
                return self._session().request(
                    method,
                    self.api_url + path,
                    json=json,
                    headers=all_headers,
                    timeout=self.settings.request_timeout_s,
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                log.warning("%s %s failed (%s), attempt %d", method, path, exc, attempt + 1)
                if self._stop.wait(TRANSPORT_PAUSE_S):
                    return None
        return None

    def _submit(self, record: TicketRecord, attempt: int) -> None:
        arrival = self._arrivals[record.index]
        key = self.key_for(record.branch_id)
        # Every try of one request carries the same key, as a well-behaved client's retries do, so
        # the shed tries of a request share one `rejected` record and the admitted one takes it over.
        idempotency = f"{self.settings.run_tag}-{record.request_id}"
        sent_at = time.time()
        response = self._request(
            "POST", "/v1/tickets", key, json=arrival.body(), headers={"Idempotency-Key": idempotency}
        )
        if response is None:
            with self._lock:
                record.outcome, record.error = "error", "no answer from the API"
            return
        with self._lock:
            if record.first_submit_at is None:
                record.first_submit_at = sent_at
        if response.status_code == 202:
            body = response.json()
            with self._lock:
                record.submissions += 1
                record.ticket_id = str(body["id"])
                record.status = str(body["status"])
                record.accepted_at = time.time()
            first = self.settings.poll_first_s
            self._timetable.push(time.monotonic() + first, _Action("poll", record, interval=first))
        elif response.status_code == 429:
            self._rejected(record, attempt, response)
        else:
            with self._lock:
                record.outcome = "error"
                record.error = f"HTTP {response.status_code}: {response.text[:300]}"

    def _rejected(self, record: TicketRecord, attempt: int, response: requests.Response) -> None:
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {}
        ticket_id = error.get("ticket_id") if isinstance(error, dict) else None
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        self._shed(record, attempt, retry_after, str(ticket_id) if ticket_id else None)

    def _shed(
        self, record: TicketRecord, attempt: int, retry_after: float | None, ticket_id: str | None
    ) -> None:
        delay = self.settings.retry.delay(retry_after, self._rng)
        retry = delay is not None and attempt < self.settings.retry.max_attempts
        with self._lock:
            record.submissions += 1
            record.rejections += 1
            if ticket_id:
                record.rejected_ids.append(ticket_id)
            if retry:
                record.retries += 1
            else:
                record.outcome = "rejected"
                record.finished_at = time.time()
        if retry and delay is not None:
            self._timetable.push(time.monotonic() + delay, _Action("submit", record, attempt=attempt + 1))

    def _poll(self, record: TicketRecord, interval: float) -> None:
        assert record.ticket_id is not None
        response = self._request("GET", f"/v1/tickets/{record.ticket_id}", self.key_for(record.branch_id))
        if response is not None and response.status_code == 200:
            view = response.json()
            with self._lock:
                record.polls += 1
                record.status = str(view["status"])
                if record.status in OUTCOMES:
                    self._finish(record, view)
                    return
        elif response is not None:
            log.warning("GET ticket %s answered HTTP %d", record.ticket_id, response.status_code)
        following = min(max(interval, 0.05) * self.settings.poll_growth, self.settings.poll_max_s)
        self._timetable.push(time.monotonic() + following, _Action("poll", record, interval=following))

    @staticmethod
    def _finish(record: TicketRecord, view: dict[str, Any]) -> None:
        timings = view.get("timings") or {}
        record.outcome = record.status
        record.finished_at = view.get("finished_at") or time.time()
        record.latency_s = timings.get("total_seconds")
        record.queue_wait_s = timings.get("queue_wait_seconds")
        record.ttft_s = timings.get("time_to_first_token_seconds")
        created, first_token = view.get("created_at"), view.get("first_token_at")
        if created is not None and first_token is not None:
            record.e2e_ttft_s = float(first_token) - float(created)

    def _cancel_leftovers(self) -> None:
        """The drain timeout passed: cancel accepted tickets still open, give up pending retries.

        New actions are refused first and those in flight are let finish, so no record changes
        under the settlement.
        """
        self._timetable.close()
        deadline = time.monotonic() + self.settings.request_timeout_s * TRANSPORT_RETRIES + 5
        while time.monotonic() < deadline:
            with self._lock:
                if self._busy == 0:
                    break
            time.sleep(0.05)
        with self._lock:
            open_records = [r for r in self.records if not r.terminal]
        for record in open_records:
            if record.ticket_id is None:
                with self._lock:
                    # Its last submission was shed and its retry is now dropped: the branch gave up.
                    if record.rejections:
                        record.outcome = "rejected"
                    else:
                        record.outcome, record.error = "error", "never submitted before the run ended"
                continue
            key = self.key_for(record.branch_id)
            response = self._request("DELETE", f"/v1/tickets/{record.ticket_id}", key)
            final = self._request("GET", f"/v1/tickets/{record.ticket_id}", key)
            with self._lock:
                if response is not None and response.status_code == 200 and response.json().get("cancelled"):
                    self.cancelled_leftovers += 1
                if final is not None and final.status_code == 200:
                    view = final.json()
                    record.status = str(view["status"])
                    if record.status in OUTCOMES:
                        self._finish(record, view)
                        continue
                record.outcome, record.error = "error", f"ticket still {record.status} after cancelling"
