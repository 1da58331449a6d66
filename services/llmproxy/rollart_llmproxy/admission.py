"""The admission gate: Suspend stops admitting turns (they wait, bounded by their deadlines), Resume
releases them in arrival order. In-flight turns are not touched."""

from __future__ import annotations

import asyncio
import time
from collections import deque


class AdmissionTimeout(Exception):
    """The deadline passed while waiting for admission."""


class AdmissionRefused(Exception):
    """Too many requests wait already."""


class AdmissionGate:
    def __init__(self, max_waiting: int = 100_000) -> None:
        self.max_waiting = max_waiting
        self.suspended = False
        self.since = 0.0  # wall clock of the current suspension
        self._since_mono = 0.0
        self.reason = ""
        self.step = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def suspend(self, reason: str = "", step: int = 0) -> bool:
        """Returns True when this call suspended (False: already suspended)."""
        if self.suspended:
            return False
        self.suspended = True
        self.since = time.time()
        self._since_mono = time.monotonic()
        self.reason = reason
        self.step = step
        return True

    def resume(self) -> tuple[int, float]:
        """Admit again; returns (requests released, seconds the suspension lasted)."""
        if not self.suspended:
            return 0, 0.0
        lasted = time.monotonic() - self._since_mono
        self.suspended = False
        self.reason = ""
        released = 0
        while self._waiters:  # arrival order: each waiter's task is woken in the order it queued
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                released += 1
        return released, lasted

    async def admit(self, deadline: float, cancel: asyncio.Future[None] | None = None) -> float:
        """Wait until admitted; returns the seconds waited. ``deadline`` is a time.monotonic() value.

        Raises AdmissionTimeout at the deadline; returns early (with the wait so far) when ``cancel`` completes
        first (the caller checks why, e.g. an Abort).
        """
        if not self.suspended:
            return 0.0
        if len(self._waiters) >= self.max_waiting:
            self._waiters = deque(f for f in self._waiters if not f.done())
            if len(self._waiters) >= self.max_waiting:
                raise AdmissionRefused(f"{len(self._waiters)} requests already wait for admission")
        start = time.monotonic()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            waits: set[asyncio.Future] = {fut}
            if cancel is not None:
                waits.add(cancel)
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise AdmissionTimeout("deadline passed while the proxy was suspended")
            done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise AdmissionTimeout(
                    f"deadline passed after {time.monotonic() - start:.3f}s waiting while the proxy was suspended"
                )
            return time.monotonic() - start
        finally:
            if not fut.done():
                fut.cancel()
