"""The sending side of a session: segments round-robin over the stripes, skipping a busy one (a stalled stripe
does not hold the others back); on RESUME, what went out on dead stripes and is still lacking goes again, and a
stripe reported silent in the tail has its lacking segments hedged over the others, once each."""

from __future__ import annotations

import asyncio
import time
from collections import deque

import numpy as np

from .errors import ProtocolError, SessionError
from .framing import _DONE, _FRAME, _FRAME_NAMES, _RESUME, F_DONE, F_RESUME, F_SEG, WRITE_HIGH_WATER, Connection
from .sessions import _Session, _Slot
from .tracker import seq_of


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
