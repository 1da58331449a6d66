"""Each job's share of a fleet shared by several LoRA jobs (config ``job_shares`` and ``fleet_turn_slots``).

``fleet_turn_slots`` is how many turns the fleet runs at once at full speed (e.g. the actors' ``max_num_seqs``
summed); ``job_shares`` weighs the jobs (a job not named weighs 1; ``""`` is the turns naming no job, the fleet
owner's). While the fleet has a free slot every turn goes on at once, whatever its job (work-conserving). When it
is full, a job at or above its share of the slots (its weight over the weights of the jobs with turns in flight
or waiting, at least one slot) waits for one of its own turns to end; a job below its share goes on, so under
contention each job's turns in flight tend to its weighted share. ``fleet_turn_slots`` 0 turns this off.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter


class ShareTimeout(Exception):
    """The turn's deadline passed while its job was over its share of a full fleet."""


class JobShares:
    def __init__(self, slots: int = 0, weights: dict[str, float] | None = None) -> None:
        self.slots = slots
        self.weights = dict(weights or {})
        self.in_flight: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self._changed = asyncio.Event()

    @property
    def on(self) -> bool:
        return self.slots > 0

    def weight(self, job: str) -> float:
        return self.weights.get(job, 1.0)

    def limit(self, job: str) -> int:
        """The job's share of the slots among the jobs with turns in flight or waiting (itself included)."""
        active = {j for j, n in (self.in_flight + self.waiting).items() if n > 0} | {job}
        total = sum(self.weight(j) for j in active)
        return max(1, math.floor(self.slots * self.weight(job) / total)) if total > 0 else self.slots

    def must_wait(self, job: str) -> bool:
        return sum(self.in_flight.values()) >= self.slots and self.in_flight[job] >= self.limit(job)

    async def acquire(self, job: str, deadline: float, cancel: asyncio.Future | None = None) -> float:
        """Take a slot for a turn of ``job`` (see the module docstring); returns the seconds waited. Raises
        ShareTimeout at ``deadline`` (time.monotonic()); returns early when ``cancel`` completes (an Abort: the
        caller checks, and must still call :meth:`release`)."""
        start = time.monotonic()
        if self.on:
            self.waiting[job] += 1
            try:
                while self.must_wait(job):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ShareTimeout(f"deadline passed waiting for job {job!r}'s share of the fleet")
                    self._changed.clear()
                    waits: set[asyncio.Future] = {asyncio.ensure_future(self._changed.wait())}
                    if cancel is not None:
                        waits.add(cancel)
                    done, pending = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                    for f in pending:
                        if f is not cancel:
                            f.cancel()
                    if cancel is not None and cancel in done:
                        break
            finally:
                self.waiting[job] -= 1
        self.in_flight[job] += 1
        self._changed.set()
        return time.monotonic() - start

    def release(self, job: str) -> None:
        self.in_flight[job] -= 1
        if self.in_flight[job] <= 0:
            del self.in_flight[job]
        self._changed.set()
