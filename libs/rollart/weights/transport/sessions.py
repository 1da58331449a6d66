"""A session: the ``S`` stripes of one delta. The side that dialled re-dials a lost stripe (same session id and
index) and the receiver's RESUME on it says what is missing; a session with no stripe for ``reconnect_timeout``,
or without progress for ``idle_timeout`` while work is pending, fails. Sender and receiver build on this
(``sender``, ``receiver``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from .errors import (
    AuthenticationError,
    HandshakeError,
    ProtocolError,
    RefusedError,
    SessionError,
    TransportError,
    UnknownJobError,
)
from .framing import _FRAME, _FRAME_NAMES, F_ERROR, Connection

log = logging.getLogger(__name__)


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
