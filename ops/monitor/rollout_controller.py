"""The monitor's part of a rollout: judge each wave, advance it at its end or roll back.

`judge` is pure: the candidate's error rate (its failed calls and the canary tickets its breaker
kept off it, shared/rollout_stats.py), shed rate and TTFT p95 over the wave against the
control's (the primary's calls in the same wave, so the same interval). A candidate short of
`min_samples` calls is not judged: the wave holds until it has them, because advancing on no
evidence would roll the candidate out blind. A control short of samples (late waves, when most
branches are on the candidate) is taken as error-free and shed-free, which only makes the
comparison stricter, and its TTFT is not compared.

On one Redis a rollback and its notify-hook job are written in one transaction, so a rollback is
never left unannounced and a notification never announces one that did not happen. On a Cluster rq
lives on a Redis of its own (it cannot run on a Cluster), so the transaction holds the queue's keys
alone (one slot) and the job follows it, as the alarm actions do: a monitor that dies in between
leaves the rollback done and its event recorded, only the hook uncalled.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from redis import Redis
from rq import Queue

from ops.monitor.dispatch import FAILED_JOB_TTL, JOB_TIMEOUT_MARGIN, RESULT_TTL, JobOptions, safe_id
from ops.monitor.rollout_notify import notify_rollback
from shared.keys import QueueKeys
from shared.policy import Policy, RolloutPolicy
from shared.redis_conn import is_cluster
from shared.rollout import RolloutState, RolloutStatus
from shared.rollout_stats import ArmStats, read_wave_stats
from shared.rollout_store import RolloutError, RolloutStore

log = logging.getLogger(__name__)

MONITOR_ACTOR = "monitor"


@dataclass(frozen=True)
class Verdict:
    action: Literal["advance", "hold", "rollback"]
    reason: str
    figures: dict[str, str | int | float] = field(default_factory=dict)


def _figures(candidate: ArmStats, control: ArmStats) -> dict[str, str | int | float]:
    out: dict[str, str | int | float] = {}
    for prefix, arm in (("candidate", candidate), ("control", control)):
        out[f"{prefix}_calls"] = arm.calls
        out[f"{prefix}_error_rate"] = round(arm.error_rate, 4)
        out[f"{prefix}_shed_rate"] = round(arm.rate("shed"), 4)
        p95 = arm.ttft_p95
        out[f"{prefix}_ttft_p95"] = "" if p95 is None else round(p95, 4)
    return out


def judge(candidate: ArmStats, control: ArmStats, policy: RolloutPolicy) -> Verdict:
    """Whether the wave's candidate did worse than the control by more than the policy's margins."""
    figures = _figures(candidate, control)
    if candidate.calls < policy.min_samples:
        return Verdict(
            "hold", f"the candidate answered {candidate.calls} of {policy.min_samples} calls", figures
        )
    control_judged = control.calls >= policy.min_samples
    compared = (
        ("error", candidate.error_rate, control.error_rate, policy.error_rate_margin),
        ("shed", candidate.rate("shed"), control.rate("shed"), policy.shed_rate_margin),
    )
    for outcome, cand_rate, control_rate, margin in compared:
        ctrl_rate = control_rate if control_judged else 0.0
        if cand_rate > ctrl_rate + margin:
            return Verdict(
                "rollback",
                f"{outcome} rate {cand_rate:.1%} against the control's {ctrl_rate:.1%} (margin {margin:.1%})",
                figures,
            )
    cand_p95, ctrl_p95 = candidate.ttft_p95, control.ttft_p95
    enough = min(len(candidate.ttft_samples), len(control.ttft_samples)) >= policy.min_samples
    if enough and cand_p95 is not None and ctrl_p95 is not None:
        limit = max(ctrl_p95 * (1 + policy.ttft_p95_margin), ctrl_p95 + policy.ttft_p95_slack_seconds)
        if cand_p95 > limit:
            return Verdict(
                "rollback",
                f"TTFT p95 {cand_p95:.3f} s against the control's {ctrl_p95:.3f} s "
                f"(margin {policy.ttft_p95_margin:.0%})",
                figures,
            )
    return Verdict("advance", "within the policy's margins", figures)


class RolloutController:
    """Steps one queue's rollout from the acting monitor's loop."""

    def __init__(
        self, client: Redis, rq_conn: Redis, policy: Policy, keys: QueueKeys, jobs: JobOptions
    ) -> None:
        self.redis = client
        self.policy = policy
        self.keys = keys
        self.store = RolloutStore(client, keys)
        self.actions_queue = Queue(jobs.actions_queue, connection=rq_conn)
        self.rq_apart = is_cluster(client)
        """rq's jobs live on a Redis of their own (the queue's is a Cluster, where rq cannot run)."""
        self.held_wave: tuple[str, int] | None = None
        """The wave last recorded as held for samples, so the hold is one event, not one per sample."""

    def tick(self, at: float) -> RolloutState | None:
        """Judge the running wave; returns the new state when it changed.

        A wave advances only once its interval is over, but a candidate already worse with enough
        samples is rolled back at once: waiting out the interval would only hurt more branches' tickets.
        """
        state = self.store.read()
        if state is None or state.status is not RolloutStatus.RUNNING:
            return None
        stats = read_wave_stats(self.redis, self.keys, state.id, state.wave)
        verdict = judge(stats["candidate"], stats["primary"], self.policy.rollout)
        if at < state.wave_due_at() and verdict.action != "rollback":
            return None
        try:
            return self._apply(state, verdict)
        except RolloutError as exc:  # an operator stepped in between reading and writing
            log.info("rollout %s: %s; judging again next sample", state.id, exc)
            return None

    def _apply(self, state: RolloutState, verdict: Verdict) -> RolloutState | None:
        if verdict.action == "hold":
            if self.held_wave != (state.id, state.wave):
                self.held_wave = (state.id, state.wave)
                self.store.note("hold", wave=state.wave, reason=verdict.reason, **verdict.figures)
            return None
        if verdict.action == "advance":
            new = self.store.advance(state.wave, MONITOR_ACTOR, {"reason": verdict.reason, **verdict.figures})
            log.warning(
                "rollout %s: wave %d passed (%s); now %s", state.id, state.wave, verdict.reason, new.status
            )
            return new
        job = self._notify_job(state, verdict)

        def enqueue_notify(pipe: Any) -> None:
            self.actions_queue.enqueue_many([job], pipeline=pipe)

        new = self.store.rollback(
            MONITOR_ACTOR,
            f"wave {state.wave}: {verdict.reason}",
            expected_wave=state.wave,
            also=None if self.rq_apart else enqueue_notify,
            figures=verdict.figures,
        )
        if self.rq_apart:
            self.actions_queue.enqueue_many([job])
        log.warning("rollout %s rolled back in wave %d: %s", state.id, state.wave, verdict.reason)
        return new

    def _notify_job(self, state: RolloutState, verdict: Verdict) -> Any:
        payload: dict[str, str | int | float] = {
            "queue": self.keys.queue,
            "rollout": state.id,
            "version": state.version,
            "candidate": state.candidate_url,
            "wave": state.wave,
            "reason": verdict.reason,
        }
        hooks = self.policy.hooks
        return Queue.prepare_data(
            notify_rollback,
            args=(self.keys.queue, payload, hooks.model_dump()),
            timeout=int(hooks.timeout_seconds) + JOB_TIMEOUT_MARGIN,
            result_ttl=RESULT_TTL,
            failure_ttl=FAILED_JOB_TTL,
            description=f"notify: rollout {state.id} of queue {self.keys.queue} rolled back",
            job_id=safe_id(f"{self.keys.queue}-rollback-{uuid.uuid4().hex[:12]}"),
        )
