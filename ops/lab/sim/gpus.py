"""Simulated GPU memory, as NVML would report it on a GPU that vLLM has claimed.

vLLM pre-allocates its KV cache, so NVML's used memory is weights + overhead + the whole KV cache no
matter how full the cache is; only other processes move it. `extra_used_bytes` stands in for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ops.lab.sim.config import SimConfig


@dataclass
class SimulatedGpu:
    index: int
    config: SimConfig
    extra_used_bytes: int = 0

    @property
    def base_used_bytes(self) -> int:
        profile = self.config.profile
        return profile.model_bytes + profile.overhead_bytes + self.config.kv_cache_bytes

    @property
    def used_bytes(self) -> int:
        return self.base_used_bytes + self.extra_used_bytes

    @property
    def free_bytes(self) -> int:
        return self.config.profile.gpu_total_bytes - self.used_bytes

    def set_pressure(self, extra_used_bytes: int) -> None:
        """Pretend another process holds `extra_used_bytes`; it cannot hold more than is free."""
        room = self.config.profile.gpu_total_bytes - self.base_used_bytes
        if not 0 <= extra_used_bytes <= room:
            raise ValueError(
                f"extra_used_bytes={extra_used_bytes} is not accepted; GPU {self.index} has room for "
                f"0 to {room} bytes beside vLLM"
            )
        self.extra_used_bytes = extra_used_bytes

    def describe(self, kv_blocks_used: int) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.config.profile.gpu_name,
            "total_bytes": self.config.profile.gpu_total_bytes,
            "used_bytes": self.used_bytes,
            "free_bytes": self.free_bytes,
            "model_bytes": self.config.profile.model_bytes,
            "kv_cache_bytes": self.config.kv_cache_bytes,
            "extra_used_bytes": self.extra_used_bytes,
            "kv_blocks_total": self.config.kv_blocks,
            "kv_blocks_used": kv_blocks_used,
            "block_size": self.config.block_size,
        }
