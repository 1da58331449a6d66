"""A user-space WAN emulator: a TCP proxy on loopback that makes each connection behave like a long-haul flow.

``tc netem`` is not available on the project's machines (docs/platform.md), so delay and loss are emulated
here:

- **rate cap per connection** (token bucket, each direction): what one TCP flow gets on a long, lossy
  path (window / RTT, Mathis et al.); striping over S connections is how a sender gets more;
- **aggregate link capacity** (one token bucket shared by every connection through the emulator): the
  link itself, so S connections can fill at most this;
- **round-trip delay**: each byte waits ``rtt/2`` in a delay line per direction (throughput is not capped by
  it; the delay line holds a bandwidth-delay product);
- **loss-like stalls**: with probability ``stall_prob`` per ``chunk`` (64 KiB) of a stream a connection pauses
  for ``stall_s`` (a lost packet, a retransmission timeout), while the other connections keep going;
- **faults for tests**: close connection *i* after it forwarded N bytes, flip one byte at stream offset N,
  stall connection *i* for T seconds at stream offset N.

    emu = WanEmulator("127.0.0.1:5000", LinkSpec(rate=25e6, rtt=0.04, link_rate=100e6, stall_prob=0.01))
    endpoint = await emu.start()        # dial this instead of the target

**Honest rates.** Over any window of ``window_s`` (100 ms) no direction releases more than ``rate *
window_s`` bytes and the link no more than ``link_rate * window_s`` (a sliding-window check on every release,
beside the token buckets). The buckets keep up to ``slack_s`` of this process's late wake-ups (a loaded
machine), so late capacity is made up, but never faster than the configured rate over a window.

**Few wake-ups per MB.** On a loaded machine every timer and socket wake-up of this process comes late, and a
proxy that wakes several times per 64 KiB falls short of its own rates. So the sockets are read with asyncio
protocols (one callback per ``recv`` of up to 256 KiB, no stream-reader hops), and ONE timer for the whole
emulator releases, per wake-up, everything the buckets, windows and delay lines allow, at least ``quantum`` bytes
per direction (or what is queued): about one wake-up per 256 KiB instead of four or five per 64 KiB. The
sockets' kernel receive buffers are sized to what the emulated path holds (its bandwidth-delay product plus two
quanta), so TCP back-pressure reaches the sender as on a real path instead of megabytes queueing in loopback
buffers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

INF = math.inf


@dataclass
class LinkSpec:
    rate: float | None = None  # bytes/s per connection and direction (None: no cap)
    link_rate: float | None = None  # bytes/s shared by all connections (None: no cap)
    rtt: float = 0.0  # seconds, round trip
    stall_prob: float = 0.0  # per ``chunk`` bytes of a stream
    stall_s: float = 0.2
    chunk: int = 64 * 1024  # the unit of ``stall_prob``
    slack_s: float = 0.05  # lateness of this process's wake-ups that does not cost capacity (TokenBucket)
    quantum: int = 256 * 1024  # bytes a direction waits for before one release (fewer wake-ups per MB)
    window_s: float = 0.1  # no window this long carries more than its rate allows
    record: bool = False  # keep every release in ``releases`` (tests: the honesty check)
    seed: int = 0
    # Faults (tests). Keys are connection numbers in accept order; direction "up" = client -> target.
    drop_after: dict[int, int] = field(default_factory=dict)
    corrupt_at: dict[int, int] = field(default_factory=dict)
    stall_at: dict[int, tuple[int, float]] = field(default_factory=dict)  # (stream offset, seconds), once
    fault_direction: str = "up"
    # Each chunk a direction reads waits rtt/2 plus a uniform draw in [-jitter, +jitter] seconds (order kept).
    jitter: float = 0.0
    # The other direction's own path (target -> client) when it differs: its rate, link_rate, rtt, jitter and
    # stalls (an asymmetric link); None: the same as this one.
    down: LinkSpec | None = None

    def direction(self, name: str) -> LinkSpec:
        return self.down if name == "down" and self.down is not None else self


class TokenBucket:
    """Paces bytes to ``rate`` per second. Times are passed in (the emulator's loop clock), so the bucket is
    plain arithmetic and testable on any clock.

    Tokens come only from elapsed time and are capped at ``burst + rate * slack``: a wake-up that comes up to
    ``slack`` seconds late (a loaded machine schedules this process late) keeps that lateness's capacity, so
    the long-run rate stays ``rate`` instead of falling with the scheduling delay (with a 5 ms burst, at load
    20 on 2 cores one flow got 8-10 of its 16 MB/s). ``reset`` drops what was kept: after a stall the stalled
    time is lost, as on a real path. The window check (:class:`RateWindow`) bounds what the kept capacity may
    release at once.
    """

    def __init__(self, rate: float, burst: float, slack: float = 0.0, now: float = 0.0) -> None:
        self.rate = rate
        self.burst = burst
        self.cap = burst + rate * slack
        self.tokens = float(burst)
        self.t = now

    def _refill(self, now: float) -> None:
        if now > self.t:
            self.tokens = min(self.cap, self.tokens + (now - self.t) * self.rate)
            self.t = now

    def available(self, now: float) -> float:
        self._refill(now)
        return self.tokens

    def ready_at(self, n: float, now: float) -> float:
        """When ``n`` bytes (at most the cap) may go; looks ahead without spending (``now`` may be future)."""
        tokens = min(self.cap, self.tokens + (now - self.t) * self.rate) if now > self.t else self.tokens
        n = min(n, self.cap)
        return now if tokens >= n else now + (n - tokens) / self.rate

    def take(self, n: float, now: float) -> None:
        self._refill(now)
        self.tokens -= n

    def reset(self, now: float) -> None:
        """Forget capacity kept beyond one burst (after a stall)."""
        self._refill(now)
        self.tokens = min(self.tokens, self.burst)


class RateWindow:
    """At most ``rate * window`` bytes released in any window of ``window`` seconds, (t - window, t]."""

    def __init__(self, rate: float, window: float) -> None:
        self.window = window
        self.cap = rate * window
        self.log: deque[tuple[float, int]] = deque()
        self.total = 0

    def _expire(self, now: float) -> None:
        log = self.log
        while log and log[0][0] <= now - self.window:
            self.total -= log.popleft()[1]

    def room(self, now: float) -> float:
        self._expire(now)
        return self.cap - self.total

    def ready_at(self, n: float, now: float) -> float:
        """When ``n`` bytes (at most the cap) fit."""
        n = min(n, self.cap)
        over = self.total + n - self.cap
        if over <= 0:
            return now
        for t, m in self.log:
            over -= m
            if over <= 0:
                return t + self.window
        return now  # unreachable: the log holds more than ``over``

    def record(self, n: int, now: float) -> None:
        self.log.append((now, n))
        self.total += n


@dataclass
class ConnStats:
    index: int
    up: int = 0
    down: int = 0
    stalls: int = 0
    dropped: bool = False
    corrupted: bool = False


class _Side(asyncio.Protocol):
    """One socket of a proxied connection: what it receives feeds ``inbound``; ``outbound`` writes to it."""

    def __init__(self, on_made: Callable[[_Side], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.inbound: _Direction | None = None  # bytes read here go this way
        self.outbound: _Direction | None = None  # this direction writes here
        self.on_made = on_made
        self.early: list[bytes] = []  # read before the directions exist (the target still being dialled)
        self.early_eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.on_made is not None:
            self.on_made(self)

    def data_received(self, data: bytes) -> None:
        if self.inbound is None:
            self.early.append(data)
        else:
            self.inbound.feed(data)

    def eof_received(self) -> bool:
        if self.inbound is None:
            self.early_eof = True
        else:
            self.inbound.feed_eof()
        return True  # half-close: the other direction may still deliver

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.inbound is None:
            self.early_eof = True
        if self.inbound is not None:
            self.inbound.feed_eof()
        if self.outbound is not None:
            self.outbound.dst_lost()

    def pause_writing(self) -> None:
        if self.outbound is not None:
            self.outbound.dst_paused = True

    def resume_writing(self) -> None:
        if self.outbound is not None:
            self.outbound.dst_paused = False
            self.outbound.emu._pacer.wake(self.outbound, self.outbound.emu._loop.time())


class _Direction:
    """One direction of one connection: a queue (the delay line and the bottleneck's buffer) released by the
    emulator's pacer within this flow's bucket and window and the link's."""

    def __init__(self, emu: WanEmulator, conn: _Conn, name: str, src: _Side, dst: _Side) -> None:
        spec = emu.spec
        self.emu, self.conn, self.name, self.src, self.dst = emu, conn, name, src, dst
        self.path = path = spec.direction(name)
        now = emu._loop.time()
        self.bucket = TokenBucket(path.rate, emu.qmin, spec.slack_s, now) if path.rate else None
        self.window = RateWindow(path.rate, spec.window_s) if path.rate else None
        self.delay = path.rtt / 2
        self.jitter = path.jitter
        self.last_due = 0.0
        self.queue: deque[tuple[float, memoryview]] = deque()  # (due time, bytes not yet released)
        self.queued = 0
        self.cap = emu.path_bytes
        self.src_paused = False
        self.dst_paused = False
        self.eof = False
        self.done = False
        self.stall_until = 0.0
        self.after_stall = False
        self.sent = 0
        faulty = name == spec.fault_direction
        self.drop_at = spec.drop_after.get(conn.stats.index) if faulty else None
        self.corrupt_at = spec.corrupt_at.get(conn.stats.index) if faulty else None
        self.stall_at = spec.stall_at.get(conn.stats.index) if faulty else None

    # -- input

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        if self.emu.tap is not None:
            self.emu.tap(self.name, data)
        now = self.emu._loop.time()
        due = now + self.delay
        if self.jitter:  # never before the previous chunk: TCP delivers in order
            due = max(now, due + self.emu.rng.uniform(-self.jitter, self.jitter), self.last_due)
        self.last_due = due
        self.queue.append((due, memoryview(data)))
        self.queued += len(data)
        if self.queued > self.cap and not self.src_paused and self.src.transport is not None:
            self.src_paused = True
            with contextlib.suppress(Exception):
                self.src.transport.pause_reading()
        self.emu._pacer.wake(self, due)

    def feed_eof(self) -> None:
        if not self.eof:
            self.eof = True
            self.emu._pacer.wake(self, self.emu._loop.time())

    def dst_lost(self) -> None:
        self.queue.clear()
        self.queued = 0
        self._end()

    # -- release

    def due_bytes(self, now: float) -> int:
        n = 0
        for due, data in self.queue:
            if due > now:
                break
            n += len(data)
        return n

    def _limits(self) -> list[TokenBucket | RateWindow]:
        emu = self.emu
        link, window = emu.dir_links.get(self.name, (emu.link, emu.link_window))
        return [x for x in (self.bucket, self.window, link, window) if x is not None]

    def release(self, now: float, limit: int) -> bool:
        """Send what may go now (at most ``limit`` bytes); True when something went."""
        if self.eof and not self.queue and not self.done:
            self._end()
            return False
        if self.done or self.dst_paused or now < self.stall_until or not self.queue:
            return False
        if self.after_stall:
            self.after_stall = False
            if self.bucket is not None:
                self.bucket.reset(now)
        due = self.due_bytes(now)
        if due == 0:
            return False
        n = min(due, limit)
        for lim in self._limits():
            n = min(n, int(lim.available(now) if isinstance(lim, TokenBucket) else lim.room(now)))
        if n <= 0 or n < min(due, self.emu.qmin):
            return False  # wait for a whole quantum: one wake-up per quantum, not per packet
        spec = self.path
        stall = False
        if spec.stall_prob:  # one draw per ``chunk`` boundary this release crosses
            rng, unit = self.emu.rng, spec.chunk
            for boundary in range((self.sent // unit + 1) * unit, self.sent + n + 1, unit):
                if rng.random() < spec.stall_prob:
                    n, stall = boundary - self.sent, True
                    break
        stall_s = spec.stall_s
        if self.stall_at is not None and self.sent < self.stall_at[0] <= self.sent + n:
            n, stall, stall_s = self.stall_at[0] - self.sent, True, self.stall_at[1]
            self.stall_at = None
        drop = self.drop_at is not None and self.sent + n >= self.drop_at
        if drop:
            n = max(0, self.drop_at - self.sent)  # type: ignore[operator]
        data = self._pop(n)
        if self.corrupt_at is not None and self.sent <= self.corrupt_at < self.sent + n:
            flipped = bytearray(data)
            flipped[self.corrupt_at - self.sent] ^= 0x5A
            data = memoryview(flipped)
            self.conn.stats.corrupted = True
        for lim in self._limits():
            if isinstance(lim, TokenBucket):
                lim.take(n, now)
            else:
                lim.record(n, now)
        self.sent += n
        stats = self.conn.stats
        if self.name == "up":
            stats.up += n
        else:
            stats.down += n
        if self.emu.releases is not None:
            self.emu.releases.append((now, n, stats.index, self.name))
        transport = self.dst.transport
        if n and transport is not None and not transport.is_closing():
            transport.write(data)
        if drop:
            stats.dropped = True
            self.conn.abort()
            return True
        if stall:
            stats.stalls += 1
            self.stall_until = now + stall_s
            self.after_stall = True
        if self.src_paused and self.queued <= self.cap and self.src.transport is not None:
            self.src_paused = False
            with contextlib.suppress(Exception):
                self.src.transport.resume_reading()
        if self.eof and not self.queue:
            self._end()
        return True

    def _pop(self, n: int) -> bytes | memoryview:
        if n == 0:
            return b""
        parts: list[memoryview] = []
        left = n
        while left:
            arrival, data = self.queue[0]
            if len(data) <= left:
                self.queue.popleft()
                parts.append(data)
                left -= len(data)
            else:
                parts.append(data[:left])
                self.queue[0] = (arrival, data[left:])
                left = 0
        self.queued -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def next_time(self, now: float) -> float:
        """The earliest time something may go (INF: nothing to do until new bytes or a resumed socket)."""
        if self.done:
            return INF
        if not self.queue:
            return now if self.eof else INF
        if self.dst_paused:
            return INF
        t = max(now, self.stall_until, self.queue[0][0])
        need = min(self.due_bytes(t), self.emu.qmin)
        for lim in self._limits():
            t = max(t, lim.ready_at(need, t))
        return t

    def _end(self) -> None:
        """Everything delivered (or undeliverable): pass the end on, close when both directions ended."""
        if self.done:
            return
        self.done = True
        self.queue.clear()
        self.queued = 0
        transport = self.dst.transport
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(Exception):
                if transport.can_write_eof():
                    transport.write_eof()
        self.conn.ended()


class _Conn:
    def __init__(self, emu: WanEmulator, stats: ConnStats, client: _Side) -> None:
        self.emu, self.stats, self.client = emu, stats, client
        self.target: _Side | None = None
        self.dirs: list[_Direction] = []
        self.closed = False

    def wire(self, target: _Side) -> None:
        self.target = target
        up = _Direction(self.emu, self, "up", self.client, target)
        down = _Direction(self.emu, self, "down", target, self.client)
        self.dirs = [up, down]
        self.client.inbound, self.client.outbound = up, down
        target.inbound, target.outbound = down, up
        for side in (self.client, target):
            for data in side.early:
                side.inbound.feed(data)  # type: ignore[union-attr]
            side.early.clear()
            if side.early_eof:
                side.inbound.feed_eof()  # type: ignore[union-attr]
            if side.lost:
                side.outbound.dst_lost()  # type: ignore[union-attr]
            if side.transport is not None:  # writes up to two quanta stay in user space before pause_writing
                with contextlib.suppress(Exception):
                    side.transport.set_write_buffer_limits(high=2 * self.emu.qmax)

    def ended(self) -> None:
        if all(d.done for d in self.dirs):
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for side in (self.client, self.target):
            if side is not None and side.transport is not None:
                side.transport.close()
        self.emu._conns.discard(self)

    def abort(self) -> None:
        """An abrupt end of the whole connection, both directions (the drop fault)."""
        self.closed = True
        for d in self.dirs:
            d.done = True
            d.queue.clear()
            d.queued = 0
        for side in (self.client, self.target):
            if side is not None and side.transport is not None:
                side.transport.abort()
        self.emu._conns.discard(self)


class _Pacer:
    """One timer for the whole emulator: each wake-up releases, in rounds of one quantum per direction (a fair
    share of the link), everything the limits allow, then sleeps until the earliest direction may send. The
    directions wait in line: one that released goes to the back (at 50 ms per turn, rotating only the first
    of the line let two of four flows through a shared 10 MB/s link twice as often and paused the others
    for up to 400 ms)."""

    def __init__(self, emu: WanEmulator) -> None:
        self.emu = emu
        self.active: dict[_Direction, None] = {}  # ordered set
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = INF

    def wake(self, d: _Direction, at: float) -> None:
        self.active[d] = None
        self._schedule(at)

    def _schedule(self, at: float) -> None:
        if at >= self.timer_at:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = at
        self.timer = self.emu._loop.call_at(at, self._tick)

    def _tick(self) -> None:
        self.timer, self.timer_at = None, INF
        loop = self.emu._loop
        now = loop.time()
        moved = True
        while moved:
            moved = False
            for d in list(self.active):  # longest-waiting first
                if d.release(now, self.emu.qmax):
                    moved = True
                    del self.active[d]  # to the back of the line: the link goes round fairly
                    self.active[d] = None
        nxt = INF
        for d in list(self.active):
            t = d.next_time(now)
            if d.done or (t == INF and not d.queue):
                del self.active[d]
            nxt = min(nxt, t)
        if nxt < INF:
            self._schedule(max(nxt, now))

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.timer_at = None, INF
        self.active.clear()


class WanEmulator:
    def __init__(self, target: str, spec: LinkSpec | None = None, listen: str = "127.0.0.1:0") -> None:
        self.target_host, _, port = target.rpartition(":")
        self.target_port = int(port)
        self.spec = spec or LinkSpec()
        self.listen_host, _, lport = listen.rpartition(":")
        self.listen_port = int(lport)
        self.rng = random.Random(self.spec.seed)
        s = self.spec
        paths = [s] if s.down is None else [s, s.down]
        rates = [r for p in paths for r in (p.rate, p.link_rate) if r]
        # A release waits for a quantum, at most a quarter of the slowest window (the window check stays smooth).
        self.qmax = max(1024, min([s.quantum] + [int(r * s.window_s / 4) for r in rates]))
        self.qmin = self.qmax
        # What the emulated path holds: one bandwidth-delay product plus two quanta (kernel buffers alike).
        self.path_bytes = max(int((p.rate or p.link_rate or 1e9) * p.rtt / 2) for p in paths) + 2 * self.qmax
        self.link = TokenBucket(s.link_rate, self.qmin, s.slack_s) if s.link_rate else None
        self.link_window = RateWindow(s.link_rate, s.window_s) if s.link_rate else None
        self.releases: list[tuple[float, int, int, str]] | None = [] if s.record else None
        self.tap: Callable[[str, bytes], None] | None = None  # sees every byte read (tests)
        # Per direction ("up", "down"): a link bucket and window shared with other emulators (one link carries
        # several forwarders' flows); a direction not named here uses this emulator's own link.
        self.dir_links: dict[str, tuple[TokenBucket | None, RateWindow | None]] = {}
        self.conns: list[ConnStats] = []
        self._conns: set[_Conn] = set()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._pacer = _Pacer(self)

    @property
    def endpoint(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def bytes_up(self) -> int:
        return sum(c.up for c in self.conns)

    @property
    def bytes_down(self) -> int:
        return sum(c.down for c in self.conns)

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with contextlib.suppress(OSError):  # the kernel holds what the path holds, not megabytes (it doubles it)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, max(64 * 1024, self.path_bytes // 2))
        sock.setblocking(False)
        return sock

    async def start(self) -> str:
        self._loop = asyncio.get_running_loop()
        t = self._loop.time()
        for lim in (self.link,):
            if lim is not None:
                lim.t = t
        sock = self._socket()  # accepted sockets inherit the receive buffer size
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.listen_host, self.listen_port))
        sock.listen(128)
        self._server = await self._loop.create_server(lambda: _Side(self._accepted), sock=sock)
        self.listen_port = sock.getsockname()[1]
        return self.endpoint

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._pacer.stop()
        for c in list(self._conns):
            c.abort()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accepted(self, client: _Side) -> None:
        stats = ConnStats(len(self.conns))
        self.conns.append(stats)
        conn = _Conn(self, stats, client)
        self._conns.add(conn)
        with contextlib.suppress(Exception):
            client.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
        task = self._loop.create_task(self._dial(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dial(self, conn: _Conn) -> None:
        sock = self._socket()
        try:
            await self._loop.sock_connect(sock, (self.target_host, self.target_port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _, target = await self._loop.create_connection(_Side, sock=sock)
        except (OSError, asyncio.CancelledError):
            sock.close()
            conn.abort()
            return
        if conn.closed:
            target.transport.close()  # type: ignore[union-attr]
            return
        conn.wire(target)


async def _main() -> None:  # pragma: no cover - manual use
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rollart.netem", description="TCP proxy emulating a WAN path")
    ap.add_argument("target")
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--rate", type=float, help="bytes/s per connection")
    ap.add_argument("--link-rate", type=float, help="bytes/s shared")
    ap.add_argument("--rtt", type=float, default=0.0)
    ap.add_argument("--stall-prob", type=float, default=0.0)
    ap.add_argument("--stall", type=float, default=0.2)
    ap.add_argument("--slack", type=float, default=LinkSpec.slack_s, help="late wake-ups kept, seconds (0: none)")
    ap.add_argument("--quantum", type=int, default=LinkSpec.quantum, help="bytes per release and wake-up")
    a = ap.parse_args()
    spec = LinkSpec(a.rate, a.link_rate, a.rtt, a.stall_prob, a.stall, slack_s=a.slack, quantum=a.quantum)
    emu = WanEmulator(a.target, spec, a.listen)
    print(await emu.start(), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(_main())
