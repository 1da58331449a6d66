"""Periodic background work of a service (reapers, sweeps), one implementation.

``Periodic(self.reap, interval_s, name="rm-reaper")``: ``start()`` in the service's ``start``, ``await stop()``
in its ``stop``. Each tick awaits ``fn()`` and then sleeps ``interval_s``; a tick that raises is logged and the
next tick runs as usual (a store hiccup must not end the reaper). Ticks never overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Periodic:
    """Runs ``fn`` every ``interval_s`` seconds in one task until :meth:`stop`."""

    def __init__(self, fn: Callable[[], Awaitable[object]], interval_s: float, *, name: str) -> None:
        if interval_s <= 0:
            raise ValueError(f"{name}: interval must be > 0, got {interval_s}")
        self.fn = fn
        self.interval_s = interval_s
        self.name = name
        self.ticks = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start ticking (first tick at once); a second call while running does nothing."""
        if not self.running:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        """Cancel the loop and wait for it (an in-flight tick is cancelled too)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _loop(self) -> None:
        while True:
            try:
                await self.fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - e.g. a Redis hiccup: try again next tick
                self.failures += 1
                log.exception("%s failed", self.name)
            self.ticks += 1
            await asyncio.sleep(self.interval_s)
