"""The receiving side of a session: every segment is verified (CRC-32, HMAC, job, version, base) before its sink
sees it; a bad one costs its stripe (re-dialled and resumed, so corruption and forgery are repaired like a drop)
until too many fail the session. While segments are missing, a stripe silent for longer than its rhythm allows
gets a RESUME (tail hedging)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import numpy as np

from rollart.delta import segment as sg
from rollart.delta.errors import DeltaError, TrailerError

from .errors import ProtocolError, SessionError
from .framing import _DONE, _FRAME_NAMES, _RESUME, F_DONE, F_ERROR, F_RESUME, F_SEG, Connection
from .sessions import _Session, _Slot
from .tracker import SegmentSink, SegmentTracker, seq_of

log = logging.getLogger(__name__)

# Tail hedging: a stripe silent this long (and three times its usual pause) while segments are missing is
# reported; longer than a shared link's regular pauses and than a TCP retransmission timeout.
HEDGE_AFTER_S = 0.25
VERIFY_IN_THREAD_BYTES = 128 * 1024  # segments at least this large are verified off the event loop


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
