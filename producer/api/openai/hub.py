"""One blocking read serves every waiting call of this API process: the live-stream hub.

A call waiting for its ticket registers a `LiveReader`; one task issues a single `XREAD BLOCK` over
all registered live streams (they share the queue's hash tag, so this also holds on a Cluster) and
hands each entry to its reader's asyncio queue. A waiting or streaming call therefore holds neither
a thread nor a Redis connection of its own. A new reader interrupts the blocked read by writing to
this process's wake stream, which every read also watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import redis
from redis.asyncio import Redis as AsyncRedis

from shared.keys import QueueKeys

log = logging.getLogger(__name__)

BLOCK_SECONDS = 5.0
"""Longest single blocking read; the client's read timeout is set above it."""
READ_TIMEOUT_SECONDS = BLOCK_SECONDS + 5.0
ENTRIES_PER_READ = 256
WAKE_EXPIRY_SECONDS = 60
ERROR_PAUSE_SECONDS = 0.5
START_ID = "0-0"

Entry = dict[str, str]
IdEntry = tuple[str, Entry]
"""An entry with its stream id (what a server-sent event carries as its `id`)."""


class LiveReader:
    """The entries of one ticket's live stream, in order, from the one after `after`."""

    def __init__(self, hub: LiveHub, key: str, after: str = START_ID) -> None:
        self.hub = hub
        self.key = key
        self.last_id = after
        self.entries: asyncio.Queue[IdEntry] = asyncio.Queue()

    async def next(self, timeout: float) -> IdEntry | None:
        """The next entry and its id, or None when none came within `timeout` seconds."""
        try:
            return await asyncio.wait_for(self.entries.get(), timeout)
        except TimeoutError:
            return None

    def close(self) -> None:
        self.hub.forget(self)


class LiveHub:
    def __init__(self, client: AsyncRedis, keys: QueueKeys, *, block_seconds: float = BLOCK_SECONDS) -> None:
        self.redis = client
        self.keys = keys
        self.block_ms = max(int(block_seconds * 1000), 1)
        self.wake_key = keys.api_wake(uuid.uuid4().hex[:12])
        self._readers: dict[str, LiveReader] = {}
        self._task: asyncio.Task[None] | None = None
        self._wakes: set[asyncio.Task[None]] = set()

    @property
    def readers(self) -> int:
        return len(self._readers)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="live-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(redis.RedisError):
            await self.redis.delete(self.wake_key)
        await self.redis.aclose()

    def open(self, ticket_id: str, after: str = START_ID) -> LiveReader:
        """Start reading `ticket_id`'s live stream after entry `after` (by default from its start,
        so nothing written is missed; a resumed reader names the last entry it received).

        The wake-up is sent in the background: the caller's answer need not wait for it.
        """
        reader = LiveReader(self, self.keys.live(ticket_id), after)
        self._readers[reader.key] = reader
        task = asyncio.get_running_loop().create_task(self._wake())
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)
        return reader

    async def _wake(self) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(self.wake_key, {"w": "1"}, maxlen=1)
            pipe.expire(self.wake_key, WAKE_EXPIRY_SECONDS)
            await pipe.execute()
        except redis.RedisError as exc:  # the hub's next read includes the reader anyway
            log.warning("could not wake the live hub: %s", exc)

    def forget(self, reader: LiveReader) -> None:
        if self._readers.get(reader.key) is reader:
            del self._readers[reader.key]

    async def _run(self) -> None:
        while True:
            streams: dict[str, str] = {self.wake_key: "$"}
            streams.update({key: reader.last_id for key, reader in self._readers.items()})
            try:
                reply = await self.redis.xread(streams, count=ENTRIES_PER_READ, block=self.block_ms)  # type: ignore[arg-type]
                self._dispatch(reply or [])
            except redis.RedisError as exc:
                log.warning("live hub read failed (%s); waiting calls fall back to the ticket", exc)
                await asyncio.sleep(ERROR_PAUSE_SECONDS)
            except Exception:  # a bug must not end the hub: waiting calls would only see the ticket
                log.exception("live hub read failed unexpectedly; reading on")
                await asyncio.sleep(ERROR_PAUSE_SECONDS)

    def _dispatch(self, reply: list[tuple[str, list[tuple[str, Entry]]]]) -> None:
        for key, entries in reply:
            reader = self._readers.get(key)
            if reader is None or not entries:
                continue
            reader.last_id = entries[-1][0]
            for entry in entries:
                reader.entries.put_nowait(entry)
