"""Hung peers of a weight-plane session (issue 19: the hang bound of a relay session): a peer that stays
connected but stops reading, or stops sending mid-delta, ends the session after ``idle_timeout`` with a clear
error instead of holding it (and its buffers) for ever. Relays, actors and the trainer use these sessions."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from rollart.delta import DeltaWriter
from rollart.weights import transport as tp
from tests.unit.weights.weights_testlib import JOB, KEY, Endpoint

IDLE = 1.0


def big_delta() -> list[bytes]:
    """~36 MB of raw segments: more than loopback's socket buffers hold, so a stopped reader stalls the sender."""
    n = 12 * 1024 * 1024
    w = DeltaWriter(job=JOB, version=1, base_version=0, key=KEY, max_segment_bytes=256 * 1024, format_version=1)
    return [*w.add_tensor("w", "BF16", (n,), np.arange(n, dtype=np.int64), np.arange(n, dtype=np.uint16)), w.trailer()]


async def test_a_receiver_that_stops_reading_fails_the_sender_after_the_idle_bound() -> None:
    never = asyncio.Event()

    async def stuck(seg) -> None:  # the receiver is alive and connected but reads nothing more
        await never.wait()

    ep = Endpoint(idle_timeout=60.0)  # the receiver itself would wait long: the sender's bound is under test
    ep.on_segment = stuck
    addr = await ep.start()
    delta = big_delta()  # (encoding it takes seconds on a loaded machine: not part of the bound)
    try:
        t0 = time.monotonic()
        with pytest.raises(tp.SessionError, match="no progress"):
            await tp.send_delta(addr, delta, job=JOB, key=KEY, version=1, streams=2, timeout=30,
                                idle_timeout=IDLE)
        assert time.monotonic() - t0 < IDLE + 10
    finally:
        never.set()
        await ep.stop()


async def test_a_sender_that_stops_mid_delta_fails_the_receiver_after_the_idle_bound() -> None:
    delta = big_delta()
    stalled = asyncio.Event()

    async def stream():
        for raw in delta[:3]:
            yield raw
        stalled.set()
        await asyncio.Event().wait()  # the upstream hangs mid-delta, its connections open

    ep = Endpoint(idle_timeout=IDLE, reconnect_timeout=1.0)
    addr = await ep.start()
    sender = asyncio.ensure_future(tp.send_delta(addr, stream(), job=JOB, key=KEY, version=1, streams=2, timeout=60))
    try:
        await asyncio.wait_for(stalled.wait(), 10)
        t0 = time.monotonic()
        [session] = ep.sessions.values()
        await asyncio.wait_for(session.sig.wait_for(lambda: session.finished), IDLE + 10)
        assert time.monotonic() - t0 < IDLE + 10
        assert isinstance(session.error, tp.SessionError) and "no progress" in str(session.error)
        assert not ep.only_sink().tracker.verified
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        await ep.stop()
