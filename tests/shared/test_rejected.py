"""The rejected record's packed layout is the same on both sides: the Lua that writes it and the
Python that reads it; what it leaves out is derived or indexed elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import shared
from shared.rejected import PACKED, unpacked
from shared.ticket_builder import LEAN_FIELDS

LUA = Path(shared.__file__).parent / "lua" / "lib" / "rejected.lua"


def test_lua_packs_the_fields_python_unpacks_in_the_same_order() -> None:
    listed = re.search(r"REJECTED_PACKED = \{(.*?)\}", LUA.read_text(), re.DOTALL)
    assert listed is not None
    assert tuple(re.findall(r"'(\w+)'", listed.group(1))) == PACKED


def test_every_lean_field_is_packed_or_derived() -> None:
    # expires_at is created_at + ttl_seconds; the idempotency key lives in its own index.
    assert set(LEAN_FIELDS) - set(PACKED) == {"expires_at", "idempotency_key"}
    assert set(PACKED) - set(LEAN_FIELDS) == {"first_seen_at"}  # a retry's, written by the script


def test_unpacked_reads_as_a_ticket_hash() -> None:
    values = ["complaint", "0412", "1.0", "256", "600.0", "26", "0123456789abcdef", "1700000000.250"]
    raw = unpacked("01m8vrjad700002rs4rehmmwye", "\x1f".join(["queue_red", "3.5", *values]))
    assert raw["status"] == "rejected" and raw["shed_code"] == "queue_red" and raw["retry_after"] == "3.5"
    assert float(raw["expires_at"]) == 1700000600.25 and raw["id"] == "01m8vrjad700002rs4rehmmwye"
