"""Cut-through forwarding never forwards a bad segment: a relay hub receives a push whose bytes are corrupted
on one stripe while a downstream subscriber follows that version; the bad segment is dropped at the relay
(its stripe re-dialled and the segment fetched again), and the downstream receives only verified bytes."""

from __future__ import annotations

import asyncio

import numpy as np

from rollart.netem import LinkSpec, WanEmulator
from rollart.weights import transport as tp
from rollart.weights.hub import DeltaHub
from tests.unit.weights.weights_testlib import JOB, KEY, OTHER_KEY, model, segments, step


def _delta(seed: int, key: bytes = KEY) -> list[bytes]:
    rng = np.random.default_rng(seed)
    base = model(rng, layers=3, hidden=64)
    return segments(base, step(rng, base, 0.05), 1, key=key)


async def test_a_corrupted_segment_is_dropped_at_the_relay_and_never_forwarded() -> None:
    delta = _delta(1)
    relay = DeltaHub(job=JOB, key=KEY, relay_id="relay", pull_wait=30)
    await relay.start("127.0.0.1:0")
    emu = WanEmulator(relay.data_endpoint, LinkSpec(corrupt_at={0: 3000}))  # a flipped byte on stripe 0
    proxy = await emu.start()
    try:
        downstream = asyncio.ensure_future(
            tp.receive_delta(relay.data_endpoint, job=JOB, key=KEY, version=1, streams=2, timeout=30)
        )
        await asyncio.sleep(0.1)  # the subscriber follows the version before its first segment arrives
        stats = await tp.send_delta(proxy, delta, job=JOB, key=KEY, version=1, streams=2, timeout=30)
        sink = await downstream
        assert emu.conns[0].corrupted
        assert stats.resent >= 1  # the relay dropped the bad segment's stripe and fetched it again
        assert sink.ordered() == delta  # byte for byte: nothing bad was forwarded
        assert [bytes(relay.versions[1].get(s)) for s in relay.versions[1].seqs_in_order()] == delta
    finally:
        await emu.stop()
        await relay.stop()


async def test_forged_segments_stop_at_the_relay() -> None:
    """Segments signed with another key fail the push session; a follower of the version gets nothing."""
    forged = _delta(2, key=OTHER_KEY)
    relay = DeltaHub(job=JOB, key=KEY, relay_id="relay", pull_wait=30)
    await relay.start("127.0.0.1:0")
    try:
        got: list[bytes] = []

        async def follow() -> None:
            sink = tp.TrackerSink(tp.SegmentTracker(JOB, 1), on_segment=lambda seg: _keep(got, seg))
            await tp.receive_delta(relay.data_endpoint, job=JOB, key=KEY, version=1, sink=sink, timeout=3)

        downstream = asyncio.ensure_future(follow())
        try:
            await tp.send_delta(relay.data_endpoint, forged, job=JOB, key=KEY, version=1, streams=1, timeout=10)
        except tp.SessionError as exc:
            assert "AuthError" in str(exc)
        else:
            raise AssertionError("the relay accepted forged segments")
        await asyncio.gather(downstream, return_exceptions=True)
        assert got == []
        buf = relay.versions.get(1)
        assert buf is None or buf.tracker.received == 0
    finally:
        await relay.stop()


async def _keep(got: list[bytes], seg) -> None:  # type: ignore[no-untyped-def]
    got.append(bytes(seg.raw))
