"""The simulated GPUs behind one endpoint: one independent engine and memory view per GPU."""

from __future__ import annotations

from ops.lab.sim.config import SimConfig
from ops.lab.sim.engine import Clock, Engine, EngineUnavailable
from ops.lab.sim.gpus import SimulatedGpu


class EnginePool:
    """Routes each request to the least-loaded GPU that is up, as a data-parallel vLLM deployment would."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.clock = Clock(config.time_scale)
        self.engines = [Engine(config, index, self.clock) for index in range(config.gpus)]
        self.gpus = [SimulatedGpu(index, config) for index in range(config.gpus)]

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    async def stop(self) -> None:
        for engine in self.engines:
            await engine.stop()

    def pick(self) -> Engine:
        """The up engine with the fewest requests, then the fewest used blocks; raises when all are down."""
        up = [engine for engine in self.engines if engine.available_in() == 0]
        if not up:
            soonest = min(self.engines, key=lambda engine: engine.available_in())
            raise EngineUnavailable(soonest.gpu, soonest.available_in())
        return min(up, key=lambda engine: (*engine.load(), engine.gpu))

    def down(self) -> list[tuple[int, float]]:
        """(GPU, wall seconds until it is back) for each GPU recovering from a simulated OOM."""
        waits = [(engine.gpu, engine.available_in()) for engine in self.engines]
        return [(gpu, wait) for gpu, wait in waits if wait > 0]

    def describe_gpus(self) -> list[dict[str, object]]:
        return [
            gpu.describe(engine.scheduler.used_blocks)
            for gpu, engine in zip(self.gpus, self.engines, strict=True)
        ]
