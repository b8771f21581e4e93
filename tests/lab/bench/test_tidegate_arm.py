"""tidegate's branches through its OpenAI front door, streamed from the open loop, against a real stack:
answers with their time to first token, shed answers counted by code (the degraded 200 and the 429),
open streams cancelled when the drain ends, and the branches' books equal to Redis's every time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from ops.lab.bench.open_loop import OpenLoopPlayer, OpenLoopSettings
from ops.lab.bench.tidegate_arm import front_door_shape
from ops.lab.stack import Stack, StackConfig
from ops.lab.traffic.accounting import check_accounting
from ops.lab.traffic.timeseries import Recorder
from ops.lab.traffic.workload import PlannedArrival
from shared.control import Mode, set_mode
from shared.policy import Policy
from tests.conftest import TEST_REDIS_URL, delete_queue_keys
from tests.waiting import wait_until

TYPES = ("loan_approval", "complaint", "archive_query")


def arrival(index: int, ticket_type: str, at: float = 0.0) -> PlannedArrival:
    return PlannedArrival(
        index=index,
        at=at,
        type=ticket_type,
        branch_id=f"branch-{index % 3:03d}",
        prompt_tokens=60,
        max_tokens=16,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir: Path = tmp_path_factory.mktemp("front-door-stack")
    queue = f"test-front-door-{run_dir.name[-6:]}"
    with Stack(StackConfig(redis_url=TEST_REDIS_URL, queue_name=queue, run_dir=run_dir, gpus=1)) as running:
        yield running
        delete_queue_keys(running.redis, queue)


def play(stack: Stack, policy: Policy, plan: list[PlannedArrival], **settings: float) -> OpenLoopPlayer:
    """Play `plan` streamed through the front door; the books must balance against Redis's."""
    recorder = Recorder(stack.redis, policy, stack.queue_name)
    recorder.start()
    keys = {a.branch_id: stack.branch_key(a.branch_id) for a in plan}
    rules = OpenLoopSettings(honouring=frozenset(), stream=True, tickets=True, **settings)  # type: ignore[arg-type]
    player = OpenLoopPlayer(plan, policy, front_door_shape(stack.api_url, keys), rules)
    player.start()
    assert player.wait(60), "the player did not finish"
    player.close()
    recorder.stop()
    records = sorted(player.records.values(), key=lambda r: r.index)
    check = check_accounting(recorder.counts_since_start(), records, list(TYPES), player.ledger(list(TYPES)))
    assert check.holds, check.mismatches
    return player


def test_streamed_answers_carry_their_ticket_and_first_token(stack: Stack, policy: Policy) -> None:
    plan = [
        arrival(0, "loan_approval"),
        arrival(1, "complaint", at=0.05),
        arrival(2, "archive_query", at=0.1),
    ]
    player = play(stack, policy, plan)
    for record in player.records.values():
        assert record.outcome == "done" and record.submissions == 1 and record.ticket_id, record
        assert record.client_ttft_s is not None and record.end_to_end_s is not None
        assert 0 < record.client_ttft_s < record.end_to_end_s
        assert player.usage[record.index] > 0
    assert not player.shed_codes


def test_streams_open_when_the_drain_ends_are_cancelled_and_their_tickets_settled(
    stack: Stack, policy: Policy
) -> None:
    stack.stop_worker(0)  # nothing runs any more: admitted tickets stay queued, their streams open
    try:
        plan = [arrival(i, "archive_query", at=0.05 * i) for i in range(3)]
        player = play(stack, policy, plan, drain_timeout_s=1.0)
    finally:
        stack.start_worker(0)
    assert [r.outcome for r in player.records.values()] == ["cancelled"] * 3
    assert player.cancelled_leftovers == 3
    assert all(r.ticket_id and r.submissions == 1 for r in player.records.values())
    assert player.submission_outcomes == {("archive_query", "cancelled"): 3}


def test_shed_answers_are_counted_by_code_and_retried(stack: Stack, policy: Policy) -> None:
    set_mode(stack.redis, stack.queue_keys, Mode.CRITICAL_ONLY, actor="test")
    try:
        probe = arrival(99, "archive_query")
        key = stack.branch_key(probe.branch_id)
        wait_until(  # the API caches the control state for a moment: wait until it refuses
            lambda: (
                requests.post(
                    f"{stack.api_url}/v1/tickets",
                    json=probe.body(),
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=5,
                ).status_code
                == 429
            ),
            10,
            "the API to apply critical-only",
        )
        plan = [arrival(0, "complaint"), arrival(1, "loan_approval"), arrival(2, "archive_query", at=0.1)]
        player = play(stack, policy, plan, retry_delay_s=0.05, max_attempts=3)
    finally:
        set_mode(stack.redis, stack.queue_keys, Mode.NORMAL, actor="test")
    complaint, loan, archive = (player.records[i] for i in range(3))
    assert policy.type_policy("complaint").shed_answer == "degraded"  # a 200 that is still a shed
    assert policy.type_policy("archive_query").shed_answer == "error"  # a 429
    for shed in (complaint, archive):
        assert (shed.submissions, shed.rejections, shed.retries, shed.outcome) == (3, 3, 2, "rejected")
        assert len(shed.rejected_ids) == 3 and shed.ticket_id is None
    assert dict(player.shed_codes) == {
        ("complaint", "200 critical_only"): 3,
        ("archive_query", "429 critical_only"): 3,
    }
    assert loan.outcome == "done" and loan.client_ttft_s is not None
    assert (complaint.end(), archive.end()) == ("degraded", "gave_up")
