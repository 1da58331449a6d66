"""The ledger's Redis connection packs commands with hiredis: the bytes on the wire are redis-py's own."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection

from rollart_ledger.service import _HiredisPackingConnection


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 1, "rollart:ledger:", 1764633600123, "holder/é", b"\x00\xffblob", 0, -7),
        ("HSET", "k", "f", 0.1, "g", 1e20, "h", -0.0, "i", 2.5e-300, "j", float("inf")),
        ("SCRIPT LOAD", "return 1"),
        ("CONFIG RESETSTAT",),
        ("SET", "k", memoryview(b"view")),
    ],
)
def test_same_bytes_as_redis_py(args):
    ours = b"".join(bytes(x) for x in _HiredisPackingConnection().pack_command(*args))
    theirs = b"".join(bytes(x) for x in Connection().pack_command(*args))
    assert ours == theirs
