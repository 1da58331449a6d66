"""A stripe after its handshake: typed frames (``u8 type, u32 length, payload``) over one TCP connection, read
into their own buffers and written by scatter-gather from views of the payload, so a segment is copied once on
the way in and never in user space on the way out. Back-pressure both ways: a stripe whose unread or unsent
bytes pile up stops reading or counts as busy."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Callable

from .errors import _STATUS_ERRORS, ST_OK, ProtocolError, TransportError
from .handshake import _RESULT, Hello, client_handshake, validate_hello

F_SEG, F_RESUME, F_DONE, F_ERROR = 1, 2, 3, 4
_FRAME_NAMES = {F_SEG: "SEG", F_RESUME: "RESUME", F_DONE: "DONE", F_ERROR: "ERROR"}

_FRAME = struct.Struct("<BI")
_RESUME = struct.Struct("<QII")
_DONE = struct.Struct("<Q32s")

DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024
WRITE_HIGH_WATER = 256 * 1024  # bytes queued in user space before a stripe counts as busy
# Unsent bytes the kernel holds per stripe (TCP_NOTSENT_LOWAT): a stalled stripe stops taking segments after
# this much, not after megabytes of socket buffer; in-flight data (the congestion window) is not limited.
NOTSENT_LOWAT = 512 * 1024


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError, AttributeError):  # Linux, macOS
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_NOTSENT_LOWAT", 25), NOTSENT_LOWAT)
    with contextlib.suppress(AttributeError, NotImplementedError):
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)


class _FrameReader(asyncio.BufferedProtocol):
    """Reads frames straight into their own buffers: ``recv_into`` a preallocated bytearray per frame, so a
    segment's bytes are copied once (kernel -> its final buffer) and never sliced, joined or moved again.

    Back-pressure: once ``max_ready`` whole frames wait unread, reading pauses (TCP then slows the sender).
    """

    def __init__(
        self, transport: asyncio.Transport, max_frame_bytes: int, max_ready: int = 2, expect_result: bool = False
    ) -> None:
        self.transport = transport
        self.max_frame_bytes = max_frame_bytes
        self.max_ready = max_ready
        self._hdr = bytearray(_FRAME.size)
        self._hdr_mv = memoryview(self._hdr)
        self._got = 0  # bytes of the current header or payload received
        self._ftype = 0
        self._payload: bytearray | None = None  # None while reading a header
        self._payload_mv: memoryview | None = None
        self.ready: deque[tuple[int, bytes | bytearray]] = deque()
        self.error: BaseException | None = None
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._discard: memoryview | None = None  # closing: whatever still arrives is read and dropped
        self.on_end: Callable[[], None] | None = None
        self.last_rx = time.monotonic()  # when bytes last arrived (tail hedging)
        self.typical_gap = 0.0  # moving average of the pauses (>= 2 ms) between arrivals on this stripe
        # Early data (client_handshake(early=True)): the handshake's RESULT comes first, read here.
        self._result: bytearray | None = bytearray(_RESULT.size) if expect_result else None
        self._result_mv = memoryview(self._result) if self._result is not None else None

    def discard(self, on_end: Callable[[], None]) -> None:
        """Read and drop everything until the peer closes (then ``on_end``): closing a socket with unread
        input sends a RST, and a RST can destroy our last frames (an ERROR) before the peer reads them."""
        self._discard = memoryview(bytearray(64 * 1024))
        self.on_end = on_end
        self.ready.clear()
        if self.error is not None:
            on_end()
            return
        self.paused = False
        with contextlib.suppress(Exception):
            self.transport.resume_reading()

    # -- asyncio.BufferedProtocol

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._discard is not None:
            return self._discard
        if self._result_mv is not None and self._payload_mv is None:
            return self._result_mv[self._got :]
        if self._payload_mv is not None:
            return self._payload_mv[self._got :]
        return self._hdr_mv[self._got :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._discard is not None:
            return
        now = time.monotonic()
        gap = now - self.last_rx
        if gap >= 0.002:  # a pause between bursts, not the pieces of one burst
            self.typical_gap = gap if not self.typical_gap else 0.8 * self.typical_gap + 0.2 * gap
        self.last_rx = now
        self._got += nbytes
        if self._result is not None:
            self._result_step()
        elif self._payload_mv is None:
            if self._got == _FRAME.size:
                self._header()
        elif self._got == len(self._payload_mv):
            self._complete(self._payload)  # type: ignore[arg-type]

    def eof_received(self) -> bool:
        self._set_error(asyncio.IncompleteReadError(b"", None))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_error(exc or asyncio.IncompleteReadError(b"", None))

    # -- parsing

    def feed(self, data: bytes) -> None:
        """Bytes that arrived before this protocol took over (read during the handshake)."""
        mv = memoryview(data)
        while mv and self.error is None:
            buf = self.get_buffer(len(mv))
            n = min(len(buf), len(mv))
            buf[:n] = mv[:n]
            mv = mv[n:]
            self.buffer_updated(n)

    def _result_step(self) -> None:
        """RESULT = u8 status, u16 msg_len, msg; then frames, or the peer's reason as the error."""
        if self._payload_mv is None:
            if self._got < _RESULT.size:
                return
            self._got = 0
            _, msg_len = _RESULT.unpack(self._result)  # type: ignore[arg-type]
            if msg_len:
                self._payload = bytearray(msg_len)
                self._payload_mv = memoryview(self._payload)
                return
        elif self._got < len(self._payload_mv):
            return
        status = self._result[0]  # type: ignore[index]
        msg = bytes(self._payload or b"").decode("utf-8", "replace")
        self._result = self._result_mv = None
        self._payload, self._payload_mv, self._got = None, None, 0
        if status != ST_OK:
            self._fail(_STATUS_ERRORS.get(status, ProtocolError)(msg or f"handshake rejected (status {status})"))

    def _header(self) -> None:
        ftype, n = _FRAME.unpack(self._hdr)
        self._got = 0
        if ftype not in _FRAME_NAMES:
            self._fail(ProtocolError(f"unknown frame type {ftype}"))
        elif n > self.max_frame_bytes:
            self._fail(ProtocolError(f"{_FRAME_NAMES[ftype]} frame of {n} bytes exceeds {self.max_frame_bytes}"))
        elif n == 0:
            self._ftype = ftype
            self._complete(b"")
        else:
            self._ftype = ftype
            self._payload = bytearray(n)
            self._payload_mv = memoryview(self._payload)

    def _complete(self, payload: bytes | bytearray) -> None:
        self.ready.append((self._ftype, payload))
        self._payload, self._payload_mv, self._got = None, None, 0
        if len(self.ready) >= self.max_ready and not self.paused:
            self.paused = True
            with contextlib.suppress(Exception):
                self.transport.pause_reading()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._set_error(exc)
        with contextlib.suppress(Exception):
            self.transport.pause_reading()

    def _set_error(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._wake()
        if self.on_end is not None:
            self.on_end()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next(self) -> tuple[int, bytes | bytearray]:
        while not self.ready:
            if self.error is not None:
                raise self.error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame = self.ready.popleft()
        if self.paused and len(self.ready) < self.max_ready and self.error is None:
            self.paused = False
            with contextlib.suppress(Exception):
                self.transport.resume_reading()
        return frame


class Connection:
    """One authenticated stripe: typed frames over a TCP stream, at memory speed.

    After the handshake the stream's transport is handed to a :class:`_FrameReader` (frames land in their
    own preallocated buffers) and sends bypass the transport's write buffer: ``write_frame`` queues the
    header and a memoryview of the payload, and the socket takes them with ``sendmsg`` (scatter-gather), so
    a segment forwarded to N stripes is never copied in user space. Whatever the kernel does not take at
    once waits as a view until the socket is writable again.
    """

    SENDMSG_MAX_BUFFERS = 64

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: Hello,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        expect_result: bool = False,
    ) -> None:
        self.hello = hello
        self.max_frame_bytes = max_frame_bytes
        self.peer = writer.get_extra_info("peername")
        # Kept only so they live as long as the stripe (a collected StreamWriter closes its transport).
        self._stream = (reader, writer)
        self.bytes_in = 0
        self.bytes_out = 0
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport = writer.transport  # type: ignore[assignment]
        # Frames the peer sent right behind its last handshake message may already sit in the stream's
        # buffer (StreamReader keeps it in ``_buffer``; no public way to take it back).
        leftover = bytes(getattr(reader, "_buffer", b""))
        self._frames = _FrameReader(self._transport, max_frame_bytes, expect_result=expect_result)
        self._transport.set_protocol(self._frames)
        self._frames.feed(leftover)
        if reader.at_eof() or getattr(reader, "_eof", False):
            self._frames.eof_received()
        with contextlib.suppress(Exception):
            if not self._transport.is_reading() and not self._frames.paused:
                self._transport.resume_reading()
        # Our own descriptor of the socket for sends; the transport never writes after the handshake.
        tsock = writer.get_extra_info("socket")
        self._sock = socket.socket(fileno=os.dup(tsock.fileno()))
        self._sock.setblocking(False)
        self._out: deque[memoryview] = deque()
        self._out_bytes = 0
        self._writing = False
        self._write_error: BaseException | None = None
        self._drained: asyncio.Future[None] | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._sock_closed = False
        self._shut = False

    @property
    def last_rx(self) -> float:
        """time.monotonic() when bytes last arrived on this stripe."""
        return self._frames.last_rx

    @property
    def typical_gap(self) -> float:
        """Moving average of the pauses between arrivals on this stripe (its normal rhythm on this path)."""
        return self._frames.typical_gap

    def waiting_on_network(self) -> bool:
        """Nothing received waits to be read here (so silence is the path's, not this side's back-pressure)."""
        f = self._frames
        return not f.paused and not f.ready and f.error is None

    async def read_frame(self) -> tuple[int, bytes | bytearray]:
        ftype, payload = await self._frames.next()
        self.bytes_in += _FRAME.size + len(payload)
        return ftype, payload

    def write_frame(self, ftype: int, payload: bytes | bytearray | memoryview) -> None:
        """Queue one frame and send what the socket takes now (no copy of the payload)."""
        if self._write_error is not None:
            raise self._write_error
        if self.closed:
            raise ConnectionResetError("stripe closed")
        view = memoryview(payload).cast("B") if not isinstance(payload, memoryview) else payload.cast("B")
        self._out.append(memoryview(_FRAME.pack(ftype, len(view))))
        if len(view):
            self._out.append(view)
        self._out_bytes += _FRAME.size + len(view)
        self.bytes_out += _FRAME.size + len(view)
        if not self._writing:
            self._flush()

    def _flush(self) -> None:
        out = self._out
        while out:
            bufs = list(itertools.islice(out, self.SENDMSG_MAX_BUFFERS))
            try:
                n = self._sock.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._write_failed(exc)
                return
            self._out_bytes -= n
            while n:
                head = out[0]
                if n >= len(head):
                    n -= len(head)
                    out.popleft()
                else:
                    out[0] = head[n:]
                    n = 0
        if out and not self._writing:
            self._writing = True
            self._loop.add_writer(self._sock.fileno(), self._flush)
        elif not out:
            if self._writing:
                self._writing = False
                self._loop.remove_writer(self._sock.fileno())
            self._wake_drain()
            if self.closed:
                self._half_close()

    def _write_failed(self, exc: BaseException) -> None:
        self._write_error = exc if isinstance(exc, ConnectionError) else ConnectionResetError(str(exc))
        self._out.clear()
        self._out_bytes = 0
        if self._writing:
            self._writing = False
            with contextlib.suppress(Exception):
                self._loop.remove_writer(self._sock.fileno())
        self._wake_drain()
        if self.closed:
            self._really_close()

    def _wake_drain(self) -> None:
        d = self._drained
        if d is not None and not d.done():
            d.set_result(None)

    def buffered(self) -> int:
        """Bytes queued in user space (not yet taken by the kernel)."""
        return self._out_bytes

    async def drain(self) -> None:
        while self._out and self._write_error is None and not self._sock_closed:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None
        if self._write_error is not None:
            raise self._write_error
        if self._frames.error is not None and isinstance(self._frames.error, ConnectionError | OSError):
            raise self._frames.error

    def close(self, linger: float = 2.0) -> None:
        """Close gracefully: queued frames leave, then FIN, then input is drained until the peer closes
        (at most ``linger`` seconds in all), so the peer reads our last frames (like a transport's close)."""
        if self.closed:
            return
        self.closed = True
        self._linger = self._loop.call_later(linger, self._really_close)
        if not self._out or self._write_error is not None:
            self._half_close()

    def _half_close(self) -> None:
        if self._shut or self._sock_closed:
            return
        self._shut = True
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._really_close()
            return
        self._frames.discard(self._really_close)

    def _really_close(self) -> None:
        if self._sock_closed:
            return
        self._sock_closed = True
        if self._linger is not None:
            self._linger.cancel()
        self._frames.on_end = None
        if self._writing:
            self._writing = False
            with contextlib.suppress(Exception):
                self._loop.remove_writer(self._sock.fileno())
        self._out.clear()
        self._out_bytes = 0
        self._wake_drain()
        with contextlib.suppress(Exception):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._transport.close()


async def dial(
    endpoint: str,
    hello: Hello,
    key: bytes,
    *,
    timeout: float = 10.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    early: bool = False,
) -> Connection:
    """Connect and authenticate one stripe (``early``: see client_handshake)."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {endpoint!r}")
    validate_hello(hello)

    async def go() -> Connection:
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
        try:
            _tune(writer)
            await client_handshake(reader, writer, hello, key, early=early)
        except BaseException:
            writer.close()
            raise
        return Connection(reader, writer, hello, max_frame_bytes, expect_result=early)

    try:
        return await asyncio.wait_for(go(), timeout)
    except TimeoutError:
        raise TransportError(f"handshake with {endpoint} timed out after {timeout:.1f}s") from None
