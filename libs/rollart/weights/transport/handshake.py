"""The handshake that opens every stripe: HELLO, CHALLENGE, AUTH, RESULT (wire format: docs/weight-plane.md,
"Striped transport"). Both sides prove they hold the job key without sending it (HMAC-SHA256 over the HELLO and
the server's nonce, one label per side); fresh nonces on both sides make a recorded handshake useless. A
rejection carries its reason to the dialer."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollart.delta import segment as sg

from .errors import (
    _STATUS_ERRORS,
    ST_AUTH,
    ST_OK,
    ST_PROTOCOL,
    ST_REFUSED,
    ST_UNKNOWN_JOB,
    AuthenticationError,
    ProtocolError,
    RefusedError,
    UnknownJobError,
)

if TYPE_CHECKING:
    from .framing import Connection

MAGIC = b"RWTP"
PROTOCOL_VERSION = 1
ROLE_PUSH = 1  # the dialer sends segments
ROLE_PULL = 2  # the dialer receives segments
ROLE_NAMES = {ROLE_PUSH: "push", ROLE_PULL: "pull"}
FLAG_RESUME = 1

_HELLO = struct.Struct("<4sBBHHHQ16s32sH")
_CHALLENGE = struct.Struct("<4sBB32s32sH")
_AUTH = struct.Struct("<B32s")
_RESULT = struct.Struct("<BH")

MAX_STREAMS = 64
MAX_JOB_BYTES = sg.MAX_JOB_BYTES
_LABEL_SERVER = b"rwtp-server\0"
_LABEL_CLIENT = b"rwtp-client\0"


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
