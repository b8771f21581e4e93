"""One blocking read serves every waiting call of this API process: the live-stream hub.

A call waiting for its ticket registers a `LiveReader`; one task issues a single `XREAD BLOCK` over
all registered live streams (they share the queue's hash tag, so this also holds on a Cluster) and
hands each entry to its readers' asyncio queues. A waiting or streaming call therefore holds neither
a thread nor a Redis connection of its own. A new reader interrupts the blocked read by writing to
this process's wake stream, which every read also watches.

Several readers may follow one stream (a call waiting on a ticket and a stream of it, or a reader
that came back before its dropped connection was noticed), each from its own entry: a stream is read
from the earliest of its readers' positions, and a reply is handed to a reader only when the read
started at or before that reader's position (a reader that joined while a read from further on was
under way is served by the next read), each reader getting the entries after its own position.
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


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id (`<millis>-<sequence>`) as what orders it."""
    millis, _, sequence = entry_id.partition("-")
    return int(millis), int(sequence)


def entries_for(entries: list[IdEntry], position: str, read_from: str) -> list[IdEntry] | None:
    """The entries of a reply, read after `read_from`, that a reader at `position` has not had; None
    when the reply cannot serve it (the read started after its position: what lies between was not
    read, and the next read, from its position, brings it)."""
    at = entry_order(position)
    if entry_order(read_from) > at:
        return None
    return [entry for entry in entries if entry_order(entry[0]) > at]


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
        self._readers: dict[str, list[LiveReader]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wakes: set[asyncio.Task[None]] = set()

    @property
    def readers(self) -> int:
        return sum(len(readers) for readers in self._readers.values())

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
        self._readers.setdefault(reader.key, []).append(reader)
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
        readers = self._readers.get(reader.key, [])
        if reader in readers:
            readers.remove(reader)
        if not readers:
            self._readers.pop(reader.key, None)

    async def _run(self) -> None:
        while True:
            read_from = {
                key: min((reader.last_id for reader in readers), key=entry_order)
                for key, readers in self._readers.items()
            }
            try:
                streams: dict[str, str] = {self.wake_key: "$", **read_from}
                reply = await self.redis.xread(streams, count=ENTRIES_PER_READ, block=self.block_ms)  # type: ignore[arg-type]
                self._dispatch(reply or [], read_from)
            except redis.RedisError as exc:
                log.warning("live hub read failed (%s); waiting calls fall back to the ticket", exc)
                await asyncio.sleep(ERROR_PAUSE_SECONDS)
            except Exception:  # a bug must not end the hub: waiting calls would only see the ticket
                log.exception("live hub read failed unexpectedly; reading on")
                await asyncio.sleep(ERROR_PAUSE_SECONDS)

    def _dispatch(self, reply: list[tuple[str, list[IdEntry]]], read_from: dict[str, str]) -> None:
        for key, entries in reply:
            if key not in read_from:  # the wake stream, or a stream whose readers all left
                continue
            for reader in self._readers.get(key, []):
                fresh = entries_for(entries, reader.last_id, read_from[key])
                if fresh:
                    reader.last_id = fresh[-1][0]
                    for entry in fresh:
                        reader.entries.put_nowait(entry)
