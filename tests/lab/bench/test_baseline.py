"""The seed's FIFO baseline on real Redis and a real simulator: replies, crashes, client retries, books."""

from __future__ import annotations

import threading
import time

from redis import Redis

from ops.lab.bench.baseline import BaselineJob, BaselineReply, FifoBaseline
from ops.lab.bench.baseline_player import BaselinePlayer, SeedClientSettings
from ops.lab.sim.process import SimulatorProcess
from ops.lab.traffic.records import OUTCOMES
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy
from tests.waiting import wait_until


class Replies:
    def __init__(self) -> None:
        self.items: list[BaselineReply] = []
        self.lock = threading.Lock()

    def __call__(self, reply: BaselineReply) -> None:
        with self.lock:
            self.items.append(reply)

    def wait_for(self, count: int, timeout: float = 30.0) -> list[BaselineReply]:
        def enough() -> list[BaselineReply] | None:
            with self.lock:
                return list(self.items) if len(self.items) >= count else None

        return wait_until(enough, timeout, f"{count} replies")


def job(index: int, max_tokens: int = 8, words: int = 20) -> BaselineJob:
    return BaselineJob(f"j{index}", "complaint", " ".join(["word"] * words), max_tokens, time.time())


def test_consumers_answer_in_fifo_order_with_the_models_usage(redis_url: str) -> None:
    replies = Replies()
    with SimulatorProcess(time_scale=20) as sim:
        fifo = FifoBaseline(redis_url, [sim.base_url], replies, concurrency=1).start()
        try:
            for index in range(4):
                fifo.submit(job(index))
            got = replies.wait_for(4)
        finally:
            fifo.request_stop()
            fifo.join(10)
            fifo.cleanup()
    assert [reply.job_id for reply in got] == ["j0", "j1", "j2", "j3"]
    assert all(reply.ok and reply.status_code == 200 for reply in got)
    assert all(reply.prompt_tokens >= 20 and 1 <= reply.completion_tokens <= 8 for reply in got)
    assert all(reply.queued_at <= reply.started_at <= reply.finished_at for reply in got)
    assert fifo.requests_sent == 4


def test_fixed_concurrency_overruns_the_kv_cache_and_crash_errors_come_back(redis_url: str) -> None:
    replies = Replies()
    # 40 blocks hold 640 tokens; four requests growing to 500 tokens each cannot all fit.
    with SimulatorProcess(
        kv_blocks=40, max_model_len=512, max_num_seqs=8, time_scale=20, oom_mode="crash", oom_recovery_s=600
    ) as sim:
        fifo = FifoBaseline(redis_url, [sim.base_url], replies, concurrency=4).start()
        try:
            for index in range(8):
                fifo.submit(job(index, max_tokens=400, words=100))
            got = replies.wait_for(8)
        finally:
            fifo.request_stop()
            fifo.join(10)
            fifo.cleanup()
    statuses = {reply.status_code for reply in got if not reply.ok}
    assert 500 in statuses, "the requests in flight at the crash fail with the OOM error"
    assert 503 in statuses, "the jobs behind them meet a GPU that is restarting"
    assert any("CUDA out of memory" in (reply.error or "") for reply in got)


def plan(
    count: int, spacing: float, ticket_type: str = "complaint", max_tokens: int = 16
) -> list[PlannedArrival]:
    return [
        PlannedArrival(
            index=i,
            at=i * spacing,
            type=ticket_type,
            branch_id=f"branch-{i % 3:03d}",
            prompt_tokens=60,
            max_tokens=max_tokens,
        )
        for i in range(count)
    ]


def test_every_submission_ends_once_when_clients_give_up_and_resend(redis_url: str, policy: Policy) -> None:
    # Tiny answer timeout with a slow GPU: branches stop waiting, resend, and finally some get through.
    settings = SeedClientSettings(
        answer_timeout_s=0.3, retry_delay_s=0.05, max_attempts=3, drain_timeout_s=5.0
    )
    with SimulatorProcess(time_scale=1, max_model_len=4096) as sim:
        player = BaselinePlayer(
            redis_url, [sim.base_url], plan(6, 0.05, max_tokens=64), policy, concurrency=1, settings=settings
        )
        player.start()
        assert player.wait(30)
        player.close()
    records = player.records
    assert all(record.outcome in ("done", "expired", "cancelled") for record in records)
    assert any(record.retries > 0 for record in records)
    ended = sum(player.submission_outcomes.values())
    assert ended == sum(record.submissions for record in records)
    assert set(outcome for _, outcome in player.submission_outcomes) <= set(OUTCOMES)
    done = [record for record in records if record.outcome == "done"]
    assert all(player.usage[record.index][1] >= 1 for record in done)
    assert all(record.latency_s is not None and record.latency_s <= 0.3 + 0.5 for record in done)


def test_answered_requests_end_done_and_the_fifo_is_removed(
    redis_url: str, redis_client: Redis, policy: Policy
) -> None:
    with SimulatorProcess(time_scale=20) as sim:
        player = BaselinePlayer(redis_url, [sim.base_url], plan(10, 0.02), policy, concurrency=4)
        player.start()
        assert player.wait(30)
        player.close()
    assert redis_client.exists(player.baseline.fifo_key) == 0
    assert [record.outcome for record in player.records] == ["done"] * 10
    assert player.submission_outcomes == {("complaint", "done"): 10}
    assert all(record.retries == 0 and record.submissions == 1 for record in player.records)
