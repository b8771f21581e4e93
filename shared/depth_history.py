"""Depth per type over the last minutes, as the acting monitor sampled it: a capped stream, so the
status page draws the same history whichever API replica serves it and after a reload.

Written in the monitor's publishing transaction (one XADD a sample), read by `producer.status`.
"""

from __future__ import annotations

from typing import Any, cast

from redis import Redis

from shared import clock
from shared.keys import QueueKeys

MAXLEN = 3600
"""An hour of one-second samples; older ones are trimmed (approximately, so trimming stays cheap)."""
READ_LIMIT = 600
WINDOW_SECONDS = 300


def append_depth(pipe: Any, keys: QueueKeys, at: float, depth_by_type: dict[str, int]) -> None:
    """Queue one sample on `pipe` (a client or a pipeline)."""
    fields: dict[str, str] = {"at": repr(at)}
    fields.update({f"t:{name}": str(depth) for name, depth in depth_by_type.items()})
    pipe.xadd(keys.depth_history, fields, maxlen=MAXLEN, approximate=True)


def read_depth_history(
    redis: Redis, keys: QueueKeys, window_seconds: float = WINDOW_SECONDS, now: float | None = None
) -> list[dict[str, Any]]:
    """Samples of the last `window_seconds`, oldest first: `{"at": t, "depth_by_type": {...}}`."""
    since = (clock.now() if now is None else now) - window_seconds
    entries = cast("list[tuple[str, dict[str, str]]]", redis.xrevrange(keys.depth_history, count=READ_LIMIT))
    samples = []
    for _, fields in reversed(entries):
        try:
            at = float(fields["at"])
        except (KeyError, ValueError):
            continue
        if at >= since:
            by_type = {k[2:]: int(v) for k, v in fields.items() if k.startswith("t:")}
            samples.append({"at": at, "depth_by_type": by_type})
    return samples
