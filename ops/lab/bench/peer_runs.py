"""The peer arms of the overload bench: the engine's own priority scheduling, SMG and LiteLLM.

Each arm starts its own simulators with the run's flags (the engine arm with `--scheduling-policy
priority`), plays the plan through `OpenLoopPlayer` (branches that send at planned times, retry shed
answers and give up at the ticket's TTL, like tidegate's; whole answers with `--client tickets`,
streamed ones with `--client openai`), samples a timeline, meters CPU and reads the simulators'
counters, as the tidegate and FIFO arms do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ops.lab.bench.cpu import CpuMeter
from ops.lab.bench.figures import Books
from ops.lab.bench.open_loop import OpenLoopPlayer, OpenLoopSettings, RequestShape
from ops.lab.bench.peers.litellm import MODEL_GROUP, LitellmGateway, litellm_command
from ops.lab.bench.peers.smg import PRIORITY_HEADER, SmgGateway, smg_class, smg_command
from ops.lab.bench.scenario import OverloadScenario, split_by_branch
from ops.lab.bench.sim_probe import served_model
from ops.lab.bench.systems import (
    HARNESS,
    OverloadSetup,
    SystemRun,
    read_counters,
    start_simulators,
    surge_cores,
    surge_meter,
    watch,
)
from ops.lab.bench.timeline import SystemState, Timeline
from ops.lab.traffic.workload import PlannedArrival
from shared.policy import Policy
from shared.scoring import effective_priority
from worker.config import WorkerConfig

PRIORITY_STEPS = 100
"""vLLM's `priority` is an integer: tidegate's fractional priority times this keeps its order."""


def engine_priority(policy: Policy, arrival: PlannedArrival) -> int:
    """The request's `priority` field for vLLM (lower runs first), from tidegate's own rule."""
    priority = effective_priority(
        policy.type_policy(arrival.type),
        urgent_level=arrival.urgent_level,
        vip_level=arrival.vip_level,
        is_bulk=arrival.is_bulk,
    )
    return round(priority * PRIORITY_STEPS)


def worker_batch() -> int:
    """The batch tidegate's worker keeps in flight by default: a peer's slots per GPU unless set."""
    return int(WorkerConfig.model_fields["max_batch"].default)


def peer_slots(scenario: OverloadScenario) -> int:
    """Requests a peer gateway sends one GPU at once: `--peer-slots`, else tidegate's worker batch."""
    return scenario.peer_slots or worker_batch()


class PeerRunner:
    """Runs one peer arm against the plan with the run's scenario, Redis-free."""

    def __init__(self, setup: OverloadSetup) -> None:
        self.setup = setup
        self._sim_pids: dict[str, int] = {}

    def engine(self, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        self.setup.progress(
            f"engine: {s.gpus} simulator(s) in {s.oom_mode} mode with --scheduling-policy priority, "
            "clients sending straight to them with the request's priority; no shedding"
        )
        with ExitStack() as cleanup:
            urls = self._simulators(cleanup, "engine", "priority")
            model = served_model(urls[0])

            def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
                body = _body(arrival, model) | {"priority": engine_priority(self.setup.policy, arrival)}
                return urls[arrival.index % len(urls)], body, {}

            return self._play(
                "engine",
                plan,
                shape,
                urls,
                {},
                notes=["clients send `priority`; the simulator runs --scheduling-policy priority"],
            )

    def smg(self, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        executable = smg_command(self.setup.progress)
        batch = peer_slots(s)
        self.setup.progress(
            f"smg: {s.gpus} simulator(s) in {s.oom_mode} mode behind SMG's priority scheduler "
            f"(peers/smg.yaml), each registered with max_running_requests={batch}"
        )
        with ExitStack() as cleanup:
            urls = self._simulators(cleanup, "smg", "fcfs")
            model = served_model(urls[0])
            gateway = SmgGateway(urls, batch, self.setup.results_dir / "smg")
            cleanup.callback(gateway.stop)
            gateway.start(executable)
            policy = self.setup.policy

            def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
                return gateway.url, _body(arrival, model), {PRIORITY_HEADER: smg_class(policy, arrival.type)}

            pids = {"smg": gateway.child.pid} if gateway.child and gateway.child.pid else {}
            notes = [
                f"smg {executable}: classes {', '.join(f'{t}={smg_class(policy, t)}' for t in self.setup.types)}"
            ]
            return self._play("smg", plan, shape, urls, pids, notes=notes)

    def litellm(self, plan: Sequence[PlannedArrival]) -> SystemRun:
        s = self.setup.scenario
        executable = litellm_command(self.setup.progress)
        batch = peer_slots(s)
        self.setup.progress(
            f"litellm: {s.gpus} simulator(s) in {s.oom_mode} mode behind the LiteLLM proxy, each deployment "
            f"capped at max_parallel_requests={batch} (a concurrency cap answering 429, no priority order)"
        )
        with ExitStack() as cleanup:
            urls = self._simulators(cleanup, "litellm", "fcfs")
            gateway = LitellmGateway(served_model(urls[0]), urls, batch, self.setup.results_dir / "litellm")
            cleanup.callback(gateway.stop)
            gateway.start(executable)

            def shape(arrival: PlannedArrival) -> tuple[str, dict[str, Any], dict[str, str]]:
                return gateway.url, _body(arrival, MODEL_GROUP), gateway.headers

            pids = {"litellm": gateway.child.pid} if gateway.child and gateway.child.pid else {}
            notes = [
                f"litellm {executable}: a concurrency cap of {batch} per deployment; LiteLLM's scheduler "
                "orders by priority only while every deployment cools down, so no priority is sent"
            ]
            return self._play("litellm", plan, shape, urls, pids, notes=notes)

    # ---- shared by the arms ------------------------------------------------------------------------
    def _simulators(self, cleanup: ExitStack, name: str, scheduling: str) -> list[str]:
        s = self.setup.scenario
        run_dir: Path = self.setup.results_dir / name
        sims = start_simulators(s.sim_settings(scheduling_policy=scheduling), s.gpus, run_dir, "sim")
        for child, _ in sims:
            cleanup.callback(child.stop, 5.0)
        self._sim_pids = {child.name: child.pid for child, _ in sims if child.pid}
        return [url for _, url in sims]

    def _play(
        self,
        name: str,
        plan: Sequence[PlannedArrival],
        shape: RequestShape,
        urls: Sequence[str],
        pids: dict[str, int],
        *,
        notes: list[str],
    ) -> SystemRun:
        s = self.setup.scenario
        honouring, _ = split_by_branch(plan, s.honour_retry_after, s.seed)
        settings = OpenLoopSettings(
            honouring=frozenset(a.branch_id for a in honouring),
            max_attempts=s.max_attempts,
            drain_timeout_s=s.drain_timeout_s,
            stream=s.client == "openai",
        )
        player = OpenLoopPlayer(plan, self.setup.policy, shape, settings)

        def probe() -> SystemState:
            return SystemState(0, player.open_requests, None)

        before = read_counters(urls)
        timeline = Timeline(probe, urls, s.sample_interval_s)
        cpu = CpuMeter(self._sim_pids | pids | {HARNESS: os.getpid()})
        surge = surge_meter(s)
        t0 = time.monotonic()
        timeline.start(t0)
        cpu.start()
        surge.start()
        player.start()
        try:
            watch(self.setup.progress, name, timeline, lambda: player.wait(0), t0)
        finally:
            player.close()
            samples = timeline.stop()
            cores = cpu.stop() | surge_cores(surge)
        after = read_counters(urls)
        return _system_run(name, player, self.setup.types, samples, after.since(before), cores, notes)


def _body(arrival: PlannedArrival, model: str) -> dict[str, Any]:
    ticket = arrival.body()
    return {"model": model, "prompt": ticket["prompt"], "max_tokens": ticket["max_tokens"]}


def _system_run(
    name: str,
    player: OpenLoopPlayer,
    types: Sequence[str],
    samples: Any,
    sim: Any,
    cores: dict[str, float],
    notes: list[str],
) -> SystemRun:
    records = sorted(player.records.values(), key=lambda r: r.index)
    streamed = player.settings.stream
    notes = [
        *notes,
        f"branches sent {'streamed' if streamed else 'whole-answer'} calls from one asyncio open loop",
    ]
    return SystemRun(
        name,
        records,
        samples,
        player.started_at,
        dict(player.usage),
        Books.from_ledger(player.ledger(types), records),
        sim,
        cores,
        notes,
        shed_codes=player.shed_by_type(types),
        client="openai" if streamed else "completions",
        send_lag=player.send_lag(),
    )
