"""Which of several monitors acts: a Redis lock with expiry, renewed only by its owner.

redis-py's Lock does the SET NX PX and the owner-checked renewal (a token-comparing Lua script);
the token is the monitor's id, so the lock's value tells an operator which monitor is acting. A
monitor that dies stops renewing, and another takes over within `ttl_seconds`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from typing import cast

from redis import Redis
from redis.exceptions import LockError

from shared.keys import QueueKeys

log = logging.getLogger(__name__)


def new_monitor_id() -> str:
    """host:pid:random, unique per process start, readable in `tidegate status`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Leadership:
    def __init__(self, redis: Redis, keys: QueueKeys, monitor_id: str, ttl_seconds: float) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"lock ttl_seconds must be > 0, got {ttl_seconds}")
        self.redis = redis
        self.keys = keys
        self.monitor_id = monitor_id
        self.ttl_seconds = ttl_seconds
        self._lock = redis.lock(keys.monitor_lock, timeout=ttl_seconds, blocking=False, thread_local=False)
        self.acting = False

    def refresh(self) -> bool:
        """Renew the lock if held, else try to take it; returns whether this monitor acts now."""
        if self.acting:
            try:
                self._lock.reacquire()
                return True
            except LockError:
                log.warning("monitor %s lost the lock; standing by", self.monitor_id)
                self.acting = False
        self.acting = bool(self._lock.acquire(blocking=False, token=self.monitor_id))
        if self.acting:
            log.info("monitor %s is now acting", self.monitor_id)
        return self.acting

    def release(self) -> None:
        """Give the lock up (on a clean shutdown) so a standby takes over at once."""
        if self.acting:
            # Already expired or taken over: nothing of ours is left to release.
            with contextlib.suppress(LockError):
                self._lock.release()
            self.acting = False


def acting_monitor(redis: Redis, keys: QueueKeys) -> str | None:
    """The id of the monitor holding the lock, if any."""
    raw = cast("bytes | str | None", redis.get(keys.monitor_lock))
    return raw.decode() if isinstance(raw, bytes) else raw
