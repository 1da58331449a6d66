"""Striped transport on loopback: exactness, stripes, handshakes, drops, corruption, forgery, back-pressure."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from rollart.delta import DeltaEncoder, decode_delta
from rollart.netem import LinkSpec, WanEmulator
from rollart.weights import transport as tp
from tests.unit.weights.weights_testlib import JOB, KEY, OTHER_KEY, Endpoint, model, segments, step


@pytest.fixture
def delta() -> list[bytes]:
    rng = np.random.default_rng(1)
    base = model(rng, layers=3, hidden=64)
    return segments(base, step(rng, base, 0.05), 1)


@pytest.mark.parametrize("streams", [1, 3])
async def test_push_roundtrip_is_exact(delta: list[bytes], streams: int) -> None:
    ep = Endpoint()
    addr = await ep.start()
    try:
        stats = await tp.send_delta(addr, delta, job=JOB, key=KEY, version=1, streams=streams, timeout=10)
        sink = ep.only_sink()
        assert sink.tracker.complete and sink.tracker.verified
        assert sink.ordered() == delta  # every segment once, byte for byte
        assert stats.hash == decode_delta(b"".join(delta), KEY).hash == sink.tracker.hash
        assert stats.segments == len(delta) and stats.resent == 0
    finally:
        await ep.stop()


async def test_pull_roundtrip_uses_every_stripe(delta: list[bytes]) -> None:
    ep = Endpoint(serve=delta)
    addr = await ep.start()
    try:
        sink = await tp.receive_delta(addr, job=JOB, key=KEY, version=1, streams=4, timeout=10)
        assert sink.ordered() == delta
        sender = next(iter(ep.sessions.values()))
        assert isinstance(sender, tp.SenderSession)
        used = {where[0] for where in sender._sent.values()}
        assert used == {0, 1, 2, 3}  # round-robin over all four connections
    finally:
        await ep.stop()


async def test_first_segment_leaves_before_extraction_ends() -> None:
    rng = np.random.default_rng(2)
    base = model(rng, layers=6, hidden=64)
    target = step(rng, base, 0.05)
    arrived: list[float] = []

    async def on_segment(seg) -> None:
        arrived.append(time.perf_counter())

    ep = Endpoint()
    ep.on_segment = on_segment
    addr = await ep.start()
    produced_last = 0.0

    async def stream():
        nonlocal produced_last
        enc = DeltaEncoder(base, target, job=JOB, version=1, key=KEY, max_segment_bytes=4096, format_version=2)
        for raw in enc.segments():
            yield raw
            await asyncio.sleep(0.002)  # the next tensor's extraction
        produced_last = time.perf_counter()

    try:
        await tp.send_delta(addr, stream(), job=JOB, key=KEY, version=1, streams=2, timeout=10)
        assert len(arrived) > 10
        assert arrived[0] < produced_last - 0.01  # the receiver had data long before the encoder finished
    finally:
        await ep.stop()


# ------------------------------------------------------------------------------------------------ handshakes


async def test_wrong_key_is_rejected_on_both_sides(delta: list[bytes]) -> None:
    ep = Endpoint()
    addr = await ep.start()
    try:
        with pytest.raises(tp.AuthenticationError, match="different job keys"):
            await tp.send_delta(addr, delta, job=JOB, key=OTHER_KEY, version=1, streams=2, timeout=5)
        await asyncio.sleep(0.05)
        assert ep.server.rejected >= 1 and "different job keys" in ep.server.last_rejection
        assert not ep.sinks  # nothing was admitted
    finally:
        await ep.stop()


async def test_wrong_job_is_rejected(delta: list[bytes]) -> None:
    ep = Endpoint()
    addr = await ep.start()
    try:
        with pytest.raises(tp.UnknownJobError, match="'other-job' is not served"):
            await tp.send_delta(addr, delta, job="other-job", key=KEY, version=1, streams=1, timeout=5)
    finally:
        await ep.stop()


async def test_a_refused_early_push_fails_with_the_listeners_reason(delta: list[bytes]) -> None:
    """Early data: the dialer sends segments right behind its AUTH; a refusal in the RESULT it has not waited
    for still ends the session with the listener's reason, and nothing reaches a sink."""
    ep = Endpoint()
    addr = await ep.start()

    async def refuse(hello: tp.Hello):
        raise tp.RefusedError("no room for version 1 here")

    ep.server.admit = refuse
    try:
        with pytest.raises(tp.RefusedError, match="no room for version 1"):
            await tp.send_delta(addr, delta, job=JOB, key=KEY, version=1, streams=2, timeout=10,
                                reconnect_timeout=1.0)
        assert not ep.sinks
    finally:
        await ep.stop()


async def test_early_data_saves_one_round_trip(delta: list[bytes]) -> None:
    """With a 500 ms RTT, a push without early data needs the handshake's two round trips before its first
    segment leaves, one with it (then one for the data and DONE in both)."""
    ep = Endpoint()
    addr = await ep.start()
    emu = WanEmulator(addr, LinkSpec(rtt=0.5))
    proxy = await emu.start()
    took = {}
    try:
        for early in (False, True):
            t0 = time.monotonic()
            stats = await tp.send_delta(proxy, delta, job=JOB, key=KEY, version=1, streams=2, timeout=10,
                                        early_data=early)
            took[early] = time.monotonic() - t0
            assert stats.resent == 0
        assert took[False] >= 1.5 and took[True] >= 1.0, took
        assert took[True] < took[False] - 0.25, took  # one RTT (0.5 s) less, with room for a loaded machine
        assert all(s.ordered() == delta for s in ep.sinks.values())
    finally:
        await emu.stop()
        await ep.stop()


async def test_client_with_a_bad_proof_gets_authentication_failed() -> None:
    """A dialer that skips checking the server and answers with a wrong proof."""
    ep = Endpoint()
    addr = await ep.start()
    host, port = addr.split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(tp.Hello(tp.ROLE_PUSH, JOB, 1, 1, 0, os.urandom(16)).encode())
        head = await reader.readexactly(tp._CHALLENGE.size)
        assert tp._CHALLENGE.unpack(head)[2] == tp.ST_OK
        writer.write(tp._AUTH.pack(0, b"\x01" * 32))
        status, n = tp._RESULT.unpack(await reader.readexactly(tp._RESULT.size))
        msg = (await reader.readexactly(n)).decode()
        assert status == tp.ST_AUTH and "authentication failed" in msg
        writer.close()
    finally:
        await ep.stop()


async def test_garbage_and_foreign_peers_get_clear_errors() -> None:
    ep = Endpoint()
    addr = await ep.start()
    host, port = addr.split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 64)
        head = await reader.readexactly(tp._CHALLENGE.size)
        _, _, status, _, _, n = tp._CHALLENGE.unpack(head)
        assert status == tp.ST_PROTOCOL and b"bad magic" in await reader.readexactly(n)
        writer.close()
        # Stream index outside 0..S-1 is refused before anything is sent.
        with pytest.raises(tp.ProtocolError, match="stream index"):
            await tp.dial(addr, tp.Hello(tp.ROLE_PUSH, JOB, 1, 2, 5, os.urandom(16)), KEY)
    finally:
        await ep.stop()

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"SSH-2.0-OpenSSH_9.2\r\n" + b"x" * 200)
        await w.drain()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port2 = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(tp.ProtocolError, match="not a RollArt weight-transport endpoint"):
            await tp.dial(f"127.0.0.1:{port2}", tp.Hello(tp.ROLE_PUSH, JOB, 1, 1, 0, os.urandom(16)), KEY)
    finally:
        server.close()


async def test_the_key_never_crosses_the_wire(delta: list[bytes]) -> None:
    ep = Endpoint()
    addr = await ep.start()
    emu = WanEmulator(addr)
    seen = bytearray()
    emu.tap = lambda direction, data: seen.extend(data)  # every byte read, both directions
    proxy = await emu.start()
    try:
        await tp.send_delta(proxy, delta, job=JOB, key=KEY, version=1, streams=2, timeout=10)
        assert len(seen) > sum(map(len, delta)) and KEY not in bytes(seen)
    finally:
        await emu.stop()
        await ep.stop()


# ---------------------------------------------------------------------------------------------------- faults


@pytest.mark.parametrize("role", ["push", "pull"])
async def test_dropped_connection_mid_stream_resumes_with_only_what_is_missing(delta: list[bytes], role: str) -> None:
    total = sum(map(len, delta))
    ep = Endpoint(serve=delta)
    addr = await ep.start()
    # Connection 1 (the second stripe) dies a third of the way through the data it carries.
    direction = "up" if role == "push" else "down"
    emu = WanEmulator(addr, LinkSpec(drop_after={1: total // 9}, fault_direction=direction))
    proxy = await emu.start()
    try:
        if role == "push":
            stats = await tp.send_delta(proxy, delta, job=JOB, key=KEY, version=1, streams=3, timeout=20)
            sink = ep.only_sink()
            assert stats.reconnects >= 1 and 1 <= stats.resent < len(delta) // 3
        else:
            sink = await tp.receive_delta(proxy, job=JOB, key=KEY, version=1, streams=3, timeout=20)
            sender = next(iter(ep.sessions.values()))
            assert 1 <= sender.segments_resent < len(delta) // 3
        assert emu.conns[1].dropped
        assert sink.ordered() == delta and sink.tracker.verified
        assert sink.tracker.duplicates <= 3  # resent segments are the lost ones, not the whole stream
    finally:
        await emu.stop()
        await ep.stop()


def _many_segments(n: int = 1 << 20) -> list[bytes]:
    """~3 MB in 64 KiB segments: enough that a stripe's buffers hold only part of what it carries."""
    from rollart.delta import DeltaWriter

    w = DeltaWriter(job=JOB, version=1, base_version=0, key=KEY, max_segment_bytes=64 * 1024, format_version=1)
    return [*w.add_tensor("w", "BF16", (n,), np.arange(n, dtype=np.int64), np.arange(n, dtype=np.uint16)), w.trailer()]


@pytest.mark.parametrize("role", ["push", "pull"])
async def test_a_stripe_stalled_in_the_tail_is_hedged_over_the_others(role: str) -> None:
    """Stripe 1 stalls for 20 s two thirds of the way through what it carries (a flow stuck in retransmission
    timeouts, still connected). The receiver reports the silent stripe (a RESUME on it), the sender sends its
    missing segments again over the other stripes, and the delta completes long before the stall ends."""
    delta = _many_segments()
    total = sum(map(len, delta))
    ep = Endpoint(serve=delta)
    addr = await ep.start()
    direction = "up" if role == "push" else "down"
    spec = LinkSpec(rate=3e6, stall_at={1: (total // 6, 20.0)}, fault_direction=direction)
    emu = WanEmulator(addr, spec)
    proxy = await emu.start()
    t0 = time.monotonic()
    try:
        if role == "push":
            stats = await tp.send_delta(proxy, delta, job=JOB, key=KEY, version=1, streams=4, timeout=15)
            sink, hedged = ep.only_sink(), stats.hedged
        else:
            sink = await tp.receive_delta(proxy, job=JOB, key=KEY, version=1, streams=4, timeout=15)
            hedged = next(iter(ep.sessions.values())).segments_hedged
        assert time.monotonic() - t0 < 10  # not the 20 s stall
        assert emu.conns[1].stalls == 1
        assert hedged >= 1
        assert sink.ordered() == delta and sink.tracker.verified
        assert sink.tracker.duplicates <= hedged + 2  # the stalled copies that still came are dropped
    finally:
        await emu.stop()
        await ep.stop()


async def test_a_silent_stripe_that_carried_nothing_more_costs_no_hedge(delta: list[bytes]) -> None:
    """Hedging re-sends only what the silent stripe carried and the receiver lacks: on a clean path the
    stripes that finished early are reported, nothing is sent twice."""
    ep = Endpoint()
    addr = await ep.start()
    emu = WanEmulator(addr, LinkSpec(rate=2e6))
    proxy = await emu.start()
    try:
        stats = await tp.send_delta(proxy, delta, job=JOB, key=KEY, version=1, streams=3, timeout=20)
        assert stats.hedged == 0 and stats.resent == 0
        assert ep.only_sink().ordered() == delta and ep.only_sink().tracker.duplicates == 0
    finally:
        await emu.stop()
        await ep.stop()


async def test_corrupted_byte_is_detected_and_repaired(delta: list[bytes]) -> None:
    ep = Endpoint()
    addr = await ep.start()
    # Flip a byte deep inside the data carried by connection 0 (past the handshake).
    emu = WanEmulator(addr, LinkSpec(corrupt_at={0: 3000}))
    proxy = await emu.start()
    try:
        stats = await tp.send_delta(proxy, delta, job=JOB, key=KEY, version=1, streams=2, timeout=20)
        sink = ep.only_sink()
        session = next(iter(ep.sessions.values()))
        assert emu.conns[0].corrupted
        assert session.faults == 1 and "ChecksumError" in session.last_fault  # CRC, not a forgery
        assert sink.ordered() == delta and stats.resent >= 1
    finally:
        await emu.stop()
        await ep.stop()


async def test_forged_segments_never_reach_the_sink() -> None:
    """A peer that passed the handshake but sends segments signed with another key."""
    rng = np.random.default_rng(3)
    base = model(rng)
    forged = segments(base, step(rng, base), 1, key=OTHER_KEY)
    ep = Endpoint(max_faults=2, reconnect_timeout=2.0)
    addr = await ep.start()
    try:
        with pytest.raises(tp.SessionError, match="AuthError"):
            await tp.send_delta(addr, forged, job=JOB, key=KEY, version=1, streams=1, timeout=10)
        sink = ep.only_sink()
        assert sink.tracker.received == 0 and not sink.segments
    finally:
        await ep.stop()


async def test_back_pressure_bounds_what_the_sender_runs_ahead() -> None:
    """A receiver that stops consuming stops the producer (bounded buffers, the sender awaits drain)."""
    from rollart.delta import DeltaWriter

    n = 12 * 1024 * 1024  # one dense bf16 tensor, every entry changed: ~36 MB of segments
    # format 1: raw streams, so the bytes on the wire are what the test sizes (format 2 would compress them)
    w = DeltaWriter(job=JOB, version=1, base_version=0, key=KEY, max_segment_bytes=256 * 1024, format_version=1)
    vals = np.arange(n, dtype=np.uint16)
    delta = [*w.add_tensor("w", "BF16", (n,), np.arange(n, dtype=np.int64), vals), w.trailer()]
    total = sum(map(len, delta))
    assert total > 24 * 1024 * 1024
    gate = asyncio.Event()

    async def blocked(seg) -> None:
        await gate.wait()

    ep = Endpoint()
    ep.on_segment = blocked
    addr = await ep.start()
    produced = 0

    async def stream():
        nonlocal produced
        for raw in delta:
            produced += len(raw)
            yield raw

    try:
        task = asyncio.ensure_future(tp.send_delta(addr, stream(), job=JOB, key=KEY, version=1, streams=2, timeout=30))
        await asyncio.sleep(1.0)
        ahead = produced
        await asyncio.sleep(0.5)
        # The producer is stalled (not merely slow) short of the end: what is in flight is bounded by the
        # session queue and the sockets' buffers (on loopback the kernel auto-tunes those to megabytes).
        assert produced == ahead < total, f"sender ran {produced} of {total} bytes ahead of a stalled receiver"
        gate.set()
        await task
        assert ep.only_sink().tracker.verified
    finally:
        await ep.stop()


# --------------------------------------------------------------------------------------------------- tracker


def test_tracker_any_order_resume_and_hash() -> None:
    from rollart.delta import segment as sg

    rng = np.random.default_rng(5)
    base = model(rng)
    delta = segments(base, step(rng, base), 1, max_segment_bytes=2048)
    segs = [sg.parse(raw, KEY) for raw in delta]
    t = tp.SegmentTracker(JOB, 1)
    order = rng.permutation(len(segs))
    for i in order[: len(segs) // 2]:
        assert t.add(segs[i])
    assert not t.add(segs[order[0]]) and t.duplicates == 1
    from_seq, missing = t.resume()
    have = set(order[: len(segs) // 2].tolist())
    assert from_seq == (len(segs) if len(segs) - 1 in have else max(have) + 1)
    assert set(missing) == set(range(from_seq)) - have
    for i in order[len(segs) // 2 :]:
        t.add(segs[i])
    assert t.complete and t.hash == decode_delta(b"".join(delta), KEY).hash
    assert t.resume() == (len(segs), [])


def test_tracker_rejects_foreign_segments() -> None:
    from rollart.delta import segment as sg
    from rollart.delta.errors import BaseMismatchError, MismatchError

    rng = np.random.default_rng(6)
    base = model(rng)
    v1 = step(rng, base)
    seg = sg.parse(segments(base, v1, 1)[0], KEY)
    with pytest.raises(MismatchError):
        tp.SegmentTracker(JOB, 2).add(seg)
    with pytest.raises(MismatchError):
        tp.SegmentTracker("other", 1).add(seg)
    with pytest.raises(BaseMismatchError):
        tp.SegmentTracker(JOB, 1, base_version=7).add(seg)
