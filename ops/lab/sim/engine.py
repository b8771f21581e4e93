"""One simulated GPU: the scheduler driven by an asyncio loop that keeps model time in step with the wall.

Model time runs `time_scale` times faster than the wall clock. The loop plans a (macro) step, sleeps
until it would end, and commits it; an arrival or abort wakes it early, and then it commits the steps
that have elapsed, the one in flight included, so a new request joins at the next step boundary as in
vLLM. When the host falls behind, the loop catches up without sleeping; a lag beyond `MAX_LAG_REAL_S`
is dropped, which reads as a slower GPU rather than as time travel.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field

from ops.lab.sim.config import SimConfig
from ops.lab.sim.scheduler import KvCacheExhausted, Scheduler, Seq
from ops.lab.sim.stats import EngineStats

log = logging.getLogger("tidegate.sim")

# Longest a macro step may last in wall time. Tokens surface when it ends, so while anyone streams the
# cap is short enough for clients to time tokens about as a GPU would emit them; otherwise only the
# final answer matters and a longer cap saves wake-ups.
MACRO_STEP_REAL_S = 0.05
STREAM_STEP_REAL_S = 0.002
MAX_LAG_REAL_S = 0.5


class EngineUnavailable(RuntimeError):
    """The GPU is recovering from a simulated OOM; `retry_after_s` is in wall seconds."""

    def __init__(self, gpu: int, retry_after_s: float) -> None:
        super().__init__(
            f"simulated GPU {gpu} is restarting after CUDA out of memory; "
            f"it accepts requests again in {retry_after_s:.1f} s"
        )
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class RequestHandle:
    """What a request's HTTP handler waits on: progress events and, at the end, its outcome."""

    seq: Seq
    gpu: int
    streaming: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None


class Clock:
    """Model seconds since start: wall seconds times the time scale."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self._origin = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._origin) * self.time_scale

    def to_real(self, model_seconds: float) -> float:
        return model_seconds / self.time_scale


class Engine:
    """A simulated GPU's inference engine; start() its loop inside the server's event loop."""

    def __init__(self, config: SimConfig, gpu: int, clock: Clock) -> None:
        self.config = config
        self.gpu = gpu
        self.clock = clock
        self.stats = EngineStats()
        self.scheduler = Scheduler(config, self.stats)
        self.down_until: float | None = None
        self._time = 0.0
        self._arrivals = itertools.count()
        self._handles: dict[Seq, RequestHandle] = {}
        self._streaming = 0
        self._wake = asyncio.Event()
        # Model time of the first event since the loop last looked: the loop may wake later than that.
        self._event_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._time = self.clock.now()
        self._task = asyncio.create_task(self._run(), name=f"sim-engine-{self.gpu}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- requests ----------------------------------------------------------------------------------

    def available_in(self) -> float:
        """Wall seconds until the GPU takes requests again; 0 when it is up."""
        if self.down_until is None:
            return 0.0
        remaining = self.down_until - self.clock.now()
        if remaining <= 0:
            self.down_until = None
            log.info("GPU %d recovered from the simulated OOM and accepts requests again", self.gpu)
            return 0.0
        return self.clock.to_real(remaining)

    def load(self) -> tuple[int, int]:
        return len(self.scheduler.running) + len(self.scheduler.waiting), self.scheduler.used_blocks

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        target_tokens: int,
        priority: int,
        *,
        streaming: bool = False,
    ) -> RequestHandle:
        """Queue a request; raises EngineUnavailable while the GPU recovers from a crash."""
        retry_after = self.available_in()
        if retry_after > 0:
            raise EngineUnavailable(self.gpu, retry_after)
        seq = Seq(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            target_tokens=target_tokens,
            priority=priority,
            arrival=self.clock.now(),
            arrival_index=next(self._arrivals),
        )
        handle = RequestHandle(seq=seq, gpu=self.gpu, streaming=streaming)
        self._handles[seq] = handle
        self._streaming += streaming
        self.scheduler.add(seq)
        self._signal()
        return handle

    def abort(self, handle: RequestHandle, reason: str) -> None:
        """Stop a request now and give its KV blocks back; a no-op once it has finished."""
        blocks = handle.seq.blocks
        if self.scheduler.abort(handle.seq):
            self._forget(handle.seq)
            log.info(
                "Aborted request %s on GPU %d (%s); freed %d KV blocks",
                handle.seq.request_id,
                self.gpu,
                reason,
                blocks,
            )
            handle.done.set()
            handle.changed.set()
            self._signal()

    # -- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("The engine loop of GPU %d failed; requests on it will not complete", self.gpu)
            raise

    def _signal(self) -> None:
        if self._event_at is None:
            self._event_at = self.clock.now()
        self._wake.set()

    def _listen(self) -> None:
        self._wake.clear()
        self._event_at = None

    async def _loop(self) -> None:
        while True:
            if not self.scheduler.has_work():
                self._listen()
                await self._wake.wait()
                # An idle GPU starts on a request when it arrives, however late this loop wakes.
                event_at = self._event_at if self._event_at is not None else self.clock.now()
                self._time = max(self._time, event_at)
                continue
            self._time = max(self._time, self.clock.now() - MAX_LAG_REAL_S * self.clock.time_scale)
            try:
                span = STREAM_STEP_REAL_S if self._streaming else MACRO_STEP_REAL_S
                plan = self.scheduler.schedule(self._time, span * self.clock.time_scale)
            except KvCacheExhausted as exhausted:
                self._crash(exhausted)
                continue
            if plan is None:
                self._skip_to_next_arrival()
                continue
            end = plan.end(plan.steps)
            self._listen()
            delay = self.clock.to_real(end - self.clock.now())
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
            else:
                await asyncio.sleep(0)
            # An arrival or abort takes effect at the step boundary after it happened, not after the wake.
            event_at = self._event_at if self._event_at is not None else self.clock.now()
            elapsed = min(event_at, self.clock.now()) - plan.start
            steps = plan.steps if elapsed >= end - plan.start else plan.steps_started(elapsed)
            steps = min(plan.steps, steps)
            result = self.scheduler.commit(plan, steps)
            self._time = plan.end(steps)
            for seq in result.progressed:
                self._handles[seq].changed.set()
            for seq in result.finished:
                handle = self._forget(seq)
                log.info(
                    "Finished request %s on GPU %d: %s after %d tokens",
                    seq.request_id,
                    self.gpu,
                    seq.finish_reason,
                    seq.output_tokens,
                )
                handle.done.set()

    def _skip_to_next_arrival(self) -> None:
        """Nothing runs and the waiting head arrived after the lagging engine time: the GPU idled until then."""
        arrival = self.scheduler.next_arrival()
        if arrival is None or arrival <= self._time:
            # With nothing running every arrived request fits, so this would be a scheduler defect.
            raise RuntimeError(f"GPU {self.gpu}: the scheduler planned nothing at t={self._time:.3f}")
        self._time = arrival

    def _forget(self, seq: Seq) -> RequestHandle:
        handle = self._handles.pop(seq)
        self._streaming -= handle.streaming
        return handle

    def _crash(self, exhausted: KvCacheExhausted) -> None:
        """Crash mode: the OOM the project exists to prevent. Everything in flight fails; the GPU restarts."""
        failed = self.scheduler.fail_all()
        self.stats.oom_crashes += 1
        self.stats.finished["error"] += len(failed)
        self.down_until = self._time + self.config.oom_recovery_s
        message = oom_message(self.config, self.gpu, exhausted)
        log.error(
            "Simulated CUDA out of memory on GPU %d: %d requests failed; down for %.1f s (wall)",
            self.gpu,
            len(failed),
            self.clock.to_real(self.config.oom_recovery_s),
        )
        for seq in failed:
            handle = self._forget(seq)
            handle.error = message
            handle.changed.set()
            handle.done.set()


def oom_message(config: SimConfig, gpu: int, exhausted: KvCacheExhausted) -> str:
    """The error text a PyTorch OOM inside vLLM would carry, with this GPU's figures."""
    gib = 1024**3
    profile = config.profile
    tried = exhausted.needed * config.block_bytes / 1024**2
    return (
        f"CUDA out of memory. Tried to allocate {tried:.2f} MiB. GPU {gpu} has a total capacity of "
        f"{profile.gpu_total_bytes / gib:.2f} GiB of which 0 bytes is free: KV cache exhausted "
        f"({config.kv_blocks} blocks of {config.block_size} tokens all in use)."
    )
