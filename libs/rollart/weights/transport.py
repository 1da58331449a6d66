"""Striped TCP transport of delta segments (docs/weight-plane.md, "Striped transport").

One *session* carries the segments of one delta ``D_v`` over ``S`` TCP connections (stripes). Segments are
handed to the connections round-robin, skipping a connection whose send buffer is still full (a stalled
stripe does not hold the others back); the receiver verifies each one (CRC-32, HMAC, job and version),
drops duplicates by sequence number and keeps ``h(v)`` over them in sequence order.

Either side may dial: in a *push* session the dialer sends (trainer -> relay), in a *pull* session the
dialer receives (subscriber -> relay). The dialer also re-dials a dropped stripe (same session id and
stream index); the receiver then sends a RESUME naming what it lacks, and the sender re-sends exactly
the segments it had put on dead connections that the receiver still lacks. A segment that fails
verification costs its connection (it is treated as a drop), so corruption and forgery are repaired by
the same path; too many faults fail the session and the caller falls back to another source.

Two latency cuts (docs/weight-plane.md): a fresh push stripe's dialer sends segments right behind its AUTH
(*early data*, one round trip before RESULT and RESUME), and a receiver that sees a stripe fall silent while
segments are missing sends a RESUME on it, after which the sender re-sends that stripe's missing segments
over the others (*tail hedging*).

Wire format (all integers little-endian)::

    HELLO     C->S  "RWTP" u8 proto=1  u8 role (1 push, 2 pull)  u16 S  u16 stream_index  u16 flags (1 resume)
                    u64 version  16s session_id  32s client_nonce  u16 job_len  job
    CHALLENGE S->C  "RWTP" u8 proto  u8 status  32s server_nonce  32s server_proof  u16 msg_len  msg
    AUTH      C->S  u8 status (0, or 1: the server's proof did not verify)  32s client_proof
    RESULT    S->C  u8 status  u16 msg_len  msg
    then frames     u8 type  u32 length  payload
        SEG    (1) sender->receiver  one segment, verbatim
        RESUME (2) receiver->sender  u64 version  u32 from_seq  u32 n  n x u32 missing: the receiver has every
                                     seq below from_seq except the listed ones, and nothing from from_seq on
        DONE   (3) receiver->sender  u64 version  32s h(v): complete and verified
        ERROR  (4) either            u8 fatal  UTF-8 message (then the connection closes)

``server_proof = HMAC-SHA256(key, "rwtp-server\\0" | HELLO | server_nonce)`` and
``client_proof = HMAC-SHA256(key, "rwtp-client\\0" | HELLO | server_nonce)``: both sides prove they hold
the job key without sending it; fresh nonces on both sides make a recorded handshake useless.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import logging
import os
import socket
import struct
import time
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rollart.delta import segment as sg
from rollart.delta.errors import (
    BaseMismatchError,
    DeltaError,
    MismatchError,
    SequenceError,
    TrailerError,
)

log = logging.getLogger(__name__)

MAGIC = b"RWTP"
PROTOCOL_VERSION = 1
ROLE_PUSH = 1  # the dialer sends segments
ROLE_PULL = 2  # the dialer receives segments
ROLE_NAMES = {ROLE_PUSH: "push", ROLE_PULL: "pull"}
FLAG_RESUME = 1

# Handshake status codes.
ST_OK = 0
ST_PROTOCOL = 1
ST_UNKNOWN_JOB = 2
ST_AUTH = 3
ST_REFUSED = 4

F_SEG, F_RESUME, F_DONE, F_ERROR = 1, 2, 3, 4
_FRAME_NAMES = {F_SEG: "SEG", F_RESUME: "RESUME", F_DONE: "DONE", F_ERROR: "ERROR"}

_HELLO = struct.Struct("<4sBBHHHQ16s32sH")
_CHALLENGE = struct.Struct("<4sBB32s32sH")
_AUTH = struct.Struct("<B32s")
_RESULT = struct.Struct("<BH")
_FRAME = struct.Struct("<BI")
_RESUME = struct.Struct("<QII")
_DONE = struct.Struct("<Q32s")
_SEQ = struct.Struct("<I")  # a segment's seq sits at byte 12, its version at 16 (docs/delta-format.md)

MAX_STREAMS = 64
MAX_JOB_BYTES = sg.MAX_JOB_BYTES
DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024
_LABEL_SERVER = b"rwtp-server\0"
_LABEL_CLIENT = b"rwtp-client\0"
WRITE_HIGH_WATER = 256 * 1024  # bytes queued in user space before a stripe counts as busy
# Unsent bytes the kernel holds per stripe (TCP_NOTSENT_LOWAT): beyond it the socket is not writable, the
# rest waits in user space and the stripe counts as busy, so a stalled stripe stops taking segments after
# ~this much instead of after megabytes of socket buffer (the others take them). In-flight data (the
# congestion window) is not limited. 512 KiB is 32 ms at 16 MB/s: a late wake-up does not starve the link.
NOTSENT_LOWAT = 512 * 1024
# Tail hedging: while segments are missing, a stripe that delivered nothing for this long (and for three
# times its usual pause) is reported (a RESUME on it), and the sender re-sends the missing segments it had
# put on that stripe over the others. The receiver drops whichever copy comes second. A quarter second is
# longer than a shared link's regular pauses (at 50 ms, stripes taking turns on a 10 MB/s link were
# reported and re-sent up to 1.5x the delta) and as long as a TCP retransmission timeout (>= 200 ms + RTT).
HEDGE_AFTER_S = 0.25
VERIFY_IN_THREAD_BYTES = 128 * 1024  # segments at least this large are verified off the event loop


# ------------------------------------------------------------------------------------------------- errors


class TransportError(Exception):
    """The weight transport failed."""


class HandshakeError(TransportError):
    """A connection's handshake was rejected; ``status`` is the handshake status code."""

    status = ST_PROTOCOL


class ProtocolError(HandshakeError):
    """The peer does not speak this protocol, or broke it."""


class UnknownJobError(HandshakeError):
    status = ST_UNKNOWN_JOB


class AuthenticationError(HandshakeError):
    """Challenge-response failed: the two sides do not hold the same job key."""

    status = ST_AUTH


class RefusedError(HandshakeError):
    """The peer authenticated us but will not serve this session (e.g. version not available)."""

    status = ST_REFUSED


class SessionError(TransportError):
    """A session could not complete: every stripe lost for too long, too many bad segments, or a fatal error."""


_STATUS_ERRORS: dict[int, type[HandshakeError]] = {
    ST_PROTOCOL: ProtocolError,
    ST_UNKNOWN_JOB: UnknownJobError,
    ST_AUTH: AuthenticationError,
    ST_REFUSED: RefusedError,
}


# ----------------------------------------------------------------------------------------------- handshake


@dataclass(frozen=True)
class Hello:
    role: int
    job: str
    version: int
    streams: int
    stream_index: int
    session_id: bytes
    resume: bool = False
    nonce: bytes = b""

    def encode(self) -> bytes:
        job = self.job.encode("utf-8")
        nonce = self.nonce or os.urandom(32)
        return (
            _HELLO.pack(
                MAGIC,
                PROTOCOL_VERSION,
                self.role,
                self.streams,
                self.stream_index,
                FLAG_RESUME if self.resume else 0,
                self.version,
                self.session_id,
                nonce,
                len(job),
            )
            + job
        )

    def with_index(self, index: int, resume: bool) -> Hello:
        return Hello(self.role, self.job, self.version, self.streams, index, self.session_id, resume)

    @property
    def session_hex(self) -> str:
        return self.session_id.hex()[:12]


def validate_hello(h: Hello) -> None:
    if h.role not in ROLE_NAMES:
        raise ProtocolError(f"unknown role {h.role}")
    if not 1 <= h.streams <= MAX_STREAMS:
        raise ProtocolError(f"stream count {h.streams} outside 1..{MAX_STREAMS}")
    if not 0 <= h.stream_index < h.streams:
        raise ProtocolError(f"stream index {h.stream_index} outside 0..{h.streams - 1}")
    if not 1 <= len(h.job.encode("utf-8")) <= MAX_JOB_BYTES:
        raise ProtocolError("job id must be 1..1024 UTF-8 bytes")


def _proof(key: bytes, label: bytes, hello_raw: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(key, label + hello_raw + server_nonce, hashlib.sha256).digest()


async def _read_msg(reader: asyncio.StreamReader, n: int) -> bytes:
    if n == 0:
        return b""
    return await reader.readexactly(n)


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError, AttributeError):  # Linux, macOS
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_NOTSENT_LOWAT", 25), NOTSENT_LOWAT)
    with contextlib.suppress(AttributeError, NotImplementedError):
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)


async def client_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: Hello, key: bytes, early: bool = False
) -> None:
    """Run the dialer's side; raises a HandshakeError subclass with the peer's reason on rejection.

    ``early``: return right after AUTH, without waiting for RESULT (the caller's Connection reads it first and
    fails with the peer's reason if it is not OK): the dialer may send frames one round trip sooner. Only once
    the listener proved it holds the key (its CHALLENGE verified), so nothing goes to an impostor.
    """
    hello_raw = hello.encode()
    writer.write(hello_raw)
    await writer.drain()
    try:
        head = await reader.readexactly(_CHALLENGE.size)
    except asyncio.IncompleteReadError:
        raise ProtocolError("the peer closed the connection during the handshake") from None
    magic, proto, status, server_nonce, server_proof, msg_len = _CHALLENGE.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"the peer is not a RollArt weight-transport endpoint (magic {magic!r})")
    msg = (await _read_msg(reader, msg_len)).decode("utf-8", "replace")
    if status != ST_OK:
        raise _STATUS_ERRORS.get(status, ProtocolError)(msg or f"handshake rejected (status {status})")
    if proto != PROTOCOL_VERSION:
        raise ProtocolError(f"peer speaks transport protocol {proto}, this side {PROTOCOL_VERSION}")
    expected = _proof(key, _LABEL_SERVER, hello_raw, server_nonce)
    if not hmac.compare_digest(expected, server_proof):
        writer.write(_AUTH.pack(1, b"\0" * 32))
        with contextlib.suppress(Exception):
            await writer.drain()
        raise AuthenticationError(
            f"the server at {writer.get_extra_info('peername')} could not prove it holds job {hello.job!r}'s key "
            "(the two sides have different job keys)"
        )
    writer.write(_AUTH.pack(0, _proof(key, _LABEL_CLIENT, hello_raw, server_nonce)))
    await writer.drain()
    if early:
        return
    try:
        status, msg_len = _RESULT.unpack(await reader.readexactly(_RESULT.size))
        msg = (await _read_msg(reader, msg_len)).decode("utf-8", "replace")
    except asyncio.IncompleteReadError:
        raise ProtocolError("the peer closed the connection during the handshake") from None
    if status != ST_OK:
        raise _STATUS_ERRORS.get(status, ProtocolError)(msg or f"handshake rejected (status {status})")


Admit = Callable[["Hello"], Awaitable[Callable[["Connection"], None]]]


async def server_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    key_for: Callable[[str], bytes | None],
    admit: Admit,
) -> tuple[Hello, Callable[[Connection], None]]:
    """Run the listener's side. Sends the reason to the dialer and raises on rejection.

    ``admit(hello)`` runs after authentication; it returns the function that takes over the connection,
    or raises RefusedError (its message goes to the dialer).
    """

    async def reject(status: int, message: str, challenge: bool) -> None:
        raw = message.encode("utf-8")[:4000]
        if challenge:
            writer.write(_CHALLENGE.pack(MAGIC, PROTOCOL_VERSION, status, b"\0" * 32, b"\0" * 32, len(raw)) + raw)
        else:
            writer.write(_RESULT.pack(status, len(raw)) + raw)
        with contextlib.suppress(Exception):
            await writer.drain()

    try:
        head = await reader.readexactly(_HELLO.size)
    except asyncio.IncompleteReadError:
        raise ProtocolError("the peer closed the connection before its hello") from None
    magic, proto, role, streams, index, flags, version, session_id, nonce, job_len = _HELLO.unpack(head)
    if magic != MAGIC:
        await reject(ST_PROTOCOL, "not a RollArt weight-transport hello (bad magic)", True)
        raise ProtocolError(f"bad magic {magic!r} from {writer.get_extra_info('peername')}")
    if proto != PROTOCOL_VERSION:
        await reject(ST_PROTOCOL, f"transport protocol {proto} not supported (this side: {PROTOCOL_VERSION})", True)
        raise ProtocolError(f"unsupported protocol {proto}")
    if not 1 <= job_len <= MAX_JOB_BYTES:
        await reject(ST_PROTOCOL, f"bad job id length {job_len}", True)
        raise ProtocolError(f"bad job id length {job_len}")
    job_raw = await reader.readexactly(job_len)
    hello_raw = head + job_raw
    try:
        job = job_raw.decode("utf-8")
        hello = Hello(role, job, version, streams, index, session_id, bool(flags & FLAG_RESUME), nonce)
        validate_hello(hello)
    except (UnicodeDecodeError, ProtocolError) as exc:
        await reject(ST_PROTOCOL, f"malformed hello: {exc}", True)
        raise ProtocolError(f"malformed hello: {exc}") from None
    key = key_for(job)
    if key is None:
        await reject(ST_UNKNOWN_JOB, f"job {job!r} is not served at this endpoint", True)
        raise UnknownJobError(f"hello for unknown job {job!r}")
    server_nonce = os.urandom(32)
    proof = _proof(key, _LABEL_SERVER, hello_raw, server_nonce)
    writer.write(_CHALLENGE.pack(MAGIC, PROTOCOL_VERSION, ST_OK, server_nonce, proof, 0))
    await writer.drain()
    try:
        status, client_proof = _AUTH.unpack(await reader.readexactly(_AUTH.size))
    except asyncio.IncompleteReadError:
        raise ProtocolError("the peer closed the connection during the handshake") from None
    if status != 0:
        raise AuthenticationError(
            f"the dialer rejected this side's proof for job {job!r}: the two sides have different job keys"
        )
    if not hmac.compare_digest(client_proof, _proof(key, _LABEL_CLIENT, hello_raw, server_nonce)):
        await reject(ST_AUTH, f"authentication failed: the dialer does not hold job {job!r}'s key", False)
        raise AuthenticationError(f"bad client proof for job {job!r} from {writer.get_extra_info('peername')}")
    try:
        take = await admit(hello)
    except RefusedError as exc:
        await reject(ST_REFUSED, str(exc), False)
        raise
    writer.write(_RESULT.pack(ST_OK, 0))
    await writer.drain()
    return hello, take


# ---------------------------------------------------------------------------------------------- connection


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


# ------------------------------------------------------------------------------------------------ tracking


def seq_of(raw: bytes | bytearray | memoryview) -> int:
    return _SEQ.unpack_from(raw, 12)[0]


class SegmentTracker:
    """Which segments of one delta are here, whether it is complete, and ``h(v)`` over them in seq order.

    Segments arrive in any order (stripes overtake each other); the hash covers the contiguous prefix as
    it fills, keeping only the out-of-order segments referenced meanwhile. No element is ever looked at.
    """

    def __init__(self, job: str, version: int, base_version: int | None = None) -> None:
        self.job = job
        self.version = version
        self.base_version = base_version
        self._have: set[int] = set()
        self._pending: dict[int, bytes | bytearray | memoryview] = {}
        self._sha = hashlib.sha256()
        self._hashed = 0
        self.segment_count: int | None = None  # data segments, from the trailer
        self.trailer_hash: bytes | None = None
        self.hash: bytes | None = None  # verified h(v)
        self.bytes = 0
        self.duplicates = 0

    def check(self, seg: sg.Segment) -> None:
        if seg.job != self.job:
            raise MismatchError(f"segment {seg.seq} belongs to job {seg.job!r}, not {self.job!r}")
        if seg.version != self.version:
            raise MismatchError(f"segment {seg.seq} belongs to version {seg.version}, not {self.version}")
        if self.base_version is not None and seg.base_version != self.base_version:
            raise BaseMismatchError(
                f"segment {seg.seq} of version {seg.version} is based on {seg.base_version}, not {self.base_version}"
            )
        if seg.is_trailer:
            if self.segment_count is not None:
                raise SequenceError(f"a second trailer (seq {seg.seq}) for version {self.version}")
            if self._have and max(self._have) >= seg.segment_count:
                raise SequenceError(f"trailer counts {seg.segment_count} segments, more arrived")
        elif self.segment_count is not None and seg.seq >= self.segment_count:
            raise SequenceError(f"segment {seg.seq} beyond the trailer's count {self.segment_count}")

    def add(self, seg: sg.Segment) -> bool:
        """Record a verified segment; False for a duplicate. Raises a DeltaError for a foreign one."""
        if seg.seq in self._have:
            self.duplicates += 1
            return False
        self.check(seg)
        if self.base_version is None:
            self.base_version = seg.base_version
        self._have.add(seg.seq)
        self.bytes += len(seg.raw)
        if seg.is_trailer:
            self.segment_count = seg.segment_count
            self.trailer_hash = seg.hash
        else:
            self._pending[seg.seq] = seg.raw
            while self._hashed in self._pending:
                self._sha.update(self._pending.pop(self._hashed))
                self._hashed += 1
        if self.complete and self.hash is None:
            digest = self._sha.digest()
            if digest != self.trailer_hash:
                raise TrailerError(
                    f"version {self.version}: segments hash to {digest.hex()[:16]}…, "
                    f"the trailer says {self.trailer_hash.hex()[:16]}…"  # type: ignore[union-attr]
                )
            self.hash = digest
        return True

    def has(self, seq: int) -> bool:
        return seq in self._have

    @property
    def received(self) -> int:
        return len(self._have)

    @property
    def total(self) -> int | None:
        """Segments including the trailer, once the trailer is known."""
        return None if self.segment_count is None else self.segment_count + 1

    @property
    def complete(self) -> bool:
        return self.segment_count is not None and len(self._have) == self.segment_count + 1

    @property
    def verified(self) -> bool:
        return self.hash is not None

    def resume(self) -> tuple[int, list[int]]:
        """(from_seq, missing): every seq below from_seq is here except ``missing``."""
        if self.segment_count is not None:
            top = self.segment_count + 1
        else:
            top = max(self._have) + 1 if self._have else 0
        if len(self._have) == top:
            return top, []
        have = np.fromiter(self._have, dtype=np.int64, count=len(self._have))
        mask = np.ones(top, dtype=bool)
        mask[have[have < top]] = False
        return top, np.flatnonzero(mask).tolist()

    def missing(self) -> list[int]:
        """Seqs known to be missing (with no trailer yet, also the next one after the highest seen)."""
        top, miss = self.resume()
        return miss if self.segment_count is not None else [*miss, top]


class SegmentSink(Protocol):
    """Where a receiving session puts verified segments (a relay's buffer, a subscriber's stager)."""

    tracker: SegmentTracker

    async def put(self, seg: sg.Segment) -> bool:
        """Stage a verified segment; False when it was a duplicate."""
        ...


class TrackerSink:
    """A sink that only tracks (and optionally hands each new segment to ``on_segment``)."""

    def __init__(
        self, tracker: SegmentTracker, on_segment: Callable[[sg.Segment], Awaitable[None]] | None = None
    ) -> None:
        self.tracker = tracker
        self.on_segment = on_segment
        self.segments: dict[int, bytes | bytearray | memoryview] = {}
        self.keep = on_segment is None

    async def put(self, seg: sg.Segment) -> bool:
        if not self.tracker.add(seg):
            return False
        if self.keep:
            self.segments[seg.seq] = seg.raw
        if self.on_segment is not None:
            await self.on_segment(seg)
        return True

    def ordered(self) -> list[bytes | bytearray | memoryview]:
        return [self.segments[i] for i in sorted(self.segments)]


# ------------------------------------------------------------------------------------------------ sessions


class _Signal:
    """Wake every waiter when state changes (asyncio is single-threaded: no lock needed around the state)."""

    def __init__(self) -> None:
        self._ev = asyncio.Event()

    def notify(self) -> None:
        self._ev.set()

    async def wait_for(self, pred: Callable[[], bool]) -> None:
        while not pred():
            self._ev.clear()
            await self._ev.wait()


class _Slot:
    __slots__ = ("index", "conn", "gen", "busy", "task", "resumed", "hedged_rx")

    def __init__(self, index: int) -> None:
        self.index = index
        self.conn: Connection | None = None
        self.gen = 0
        self.busy = False
        self.task: asyncio.Task | None = None
        self.resumed = False  # sender: this connection's first RESUME came (a later one asks for a hedge)
        self.hedged_rx = -1.0  # receiver: the silence (last_rx) already reported on this connection


Redial = Callable[[int], Awaitable[Connection]]


class _Session:
    """S stripes of one session; re-dials lost ones when this side dialled (``redial``)."""

    def __init__(
        self,
        *,
        job: str,
        version: int,
        streams: int,
        session_id: bytes,
        redial: Redial | None = None,
        reconnect_timeout: float = 10.0,
        idle_timeout: float = 60.0,
        name: str = "",
    ) -> None:
        self.job, self.version, self.streams, self.session_id = job, version, streams, session_id
        self.slots = [_Slot(i) for i in range(streams)]
        self.redial = redial
        self.reconnect_timeout = reconnect_timeout
        self.idle_timeout = idle_timeout
        self.name = name or f"{job}/v{version}/{session_id.hex()[:8]}"
        self.sig = _Signal()
        self.error: BaseException | None = None
        self.finished = False
        self.bytes_in = 0
        self.bytes_out = 0
        self.reconnects = 0
        self.faults = 0
        self.last_activity = time.monotonic()
        self._tasks: set[asyncio.Task] = set()
        self._redialing: set[int] = set()
        self._orphan_since: float | None = time.monotonic()
        self._spawn(self._watchdog())

    # -- plumbing

    def _spawn(self, coro: Awaitable) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def live(self) -> list[_Slot]:
        return [s for s in self.slots if s.conn is not None]

    def ended_ok(self) -> bool:
        """True once the session reached its goal (then losing stripes is the normal end)."""
        return False

    def attach(self, index: int, conn: Connection) -> None:
        """Take over a (re)connected stripe; a stripe it replaces counts as lost."""
        if self.finished:
            conn.close()
            return
        slot = self.slots[index]
        if slot.conn is not None:
            self._lost(slot, slot.gen, ConnectionResetError("superseded by a new connection"), redial=False)
        slot.gen += 1
        slot.conn = conn
        slot.busy = False
        slot.resumed = False
        slot.hedged_rx = -1.0
        self._orphan_since = None
        self.last_activity = time.monotonic()
        slot.task = self._spawn(self._read_loop(slot, slot.gen, conn))
        self._attached(slot)
        self.sig.notify()

    def _attached(self, slot: _Slot) -> None:
        pass

    async def _read_loop(self, slot: _Slot, gen: int, conn: Connection) -> None:
        try:
            while True:
                ftype, payload = await conn.read_frame()
                self.bytes_in += _FRAME.size + len(payload)
                self.last_activity = time.monotonic()
                if ftype == F_ERROR:
                    fatal = payload[:1] == b"\x01"
                    msg = payload[1:].decode("utf-8", "replace")
                    if fatal:
                        self.fail(SessionError(f"peer ended session {self.name}: {msg}"))
                        return
                    raise ConnectionResetError(f"peer dropped the stripe: {msg}")
                await self._frame(slot, gen, conn, ftype, payload)
                if self.finished:
                    return
        except asyncio.CancelledError:
            raise
        except (RefusedError, AuthenticationError, UnknownJobError) as exc:  # an early stripe's RESULT: final
            self.fail(exc)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ProtocolError) as exc:
            self._lost(slot, gen, exc)
        except Exception as exc:  # noqa: BLE001 - a bug must not hang the session
            log.exception("session %s: stripe %d failed", self.name, slot.index)
            self._lost(slot, gen, exc)

    async def _frame(self, slot: _Slot, gen: int, conn: Connection, ftype: int, payload: bytes | bytearray) -> None:
        raise ProtocolError(f"unexpected {_FRAME_NAMES.get(ftype, ftype)} frame")

    def drop(self, slot: _Slot, gen: int, reason: str, exc: BaseException | None = None) -> None:
        """Tell the peer why and drop one stripe (it is re-dialled and resumed)."""
        conn = slot.conn
        if conn is not None and slot.gen == gen:
            with contextlib.suppress(Exception):
                conn.write_frame(F_ERROR, b"\x00" + reason.encode("utf-8")[:4000])
        self._lost(slot, gen, exc or ConnectionResetError(reason))

    def _lost(self, slot: _Slot, gen: int, exc: BaseException, redial: bool = True) -> None:
        if slot.gen != gen or slot.conn is None:
            return
        conn = slot.conn
        slot.conn = None
        slot.busy = False
        if slot.task is not None and slot.task is not asyncio.current_task():
            slot.task.cancel()
        conn.close()
        if self.finished:
            return
        if self.ended_ok():
            if not self.live():
                self._finish()
            return
        log.info("session %s: stripe %d lost (%s)", self.name, slot.index, exc)
        if not self.live():
            self._orphan_since = time.monotonic()
        if redial:
            self._start_redial(slot.index)
        self.sig.notify()

    def _start_redial(self, index: int) -> None:
        if self.redial is not None and not self.finished and index not in self._redialing:
            self._redialing.add(index)
            self._spawn(self._redial_loop(index))

    async def _redial_loop(self, index: int) -> None:
        assert self.redial is not None
        deadline = time.monotonic() + self.reconnect_timeout
        delay = 0.02
        last: BaseException | None = None
        try:
            while not self.finished and time.monotonic() < deadline:
                try:
                    conn = await asyncio.wait_for(self.redial(index), max(0.1, deadline - time.monotonic()))
                except (HandshakeError, TransportError, OSError, TimeoutError) as exc:
                    last = exc
                    if isinstance(exc, AuthenticationError | UnknownJobError | RefusedError):
                        break  # retrying cannot help
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                if self.finished:
                    conn.close()
                    return
                self.reconnects += 1
                self._redialing.discard(index)
                self.attach(index, conn)
                return
        finally:
            self._redialing.discard(index)
        if not self.finished and not self.live() and not self._redialing:
            self.fail(SessionError(f"session {self.name}: every stripe lost, reconnecting failed: {last}"))

    async def _watchdog(self) -> None:
        tick = max(0.02, min(0.25, self.reconnect_timeout / 4, self.idle_timeout / 4))
        while not self.finished:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if self._orphan_since is not None and not self._redialing and not self.live():
                if now - self._orphan_since > self.reconnect_timeout:
                    self.fail(SessionError(f"session {self.name}: no stripe for {self.reconnect_timeout:.1f}s"))
                    return
            if now - self.last_activity > self.idle_timeout and self._idle_matters():
                self.fail(SessionError(f"session {self.name}: no progress for {self.idle_timeout:.1f}s"))
                return

    def _idle_matters(self) -> bool:
        return False

    def fail(self, exc: BaseException) -> None:
        if self.finished:
            return
        if not self.ended_ok():
            self.error = exc
            log.warning("session %s failed: %s", self.name, exc)
        self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        for slot in self.slots:
            if slot.conn is not None:
                slot.conn.close()
                slot.conn = None
        self.sig.notify()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        self._finish()
        current = asyncio.current_task()
        await asyncio.gather(*[t for t in self._tasks if t is not current], return_exceptions=True)


class SenderSession(_Session):
    """Sends one delta's segments round-robin over its stripes and repairs losses on RESUME.

    ``send(raw)`` applies back-pressure: at most ``max_queued`` segments wait in this session, and a
    stripe takes a new segment only once its socket buffer has drained. Nothing goes out before the
    receiver's first RESUME says what it already has.
    """

    def __init__(self, *, max_queued: int = 4, **kw: object) -> None:
        self.max_queued = max_queued
        self._queue: deque[int] = deque()
        self._resend: deque[int] = deque()
        self._avoid: dict[int, int] = {}  # seq -> the slow stripe a hedged copy must not take
        self._hedged: set[int] = set()  # seqs hedged once (never twice)
        self._store: dict[int, bytes | bytearray | memoryview] = {}
        self._sent: dict[int, tuple[int, int]] = {}  # seq -> (stripe, generation)
        self._from_seq: int | None = None  # from the receiver's last RESUME
        self._missing: set[int] = set()
        self._rr = 0
        self.done = asyncio.Event()
        self.done_hash: bytes | None = None
        self.segments_sent = 0
        self.segments_resent = 0
        self.segments_hedged = 0
        self.segments_skipped = 0
        self.payload_bytes = 0
        super().__init__(**kw)  # type: ignore[arg-type]
        self._spawn(self._dispatch())

    def ended_ok(self) -> bool:
        return self.done.is_set()

    def _idle_matters(self) -> bool:
        # Stuck with work in hand (a receiver that stopped reading without closing): give up after
        # idle_timeout. Waiting for the producer (a delta still being extracted upstream) is not idling.
        return bool(self._queue or self._resend or any(s.busy for s in self.slots))

    def _wanted(self, seq: int) -> bool:
        assert self._from_seq is not None
        return seq >= self._from_seq or seq in self._missing

    async def send(self, raw: bytes | bytearray | memoryview) -> None:
        """Queue one segment (waits while the session is full). A no-op once the receiver is done."""
        seq = seq_of(raw)
        await self.sig.wait_for(lambda: len(self._queue) < self.max_queued or self.finished)
        if self.error is not None:
            raise self.error
        if self.finished:
            return
        self._store[seq] = raw
        self._queue.append(seq)
        self.sig.notify()

    async def finish(self, timeout: float | None = None) -> bytes:
        """Wait for the receiver's DONE (returns its h(v)); raises SessionError on failure."""
        try:
            await asyncio.wait_for(self.sig.wait_for(lambda: self.finished), timeout)
        except TimeoutError:
            self.fail(SessionError(f"session {self.name}: no DONE within {timeout:.1f}s"))
        if not self.done.is_set():
            raise self.error or SessionError(f"session {self.name} ended without DONE")
        assert self.done_hash is not None
        return self.done_hash

    def _ready_slot(self, avoid: int | None = None) -> _Slot | None:
        n = self.streams
        for k in range(n):
            slot = self.slots[(self._rr + k) % n]
            if slot.conn is not None and not slot.busy and slot.index != avoid:
                self._rr = (slot.index + 1) % n
                return slot
        return None

    def _can_dispatch(self) -> bool:
        if self.finished:
            return True
        if self._from_seq is None or not (self._resend or self._queue):
            return False
        return any(s.conn is not None and not s.busy for s in self.slots)

    async def _dispatch(self) -> None:
        while True:
            await self.sig.wait_for(self._can_dispatch)
            if self.finished:
                return
            resend = bool(self._resend)
            seq = self._resend.popleft() if resend else self._queue.popleft()
            self.sig.notify()  # queue space for send()
            if not self._wanted(seq) or (not resend and seq in self._sent):
                self.segments_skipped += 1
                continue
            avoid = self._avoid.pop(seq, None) if resend else None
            hedge = avoid is not None and self._sent.get(seq, (-1, 0))[0] == avoid
            slot = self._ready_slot(avoid if hedge else None)
            if slot is None:  # only the slow stripe itself is ready: its copy is still on the way
                self.segments_skipped += 1
                continue
            assert slot.conn is not None
            raw = self._store[seq]
            conn = slot.conn
            try:
                conn.write_frame(F_SEG, raw)
            except Exception as exc:  # noqa: BLE001 - a dead socket: requeue, treat as a loss
                self._resend.appendleft(seq)
                self._lost(slot, slot.gen, exc)
                continue
            self._sent[seq] = (slot.index, slot.gen)
            self.last_activity = time.monotonic()
            self.segments_sent += 1
            self.segments_resent += resend and not hedge
            self.segments_hedged += hedge
            self.payload_bytes += len(raw)
            self.bytes_out += _FRAME.size + len(raw)
            if conn.buffered() > WRITE_HIGH_WATER // 2:
                slot.busy = True
                self._spawn(self._drain(slot, slot.gen, conn))
            else:
                await asyncio.sleep(0)  # let readers (RESUME, DONE) run between small segments

    async def _drain(self, slot: _Slot, gen: int, conn: Connection) -> None:
        try:
            await conn.drain()
        except Exception as exc:  # noqa: BLE001
            self._lost(slot, gen, exc)
            return
        if slot.gen == gen:
            slot.busy = False
        self.last_activity = time.monotonic()
        self.sig.notify()

    def _dead(self, where: tuple[int, int]) -> bool:
        s = self.slots[where[0]]
        return s.gen != where[1] or s.conn is None

    async def _frame(self, slot: _Slot, gen: int, conn: Connection, ftype: int, payload: bytes | bytearray) -> None:
        if ftype == F_RESUME:
            if len(payload) < _RESUME.size:
                raise ProtocolError("short RESUME frame")
            version, from_seq, n = _RESUME.unpack_from(payload, 0)
            if version != self.version or len(payload) != _RESUME.size + 4 * n:
                raise ProtocolError(f"RESUME for version {version} ({len(payload)} bytes) in session {self.name}")
            missing = np.frombuffer(payload, dtype="<u4", count=n, offset=_RESUME.size)
            self._from_seq = from_seq
            self._missing = set(missing.tolist())
            if slot.resumed and slot.gen == gen:
                # Not this connection's first RESUME: the receiver has had nothing on it for a while in the
                # tail (HEDGE_AFTER_S). What it still lacks of what went out here goes again over the other
                # stripes, once per segment; whichever copy comes second is dropped as a duplicate.
                here = (slot.index, gen)
                for seq in sorted(q for q, where in self._sent.items() if where == here and self._wanted(q)):
                    if seq not in self._hedged and seq not in self._resend:
                        self._hedged.add(seq)
                        self._avoid[seq] = slot.index
                        self._resend.append(seq)
            slot.resumed = True
            # What went out on dead stripes and is still lacking goes again; what is in flight on live
            # stripes will arrive by itself.
            again = sorted(seq for seq, where in self._sent.items() if self._dead(where) and self._wanted(seq))
            for seq in again:
                del self._sent[seq]
                if seq not in self._resend:
                    self._resend.append(seq)
            self.sig.notify()
        elif ftype == F_DONE:
            if len(payload) != _DONE.size:
                raise ProtocolError("bad DONE frame")
            version, digest = _DONE.unpack(payload)
            if version != self.version:
                raise ProtocolError(f"DONE for version {version} in session {self.name}")
            self.done_hash = digest
            self.done.set()
            self._finish()
        else:
            raise ProtocolError(f"unexpected {_FRAME_NAMES[ftype]} frame at the sender")


class ReceiverSession(_Session):
    """Receives one delta over its stripes into a sink; verifies every segment before the sink sees it."""

    def __init__(
        self, *, key: bytes, sink: SegmentSink, max_faults: int = 8, hedge_after: float = HEDGE_AFTER_S, **kw: object
    ) -> None:
        self.key = key
        self.sink = sink
        self.max_faults = max_faults
        self.hedge_after = hedge_after  # <= 0: no tail hedging
        self.hedges = 0  # RESUMEs sent on silent stripes
        self._hedging = False
        self.complete = asyncio.Event()
        self.segments_in = 0
        self.duplicates = 0
        self.last_fault: str | None = None
        if sink.tracker.complete:
            self.complete.set()
        super().__init__(**kw)  # type: ignore[arg-type]

    def ended_ok(self) -> bool:
        return self.complete.is_set()

    def _idle_matters(self) -> bool:
        return not self.complete.is_set()

    def _attached(self, slot: _Slot) -> None:
        conn = slot.conn
        assert conn is not None
        tracker = self.sink.tracker
        if tracker.complete and tracker.hash is not None:
            conn.write_frame(F_DONE, _DONE.pack(self.version, tracker.hash))
            self.complete.set()
            return
        from_seq, missing = tracker.resume()
        body = _RESUME.pack(self.version, from_seq, len(missing)) + np.asarray(missing, dtype="<u4").tobytes()
        conn.write_frame(F_RESUME, body)

    def _fault(self, slot: _Slot, gen: int, exc: DeltaError) -> None:
        self.faults += 1
        self.last_fault = f"{type(exc).__name__}: {exc}"
        log.warning("session %s: bad segment (%d so far): %s", self.name, self.faults, self.last_fault)
        if self.faults > self.max_faults:
            self._fatal(f"{self.faults} bad segments, last: {self.last_fault}")
        else:
            # The segment goes with its stripe; the RESUME after re-dialling fetches it again.
            self.drop(slot, gen, f"segment rejected: {self.last_fault}", exc)

    async def _frame(self, slot: _Slot, gen: int, conn: Connection, ftype: int, payload: bytes | bytearray) -> None:
        if ftype != F_SEG:
            raise ProtocolError(f"unexpected {_FRAME_NAMES[ftype]} frame at the receiver")
        if self.complete.is_set():
            self.duplicates += 1
            return
        tracker = self.sink.tracker
        if len(payload) >= 16 and tracker.has(seq_of(payload)):
            self.duplicates += 1  # (unverified seq: a forged one only skips a segment the RESUME re-fetches)
            return
        try:
            if len(payload) >= VERIFY_IN_THREAD_BYTES:
                # CRC-32 and HMAC release the GIL: this stripe's segment is verified on another core while
                # the loop moves the other stripes' bytes.
                seg = await asyncio.to_thread(sg.parse, payload, self.key)
                if self.complete.is_set() or tracker.has(seg.seq):
                    self.duplicates += 1
                    return
            else:
                seg = sg.parse(payload, self.key)
            tracker.check(seg)
        except DeltaError as exc:
            self._fault(slot, gen, exc)
            return
        try:
            new = await self.sink.put(seg)
        except TrailerError as exc:  # every segment verified, yet h(v) differs: no resend can fix that
            self._fatal(f"{type(exc).__name__}: {exc}")
            return
        except DeltaError as exc:
            self._fault(slot, gen, exc)
            return
        if new:
            self.segments_in += 1
        else:
            self.duplicates += 1
        if not self._hedging and self.hedge_after > 0 and not tracker.complete:
            self._hedging = True
            self._spawn(self._hedge_watch())
        if tracker.complete and not self.complete.is_set():
            assert tracker.hash is not None
            done = _DONE.pack(self.version, tracker.hash)
            for s in self.live():
                with contextlib.suppress(Exception):
                    s.conn.write_frame(F_DONE, done)  # type: ignore[union-attr]
            self.complete.set()
            self.sig.notify()

    async def _hedge_watch(self) -> None:
        """While segments are missing behind ones already here (a gap: some stripe is behind), report every
        stripe that has been waiting on the network for longer than its rhythm allows (three times its usual
        pause, at least ``hedge_after``) with a RESUME on it, once per silence: the sender re-sends what it had
        put on that stripe over the others (a stalled TCP flow, a retransmission timeout). No gap, no report:
        a slow producer or a finished stripe costs nothing."""
        tracker = self.sink.tracker
        while not self.finished and not tracker.complete:
            await asyncio.sleep(self.hedge_after)
            now = time.monotonic()
            for s in self.live():
                conn = s.conn
                assert conn is not None
                rx = conn.last_rx
                # Silent for longer than this path's rhythm allows (a slow shared link pauses every stripe
                # regularly: three times its usual pause, at least hedge_after).
                if now - rx < max(self.hedge_after, 3 * conn.typical_gap) or s.hedged_rx == rx:
                    continue
                if not conn.waiting_on_network():
                    continue
                from_seq, missing = tracker.resume()
                if not missing:
                    break
                s.hedged_rx = rx
                body = _RESUME.pack(self.version, from_seq, len(missing)) + np.asarray(missing, dtype="<u4").tobytes()
                with contextlib.suppress(Exception):
                    conn.write_frame(F_RESUME, body)
                    self.hedges += 1

    def _fatal(self, message: str) -> None:
        for s in self.live():
            with contextlib.suppress(Exception):
                s.conn.write_frame(F_ERROR, b"\x01" + message.encode("utf-8")[:4000])  # type: ignore[union-attr]
        self.fail(SessionError(f"session {self.name}: {message}"))

    async def wait(self, timeout: float | None = None) -> SegmentTracker:
        """Until the delta is complete and verified; raises SessionError when the session failed."""
        try:
            await asyncio.wait_for(self.sig.wait_for(lambda: self.complete.is_set() or self.finished), timeout)
        except TimeoutError:
            self.fail(SessionError(f"session {self.name}: incomplete after {timeout:.1f}s"))
        if self.complete.is_set():
            for s in self.live():  # let the DONE frames leave before the stripes close
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(s.conn.drain(), 2.0)  # type: ignore[union-attr]
            await self.close()
            return self.sink.tracker
        raise self.error or SessionError(f"session {self.name} ended incomplete")


# --------------------------------------------------------------------------------------------------- server


class TransportServer:
    """Accepts stripes: authenticates each, then hands it to the session ``admit`` chose."""

    def __init__(
        self,
        *,
        key_for: Callable[[str], bytes | None],
        admit: Admit,
        host: str = "127.0.0.1",
        port: int = 0,
        handshake_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.key_for = key_for
        self.admit = admit
        self.host, self.port = host, port
        self.handshake_timeout = handshake_timeout
        self.max_frame_bytes = max_frame_bytes
        self.server: asyncio.base_events.Server | None = None
        self.rejected = 0
        self.accepted = 0
        self.last_rejection: str | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, self.host, self.port, limit=1 << 20)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.address

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _tune(writer)
        try:
            hello, take = await asyncio.wait_for(
                server_handshake(reader, writer, self.key_for, self.admit), self.handshake_timeout
            )
        except (HandshakeError, TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self.rejected += 1
            self.last_rejection = f"{type(exc).__name__}: {exc}"
            log.warning("transport: rejected %s: %s", writer.get_extra_info("peername"), self.last_rejection)
            writer.close()
            return
        self.accepted += 1
        take(Connection(reader, writer, hello, self.max_frame_bytes))


# ---------------------------------------------------------------------------------------------- client API


def new_session_id() -> bytes:
    return os.urandom(16)


async def _open(
    session: _Session, endpoint: str, hello: Hello, key: bytes, dial_timeout: float, early: bool = False
) -> None:
    """Dial every stripe concurrently; at least one must come up, the others keep being re-dialled."""

    async def one(i: int) -> Connection:
        return await dial(endpoint, hello.with_index(i, resume=False), key, timeout=dial_timeout, early=early)

    results = await asyncio.gather(*(one(i) for i in range(session.streams)), return_exceptions=True)
    fatal: list[BaseException] = [
        r for r in results if isinstance(r, AuthenticationError | UnknownJobError | RefusedError | ProtocolError)
    ]
    ok = [(i, r) for i, r in enumerate(results) if isinstance(r, Connection)]
    if fatal or not ok:
        for _, c in ok:
            c.close()
        await session.close()
        err = (fatal or [r for r in results if isinstance(r, BaseException)])[0]
        if isinstance(err, OSError):
            raise TransportError(f"cannot reach {endpoint}: {err}") from err
        raise err
    for i, r in enumerate(results):
        if isinstance(r, Connection):
            session.attach(i, r)
        else:
            session._start_redial(i)


def _redialer(endpoint: str, hello: Hello, key: bytes, dial_timeout: float) -> Redial:
    async def redial(i: int) -> Connection:
        return await dial(endpoint, hello.with_index(i, resume=True), key, timeout=dial_timeout)

    return redial


async def open_push(
    endpoint: str,
    *,
    job: str,
    key: bytes,
    version: int,
    streams: int = 4,
    reconnect_timeout: float = 10.0,
    idle_timeout: float = 60.0,
    dial_timeout: float = 10.0,
    max_queued: int = 4,
    early_data: bool = True,
) -> SenderSession:
    """Dial ``endpoint`` and open a session that sends ``D_version`` (then call send/finish).

    ``early_data``: segments go out right behind each stripe's AUTH, from seq 0, one round trip before the
    listener's RESULT and first RESUME arrive (a refusal then fails the session with the listener's reason,
    and what the receiver already had arrives again and is dropped as duplicates: pass False when
    re-pushing a version the receiver may partly hold). Re-dialled stripes always wait for their RESUME.
    """
    hello = Hello(ROLE_PUSH, job, version, streams, 0, new_session_id())
    session = SenderSession(
        job=job,
        version=version,
        streams=streams,
        session_id=hello.session_id,
        redial=_redialer(endpoint, hello, key, dial_timeout),
        reconnect_timeout=reconnect_timeout,
        idle_timeout=idle_timeout,
        max_queued=max_queued,
        name=f"push {job}/v{version} -> {endpoint}",
    )
    if early_data:
        session._from_seq = 0  # a fresh session: the receiver is assumed to have nothing until its RESUME
    await _open(session, endpoint, hello, key, dial_timeout, early=early_data)
    return session


async def open_pull(
    endpoint: str,
    *,
    job: str,
    key: bytes,
    version: int,
    sink: SegmentSink,
    streams: int = 4,
    reconnect_timeout: float = 10.0,
    idle_timeout: float = 60.0,
    dial_timeout: float = 10.0,
    max_faults: int = 8,
) -> ReceiverSession:
    """Dial ``endpoint`` and open a session receiving ``D_version`` into ``sink`` (then call wait)."""
    hello = Hello(ROLE_PULL, job, version, streams, 0, new_session_id())
    session = ReceiverSession(
        key=key,
        sink=sink,
        max_faults=max_faults,
        job=job,
        version=version,
        streams=streams,
        session_id=hello.session_id,
        redial=_redialer(endpoint, hello, key, dial_timeout),
        reconnect_timeout=reconnect_timeout,
        idle_timeout=idle_timeout,
        name=f"pull {job}/v{version} <- {endpoint}",
    )
    await _open(session, endpoint, hello, key, dial_timeout)
    return session


@dataclass
class SendStats:
    endpoint: str
    version: int
    streams: int
    segments: int
    resent: int
    payload_bytes: int
    wire_bytes: int
    reconnects: int
    seconds: float
    hash: bytes
    hedged: int = 0  # segments sent again over other stripes because theirs was silent in the tail


async def send_delta(
    endpoint: str,
    segments: Iterable[bytes] | AsyncIterable[bytes],
    *,
    job: str,
    key: bytes,
    version: int,
    streams: int = 4,
    timeout: float | None = None,
    **kw: float,
) -> SendStats:
    """Push a delta (its segments as they are produced) to a receiver; returns when it has verified all."""
    t0 = time.perf_counter()
    session = await open_push(endpoint, job=job, key=key, version=version, streams=streams, **kw)  # type: ignore[arg-type]
    try:
        if isinstance(segments, AsyncIterable):
            async for raw in segments:
                await session.send(raw)
        else:
            for raw in segments:
                await session.send(raw)
        digest = await session.finish(timeout)
    finally:
        await session.close()
    return SendStats(
        endpoint,
        version,
        streams,
        session.segments_sent,
        session.segments_resent,
        session.payload_bytes,
        session.bytes_out,
        session.reconnects,
        time.perf_counter() - t0,
        digest,
        session.segments_hedged,
    )


async def receive_delta(
    endpoint: str,
    *,
    job: str,
    key: bytes,
    version: int,
    sink: SegmentSink | None = None,
    streams: int = 4,
    timeout: float | None = None,
    **kw: float,
) -> SegmentSink:
    """Pull a delta from a sender; returns the sink (a TrackerSink holding the segments by default)."""
    sink = sink or TrackerSink(SegmentTracker(job, version))
    session = await open_pull(endpoint, job=job, key=key, version=version, sink=sink, streams=streams, **kw)  # type: ignore[arg-type]
    try:
        await session.wait(timeout)
    finally:
        await session.close()
    return sink


__all__ = [
    "AuthenticationError",
    "Connection",
    "Hello",
    "HandshakeError",
    "ProtocolError",
    "ReceiverSession",
    "RefusedError",
    "SegmentSink",
    "SegmentTracker",
    "SendStats",
    "SenderSession",
    "SessionError",
    "TrackerSink",
    "TransportError",
    "TransportServer",
    "UnknownJobError",
    "dial",
    "open_pull",
    "open_push",
    "receive_delta",
    "send_delta",
    "seq_of",
]
