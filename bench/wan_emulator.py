"""A user-space WAN emulator: a TCP proxy on loopback that makes each connection behave like a long-haul flow.

``tc netem`` is not available on the project's machines (docs/architecture.md, "Platform facts that shape the
code"), so delay and loss are emulated here:

- **rate cap per connection** (token bucket, each direction): what one TCP flow gets on a long, lossy
  path (window / RTT, Mathis et al.); striping over S connections is how a sender gets more;
- **aggregate link capacity** (one token bucket shared by every connection through the emulator): the
  link itself, so S connections can fill at most this;
- **round-trip delay**: each chunk waits ``rtt/2`` in a delay line per direction (throughput is not capped by
  it; the delay line holds a bandwidth-delay product);
- **loss-like stalls**: with probability ``stall_prob`` per chunk a connection pauses for ``stall_s``
  (a lost packet, a retransmission timeout), while the other connections keep going;
- **faults for tests**: close connection *i* after it forwarded N bytes, flip one byte at stream offset N.

    emu = WanEmulator("127.0.0.1:5000", LinkSpec(rate=25e6, rtt=0.04, link_rate=100e6, stall_prob=0.01))
    endpoint = await emu.start()        # dial this instead of the target
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class LinkSpec:
    rate: float | None = None  # bytes/s per connection and direction (None: no cap)
    link_rate: float | None = None  # bytes/s shared by all connections (None: no cap)
    rtt: float = 0.0  # seconds, round trip
    stall_prob: float = 0.0  # per chunk
    stall_s: float = 0.2
    chunk: int = 64 * 1024
    slack_s: float = 0.05  # lateness of this process's wake-ups that does not cost capacity (TokenBucket)
    seed: int = 0
    # Faults (tests). Keys are connection numbers in accept order; direction "up" = client -> target.
    drop_after: dict[int, int] = field(default_factory=dict)
    corrupt_at: dict[int, int] = field(default_factory=dict)
    fault_direction: str = "up"


class TokenBucket:
    """Paces bytes to ``rate`` per second; a burst of at most ``burst`` bytes.

    ``slack``: a wake-up that comes late (a loaded machine schedules this process late) keeps the capacity
    of up to ``slack`` seconds of lateness, so the long-run rate stays ``rate`` instead of falling with the
    scheduling delay (with a burst of 5 ms, every wake-up more than ~5 ms late used to lose its lateness
    for good: at load 20 on 2 cores one flow got 8-10 of its 16 MB/s). Tokens still only come from
    elapsed time, so no window is faster than ``rate`` plus ``burst`` and the lateness itself.
    """

    def __init__(self, rate: float, burst: float, slack: float = 0.0) -> None:
        self.rate = rate
        self.burst = burst
        self.slack = slack
        self.tokens = burst
        self.t = time.monotonic()
        self.due: float | None = None  # when the last sleep should have ended
        self.lock = asyncio.Lock()

    def reset(self) -> None:
        """Forget any lateness (after a stall: the stalled time is lost, as on a real path)."""
        self.due = None

    async def take(self, n: int) -> None:
        async with self.lock:
            now = time.monotonic()
            cap = self.burst
            if self.due is not None:
                cap += self.rate * min(self.slack, max(0.0, now - self.due))
            # The cap limits what this refill adds; tokens already kept from lateness stay until spent.
            self.tokens = min(max(cap, self.tokens), self.tokens + (now - self.t) * self.rate)
            self.t = now
            self.due = None
            self.tokens -= n
            if self.tokens < 0:
                self.due = now - self.tokens / self.rate
                await asyncio.sleep(-self.tokens / self.rate)


@dataclass
class ConnStats:
    index: int
    up: int = 0
    down: int = 0
    stalls: int = 0
    dropped: bool = False
    corrupted: bool = False


class WanEmulator:
    def __init__(self, target: str, spec: LinkSpec | None = None, listen: str = "127.0.0.1:0") -> None:
        self.target_host, _, port = target.rpartition(":")
        self.target_port = int(port)
        self.spec = spec or LinkSpec()
        self.listen_host, _, lport = listen.rpartition(":")
        self.listen_port = int(lport)
        self.rng = random.Random(self.spec.seed)
        self.link = (
            TokenBucket(self.spec.link_rate, max(self.spec.chunk, self.spec.link_rate * 0.005), self.spec.slack_s)
            if self.spec.link_rate
            else None
        )
        self.conns: list[ConnStats] = []
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoint(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def bytes_up(self) -> int:
        return sum(c.up for c in self.conns)

    @property
    def bytes_down(self) -> int:
        return sum(c.down for c in self.conns)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self.endpoint

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        stats = ConnStats(len(self.conns))
        self.conns.append(stats)
        try:
            treader, twriter = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            cwriter.close()
            return
        self._writers |= {cwriter, twriter}
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        pumps = [
            asyncio.ensure_future(self._pump(creader, twriter, stats, "up", (cwriter, twriter))),
            asyncio.ensure_future(self._pump(treader, cwriter, stats, "down", (cwriter, twriter))),
        ]
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        except asyncio.CancelledError:  # stop(): end quietly
            for p in pumps:
                p.cancel()
        finally:
            for w in (cwriter, twriter):
                w.close()
                self._writers.discard(w)
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stats: ConnStats,
        direction: str,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        spec = self.spec
        bucket = TokenBucket(spec.rate, max(spec.chunk, spec.rate * 0.005), spec.slack_s) if spec.rate else None
        delay = spec.rtt / 2
        line: deque[tuple[float, bytes]] = deque()
        ready = asyncio.Event()
        done = False
        faulty = direction == spec.fault_direction
        drop_at = spec.drop_after.get(stats.index) if faulty else None
        corrupt_at = spec.corrupt_at.get(stats.index) if faulty else None
        # The delay line holds at most one bandwidth-delay product (plus a chunk), so TCP back-pressure
        # reaches the sender as it would on a real path.
        cap = int((spec.rate or spec.link_rate or 1e9) * delay) + 2 * spec.chunk
        queued = 0
        room = asyncio.Event()
        room.set()

        async def deliver() -> None:
            nonlocal queued
            while True:
                while not line:
                    if done:
                        return
                    ready.clear()
                    await ready.wait()
                due, data = line[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                line.popleft()
                queued -= len(data)
                room.set()
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        sent = 0
        try:
            while True:
                data = await reader.read(spec.chunk)
                if not data:
                    break
                if spec.stall_prob and self.rng.random() < spec.stall_prob:
                    stats.stalls += 1
                    await asyncio.sleep(spec.stall_s)
                    if bucket is not None:
                        bucket.reset()
                if bucket is not None:
                    await bucket.take(len(data))
                if self.link is not None:
                    await self.link.take(len(data))
                if corrupt_at is not None and sent <= corrupt_at < sent + len(data):
                    b = bytearray(data)
                    b[corrupt_at - sent] ^= 0x5A
                    data = bytes(b)
                    stats.corrupted = True
                if drop_at is not None and sent + len(data) >= drop_at:
                    data = data[: max(0, drop_at - sent)]
                    stats.dropped = True
                sent += len(data)
                if direction == "up":
                    stats.up += len(data)
                else:
                    stats.down += len(data)
                while queued > cap:
                    room.clear()
                    await room.wait()
                line.append((time.monotonic() + delay, data))
                queued += len(data)
                ready.set()
                if stats.dropped:
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            ready.set()
            if stats.dropped:
                sender.cancel()
                for w in both:  # an abrupt end of the whole connection, both directions
                    with contextlib.suppress(Exception):
                        w.transport.abort()
            else:
                with contextlib.suppress(Exception):
                    await sender
                with contextlib.suppress(Exception):
                    if writer.can_write_eof():
                        writer.write_eof()


async def _main() -> None:  # pragma: no cover - manual use
    import argparse

    ap = argparse.ArgumentParser(description="TCP proxy emulating a WAN path")
    ap.add_argument("target")
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--rate", type=float, help="bytes/s per connection")
    ap.add_argument("--link-rate", type=float, help="bytes/s shared")
    ap.add_argument("--rtt", type=float, default=0.0)
    ap.add_argument("--stall-prob", type=float, default=0.0)
    ap.add_argument("--stall", type=float, default=0.2)
    ap.add_argument("--slack", type=float, default=LinkSpec.slack_s, help="late wake-ups kept, seconds (0: none)")
    a = ap.parse_args()
    spec = LinkSpec(a.rate, a.link_rate, a.rtt, a.stall_prob, a.stall, slack_s=a.slack)
    emu = WanEmulator(a.target, spec, a.listen)
    print(await emu.start(), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(_main())
