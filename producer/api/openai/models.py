"""The model ids a caller may name: the alias `tidegate`, and every model a live worker serves.

Read from the worker registry at most every `cache_seconds`; a model seen once stays known to this
process, so a caller naming the served model is not turned away while its workers restart.
"""

from __future__ import annotations

import time

from fastapi.concurrency import run_in_threadpool
from redis import Redis

from shared.keys import QueueKeys
from shared.live_workers import read_live_workers

ALIAS = "tidegate"
"""Whatever the workers serve."""


class ModelCatalog:
    def __init__(self, client: Redis, keys: QueueKeys, cache_seconds: float = 2.0) -> None:
        self.client = client
        self.keys = keys
        self.cache_seconds = cache_seconds
        self._seen: dict[str, None] = {ALIAS: None}
        self._read_at = float("-inf")

    async def known(self) -> list[str]:
        if time.monotonic() - self._read_at >= self.cache_seconds:
            workers = await run_in_threadpool(read_live_workers, self.client, self.keys)
            for worker in workers:
                if worker.model:
                    self._seen.setdefault(worker.model, None)
            self._read_at = time.monotonic()
        return list(self._seen)
