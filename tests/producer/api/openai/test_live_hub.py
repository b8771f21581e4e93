"""The live-stream hub: every reader of a stream gets each entry after its own position exactly once,
however many read the stream and whenever each joined."""

from __future__ import annotations

import asyncio

from redis import Redis

from producer.api.openai.hub import READ_TIMEOUT_SECONDS, IdEntry, LiveHub, LiveReader, entries_for
from shared.config import Settings
from shared.keys import QueueKeys
from shared.redis_conn import connect_async_from

TICKET = "t-hub"
WAIT_S = 10.0
ABSENCE_S = 0.2
"""How long a reader that has had everything is watched for a duplicate."""


def ids(entries: list[IdEntry] | None) -> list[str] | None:
    return None if entries is None else [entry_id for entry_id, _ in entries]


def test_a_reply_serves_the_readers_at_or_after_where_the_read_began() -> None:
    reply: list[IdEntry] = [("5-0", {}), ("5-1", {}), ("9-0", {})]
    assert ids(entries_for(reply, "4-0", read_from="4-0")) == ["5-0", "5-1", "9-0"]
    assert ids(entries_for(reply, "5-0", read_from="4-0")) == ["5-1", "9-0"]  # had the first already
    assert ids(entries_for(reply, "9-0", read_from="4-0")) == []
    # A reader that came back at 3-0 while a read from 4-0 was under way: the entry after 3-0 was not
    # read, so this reply must not be handed to it (it would skip that entry); the next read serves it.
    assert entries_for(reply, "3-0", read_from="4-0") is None


async def _collect(reader: LiveReader, count: int) -> list[str]:
    got: list[str] = []
    while len(got) < count:
        entry = await reader.next(WAIT_S)
        assert entry is not None, f"{reader.key}: {len(got)} of {count} entries came"
        got.append(entry[1]["n"])
    return got


def test_readers_of_one_stream_each_get_every_entry_after_their_position_once(
    redis_client: Redis, redis_url: str, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    stream = keys.live(TICKET)

    async def scenario() -> tuple[list[str], list[str], list[str], list[str]]:
        hub = LiveHub(
            connect_async_from(
                Settings(redis_url=redis_url, queue_name=queue_name), read_timeout=READ_TIMEOUT_SECONDS
            ),
            keys,
        )
        hub.start()
        try:
            first = hub.open(TICKET)
            written = [redis_client.xadd(stream, {"n": str(n)}) for n in range(4)]
            head = await _collect(first, 4)
            # A second reader from the start and one resuming after the second entry join the first,
            # which stays open; four more entries follow.
            again = hub.open(TICKET)
            resumed = hub.open(TICKET, after=str(written[1]))
            for n in range(4, 8):
                redis_client.xadd(stream, {"n": str(n)})
            tails = await asyncio.gather(_collect(first, 4), _collect(again, 8), _collect(resumed, 6))
            for reader in (first, again, resumed):
                assert await reader.next(ABSENCE_S) is None  # nothing twice
                reader.close()
            assert hub.readers == 0
            return head + tails[0], tails[1], tails[2], [str(n) for n in range(8)]
        finally:
            await hub.stop()

    try:
        first, again, resumed, everything = asyncio.run(scenario())
    finally:
        redis_client.delete(stream)
    assert first == everything
    assert again == everything
    assert resumed == everything[2:]
