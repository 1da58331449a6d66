"""The WAN emulator keeps its configured rates, and never exceeds them: its token bucket keeps capacity when
this process wakes up late (a loaded machine), and no 100 ms window carries more than the rate allows.

The bucket and window tests pass times in (no clock, no load dependence). The end-to-end tests push real
bytes through a real emulator on loopback while the event loop is made to wake up late on purpose, and check
every release the emulator made.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from rollart.netem import LinkSpec, RateWindow, TokenBucket, WanEmulator

RATE = 4e6  # bytes/s
CHUNK = 64 * 1024  # 16 ms per chunk at RATE; the burst is one chunk
LATE = 0.04  # every 4th wake-up comes this late (the process was busy elsewhere)


def _rate(slack: float, chunks: int = 24, late_every: int = 4, late: float = LATE) -> float:
    """Send ``chunks`` chunks as fast as the bucket allows, waking exactly on time except every
    ``late_every``-th wake-up, which comes ``late`` seconds late; the rate achieved."""
    now = 100.0
    bucket = TokenBucket(RATE, CHUNK, slack, now)
    bucket.take(CHUNK, now)  # spend the initial burst
    t0 = now
    for i in range(chunks):
        now = bucket.ready_at(CHUNK, now)
        if late_every and i % late_every == late_every - 1 and i < chunks - 1:
            now += late
        bucket.take(CHUNK, now)
    return chunks * CHUNK / (now - t0)  # the bucket was empty at t0: RATE when every take came on time


def test_late_wakeups_keep_the_rate_with_slack() -> None:
    kept = _rate(slack=0.05)
    lost = _rate(slack=0.0)
    # Without slack each late wake-up loses its 40 ms; with it the lateness is made up by the next takes.
    assert kept > 0.95 * RATE, kept
    assert lost < 0.8 * RATE, lost


def test_slack_never_exceeds_the_rate() -> None:
    """Tokens come only from elapsed time: on time or late, the long-run rate is at most RATE."""
    assert _rate(0.05, chunks=40, late_every=0) <= 1.001 * RATE
    assert _rate(0.05, chunks=40, late_every=1, late=0.01) <= 1.001 * RATE


def test_lateness_beyond_slack_is_lost() -> None:
    assert _rate(slack=0.01) < 0.9 * RATE  # 40 ms late, 10 ms kept


def test_a_stall_is_not_made_up() -> None:
    """After ``reset`` (the emulator calls it after a stall) only one burst is left: the stalled time is lost."""
    for reset in (True, False):
        now = 100.0
        bucket = TokenBucket(RATE, CHUNK, 0.05, now)
        bucket.take(CHUNK, now)
        now += 0.05  # the stall
        if reset:
            bucket.reset(now)
        wait = bucket.ready_at(2 * CHUNK, now) - now
        if reset:  # one chunk's burst in the bucket: waits one chunk time for the second
            assert wait == pytest.approx(CHUNK / RATE)
        else:
            assert wait == 0.0


def test_ready_at_looks_ahead_without_spending() -> None:
    bucket = TokenBucket(RATE, CHUNK, 0.05, 100.0)
    bucket.take(CHUNK, 100.0)
    assert bucket.ready_at(CHUNK, 100.0) == pytest.approx(100.0 + CHUNK / RATE)
    bucket.ready_at(CHUNK, 200.0)  # a look far ahead must not hand out future tokens now
    assert bucket.available(100.0) == pytest.approx(0.0)


def test_window_room_and_ready_at() -> None:
    w = RateWindow(RATE, 0.1)  # 400 kB per 100 ms
    w.record(300_000, 10.0)
    assert w.room(10.05) == pytest.approx(100_000)
    assert w.ready_at(200_000, 10.05) == pytest.approx(10.1)  # when the first record leaves the window
    assert w.room(10.1) == pytest.approx(400_000)  # (t - 0.1, t]: a record exactly 100 ms old is out


# --------------------------------------------------------------------------------------- end to end


def windows_ok(releases: list[tuple[float, int]], rate: float, window: float = 0.1) -> tuple[bool, float]:
    """Whether every window (t - window, t] holds at most rate * window bytes; the fullest window's bytes."""
    worst = 0.0
    j = 0
    total = 0
    for t, n in releases:
        total += n
        while releases[j][0] <= t - window:
            total -= releases[j][1]
            j += 1
        worst = max(worst, total)
    return worst <= rate * window + 1e-6, worst


async def _push_through(spec: LinkSpec, streams: int, nbytes: int, late_every: float, late: float) -> tuple:
    """Push ``nbytes`` over each of ``streams`` connections through an emulator in this process while the
    event loop is blocked for ``late`` seconds every ``late_every`` seconds (a loaded machine)."""
    got = [0] * streams
    done = asyncio.Event()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        i = int((await reader.readexactly(1))[0])
        got[i] += 1
        while data := await reader.read(1 << 20):
            got[i] += len(data)
        if sum(got) == streams * nbytes:
            done.set()
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    emu = WanEmulator(f"127.0.0.1:{port}", spec)
    proxy = await emu.start()
    loop = asyncio.get_running_loop()
    stop = False

    def hog() -> None:  # another process's turn on the CPU: this loop wakes up late
        if not stop:
            time.sleep(late)
            loop.call_later(late_every, hog)

    loop.call_later(late_every, hog)
    payload = bytes(nbytes - 1)

    async def send(i: int) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", int(proxy.rpartition(":")[2]))
        writer.write(bytes([i]) + payload)
        await writer.drain()
        writer.write_eof()
        await done.wait()
        writer.close()

    t0 = loop.time()
    try:
        await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(streams))), 60)
    finally:
        stop = True
        elapsed = loop.time() - t0
        await emu.stop()
        server.close()
    assert got == [nbytes] * streams
    return emu, elapsed


async def test_the_emulator_never_exceeds_its_rates_in_any_100ms_window() -> None:
    """Real sockets, late wake-ups (the loop blocked 30 ms every 60 ms): per connection and for the link, no
    100 ms window carries more than the configured rate allows, and the late capacity is still made up."""
    rate, link = 2e6, 3e6
    spec = LinkSpec(rate=rate, link_rate=link, rtt=0.02, record=True)
    emu, elapsed = await _push_through(spec, streams=2, nbytes=1_500_000, late_every=0.06, late=0.03)
    assert emu.releases
    for c in range(2):
        mine = [(t, n) for t, n, i, d in emu.releases if i == c and d == "up"]
        ok, worst = windows_ok(mine, rate)
        assert ok, f"connection {c}: {worst:.0f} bytes in 100 ms, rate allows {rate * 0.1:.0f}"
    ok, worst = windows_ok([(t, n) for t, n, _, _ in emu.releases], link)
    assert ok, f"link: {worst:.0f} bytes in 100 ms, rate allows {link * 0.1:.0f}"
    # 3 MB at 3 MB/s: ~1 s plus the delay; the lost 30 ms per 60 ms are made up (the slack), within 25%.
    assert elapsed < 1.25 * (2 * 1_500_000 / link) + 0.3, elapsed
    assert elapsed > 2 * 1_500_000 / link - 0.11  # never faster than the link (one window of head start)


async def test_stalls_cost_time_and_are_counted() -> None:
    spec = LinkSpec(rate=4e6, stall_prob=0.5, stall_s=0.05, record=True)  # ~7 of 15 chunks
    emu, elapsed = await _push_through(spec, streams=1, nbytes=1_000_000, late_every=10.0, late=0.0)
    stalls = emu.conns[0].stalls
    assert stalls >= 1
    assert elapsed >= 1_000_000 / 4e6 + 0.9 * stalls * 0.05 - 0.11
    ok, worst = windows_ok([(t, n) for t, n, _, _ in emu.releases], 4e6)
    assert ok, worst
