"""Opening sessions by dialling: ``open_push`` (this side sends, e.g. trainer -> relay) and ``open_pull`` (this
side receives, e.g. subscriber -> relay), and ``send_delta`` / ``receive_delta`` around them. Every stripe is
dialled at once; one must come up, the others keep being re-dialled."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass

from .errors import AuthenticationError, ProtocolError, RefusedError, TransportError, UnknownJobError
from .framing import Connection, dial
from .handshake import ROLE_PULL, ROLE_PUSH, Hello
from .receiver import ReceiverSession
from .sender import SenderSession
from .sessions import Redial, _Session
from .tracker import SegmentSink, SegmentTracker, TrackerSink


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
