"""Loads the Lua scripts in shared/lua once per connection and registers them with redis-py.

A script may start with `-- @include NAME` lines; each is replaced by shared/lua/lib/NAME.lua when
loaded, so the helpers that end a ticket are written once. The Lua that runs is the Lua in the repo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from redis import Redis
from redis.commands.core import Script

_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.MULTILINE)
SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "finish",
    "retry",
    "preempt",
    "extend",
    "cancel",
    "reap",
    "read",
    "breaker_record",
    "breaker_commit",
)


@cache
def load_lua(name: str) -> str:
    """The source of shared/lua/NAME.lua with its includes resolved."""
    lua_dir = resources.files("shared").joinpath("lua")
    source = lua_dir.joinpath(f"{name}.lua").read_text(encoding="utf-8")

    def include(match: re.Match[str]) -> str:
        return lua_dir.joinpath("lib", f"{match.group(1)}.lua").read_text(encoding="utf-8")

    return _INCLUDE.sub(include, source)


@dataclass(frozen=True)
class Scripts:
    """The registered scripts of one Redis client (EVALSHA, reloaded on NOSCRIPT by redis-py)."""

    enqueue: Script
    claim: Script
    finish: Script
    retry: Script
    preempt: Script
    extend: Script
    cancel: Script
    reap: Script
    read: Script
    breaker_record: Script
    breaker_commit: Script

    @classmethod
    def register(cls, redis: Redis) -> Scripts:
        return cls(**{name: redis.register_script(load_lua(name)) for name in SCRIPT_NAMES})
